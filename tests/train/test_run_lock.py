"""The run directory's lock on a filesystem without flock (Lustre mounted without ``-o flock``):
a one-line input error that names the filesystem and the fix, not an OSError traceback from every
train job; any other OSError stays what it is."""

from __future__ import annotations

import errno

import pytest

from aggbench.train import checkpoint
from aggbench.train.checkpoint import LockUnsupportedError, RunLock


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK])
def test_a_filesystem_without_locks_is_an_input_error_naming_it(tmp_path, monkeypatch, code):
    def no_locks(fd, op):
        raise OSError(code, "Function not implemented")

    monkeypatch.setattr(checkpoint.fcntl, "flock", no_locks)
    with (
        pytest.raises(
            LockUnsupportedError, match=r"its filesystem takes no flock \(E\w+; Lustre mounted"
        ) as err,
        RunLock(tmp_path / "run"),
    ):
        pass
    assert str(tmp_path / "run") in str(err.value) and "-o flock" in str(err.value)


def test_another_os_error_is_not_renamed(tmp_path, monkeypatch):
    def broken(fd, op):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(checkpoint.fcntl, "flock", broken)
    with pytest.raises(OSError) as err, RunLock(tmp_path / "run"):
        pass
    assert not isinstance(err.value, LockUnsupportedError) and err.value.errno == errno.EIO
