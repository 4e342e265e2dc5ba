"""Checkpoints that are either complete or absent, a retention policy, and a per-run lock.

Layout of a run directory::

    <run>/checkpoints/step_<N>/        model + tokenizer (save_pretrained: what the evaluator loads)
                                      trainer_state.pt (optimizer, scheduler, RNG; latest only)
                                      sharded/ (multi-rank FSDP only: model + optimizer shards,
                                      torch.distributed.checkpoint; latest only)
                                      COMPLETE (written last, inside the temporary directory)
    <run>/metrics.jsonl                one line per finished step (the source of truth)
    <run>/.lock                        flock held by the process training this run

A checkpoint is built in ``step_<N>.tmp-<pid>`` and renamed into place, so a crash never leaves a
directory named ``step_<N>`` that is not complete.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

COMPLETE = "COMPLETE"
STATE_FILE = "trainer_state.pt"
SHARDED_DIR = "sharded"
_STEP_RE = re.compile(r"^step_(\d+)$")


class RunLockedError(RuntimeError):
    pass


class RunLock:
    """Exclusive lock on a run directory (an orphaned cluster job and its rerun must not both train).

    Uses ``flock``, which the kernel releases when the holder dies, so a crash never leaves a stale
    lock. Note: flock on some network filesystems is advisory per node only.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / ".lock"
        self._fh: Any = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "a+")  # noqa: SIM115 - held for the lock's lifetime
        try:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._fh.seek(0)
            holder = self._fh.read().strip() or "another process"
            self._fh.close()
            raise RunLockedError(
                f"run directory {self.path.parent} is being trained by {holder}; "
                "wait for it or kill it (the lock frees itself when that process dies)"
            ) from None
        self._fh.seek(0)
        self._fh.truncate()
        self._fh.write(f"pid {os.getpid()} on {os.uname().nodename}\n")
        self._fh.flush()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step_{step}"


def complete_steps(run_dir: Path) -> list[int]:
    """Steps with a complete checkpoint directory, ascending."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    steps = []
    for d in root.iterdir():
        m = _STEP_RE.match(d.name)
        if m and (d / COMPLETE).exists():
            steps.append(int(m.group(1)))
    return sorted(steps)


def latest_resumable(run_dir: Path) -> int | None:
    """The latest complete checkpoint that holds trainer state, or None (start from step 0)."""
    for step in reversed(complete_steps(run_dir)):
        if (checkpoint_dir(run_dir, step) / STATE_FILE).exists():
            return step
    return None


def clean_partial(run_dir: Path) -> list[Path]:
    """Remove leftovers of interrupted checkpoint writes (``*.tmp-*`` directories)."""
    root = Path(run_dir) / "checkpoints"
    removed = []
    if root.is_dir():
        for d in root.iterdir():
            if ".tmp-" in d.name:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    return removed


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: Any,
    tokenizer: Any,
    trainer_state: dict[str, Any],
    *,
    fault: Any = None,
    state_dict: dict[str, Any] | None = None,
    extra: Any = None,
) -> Path:
    """Write ``step_<N>`` atomically; ``fault(point)`` is the crash-test hook (None in real runs).

    ``state_dict``: the model's full state dict when ``model`` cannot give it (FSDP-sharded);
    ``extra(tmp)`` writes more files into the temporary directory before it is completed.
    """
    final = checkpoint_dir(run_dir, step)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
    tokenizer.save_pretrained(tmp)
    if fault is not None:
        fault("checkpoint_write")
    if extra is not None:
        extra(tmp)
    torch.save(trainer_state, tmp / STATE_FILE)
    (tmp / COMPLETE).write_text(f"{step}\n")
    _fsync_dir(tmp)
    if final.exists():  # a rerun of the same step (e.g. after a crash before metrics were synced)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(final.parent)
    return final


def apply_retention(run_dir: Path, latest: int, keep_weights: str, eval_steps: list[int]) -> None:
    """Keep optimizer state in the latest checkpoint only; drop weights of steps not evaluated.

    (A 7B checkpoint with optimizer state is ~100 GB.) ``keep_weights="all"`` keeps every model.
    """
    for step in complete_steps(run_dir):
        if step == latest:
            continue
        d = checkpoint_dir(run_dir, step)
        (d / STATE_FILE).unlink(missing_ok=True)
        shutil.rmtree(d / SHARDED_DIR, ignore_errors=True)
        if keep_weights == "eval_steps" and step not in eval_steps:
            shutil.rmtree(d, ignore_errors=True)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
