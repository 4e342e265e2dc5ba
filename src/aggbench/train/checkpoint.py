"""Checkpoints that are either complete or absent, a retention policy, and a per-run lock.

Layout of a run directory::

    <run>/checkpoints/step_<N>/        model + tokenizer (save_pretrained: what the evaluator loads)
                                      trainer_state.pt (optimizer, scheduler, RNG, prompt cursor;
                                      latest only)
                                      sharded/ (multi-rank FSDP only: model + optimizer shards,
                                      torch.distributed.checkpoint; latest only)
                                      COMPLETE (written last, inside the temporary directory)
    <run>/metrics.jsonl                one line per finished step (the source of truth)
    <run>/.lock                        flock held by the process training this run

A checkpoint is built in ``step_<N>.tmp-<pid>`` and renamed into place, so a crash never leaves a
directory named ``step_<N>`` that is not complete. A file of it damaged later (a full disk, a bad
copy) is a :class:`CheckpointError` on resume naming the file and the fix, never a torch traceback;
COMPLETE records every file's sha256, so bytes changed inside a file whose header still reads are
caught too (on resume here, on evaluation by ``modeldir.require_model_dir``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import pickle
import shutil
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from aggbench.config_errors import ConfigError
from aggbench.errors import InputError
from aggbench.files import disk_full, sha256_file, write_atomic
from aggbench.layout import (
    COMPLETE,
    STATE_FILE,
    checkpoint_dir,
    checkpoints_root,
    complete_steps,
    rule_file,
)
from aggbench.modeldir import (
    ModelDirError,
    checksum_mismatch,
    directory_checksums,
    loading,
    mark_verified,
    weights_problem,
)

SHARDED_DIR = "sharded"


class RunLockedError(InputError, RuntimeError):
    """The run directory is locked by another job (the message names the holder)."""


class LockUnsupportedError(InputError, OSError):
    """The run directory's filesystem takes no flock (Lustre mounted without ``-o flock``, say)."""


# flock's answer on a filesystem that implements no locks (ENOSYS, EOPNOTSUPP) or cannot take more
NO_LOCKS = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK)


class CheckpointError(ModelDirError):
    """A file of the checkpoint being resumed is empty, truncated or otherwise unreadable."""


