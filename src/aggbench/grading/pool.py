"""Grading worker processes with a hard per-task deadline.

Why not ``multiprocessing.Pool`` or ``concurrent.futures``: neither can stop one task that runs too
long. math-verify's own timeout is ``signal.alarm``: main thread only, and a signal handler runs
only when the C code under it checks for signals, which one huge big-integer multiplication (the
end of ``10^{10^{10}}``) or a C extension never does; so a pathological response could hang a
trainer. Here every worker is a separate process; the parent knows which task each worker is
on and since when, and a task past its deadline gets a failure result while its worker is killed
(SIGKILL) and replaced. A worker that dies (segfault, ``os._exit``, OOM killer) is replaced too.

Speed: workers live across :meth:`GradingPool.map` calls, tasks travel in chunks, and each result
comes back as one small pipe message, so a warm pool grades 64 short responses in well under a
second (tests/grading/test_pool.py measures it). Processes come from the ``forkserver`` context (``spawn`` where there is none): both
are safe in a process that already runs torch or CUDA threads, which ``fork`` is not. The fork
server preloads the grading module, so a replacement worker starts in milliseconds instead of
re-importing sympy.

Usage::

    with GradingPool(workers=4, timeout_s=10) as pool:
        results = pool.map("aggbench.grading.math:grade_math_item", items)

``fn`` is a module-level callable or a ``"module:function"`` string; both are resolved in the
worker. Failed tasks get ``failure(reason)`` (default: a dict with ``correct=False``) with reason
``"timeout"``, ``"worker_crashed"`` or ``"error: <type>: <message>"``. As with any ``spawn`` or
``forkserver`` user, workers import the parent's main module, so a script that makes a pool needs
the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import multiprocessing
import os
import pickle
import signal
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from aggbench.graders import resolve_target

__all__ = ["GradingPool", "default_failure", "default_workers"]

# Modules the worker (and the fork server, where it is ours to start) imports before it says ready,
# so the first task's deadline does not include importing sympy.
DEFAULT_PRELOAD: tuple[str, ...] = ("aggbench.grading.math",)
# A worker that has not said "ready" after this long is treated as broken.
STARTUP_TIMEOUT_S = 120.0

_MISSING = object()


def default_workers() -> int:
    """The CPUs this process may use, at most 8 (grading is cheap; leave cores to the trainer)."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def harness_failed(reason: Any) -> bool:
    """Whether a verdict's ``reason`` says the grading harness decided it, not the response: the
    pool's failures (``timeout``, ``worker_crashed``, ``error: ...``; the math grader's own soft
    deadline says ``timeout`` too) and the code sandbox's own (``sandbox_error: ...``: the child
    died in set-up before the code ran, or the runner ended early). Such a verdict is scored wrong.
    A program's own time-out in the code grader (``timeout: test 3/10 failed``) is the response's
    doing and is not one."""
    text = str(reason or "")
    return text in ("timeout", "worker_crashed") or text.startswith(("error: ", "sandbox_error"))


def default_failure(reason: str) -> dict[str, Any]:
    """What a failed task yields unless ``map`` is given another ``failure`` factory."""
    return {"correct": False, "extracted": None, "reason": reason}


