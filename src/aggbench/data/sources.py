"""Shared machinery of the declarative data specs: strict models, config lookup, row sources.

Used by :mod:`aggbench.data.benchmarks` and :mod:`aggbench.data.training`:

- :class:`Strict` models reject unknown keys; :func:`read_spec` turns pydantic's errors into
  messages that name the YAML file, the bad key and the keys allowed there (with a suggestion).
- :func:`resolve_config` finds ``NAME.yaml`` under an env-var directory, then ``configs/<kind>/``.
- Row sources yield ``(where, line, row)``: :func:`offline_rows` (``$AGGBENCH_DATA_DIR`` JSONL,
  optionally joined by row order with a second file), :func:`hub_rows` (``datasets.load_dataset``
  at a pinned revision, imported lazily), :func:`url_rows` (a JSONL file at a URL pinned by its
  sha256, e.g. a raw file at a git commit) and :func:`builtin_rows` (the tiny task).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pickle
import re
import warnings
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from aggbench.data.jsonl import DataError, get_field, iter_jsonl
from aggbench.graders import GraderSpec, get_grader, grader_names
from aggbench.registry import did_you_mean

# src/aggbench/data/sources.py -> parents[3] is the repository root in the src layout.
REPO_ROOT = Path(__file__).resolve().parents[3]
DATA_DIR_ENV = "AGGBENCH_DATA_DIR"
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class SpecError(ValueError):
    """A benchmark or dataset config that cannot be found or does not validate."""


class DataUnavailableError(RuntimeError):
    """Neither the offline file nor the hub could provide the data."""


class Strict(BaseModel):
    """Base for config models: unknown keys are errors (see :func:`read_spec` for the message)."""

    model_config = ConfigDict(extra="forbid")


class FieldMap(Strict):
    """Canonical field -> source column (dotted path; integer segments index lists).

    ``id: null`` numbers the rows instead (``<name>-<row index>``).
    """

    id: str | None = None
    prompt: str
    answer: str | None = None
    solution: str | None = None  # read by answer_from: boxed_in_solution
    tests: str | None = None
    starter_code: str | None = None
    func_name: str | None = None  # default: the first `def` of the starter code
    date: str | None = None
    grading: list[str] = Field(default_factory=list)  # copied to record["grading"] (grader options)
    meta: list[str] = Field(default_factory=list)  # copied to record["meta"]


class HubSource(Strict):
    """Where the data lives on the Hugging Face hub."""

    id: str
    revision: str = Field(description="a 40-hex commit (pinned) or a branch such as 'main' (warned)")
    split: str
    # Several configs are loaded in order and concatenated (opencompass/AIME2025 has I and II).
    config: str | list[str] | None = None
    # Raw files inside the repo, read with the json/parquet builder. Needed where the repo only
    # works through a loading script, which `datasets` >= 4 no longer runs (LiveCodeBench).
    data_files: list[str] | None = None
    # Column mapping for the hub copy when its columns differ from the offline file's.
    fields: FieldMap | None = None
    # A named row converter applied before the field mapping (decodes LCB's test encodings).
    adapter: Literal["livecodebench"] | None = None

    @property
    def pinned(self) -> bool:
        return bool(_FULL_SHA.match(self.revision))


class UrlSource(Strict):
    """A JSONL file at a URL, pinned by content: a raw file at a git commit, say, for data whose hub
    copy cannot be pinned. Same columns as the offline file (``fields`` applies)."""

    url: str
    sha256: str = Field(description="the file's sha256 (64 hex): a different file is refused")

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256.match(value):
            raise ValueError(f"sha256 must be 64 lowercase hex digits, got {value!r}")
        return value


class BuiltinSource(Strict):
    """The built-in synthetic task, ``aggbench.tiny.task.make_task(seed, n_train, n_test)``."""

    name: Literal["tiny"] = "tiny"
    split: Literal["train", "test"]
    seed: int = 0
    n_train: int = Field(ge=1)
    n_test: int = Field(ge=1)


class Grader(Strict):
    name: str  # a registered grader (aggbench.graders): math, code, tiny, evalplus, or a plugin's
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("name")
    @classmethod
    def _registered(cls, name: str) -> str:
        valid = grader_names()
        if name not in valid:
            raise PydanticCustomError(
                "unknown_grader",
                "unknown value '{got}'.{hint} Valid: {valid}",
                {"got": name, "hint": did_you_mean(name, valid), "valid": ", ".join(valid)},
            )
        return name

    @property
    def entry(self) -> GraderSpec:
        return get_grader(self.name)


class JoinCheck(Strict):
    """Every row's ``left`` text (offline file) must occur in the joined row's ``right`` text."""

    left: str
    right: str


class OfflineJoin(Strict):
    """Columns taken from a second offline file, matched by row order."""

    file: str
    by: Literal["row_order"] = "row_order"
    columns: list[str]
    check: JoinCheck | None = None


def check_relative(value: str | None) -> str | None:
    if value is not None and (Path(value).is_absolute() or ".." in Path(value).parts):
        raise ValueError(f"{value!r} must be a path relative to ${DATA_DIR_ENV}")
    return value


S = TypeVar("S", bound=Strict)


def config_dirs(subdir: str, env_var: str) -> list[Path]:
    """Directories searched for ``NAME.yaml``: ``$env_var`` (os.pathsep-separated), then the repo's."""
    dirs = [Path(p) for p in os.environ.get(env_var, "").split(os.pathsep) if p]
    repo = REPO_ROOT / "configs" / subdir
    return [*dirs, repo] if repo.is_dir() else dirs


