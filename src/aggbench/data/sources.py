"""Shared machinery of the declarative data specs: strict models and config lookup.

Used by :mod:`aggbench.data.benchmarks` and :mod:`aggbench.data.training`:

- :class:`Strict` models reject unknown keys; :func:`read_spec` turns pydantic's errors into
  messages that name the YAML file, the bad key and the keys allowed there (with a suggestion).
- The source models (:class:`HubSource`, :class:`UrlSource`, :class:`BuiltinSource`,
  :class:`OfflineJoin`) and the field map say where rows come from; :mod:`aggbench.data.rows`
  reads them.
- :func:`resolve_config` finds ``NAME.yaml`` under an env-var directory, then ``configs/<kind>/``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from aggbench.errors import InputError, not_utf8
from aggbench.graders import GraderSpec, get_grader, grader_names
from aggbench.registry import did_you_mean

# src/aggbench/data/sources.py -> parents[3] is the repository root in the src layout.
REPO_ROOT = Path(__file__).resolve().parents[3]
DATA_DIR_ENV = "AGGBENCH_DATA_DIR"
_FULL_SHA = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class SpecError(InputError, ValueError):
    """A benchmark or dataset config that cannot be found or does not validate."""


class DataUnavailableError(InputError, RuntimeError):
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
        return check_sha256(value)


def check_sha256(value: str | None) -> str | None:
    """A pinned file digest: None or 64 lowercase hex digits."""
    if value is not None and not _SHA256.match(value):
        raise ValueError(f"sha256 must be 64 lowercase hex digits, got {value!r}")
    return value


class BuiltinSource(Strict):
    """The built-in synthetic task, ``aggbench.tiny.task.make_task(seed, n_train, n_test)``; the
    validation split is ``make_validation(seed, n_validation, n_test)`` (apart from the test split)."""

    name: Literal["tiny"] = "tiny"
    split: Literal["train", "test", "validation"]
    seed: int = 0
    n_train: int = Field(ge=1)
    n_test: int = Field(ge=1)
    n_validation: int | None = Field(None, ge=1, description="split validation only: its size")

    @model_validator(mode="after")
    def _validation_size(self) -> BuiltinSource:
        if (self.split == "validation") != (self.n_validation is not None):
            raise ValueError("n_validation is the size of split: validation (give it there, and only there)")
        return self


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
    sha256: str | None = Field(None, description="the join file's sha256: another file is refused")

    @field_validator("sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        return check_sha256(value)


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
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: {not_utf8(exc)}") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read ({exc.strerror})") from None
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