def _worker_main(conn: Connection, preload: tuple[str, ...]) -> None:
    """Worker loop: receive ``(batch_id, fn, indices, pickled items)``, answer one message per item.

    The function and the items arrive pickled inside the message (plain bytes), so one that cannot
    be unpickled here (a function defined where the worker cannot import it) fails those items
    with a clear error instead of killing the worker.
    """
    # Ctrl-C reaches the whole process group; the parent handles it and closes the pool.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in preload:
        importlib.import_module(module)
    conn.send(("ready", None, None, None))
    cache: dict[str | bytes, Callable[[Any], Any]] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # parent gone
            return
        if msg is None:
            return
        batch_id, fn_payload, indices, items_blob = msg
        try:
            fn = cache.get(fn_payload)
            if fn is None:
                fn = resolve_target(fn_payload) if isinstance(fn_payload, str) else pickle.loads(fn_payload)
                cache[fn_payload] = fn
            items = pickle.loads(items_blob)
        except Exception as exc:
            for index in indices:
                conn.send(
                    (
                        "err",
                        batch_id,
                        index,
                        f"cannot load the task in the worker: {type(exc).__name__}: {exc}",
                    )
                )
            continue
        for index, item in zip(indices, items, strict=True):
            try:
                result = fn(item)
                conn.send(("ok", batch_id, index, result))
            except Exception as exc:  # includes a result that cannot be pickled
                conn.send(("err", batch_id, index, f"{type(exc).__name__}: {exc}"[:500]))


@dataclass
class _Worker:
    process: Any
    conn: Connection
    ready: bool = False
    started_at: float = field(default_factory=time.monotonic)  # process start, then task start
    task: collections.deque = field(default_factory=collections.deque)  # [(index, item), ...] left

    @property
    def busy(self) -> bool:
        return bool(self.task)


def _kill(worker: _Worker) -> None:
    with contextlib.suppress(Exception):
        worker.process.kill()
    with contextlib.suppress(Exception):
        worker.process.join(timeout=2.0)
    with contextlib.suppress(Exception):
        worker.conn.close()


def _shutdown(workers: list[_Worker]) -> None:
    for w in workers:
        with contextlib.suppress(Exception):
            w.conn.send(None)
    deadline = time.monotonic() + 1.0
    for w in workers:
        with contextlib.suppress(Exception):
            w.process.join(timeout=max(0.0, deadline - time.monotonic()))
        _kill(w)  # no-op for a worker that already left
    workers.clear()


