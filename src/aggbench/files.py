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
    usual permissions (0666 minus the umask), not mkstemp's 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yield fh
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_writer`; returns the path."""
    with atomic_writer(path) as fh:
        fh.write(text)
    return Path(path)
