"""aggbench.files: the target is replaced only by a complete file, with the usual permissions."""

from __future__ import annotations

import os

import pytest

from aggbench.files import atomic_writer, write_atomic


def test_complete_write_replaces_the_file_with_umask_permissions(tmp_path):
    path = tmp_path / "sub" / "out.jsonl"
    old = os.umask(0o027)
    try:
        write_atomic(path, "new\n")
    finally:
        os.umask(old)
    assert path.read_text() == "new\n"
    assert path.stat().st_mode & 0o777 == 0o640  # 0666 minus the umask, not mkstemp's 0600
    assert [p.name for p in path.parent.iterdir()] == ["out.jsonl"]


def test_an_error_mid_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text("old\n")
    with pytest.raises(RuntimeError, match="crash"), atomic_writer(path) as fh:
        fh.write("half a li")
        raise RuntimeError("crash")
    assert path.read_text() == "old\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.jsonl"]


def test_the_content_and_the_rename_are_synced_before_the_return(tmp_path, monkeypatch):
    """fsync of the temporary file while it holds the whole content, then of the folder after the
    rename: a node that loses power keeps the old file or the new one, never an empty one."""
    import stat

    seen = []
    real = os.fsync

    def record(fd):
        mode = os.fstat(fd).st_mode
        size = os.fstat(fd).st_size
        seen.append(("dir" if stat.S_ISDIR(mode) else "file", size, (tmp_path / "out.json").exists()))
        real(fd)

    monkeypatch.setattr(os, "fsync", record)
    write_atomic(tmp_path / "out.json", '{"a": 1}\n')
    assert seen == [("file", 9, False), ("dir", seen[1][1], True)]