class DiskFullError(InputError, OSError):
    """Training stopped on a full disk (or quota); the message names the file and where it resumes."""


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
        except OSError as exc:
            self._fh.close()
            if exc.errno not in NO_LOCKS:
                raise
            raise LockUnsupportedError(
                f"run directory {self.path.parent}: its filesystem takes no flock ({errno.errorcode[exc.errno]}; "
                "Lustre mounted without -o flock, say), so the lock that keeps an orphaned job and its "
                "rerun from training the same run cannot be taken; put results_dir on a filesystem "
                "with flock (ask for -o flock, not localflock, which locks per node only)"
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


def unreadable(run_dir: Path, step: int, path: Path, why: str) -> CheckpointError:
    """The error for an unreadable file of ``step_N``: names the file, the cause and the fix."""
    earlier = [
        s for s in complete_steps(run_dir) if s < step and (checkpoint_dir(run_dir, s) / STATE_FILE).exists()
    ]
    then = f"resume from step {earlier[-1]}" if earlier else "start again from step 0"
    return CheckpointError(
        f"{path} is unreadable ({why}); delete {checkpoint_dir(run_dir, step)} to {then}, "
        "or train into a new --out"
    )


def check_readable(run_dir: Path, step: int, *, checksums: bool = True) -> None:
    """Checks of ``step_N``'s files before anything loads: cheap ones first (an empty or truncated
    trainer state, weights file or shard: sizes and headers), then (``checksums``) every file's
    bytes against the sha256 its COMPLETE marker recorded. Raises :class:`CheckpointError`."""
    d = checkpoint_dir(run_dir, step)
    weights = sorted(d.glob("*.safetensors"))
    if not weights:
        raise unreadable(run_dir, step, d / "model.safetensors", "missing")
    files = [(d / STATE_FILE, _torch_file_problem), *((w, weights_problem) for w in weights)]
    if (d / SHARDED_DIR).is_dir():
        shards = [d / SHARDED_DIR / ".metadata", *sorted((d / SHARDED_DIR).glob("*.distcp"))]
        files += [(f, _nonempty_problem) for f in shards]
    for path, problem in files:
        why = problem(path)
        if why:
            raise unreadable(run_dir, step, path, why)
    bad = checksum_mismatch(d) if checksums else None  # bytes changed inside an intact-looking file
    if bad is not None:
        raise unreadable(run_dir, step, *bad)


def verify_checksums(run_dir: Path, step: int, ranks: Any) -> None:
    """step_N's bytes against the sha256 its COMPLETE marker recorded, the files shared out between
    the job's ranks (each hashes every world-th file; ``ranks``: ``aggbench.train.parallel.Ranks``),
    the verdicts gathered on rank 0 and its first mismatch sent to every rank: each file is read
    once, and the wait in the collectives is the slowest slice, not the whole checkpoint. Raises
    :class:`CheckpointError` on every rank; afterwards :func:`check_readable` (every rank) does not
    hash the directory again."""
    check_readable(run_dir, step, checksums=False)  # an empty or truncated file: named as such first
    d = checkpoint_dir(run_dir, step)
    mine = checksum_mismatch(d, (ranks.rank, ranks.world))
    verdicts = ranks.gather_to_main(mine)
    bad = ranks.broadcast(next((v for v in verdicts if v is not None), None) if verdicts else None)
    if bad is not None:
        raise unreadable(run_dir, step, *bad)
    mark_verified(d)


@contextlib.contextmanager
def opening(run_dir: Path, step: int, model_path: str | Path) -> Iterator[Path]:
    """Around loading the policy: yields the directory it loads from (``step_N`` of a resume, its
    files checked first, else ``model_path``); a failure to load is one line naming it."""
    if not step:
        with loading(model_path, what="model.path"):
            yield Path(model_path)
        return
    check_readable(run_dir, step)
    d = checkpoint_dir(run_dir, step)
    with reading(run_dir, step, d):
        yield d


@contextlib.contextmanager
def reading(run_dir: Path, step: int, path: Path) -> Iterator[None]:
    """Around the code that loads ``path`` of ``step_N``: a failure to read it (``EOFError`` of an
    empty pickle, which click would take for Ctrl-D; a torn zip; a bad safetensors file; a failed
    torch.distributed.checkpoint load) becomes :class:`CheckpointError`."""
    try:
        yield
    except BaseException as exc:
        cause = _read_failure(exc)
        if cause is None:
            raise
        raise unreadable(run_dir, step, path, cause) from exc


def _read_failure(exc: BaseException) -> str | None:
    """``Type: first sentence`` of an error that means a file did not read; None for anything else
    (out of memory, a CUDA error, Ctrl-C, an aggbench error). torch.distributed.checkpoint's
    ``CheckpointException`` is judged by the first rank's error inside it."""
    failures = getattr(exc, "failures", None)
    if type(exc).__name__ == "CheckpointException" and isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        exc = first[0] if isinstance(first, tuple) else first
    text = str(exc).strip()
    if (
        isinstance(exc, ModelDirError | torch.OutOfMemoryError)
        or "out of memory" in text.lower()
        or "CUDA" in text
        or not isinstance(exc, OSError | EOFError | ValueError | RuntimeError | pickle.UnpicklingError)
        and type(exc).__name__ not in ("SafetensorError", "CheckpointException")
    ):
        return None
    return (
        f"{type(exc).__name__}: {text.splitlines()[0].split('. ')[0][:200]}" if text else type(exc).__name__
    )


def _torch_file_problem(path: Path) -> str | None:
    if path.stat().st_size == 0:
        return "empty file"
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive; its directory is at the end
        return "truncated or not a torch.save file"
    return None


def _nonempty_problem(path: Path) -> str | None:
    if not path.is_file():
        return "missing"
    return "empty file" if path.stat().st_size == 0 else None


def clean_partial(run_dir: Path) -> list[Path]:
    """Remove leftovers of interrupted checkpoint writes (``*.tmp-*`` directories)."""
    root = checkpoints_root(run_dir)
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
    writing = tmp
    try:
        tmp.mkdir(parents=True)
        writing = tmp / "model.safetensors"
        model.save_pretrained(tmp, safe_serialization=True, state_dict=state_dict)
        writing = tmp / "tokenizer.json"
        tokenizer.save_pretrained(tmp)
        if fault is not None:
            fault("checkpoint_write")
        if extra is not None:
            writing = tmp / SHARDED_DIR
            extra(tmp)
        writing = tmp / STATE_FILE
        torch.save(trainer_state, tmp / STATE_FILE)
        # written last: the step and every file's sha256, verified on resume and evaluation
        writing = tmp / COMPLETE
        (tmp / COMPLETE).write_text(json.dumps({"step": step, "sha256": directory_checksums(tmp)}) + "\n")
    except Exception as exc:  # a full disk, say: name the file, leave no partial directory behind
        exc.aggbench_writing = writing  # type: ignore[attr-defined]
        exc.aggbench_disk_full = disk_full(exc, tmp.parent)  # type: ignore[attr-defined]  # before freeing
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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


def rule_source(rule: Any) -> dict[str, str]:
    """``{"source_file", "source_sha256"}`` of a rule a user's plugin defines (its function's file,
    sha256 in 16 hex digits); {} for a rule aggbench ships (its version says what it computes)."""
    import inspect

    fn = rule.spec.fn
    module = getattr(fn, "__module__", "") or ""
    if module == "aggbench" or module.startswith("aggbench."):
        return {}
    try:
        path = Path(inspect.getsourcefile(fn) or "")
        digest = sha256_file(path)[:16]
    except (OSError, TypeError):
        return {}
    return {"source_file": str(path), "source_sha256": digest}


def record_rule(out: Path, rule: Any, source: dict[str, str], resumes_at: int) -> None:
    """Write the run's aggregation.json at its first segment (the rule as described, and a plugin's
    file pin: :func:`rule_source`); at a later one whose plugin file changed (a resume
    :func:`check_rule_version` allowed), pin the new file and append the change to
    ``source_changes`` (from, to, the step it resumed at), so the segments after it resume and the
    record says since when the run trains the edited file. ``source``: :func:`rule_source` as read
    once when the plugin was imported (what :func:`check_rule_version` judged). Rank 0, under the
    run lock."""
    path = rule_file(out)
    if not path.exists():
        write_atomic(path, json.dumps({**rule.describe(), **source}, indent=2) + "\n")
        return
    stored = json.loads(path.read_text())
    was, now = stored.get("source_sha256"), source.get("source_sha256")
    if was and now and was != now and stored.get("rule") == rule.rule:
        stored["source_changes"] = [
            *stored.get("source_changes", []),
            {"from": was, "to": now, "resumed_at_step": resumes_at},
        ]
        stored.update(source)
        write_atomic(path, json.dumps(stored, indent=2) + "\n")


def check_rule_version(out: Path, rule: Any, *, source: dict[str, str], allow_change: bool = False) -> None:
    """Refuse to resume a run trained under another version of its rule (a changed meaning: results
    of the two must never be mixed). A run from before aggregation.json existed was version 1. A
    plugin's rule is also pinned by its file's sha256 as the run's first segment found it (an edit
    may change the weights with the version unchanged); ``allow_change`` (``--allow-config-change``)
    lets a run resume past such an edit. ``source``: :func:`rule_source`, read once at import."""
    path = rule_file(out)
    stored = json.loads(path.read_text()) if path.is_file() else {"rule": rule.rule, "version": "1"}
    if stored.get("rule") == rule.rule and str(stored.get("version")) != rule.spec.version:
        raise ConfigError(
            f"{out} was trained with aggregation rule {rule.rule!r} version {stored.get('version')}; this "
            f"aggbench's {rule.rule!r} is version {rule.spec.version}, whose meaning differs "
            "(docs/aggregations.md). Results of the two versions must not be mixed: train the cell into a "
            "new results directory"
        )
    now = source.get("source_sha256")
    was = stored.get("source_sha256")
    if stored.get("rule") == rule.rule and was and now and was != now and not allow_change:
        raise ConfigError(
            f"{out} was trained with aggregation rule {rule.rule!r} from {stored.get('source_file')} at "
            f"sha256 {was}; that plugin's file ({source['source_file']}) is now {now}: an edit "
            "may have changed the rule's weights with its version unchanged, and results of the two must "
            "not be mixed. Restore the file; or give the changed rule a new version (register_rule("
            "version=...)) and train the cell into a new results directory; or, for an edit that cannot "
            "change the weights (a comment, another function), resume this segment once by hand with "
            "`aggbench train ... --allow-config-change`"
        )


def prompt_cursor(state: dict[str, Any] | None, step: int, per_step: int) -> int:
    """Where the prompt stream (``batching.PromptStream``) reads on after checkpoint ``step``.

    ``state``: its trainer state (None: a fresh run, position 0). A checkpoint written before the
    cursor was saved holds none; then the position of a run without dynamic sampling,
    ``step * per_step``, which is what such a run read (a dynamic-sampling run of that version drew
    its refills elsewhere, so its resume reads on from there).
    """
    if state is None:
        return 0
    return int(state.get("prompt_cursor", step * per_step))
