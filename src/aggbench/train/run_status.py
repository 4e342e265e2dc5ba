"""The MLflow run's status through a training segment, and SIGTERM as an exception.

A run is never left RUNNING by a process that could still say how it ended (``aggbench.tracking``'s
docstring states the policy): SIGTERM (what SLURM and Snakemake send) and Ctrl-C mark it KILLED, any
other exception FAILED, and the process exits non-zero (143 for SIGTERM) or the exception propagates.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Iterator
from typing import Any

from aggbench.tracking import MlflowRun

log = logging.getLogger("aggbench.tracking")


class Terminated(SystemExit):
    """Raised in the main thread by SIGTERM inside ``run_status``: cleanup (``finally``) runs, and
    uncaught it exits the process with status 128 + SIGTERM = 143, as the default action reports."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM raises ``Terminated`` inside the block (main thread only: elsewhere Python cannot
    install handlers); a second SIGTERM gets the previous handler (by default: dies at once)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    previous = signal.SIG_DFL if previous is None else previous  # installed outside Python

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, previous)
        raise Terminated(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def run_status(run: MlflowRun | None, done: str) -> Iterator[None]:
    """The run is RUNNING inside the block and ``done`` after it; KILLED on SIGTERM or Ctrl-C,
    FAILED on any other exception, which propagates (the module docstring's policy). ``run=None``:
    nothing is tracked; SIGTERM still raises ``Terminated`` (cleanup runs, exit status 143)."""
    if run is None:
        with _sigterm_raises():
            yield
        return
    run.set_status("RUNNING")
    with _sigterm_raises():
        try:
            yield
        except BaseException as exc:
            ended = "KILLED" if isinstance(exc, Terminated | KeyboardInterrupt) else "FAILED"
            try:
                run.set_status(ended)
            except Exception as mlflow_exc:  # the original error matters more than the status
                log.warning("could not mark MLflow run %s %s: %s", run.run_id, ended, mlflow_exc)
            raise
    run.set_status(done)
