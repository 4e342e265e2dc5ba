"""Atomic file writes: a temporary file in the target's folder, renamed into place when complete,
so a crash or an error never leaves a half-written file (readers see the old file or the new one).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def atomic_writer(path: str | Path) -> Iterator[TextIO]:
    """A UTF-8 text handle whose content replaces ``path`` when the block ends without an error;
    on an error the temporary file is removed and ``path`` is left as it was. The file gets the
    usual permissions (0666 minus the umask), not mkstemp's 0600. The content is on disk before
    the rename and the rename before the return (fsync of the file, then of its folder), so a node
    that loses power keeps the old file or the new one, never an empty one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _fsync_dir(folder: Path) -> None:
    """Make a rename in ``folder`` durable; a filesystem that cannot fsync a folder is left as it is."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_writer`; returns the path."""
    with atomic_writer(path) as fh:
        fh.write(text)
    return Path(path)


# Below this much free space, a failed write is taken for a full disk: torch's serializer reports
# one as "unexpected pos ..." with no errno, so the chain alone cannot always tell.
NEARLY_FULL_BYTES = 1 << 20


def disk_full(exc: BaseException, where: str | Path | None = None) -> bool:
    """Whether ``exc`` (or an error in its chain) comes from a full disk or quota: an ``OSError``
    with ENOSPC or EDQUOT, SQLite's "database or disk is full", one a writer judged so, or (with
    ``where``, for a writer that just failed) any failure while the filesystem of ``where`` has
    under ``NEARLY_FULL_BYTES`` free."""
    import errno
    import shutil

    for e in _chain(exc):
        if getattr(e, "aggbench_disk_full", False):  # judged by the writer before it freed its partial file
            return True
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(e)
        if "No space left on device" in text or "database or disk is full" in text:
            return True
    if where is None:
        return False
    try:
        return shutil.disk_usage(where).free < NEARLY_FULL_BYTES
    except OSError:
        return False


def written_file(exc: BaseException) -> str | None:
    """The file a failed write names: ``aggbench_writing`` set by the writer, else an ``OSError``'s
    filename in the chain; None when nothing names one."""
    for e in _chain(exc):
        named = getattr(e, "aggbench_writing", None) or (e.filename if isinstance(e, OSError) else None)
        if named:
            return str(named)
    return None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, then its cause or context, and so on (each once)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def sha256_file(path: str | Path) -> str:
    """The sha256 of a file's bytes, read in 1 MiB blocks (fetched data, checkpoint files)."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def relative_to_file(target: str | Path, written: str | Path) -> str:
    """``target`` as a run file at ``written`` stores it: relative to that file's folder when it is a
    local path, so a copied or moved results directory resolves it to its own files (issue 26);
    anything else (a hub id such as ``Qwen/Qwen3-1.7B``) as given."""
    target = Path(target)
    if not target.exists():
        return str(target)
    return os.path.relpath(target.resolve(), Path(written).resolve().parent)
