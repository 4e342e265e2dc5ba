"""Model directories a user names (``model.path``, ``--checkpoint``): checked before loading, and
load failures reported as one line naming the directory instead of a transformers traceback.

transformers' own errors for these cases are misleading ("Repo id must be in the form ..." for a
local path that does not exist, a sentencepiece hint for an empty folder, ``header too small`` for
a truncated safetensors file), so aggbench checks the directory itself first.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Iterator
from pathlib import Path


class ModelDirError(ValueError):
    """A model directory that does not exist, is not a model, or does not load."""


def require_model_dir(path: str | Path, *, what: str, fix: str) -> Path:
    """Return ``path`` if it is a directory holding a readable ``config.json``; else raise.

    ``what`` names the setting (``"model.path"``, ``"--checkpoint"``); ``fix`` says what to run.
    """
    p = Path(path)
    if not p.exists():
        raise ModelDirError(f"{what} {p} does not exist; {fix}")
    if not p.is_dir():
        raise ModelDirError(f"{what} {p} is a file, not a model directory; {fix}")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ModelDirError(f"{what} {p} is not a model directory (no config.json); {fix}")
    try:
        json.loads(cfg.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelDirError(f"{what} {p}: config.json is not valid JSON ({exc}); {fix}") from exc
    return p


def require_weights(path: str | Path, *, what: str, fix: str) -> Path:
    """:func:`require_model_dir`, and its ``.safetensors`` files complete (their
    headers read: an empty or truncated weights file fails here, before anything loads)."""
    p = require_model_dir(path, what=what, fix=fix)
    for weights in sorted(p.glob("*.safetensors")):
        if why := weights_problem(weights):
            raise ModelDirError(f"{what} {p}: {weights.name} is unreadable ({why}); {fix}")
    return p


def weights_problem(path: Path) -> str | None:
    """Why a ``.safetensors`` file cannot be complete (empty, header or data cut short), or None;
    reads its header only."""
    try:
        size = path.stat().st_size
    except OSError as exc:  # a dangling link
        return f"{type(exc).__name__}: {exc.strerror}"
    if size == 0:
        return "empty file"
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8).ljust(8, b"\xff"))
            if 8 + n > size:
                return f"truncated: {size} bytes, shorter than its header says"
            header = json.loads(fh.read(n))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, UnicodeDecodeError):
        return "not a safetensors file (corrupt header)"
    need = 8 + n + max(ends, default=0)
    return f"truncated: {size} of {need} bytes" if size < need else None


@contextlib.contextmanager
def loading(path: str | Path, *, what: str) -> Iterator[None]:
    """Around ``from_pretrained`` calls: a failure to read the files (truncated or missing weights,
    a bad tokenizer file) becomes :class:`ModelDirError` naming the directory and the cause."""
    try:
        yield
    except (OSError, ValueError) as exc:
        if isinstance(exc, ModelDirError):
            raise
        raise ModelDirError(f"cannot load {what} {path}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # safetensors raises its own SafetensorError (not an OSError)
        if type(exc).__name__ != "SafetensorError":
            raise
        raise ModelDirError(f"cannot load {what} {path}: weights file unreadable ({exc})") from exc
