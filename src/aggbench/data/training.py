"""RL training datasets (configs/datasets/*.yaml) loaded into canonical ``{"id", "prompt", "answer"}``.

``prompt`` is always the RAW problem text. Where a dataset ships its prompts already wrapped in an
instruction (DAPO-Math-17k: "Solve the following math problem step by step. ... Answer: $Answer"),
``strip_instruction: true`` removes the wrapper given by ``instruction_template`` (a row that does
not match it is an error, never silently kept), and :meth:`TrainingDatasetSpec.render_prompt`
re-applies the same template, so one YAML string both strips and rebuilds the training prompt.

``dedupe: true`` keeps the first row of every distinct raw problem: the hub copy of DAPO-Math-17k
repeats its 17,398 unique problems about 100 times (~1.79M rows).

``holdout: {n, seed}`` keeps ``n`` distinct problems out of training for checkpoint selection
(:mod:`aggbench.data.holdout`; a ``limit`` cuts the training rows after the split).

Sources, as for benchmarks: ``$AGGBENCH_DATA_DIR/<offline_file>`` first, else the pinned hub copy;
``builtin`` is the tiny task's train split.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

from pydantic import field_validator, model_validator

from aggbench.data.holdout import Holdout, split_holdout
from aggbench.data.jsonl import DataError, get_field, iter_jsonl
from aggbench.data.rows import (
    Row,
    as_answer,
    as_text,
    resolve_data_dir,
)
from aggbench.data.sources import (
    FieldMap,
    available_names,
    config_dirs,
)
from aggbench.data.spec import DataSpec, load_spec

log = logging.getLogger(__name__)
DATASET_DIR_ENV = "AGGBENCH_DATASET_DIR"
_TRAINING_FIELDS = {"id", "prompt", "answer", "meta"}


class TrainingDatasetSpec(DataSpec):
    """One RL training set. See configs/datasets/*.yaml (common fields: :class:`DataSpec`)."""

    instruction_template: str = "{prompt}"
    strip_instruction: bool = False
    dedupe: bool = False
    holdout: Holdout | None = None

    @field_validator("instruction_template")
    @classmethod
    def _one_placeholder(cls, value: str) -> str:
        if value.count("{prompt}") != 1:
            raise ValueError("instruction_template must contain the placeholder {prompt} exactly once")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> TrainingDatasetSpec:
        maps = self._check_sources("hub, url, offline_file or builtin")
        if self.builtin is not None and self.builtin.split != "train":
            raise ValueError("a training dataset uses the built-in task's train split")
        for label, fields in maps:
            extra = sorted(k for k in fields.model_fields_set if k not in _TRAINING_FIELDS)
            if extra:
                raise ValueError(
                    f"{label} of a training dataset maps only id, prompt, answer, meta (not {', '.join(extra)})"
                )
            if not fields.answer:
                raise ValueError(f"{label}.answer is required")
        return self

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


def list_training_datasets() -> list[str]:
    """Names found under ``$AGGBENCH_DATASET_DIR`` and ``configs/datasets``."""
    return available_names(config_dirs("datasets", DATASET_DIR_ENV))


def load_training_spec(name_or_path: str | Path) -> TrainingDatasetSpec:
    """Find (path, or NAME under ``$AGGBENCH_DATASET_DIR`` / ``configs/datasets``) and validate."""
    return load_spec(
        TrainingDatasetSpec, name_or_path, kind="training dataset", subdir="datasets", env_var=DATASET_DIR_ENV
    )


def load_training_dataset(
    spec: TrainingDatasetSpec | str | Path, *, data_dir: str | Path | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """Canonical ``{"id", "prompt", "answer"[, "meta"]}`` records to train on, de-duplicated if the
    spec says so, without the spec's ``holdout`` problems; the first ``limit`` of them."""
    if not isinstance(spec, TrainingDatasetSpec):
        spec = load_training_spec(spec)
    # opened here, not in a shared helper: the sources warn at their loader's caller (stacklevel 4)
    return _split(spec, spec.open_rows(resolve_data_dir(data_dir)), limit)[0]


def load_training_split(
    spec: TrainingDatasetSpec | str | Path, *, data_dir: str | Path | None = None, limit: int | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(``load_training_dataset``'s records, the rows its ``holdout`` left out: [] without one),
    from one read of the source."""
    if not isinstance(spec, TrainingDatasetSpec):
        spec = load_training_spec(spec)
    return _split(spec, spec.open_rows(resolve_data_dir(data_dir)), limit)


def _split(
    spec: TrainingDatasetSpec, opened: Any, limit: int | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, _source, fields, _offline = opened
    if spec.holdout is None:
        return _records(spec, fields, rows, limit), []
    train, held = split_holdout(spec, _records(spec, fields, rows, None))
    log.info(
        "%s: %d rows of %d problems held out of training (holdout)", spec.name, len(held), spec.holdout.n
    )
    return (train[:limit] if limit is not None else train), held


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
    "Holdout",
    "Row",
    "TrainingDatasetSpec",
    "list_training_datasets",
    "load_training_dataset",
    "load_training_split",
    "load_training_spec",
]


def read_training_records(path: str | Path, *, name: str | None = None) -> list[dict[str, Any]]:
    """The canonical training JSONL that ``prepare-data`` wrote ({id, prompt, answer} per line),
    as the trainer reads it. Checked whole before a model loads: a missing or empty file, or a line
    whose prompt is not text or whose answer is missing, null or not text, raises
    :class:`DataError` naming the file, line and field. ``name``: the dataset, for the fix."""
    p = Path(path)
    fix = f"write it with `aggbench prepare-data {name or 'NAME'} --out {p}`, or correct dataset.path"
    if not p.exists():
        raise DataError(p, None, None, f"does not exist (dataset.path); {fix}")
    if not p.is_file():
        raise DataError(p, None, None, f"is not a file (dataset.path); {fix}")
    records = []
    for line, row in iter_jsonl(p):
        for key in ("prompt", "answer"):
            why = _canonical_problem(row.get(key), key in row, list_ok=key == "answer")
            if why:
                raise DataError(p, line, key, why)
        records.append(row)
    if not records:
        raise DataError(p, None, None, f"no records (the trainer needs at least one prompt); {fix}")
    return records


def _canonical_problem(value: Any, present: bool, *, list_ok: bool) -> str | None:
    """Why a prompt (text) or an answer (text, or a list of accepted texts) cannot be used, or None."""
    if not present:
        return "missing (canonical records have id, prompt, answer)"
    if value is None:
        return "is null"
    if list_ok and isinstance(value, list):
        if not value:
            return "is an empty list"
        bad = next((v for v in value if not isinstance(v, str) or not v.strip()), None)
        return None if bad is None else f"expected a list of non-empty strings, holds {bad!r}"
    if not isinstance(value, str):
        kind = "a string or a list of strings" if list_ok else "a string"
        return f"expected {kind}, got {type(value).__name__} {json.dumps(value)[:40]}"
    return "is empty" if not value.strip() else None