def available_names(dirs: Iterable[Path]) -> list[str]:
    return sorted({p.stem for d in dirs if d.is_dir() for p in [*d.glob("*.yaml"), *d.glob("*.yml")]})


def resolve_config(name_or_path: str | Path, *, kind: str, subdir: str, env_var: str) -> Path:
    """A path to a YAML file, or NAME looked up under ``$env_var`` then ``configs/<subdir>/``."""
    path = Path(name_or_path)
    if looks_like_path(name_or_path):
        if path.is_file():
            return path
        what = "is a directory, not a YAML file" if path.is_dir() else "does not exist"
        raise SpecError(f"{kind} config file {str(path)!r} {what}")
    dirs = config_dirs(subdir, env_var)
    for directory in dirs:
        for ext in (".yaml", ".yml"):
            if (directory / f"{path.name}{ext}").is_file():
                return directory / f"{path.name}{ext}"
    names = available_names(dirs)
    searched = ", ".join(str(d) for d in dirs) or "(no directory)"
    raise SpecError(
        f"unknown {kind} {path.name!r}.{did_you_mean(path.name, names)} "
        f"Available: {', '.join(names) or '(none)'}. Searched: {searched}; "
        f"set ${env_var} to add a directory of {kind} YAML files."
    )


def looks_like_path(name_or_path: str | Path) -> bool:
    """True for a Path, a name ending in .yaml/.yml, or one with a directory part."""
    path = Path(name_or_path)
    return isinstance(name_or_path, Path) or path.suffix in {".yaml", ".yml"} or len(path.parts) > 1