class GradingPool:
    """Worker processes that grade items with a hard per-item deadline (see the module docstring).

    Args:
        workers: number of worker processes (default: :func:`default_workers`).
        timeout_s: deadline of one item, counted from when its worker starts it.
        context: multiprocessing start method; ``forkserver`` (default) or ``spawn``. ``fork`` is
            refused: forking a process that runs torch threads can deadlock the child.
        preload: modules each worker imports before it takes work.
        chunk_size: items sent to a worker at once (default: about four chunks per worker).
    """

    def __init__(
        self,
        workers: int | None = None,
        timeout_s: float = 10.0,
        *,
        context: str | None = None,
        preload: Sequence[str] = DEFAULT_PRELOAD,
        chunk_size: int | None = None,
    ) -> None:
        n = default_workers() if workers is None else int(workers)
        if n < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if chunk_size is not None and chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        methods = multiprocessing.get_all_start_methods()
        if context is None:
            context = "forkserver" if "forkserver" in methods else "spawn"
        if context not in ("forkserver", "spawn"):
            raise ValueError(
                f"context must be 'forkserver' or 'spawn' (fork is unsafe with torch threads), got {context!r}"
            )
        self._ctx = multiprocessing.get_context(context)
        self._preload = tuple(preload)
        if context == "forkserver" and self._preload:
            # Only takes effect if the fork server is not running yet; workers import anyway.
            self._ctx.set_forkserver_preload(list(self._preload))
        self.n_workers = n
        self.timeout_s = float(timeout_s)
        self.chunk_size = chunk_size
        self.replaced = 0  # workers killed or found dead and replaced, over the pool's life
        self._batch = 0
        self._workers: list[_Worker] = []
        self._closed = False
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        for _ in range(n):
            self._workers.append(self._spawn())

    # ------------------------------------------------------------------ lifecycle

    def _spawn(self) -> _Worker:
        parent, child = self._ctx.Pipe(duplex=True)
        # Not a daemon: a task (code grading) may need child processes of its own. The finalizer
        # and close() stop the workers; a worker also leaves when the parent's pipe end closes.
        proc = self._ctx.Process(target=_worker_main, args=(child, self._preload), name="aggbench-grader")
        proc.start()
        child.close()
        return _Worker(process=proc, conn=parent)

    def _replace(self, i: int) -> None:
        _kill(self._workers[i])
        self._workers[i] = self._spawn()
        self.replaced += 1

    def close(self) -> None:
        """Stop the workers (idempotent)."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> GradingPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pids(self) -> list[int]:
        """The current workers' process ids (they change when a worker is replaced)."""
        return [w.process.pid for w in self._workers]

    # ------------------------------------------------------------------ map

    def map(
        self,
        fn: str | Callable[[Any], Any],
        items: Iterable[Any],
        *,
        failure: Callable[[str], Any] = default_failure,
        timeouts: Sequence[float] | None = None,
        progress: Callable[[int], Any] | None = None,
    ) -> list[Any]:
        """``[fn(item) for item in items]`` in the workers, in input order.

        An item that runs past its deadline (``timeouts[i]`` or the pool's ``timeout_s``) yields
        ``failure("timeout")`` and its worker is killed and replaced; an item whose worker dies
        yields ``failure("worker_crashed")``; an item whose ``fn`` raises yields
        ``failure("error: <type>: <message>")``. The other items of a killed worker's chunk are
        handed to the next free worker. ``progress(k)`` is called as ``k`` more items finish.
        """
        if self._closed:
            raise RuntimeError("GradingPool.map called after close()")
        items = list(items)
        n = len(items)
        if timeouts is not None and len(timeouts) != n:
            raise ValueError(f"timeouts has {len(timeouts)} entries for {n} items")
        if n == 0:
            return []
        for i, w in enumerate(self._workers):
            if w.task:  # still on an earlier map() that was interrupted (an exception, Ctrl-C)
                self._replace(i)
        self._batch += 1
        try:
            fn_payload = fn if isinstance(fn, str) else pickle.dumps(fn)
        except Exception as exc:
            raise TypeError(f"fn must be a module-level function (picklable by reference): {exc}") from exc
        size = self.chunk_size or max(1, min(64, -(-n // (4 * self.n_workers))))
        call = _MapCall(self, self._batch, fn_payload, items, size=size, failure=failure, timeouts=timeouts)
        while call.remaining:
            now = time.monotonic()
            call.hand_out(now)
            call.collect(call.wait_ready(now))
            call.report(progress)
            call.expire(time.monotonic())
        if progress is not None and n > call.reported:
            progress(n - call.reported)
        return call.results


class _MapCall:
    """One :meth:`GradingPool.map` call: its results, the chunks not handed out yet and the items
    left, and a method per phase of the call's loop (hand out work, wait, collect what came back or
    who died, report progress, expire deadlines). The workers are the pool's, shared by every call;
    ``batch`` tells this call's answers from the stale ones of an earlier, interrupted call."""

    def __init__(
        self,
        pool: GradingPool,
        batch: int,
        fn_payload: str | bytes,
        items: list[Any],
        *,
        size: int,
        failure: Callable[[str], Any],
        timeouts: Sequence[float] | None,
    ) -> None:
        self.pool = pool
        self.batch = batch
        self.fn_payload = fn_payload
        self.failure = failure
        self.timeouts = timeouts
        self.n = len(items)
        self.results: list[Any] = [_MISSING] * self.n
        indexed = list(enumerate(items))
        self.pending: collections.deque = collections.deque(
            indexed[i : i + size] for i in range(0, self.n, size)
        )
        self.remaining = self.n
        self.reported = 0

    def deadline_of(self, w: _Worker) -> float:
        index = w.task[0][0]
        return w.started_at + (self.timeouts[index] if self.timeouts is not None else self.pool.timeout_s)

    def finish(self, index: int, value: Any) -> None:
        if self.results[index] is _MISSING:
            self.results[index] = value
            self.remaining -= 1

    def hand_out(self, now: float) -> None:
        """The next pending chunk to every ready, idle worker."""
        for w in self.pool._workers:
            if w.ready and not w.busy and self.pending:
                chunk = self.pending.popleft()
                try:
                    blob = pickle.dumps([item for _index, item in chunk])
                except Exception as exc:
                    raise TypeError(f"cannot send these items to a grading worker: {exc}") from exc
                try:
                    w.conn.send((self.batch, self.fn_payload, [index for index, _item in chunk], blob))
                except (BrokenPipeError, OSError):
                    self.pending.appendleft(chunk)  # the dead worker is noticed below
                    continue
                w.task.extend(chunk)
                w.started_at = now

    def wait_ready(self, now: float) -> set:
        """Wait until a worker sends or dies, or the nearest deadline (an item's, a start's) passes;
        the connections and process sentinels that are ready."""
        workers = self.pool._workers
        waits = [self.deadline_of(w) for w in workers if w.busy]
        waits += [w.started_at + STARTUP_TIMEOUT_S for w in workers if not w.ready]
        timeout = max(0.0, min(waits) - now) if waits else None
        return set(wait([w.conn for w in workers] + [w.process.sentinel for w in workers], timeout))

    def collect(self, ready: set) -> None:
        """Read every ready worker's messages; a dead worker's current item fails and it is replaced
        (one that died before it was ready raises)."""
        pool = self.pool
        for i, w in enumerate(pool._workers):
            dead = w.process.sentinel in ready
            if w.conn in ready or dead:
                dead = self._drain(w) or dead
            if dead:
                if not w.ready:
                    w.process.join(timeout=1.0)
                    code = w.process.exitcode
                    pool._replace(i)  # keep the pool whole before raising
                    raise RuntimeError(
                        f"a grading worker exited with code {code} before it was ready "
                        f"(preload {pool._preload}); run `python -c 'import {pool._preload[0] if pool._preload else 'aggbench'}'` to see why"
                    )
                self._fail_current(w, "worker_crashed")
                pool._replace(i)

    def report(self, progress: Callable[[int], Any] | None) -> None:
        """``progress(k)`` for the ``k`` items finished since the last report."""
        if progress is not None and self.n - self.remaining > self.reported:
            progress(self.n - self.remaining - self.reported)
            self.reported = self.n - self.remaining

    def expire(self, now: float) -> None:
        """An item past its deadline fails and its worker is replaced; a worker that has not started
        within STARTUP_TIMEOUT_S is replaced and raises."""
        for i, w in enumerate(self.pool._workers):
            if w.busy and now >= self.deadline_of(w):
                self._fail_current(w, "timeout")
                self.pool._replace(i)
            elif not w.ready and now >= w.started_at + STARTUP_TIMEOUT_S:
                self.pool._replace(i)
                raise RuntimeError(f"a grading worker did not start within {STARTUP_TIMEOUT_S:.0f} s")

    def _drain(self, w: _Worker) -> bool:
        """Read every message a worker has sent; True if its pipe is closed (the worker is gone)."""
        try:
            while w.conn.poll():
                kind, msg_batch, index, payload = w.conn.recv()
                if kind == "ready":
                    w.ready = True
                    w.started_at = time.monotonic()
                    continue
                if msg_batch != self.batch:
                    continue  # a stale answer from an earlier, interrupted map()
                if w.task and w.task[0][0] == index:
                    w.task.popleft()
                w.started_at = time.monotonic()  # the next item starts now
                self.finish(index, payload if kind == "ok" else self.failure(f"error: {payload}"))
        except (EOFError, OSError):
            return True
        return False

    def _fail_current(self, w: _Worker, reason: str) -> None:
        """The worker's current item fails with ``reason``; the rest of its chunk goes back to the queue."""
        if not w.task:
            return
        index, _item = w.task.popleft()
        self.finish(index, self.failure(reason))
        if w.task:
            self.pending.appendleft(list(w.task))
        w.task.clear()
