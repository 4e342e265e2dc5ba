"""RL training datasets (configs/datasets/*.yaml) loaded into canonical ``{"id", "prompt", "answer"}``.

``prompt`` is always the RAW problem text. Where a dataset ships its prompts already wrapped in an
instruction (DAPO-Math-17k: "Solve the following math problem step by step. ... Answer: $Answer"),
``strip_instruction: true`` removes the wrapper given by ``instruction_template`` (a row that does
not match it is an error, never silently kept), and :meth:`TrainingDatasetSpec.render_prompt`
re-applies the same template, so one YAML string both strips and rebuilds the training prompt.

``dedupe: true`` keeps the first row of every distinct raw problem: the hub copy of DAPO-Math-17k
repeats its 17,398 unique problems about 100 times (~1.79M rows).

Sources, as for benchmarks: ``$AGGBENCH_DATA_DIR/<offline_file>`` first, else the pinned hub copy;
``builtin`` is the tiny task's train split.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from aggbench.data.jsonl import DataError, get_field
from aggbench.data.sources import (
    DATA_DIR_ENV,
    BuiltinSource,
    DataUnavailableError,
    FieldMap,
    Grader,
    HubSource,
    Row,
    Strict,
    as_answer,
    as_text,
    available_names,
    builtin_rows,
    check_relative,
    config_dirs,
    hub_rows,
    looks_like_path,
    offline_path,
    offline_rows,
    read_spec,
    resolve_config,
    resolve_data_dir,
    top_columns,
)

log = logging.getLogger(__name__)
DATASET_DIR_ENV = "AGGBENCH_DATASET_DIR"
_TRAINING_FIELDS = {"id", "prompt", "answer", "meta"}


class TrainingDatasetSpec(Strict):
    """One RL training set. See configs/datasets/*.yaml."""

    name: str
    version: int = Field(ge=1)
    description: str = ""
    hub: HubSource | None = None
    offline_file: str | None = None
    builtin: BuiltinSource | None = None
    fields: FieldMap | None = None
    answer_transform: Literal["none", "integer"] = "none"
    instruction_template: str = "{prompt}"
    strip_instruction: bool = False
    dedupe: bool = False
    system_prompt: str | None = None
    use_chat_template: bool = True
    grader: Grader

    _path: Path | None = PrivateAttr(default=None)

    @field_validator("instruction_template")
    @classmethod
    def _one_placeholder(cls, value: str) -> str:
        if value.count("{prompt}") != 1:
            raise ValueError("instruction_template must contain the placeholder {prompt} exactly once")
        return value

    @field_validator("offline_file")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        return check_relative(value)

    @model_validator(mode="after")
    def _consistent(self) -> TrainingDatasetSpec:
        if self.builtin is not None:
            if self.hub or self.offline_file:
                raise ValueError("builtin excludes hub and offline_file")
            if self.builtin.split != "train":
                raise ValueError("a training dataset uses the built-in task's train split")
            self.fields = self.fields or FieldMap(id="id", prompt="prompt", answer="answer")
        elif self.hub is None and self.offline_file is None:
            raise ValueError("give at least one data source: hub, offline_file or builtin")
        if self.fields is None:
            raise ValueError("fields is required (the mapping to the canonical record)")
        for label, fields in (("fields", self.fields), ("hub.fields", self.hub and self.hub.fields)):
            if fields is None:
                continue
            extra = sorted(k for k in fields.model_fields_set if k not in _TRAINING_FIELDS)
            if extra:
                raise ValueError(
                    f"{label} of a training dataset maps only id, prompt, answer, meta (not {', '.join(extra)})"
                )
            if not fields.answer:
                raise ValueError(f"{label}.answer is required")
        return self

    @property
    def source_path(self) -> Path | None:
        return self._path

    def strip(self, text: str, *, where: str, line: int, field: str) -> str:
        """The raw problem inside ``instruction_template``; a row that does not match is an error."""
        prefix, suffix = self.instruction_template.split("{prompt}")
        if not (text.startswith(prefix) and text.endswith(suffix) and len(text) > len(prefix) + len(suffix)):
            head = prefix[:40].replace("\n", "\\n")
            raise DataError(
                where,
                line,
                field,
                f"does not match instruction_template (expected it to start with {head!r}...)",
            )
        return text[len(prefix) : len(text) - len(suffix)]

    def render_prompt(self, record: dict[str, Any]) -> str:
        """The training prompt: ``instruction_template`` applied to the raw problem."""
        prefix, suffix = self.instruction_template.split("{prompt}")
        return prefix + record["prompt"] + suffix

    def render_messages(self, record: dict[str, Any]) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*messages, {"role": "user", "content": self.render_prompt(record)}]


def list_training_datasets() -> list[str]:
    """Names found under ``$AGGBENCH_DATASET_DIR`` and ``configs/datasets``."""
    return available_names(config_dirs("datasets", DATASET_DIR_ENV))


def load_training_spec(name_or_path: str | Path) -> TrainingDatasetSpec:
    """Find (path, or NAME under ``$AGGBENCH_DATASET_DIR`` / ``configs/datasets``) and validate."""
    path = resolve_config(name_or_path, kind="training dataset", subdir="datasets", env_var=DATASET_DIR_ENV)
    expect = None if looks_like_path(name_or_path) else path.stem
    return read_spec(TrainingDatasetSpec, path, kind="training dataset", expect_name=expect)


def load_training_dataset(
    spec: TrainingDatasetSpec | str | Path, *, data_dir: str | Path | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """Canonical ``{"id", "prompt", "answer"[, "meta"]}`` records, de-duplicated if the spec says so."""
    if not isinstance(spec, TrainingDatasetSpec):
        spec = load_training_spec(spec)
    fields = spec.fields
    assert fields is not None  # set by the validator
    root = resolve_data_dir(data_dir)
    rows: Any
    if spec.builtin is not None:
        rows = builtin_rows(spec.builtin)
    elif path := offline_path(root, spec.offline_file, name=spec.name, has_hub=spec.hub is not None):
        rows = offline_rows(path.parent, path.name)  # no join: the file alone
    elif spec.hub is not None:
        fields = spec.hub.fields or fields
        rows = hub_rows(
            spec.hub,
            name=spec.name,
            offline_file=spec.offline_file,
            columns=top_columns(fields),
            data_dir=root,
        )
    else:
        raise DataUnavailableError(
            f"{spec.name}: no hub source, and the offline file {spec.offline_file!r} was not found under "
            f"${DATA_DIR_ENV} ({DATA_DIR_ENV} is {repr(os.fspath(root)) if root else 'unset'}). "
            f"Set {DATA_DIR_ENV} to the directory that holds {spec.offline_file}."
        )
    return _records(spec, fields, rows, limit)


def _records(
    spec: TrainingDatasetSpec, fields: FieldMap, rows: Any, limit: int | None
) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    first: dict[str, tuple[str, int, Any]] = {}  # raw problem -> (where, line, answer) of its first row
    n_rows = conflicts = 0
    for index, (where, line, row) in enumerate(rows):
        n_rows += 1
        record = _record(spec, fields, row, index, where, line)
        if spec.dedupe:
            seen = first.get(record["prompt"])
            if seen is not None:
                if seen[2] != record["answer"]:
                    conflicts += 1
                    if conflicts == 1:
                        warnings.warn(
                            f"{spec.name}: {where}:{line} repeats the problem of {seen[0]}:{seen[1]} with another "
                            f"answer ({record['answer']!r} vs {seen[2]!r}); the first is kept",
                            stacklevel=3,
                        )
                continue
            first[record["prompt"]] = (where, line, record["answer"])
        records.append(record)
        if limit is not None and len(records) >= limit:
            break
    if spec.dedupe:
        log.info(
            "%s: %d rows -> %d unique problems (%d with conflicting answers)",
            spec.name,
            n_rows,
            len(records),
            conflicts,
        )
    return records


def _record(
    spec: TrainingDatasetSpec, fields: FieldMap, row: dict[str, Any], index: int, where: str, line: int
) -> dict[str, Any]:
    def get(path: str) -> Any:
        return get_field(row, path, where=where, line=line)

    prompt = as_text(get(fields.prompt), where, line, fields.prompt)
    if spec.strip_instruction:
        prompt = spec.strip(prompt, where=where, line=line, field=fields.prompt)
    record: dict[str, Any] = {
        "id": as_text(get(fields.id), where, line, fields.id) if fields.id else f"{spec.name}-{index}",
        "prompt": as_text(prompt, where, line, fields.prompt),  # kept exactly: render_prompt rebuilds the row
        "answer": as_answer(get(fields.answer), spec.answer_transform, where, line, fields.answer),
    }
    if fields.meta:
        record["meta"] = {col.rsplit(".", 1)[-1]: get(col) for col in fields.meta}
    return record


__all__ = [
    "DATASET_DIR_ENV",
    "Row",
    "TrainingDatasetSpec",
    "list_training_datasets",
    "load_training_dataset",
    "load_training_spec",
]