def read_spec(cls: type[S], path: Path, *, kind: str, expect_name: str | None = None) -> S:
    """Parse and validate one YAML spec; errors name the file, the bad key and the allowed keys."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: invalid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping of keys at the top level")
    try:
        spec = cls.model_validate(data)
    except ValidationError as exc:
        raise SpecError(f"{path}: invalid {kind} config:\n  " + "\n  ".join(_explain(cls, exc))) from None
    if expect_name is not None and getattr(spec, "name", expect_name) != expect_name:
        raise SpecError(f"{path}: name {spec.name!r} does not match the file name {expect_name!r}")  # type: ignore[attr-defined]
    spec._path = path  # type: ignore[attr-defined]
    return spec


def _explain(cls: type[BaseModel], exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(part) for part in err["loc"])
        if err["type"] == "extra_forbidden":
            parent = err["loc"][:-1]
            allowed = _allowed_keys(cls, parent)
            key = str(err["loc"][-1])
            where = f" under {'.'.join(map(str, parent))!r}" if parent else ""
            lines.append(
                f"unknown key {loc!r}.{did_you_mean(key, allowed)} Allowed keys{where}: {', '.join(allowed)}"
            )
        elif err["type"] == "literal_error":  # e.g. grader.name: maht -> did you mean 'math'?
            valid = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
            got = str(err["input"])
            lines.append(f"{loc}: unknown value {got!r}.{did_you_mean(got, valid)} Valid: {', '.join(valid)}")
        else:
            lines.append(f"{loc or '(top level)'}: {err['msg']}")
    return lines


def _allowed_keys(cls: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] | None = cls
    for part in loc:
        if model is None:
            return []
        if isinstance(part, int):
            continue
        field = model.model_fields.get(str(part))
        model = _model_in(field.annotation) if field else None
    return sorted(model.model_fields) if model else []


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found:
            return found
    return None


Row = tuple[str, int, dict[str, Any]]  # (where, 1-based line or row number, row)


def resolve_data_dir(explicit: str | Path | None = None) -> Path | None:
    """The offline data directory: the explicit argument, else ``$AGGBENCH_DATA_DIR``, else None."""
    value = explicit if explicit is not None else os.environ.get(DATA_DIR_ENV)
    return Path(value) if value else None


def offline_path(root: Path | None, relpath: str | None, *, name: str, has_online: bool) -> Path | None:
    """``root/relpath`` if that file exists; warns when a data dir is set but lacks it and an online
    source (hub or URL) comes next."""
    if root is None or relpath is None:
        return None
    path = root / relpath
    if path.is_file():
        return path
    if has_online:
        warnings.warn(
            f"{name}: {path} not found under the offline data dir; trying the hub or URL", stacklevel=4
        )
    return None


def offline_rows(root: Path, relpath: str, join: OfflineJoin | None = None) -> Iterator[Row]:
    """Rows of ``root/relpath`` (JSONL), with ``join.columns`` added from a second file by row order."""
    path = root / relpath
    if join is None:
        return ((str(path), line, row) for line, row in iter_jsonl(path))
    rows = [(str(path), line, row) for line, row in iter_jsonl(path)]
    jpath = root / join.file
    if not jpath.is_file():
        raise DataUnavailableError(f"{jpath} (offline_join.file, under ${DATA_DIR_ENV}) does not exist")
    right = list(iter_jsonl(jpath))
    if len(right) != len(rows):
        raise DataError(
            jpath,
            None,
            None,
            f"has {len(right)} rows but {path} has {len(rows)}; a row-order join needs equal counts",
        )
    for (where, line, row), (rline, rrow) in zip(rows, right, strict=True):
        for column in join.columns:
            if column in row:
                raise DataError(where, line, column, f"already present; cannot join it from {jpath}")
            row[column] = get_field(rrow, column, where=jpath, line=rline)
        if join.check:
            left = _squash(get_field(row, join.check.left, where=where, line=line))
            if left not in _squash(get_field(rrow, join.check.right, where=jpath, line=rline)):
                raise DataError(
                    jpath,
                    rline,
                    join.check.right,
                    f"does not contain {join.check.left!r} of {where}:{line}; the two files are not in the same row order",
                )
    return iter(rows)


def top_columns(fields: FieldMap) -> list[str]:
    """Top-level source columns a field map reads (for ``select_columns`` on big hub datasets)."""
    paths = [v for k, v in fields if isinstance(v, str)] + [*fields.grading, *fields.meta]
    return [p.split(".", 1)[0] for p in paths]


def _squash(value: Any) -> str:
    return " ".join(str(value).split())


def resolve_revision(hub: HubSource) -> str | None:
    """The commit a branch revision points at now (hub metadata only), or None when unreachable.

    A spec that names a branch (every shipped spec is pinned to a commit) is resolved on its first
    online load, and the commit is named so the user pins it in one edit."""
    try:
        from huggingface_hub import HfApi, constants

        if constants.HF_HUB_OFFLINE:
            return None
        return HfApi().dataset_info(hub.id, revision=hub.revision).sha
    except Exception:  # offline, rate-limited, gated: the warning still says the revision is a branch
        return None


def hub_rows(
    hub: HubSource,
    *,
    name: str,
    offline_file: str | None,
    columns: Iterable[str] | None = None,
    data_dir: Path | None = None,
) -> Iterator[Row]:
    """Rows from the hub via ``datasets.load_dataset``; offline failures name ``$AGGBENCH_DATA_DIR``.

    The download happens before this returns (so its errors surface here); rows are then streamed.
    ``columns`` (top-level names) restricts the columns read, which matters for DAPO's 1.79M rows.
    """
    if not hub.pinned:
        sha = resolve_revision(hub)
        warnings.warn(
            f"{name}: hub revision {hub.revision!r} of {hub.id} is not a pinned commit; the data may change"
            + (f". It resolves to {sha} today: put `revision: {sha}` in its spec to pin it" if sha else ""),
            stacklevel=4,
        )
    where = f"hf://datasets/{hub.id}@{hub.revision} split={hub.split} row"
    try:
        import datasets

        if hub.data_files:
            urls = [f"hf://datasets/{hub.id}@{hub.revision}/{f}" for f in hub.data_files]
            builder = "parquet" if all(f.endswith(".parquet") for f in hub.data_files) else "json"
            parts = [datasets.load_dataset(builder, data_files={hub.split: urls}, split=hub.split)]
        else:
            configs = hub.config if isinstance(hub.config, list) else [hub.config]
            parts = [
                datasets.load_dataset(hub.id, c, revision=hub.revision, split=hub.split) for c in configs
            ]
        if columns is not None and hub.adapter is None:
            keep = sorted(set(columns))
            parts = [part.select_columns([c for c in keep if c in part.column_names]) for part in parts]
    except Exception as exc:  # any hub failure gets the same actionable message
        raise DataUnavailableError(
            f"{name}: could not load {where.removesuffix(' row')} from the Hugging Face hub ({type(exc).__name__}: {exc}). "
            + _offline_hint(offline_file, data_dir)
        ) from exc
    adapt = _adapt_livecodebench if hub.adapter == "livecodebench" else dict
    rows = (adapt(row) for part in parts for row in part)
    return ((where, i + 1, row) for i, row in enumerate(rows))


def _offline_hint(offline_file: str | None, data_dir: Path | None) -> str:
    """The fix when an online source fails: where the offline copy goes."""
    have = f"set to {str(data_dir)!r}" if data_dir else "unset"
    return (
        f"Offline, set ${DATA_DIR_ENV} to a directory holding {offline_file or 'the canonical JSONL file'} "
        f"(the data dir is {have})."
    )


def url_rows(
    source: UrlSource, *, name: str, offline_file: str | None, data_dir: Path | None
) -> Iterator[Row]:
    """Rows of the JSONL file at ``source.url``, downloaded once into the `datasets` cache (its own
    download manager: retries, resumes, HF_DATASETS_OFFLINE), refused unless its sha256 is the
    pinned one. The download and the check happen before this returns."""
    import hashlib

    try:
        from datasets import DownloadManager

        path = Path(DownloadManager().download(source.url))
    except Exception as exc:
        raise DataUnavailableError(
            f"{name}: could not download {source.url} ({type(exc).__name__}: {exc}). "
            + _offline_hint(offline_file, data_dir)
        ) from exc
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != source.sha256:
        raise DataUnavailableError(
            f"{name}: {source.url} (downloaded to {path}) has sha256 {digest}, but its spec pins "
            f"{source.sha256}: the file changed upstream or the download is corrupt. Delete {path} "
            "to download it again, or check the URL's commit."
        )
    return ((source.url, line, row) for line, row in iter_jsonl(path))


def builtin_rows(source: BuiltinSource) -> Iterator[Row]:
    """The built-in task's split; ``make_task`` may return a (train, test) pair or a dict of them."""
    try:
        from aggbench.tiny.task import make_task
    except ImportError as exc:
        raise DataUnavailableError(f"the built-in task needs aggbench.tiny.task.make_task ({exc})") from exc
    result = make_task(seed=source.seed, n_train=source.n_train, n_test=source.n_test)
    splits = result if isinstance(result, dict) else dict(zip(("train", "test"), result, strict=True))
    where = f"aggbench.tiny.task.make_task(seed={source.seed}) {source.split}"
    return ((where, i + 1, dict(row)) for i, row in enumerate(splits[source.split]))


