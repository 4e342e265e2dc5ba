"""Row sources of the declarative data specs, and the checks of one row's values.

Every source yields ``(where, line, row)``: :func:`offline_rows` (``$AGGBENCH_DATA_DIR`` JSONL,
optionally joined by row order with a second file), :func:`hub_rows` (``datasets.load_dataset`` at
a pinned revision, imported lazily), :func:`url_rows` (a JSONL file at a URL pinned by its sha256,
e.g. a raw file at a git commit) and :func:`builtin_rows` (the tiny task). :func:`as_text` and
:func:`as_answer` turn a source value into canonical text, or raise a :class:`DataError` naming
the row. The source models themselves are in :mod:`aggbench.data.sources`.
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
from typing import Any

from aggbench.data.jsonl import DataError, get_field, iter_jsonl
from aggbench.data.sources import (
    DATA_DIR_ENV,
    BuiltinSource,
    DataUnavailableError,
    FieldMap,
    HubSource,
    OfflineJoin,
    UrlSource,
)
from aggbench.files import sha256_file
from aggbench.tiny.task import make_task, make_validation

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


def offline_rows(
    root: Path, relpath: str, join: OfflineJoin | None = None, *, sha256: str | None = None, name: str = ""
) -> Iterator[Row]:
    """Rows of ``root/relpath`` (JSONL), with ``join.columns`` added from a second file by row order;
    each file refused unless its sha256 is the spec's pin, where it gives one (``offline_sha256``,
    ``offline_join.sha256``)."""
    path = root / relpath
    _check_pin(path, sha256, "offline_sha256", name)
    if join is None:
        return ((str(path), line, row) for line, row in iter_jsonl(path))
    rows = [(str(path), line, row) for line, row in iter_jsonl(path)]
    jpath = root / join.file
    if not jpath.is_file():
        raise DataUnavailableError(f"{jpath} (offline_join.file, under ${DATA_DIR_ENV}) does not exist")
    _check_pin(jpath, join.sha256, "offline_join.sha256", name)
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


def _check_pin(path: Path, pinned: str | None, key: str, name: str) -> None:
    """Refuse an offline file whose sha256 is not the spec's ``key`` (no pin: nothing to check)."""
    if pinned is None:
        return
    digest = sha256_file(path)
    if digest != pinned:
        raise DataUnavailableError(
            f"{name}: {path} has sha256 {digest}, but the spec's {key} pins {pinned}: it is not the file the "
            f"spec was written for (another copy, or a damaged or truncated one). Put the pinned file there "
            f"(the spec's comments say where it comes from), or unset ${DATA_DIR_ENV} to use the hub"
        )


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
    try:
        from datasets import DownloadManager

        path = Path(DownloadManager().download(source.url))
    except Exception as exc:
        raise DataUnavailableError(
            f"{name}: could not download {source.url} ({type(exc).__name__}: {exc}). "
            + _offline_hint(offline_file, data_dir)
        ) from exc
    digest = sha256_file(path)
    if digest != source.sha256:
        raise DataUnavailableError(
            f"{name}: {source.url} (downloaded to {path}) has sha256 {digest}, but its spec pins "
            f"{source.sha256}: the file changed upstream or the download is corrupt. Delete {path} "
            "to download it again, or check the URL's commit."
        )
    return ((source.url, line, row) for line, row in iter_jsonl(path))


def builtin_rows(source: BuiltinSource) -> Iterator[Row]:
    """The built-in task's split (``make_task`` returns the (train, test) pair)."""
    fn = "make_validation" if source.split == "validation" else "make_task"
    where = f"aggbench.tiny.task.{fn}(seed={source.seed}) {source.split}"
    if source.split == "validation":
        split = make_validation(source.seed, source.n_validation, source.n_test)
        return ((where, i + 1, dict(row)) for i, row in enumerate(split))
    train, test = make_task(seed=source.seed, n_train=source.n_train, n_test=source.n_test)
    split = train if source.split == "train" else test
    return ((where, i + 1, dict(row)) for i, row in enumerate(split))


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