class _NoGlobals(pickle.Unpickler):
    """LCB stores private tests as base64(zlib(pickle(json string))); a str needs no globals, so
    refusing every global makes loading a hub file unable to run code."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from LiveCodeBench test data")


def decode_lcb_tests(value: str | list) -> list[dict[str, Any]]:
    """LiveCodeBench ``*_test_cases``: a JSON list, or the compressed pickle of one (private tests)."""
    if isinstance(value, list):
        return value
    if not value:
        return []
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raw = zlib.decompress(base64.b64decode(value))
        return json.loads(_NoGlobals(io.BytesIO(raw)).load())


def _adapt_livecodebench(row: dict[str, Any]) -> dict[str, Any]:
    """code_generation_lite row -> the offline file's columns (rllm + the joined QwQ columns)."""
    private = decode_lcb_tests(row.get("private_test_cases") or "")
    metadata = json.loads(row.get("metadata") or "{}")
    return {
        "problem": row["question_content"],
        "starter_code": row.get("starter_code") or "",
        "tests": decode_lcb_tests(row["public_test_cases"]) + private,
        "question_id": row["question_id"],
        "contest_id": row.get("contest_id"),
        "contest_date": row["contest_date"],
        "difficulty": row.get("difficulty"),
        "func_name": metadata.get("func_name"),
        "_public_tests_only": not private,
    }


def as_text(value: Any, where: str, line: int, field: str | None) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise DataError(where, line, field, f"expected text, got {type(value).__name__}")
    text = str(value)
    if not text.strip():
        raise DataError(where, line, field, "is empty")
    return text


def as_answer(value: Any, transform: str, where: str, line: int, field: str | None) -> str | list[str]:
    if isinstance(value, list):
        if not value:
            raise DataError(where, line, field, "is an empty list")
        return [as_text(v, where, line, field).strip() for v in value]
    if isinstance(value, float):
        value = str(int(value)) if value.is_integer() else repr(value)
    answer = as_text(value, where, line, field).strip()
    if transform == "integer":
        if not re.fullmatch(r"[+-]?\d+", answer):
            raise DataError(where, line, field, f"expected an integer answer, got {answer!r}")
        answer = str(int(answer))  # "025" -> "25": AIME answers are zero-padded in some copies
    return answer
