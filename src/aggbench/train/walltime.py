"""Stop a segment before its job's walltime, at a checkpoint, instead of being killed mid-segment.

A train job is one segment (``checkpoint.every`` steps, ``aggbench.train.loop``'s decision 1); its
regular checkpoint is at the segment's end. A job that SLURM kills at its walltime loses every step
since the segment's start, and a retry with the same ``runtime`` meets the same end. With a known
end time the trainer instead checks after each step whether one more step and a checkpoint still
fit; when they do not, it saves the step it is at (an extra ``step_N``: under ``keep_weights:
eval_steps``, the shipped configs', the retention policy drops it at the next save unless it is an
evaluated step; under ``all`` its weights stay) and exits with :class:`WalltimeStop` (exit status
143; under torchrun, which reports a failed worker as 1, the job's status is 1; MLflow KILLED). The
retry, or a rerun of the same command, resumes from that step: each attempt keeps its work. A
resumed segment starts from the run's own timings (the last steps' ``time/generate_s`` +
``time/update_s``, and the latest checkpoint's save: its COMPLETE marker's time less its step's row
time), and refuses to start when not even one step and a save fit (:class:`WalltimeTooShortError`).

Where the end comes from, first found wins: ``aggbench train --stop-by`` (a Unix time), SLURM's
``$SLURM_JOB_END_TIME`` (set by Slurm 23.02 and later), else ``squeue -j $SLURM_JOB_ID -o %e`` (the
job's expected end, older Slurm). Outside a SLURM job, with no ``--stop-by``, nothing changes. Rank 0
decides and every rank follows (one broadcast per step), so ranks stop at the same step.
"""

from __future__ import annotations

import logging
import math
import os
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from aggbench.config_errors import ConfigError
from aggbench.errors import InputError
from aggbench.train.run_status import Terminated

log = logging.getLogger("aggbench.train.walltime")

END_ENV = "SLURM_JOB_END_TIME"
# Seconds kept free after the checkpoint: process exit, the job's log flush, SLURM's own slack.
MARGIN_S = 120.0
# The next step is assumed up to this much slower than the slowest step seen (dynamic sampling's
# refill rounds vary the step time).
STEP_SLACK = 1.25
# A save read from the run files (COMPLETE's mtime less its row's time) longer than this many steps
# is not a save: the directory was copied or restored (cp -r, rsync without -t), so it is ignored.
SAVE_TRUST = 10.0


class WalltimeStop(Terminated):
    """The trainer stopped itself before the job's end, after saving the step it reached: as a
    SIGTERM (exit status 143, the MLflow run KILLED), with the message saying where a rerun resumes."""

    def __init__(self, message: str) -> None:
        super().__init__(143)
        self.message = message

    def __str__(self) -> str:
        return self.message


class WalltimeTooShortError(InputError, RuntimeError):
    """A resumed segment's job ends before one step and a checkpoint could finish (by the run's own
    timings): the train job's ``runtime`` is too short for this model."""


def job_end(stop_by: float | None) -> float | None:
    """The Unix time the job ends: ``stop_by`` if given, else SLURM's (see the module docstring);
    None outside a SLURM job or when SLURM does not say (an unlimited job)."""
    if stop_by is not None:
        if not math.isfinite(stop_by) or not 0 < stop_by < 1e11:
            raise ConfigError(
                f"--stop-by {stop_by!r} is not a Unix time (seconds since 1970, e.g. `date +%s`)"
            )
        return float(stop_by)
    if os.environ.get(END_ENV, "").strip():
        try:
            end = float(os.environ[END_ENV])
        except ValueError:
            end = math.nan
        if not math.isfinite(end) or not 0 < end < 1e11:
            log.warning(
                "$%s=%r is not a Unix time: no stop before the walltime", END_ENV, os.environ[END_ENV]
            )
            return None
        return end
    job = os.environ.get("SLURM_JOB_ID", "").strip()
    if not job:
        return None
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%e"],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            # ISO dates whatever the site or user sets (a "relative" format would not parse)
            env={**os.environ, "SLURM_TIME_FORMAT": "standard"},
        ).stdout.strip()
        return datetime.fromisoformat(out).timestamp()  # squeue prints this machine's local time
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        log.warning(
            "SLURM job %s: could not read its end time from squeue (%s): no stop before the walltime",
            job,
            exc,
        )
        return None


class Deadline:
    """The stop rule of one segment: after a step, stop when now + (the slowest step so far x
    ``STEP_SLACK``) + one checkpoint's save time (the slowest save seen; before any, a step's time)
    + ``MARGIN_S`` passes ``end``. ``end`` None: never stop."""

    def __init__(self, end: float | None, step_s: float = 0.0, save_s: float | None = None) -> None:
        self.end = end
        self.step_s = step_s  # the slowest step seen (a resumed segment: its run's last steps')
        self.save_s = save_s

    def saved(self, seconds: float) -> None:
        self.save_s = max(self.save_s or 0.0, seconds)

    def stop_after(self, step_s: float, now: float | None = None) -> bool:
        """Record a step that took ``step_s`` seconds; True when another step and a checkpoint would
        not end before ``end``."""
        if self.end is None:
            return False
        self.step_s = max(self.step_s, step_s)
        return (time.time() if now is None else now) + self.need() > self.end

    def need(self) -> float:
        """Seconds one more step and its checkpoint are allowed: the slowest step x ``STEP_SLACK``,
        the slowest save (before any is known: a step's time), and ``MARGIN_S``."""
        save = self.save_s if self.save_s is not None else self.step_s
        return STEP_SLACK * self.step_s + save + MARGIN_S


def past_timings(rows: list[dict[str, Any]], complete: Path | None) -> tuple[float, float | None]:
    """(slowest of the last 5 steps, the latest checkpoint's save) in seconds from a run's files:
    ``rows`` its metrics rows up to the resume step (step time: ``time/generate_s`` +
    ``time/update_s``), ``complete`` that checkpoint's COMPLETE marker (written when the save ended;
    its step's row was written just before the save began). (0.0, None) where they say nothing."""
    steps = [r.get("time/generate_s", 0.0) + r.get("time/update_s", 0.0) for r in rows[-5:]]
    step_s, save = max(steps, default=0.0), None
    if rows and complete is not None and complete.is_file() and isinstance(rows[-1].get("time"), float):
        save = max(complete.stat().st_mtime - rows[-1]["time"], 0.0)
        if step_s and save > SAVE_TRUST * step_s:  # a copied or restored run directory's mtimes
            save = None
    return step_s, save


def for_segment(
    cell: str,
    stop_by: float | None,
    *,
    main: bool,
    broadcast: Callable[[Any], Any],
    timings: tuple[float, float | None] = (0.0, None),
) -> Deadline:
    """The segment's :class:`Deadline` from rank 0's reading of the job's end (``broadcast``: rank 0's
    value on every rank, so all ranks stop alike) and of the run's past ``timings`` (:func:`past_timings`),
    said once in the job's log. Raises :class:`WalltimeTooShortError` (every rank) when the past
    timings say one step and a save cannot finish before the end."""
    too_short = None
    if main:
        end = job_end(stop_by)
        deadline = Deadline(end, *timings)
        if end is not None:
            left = end - time.time()
            log.info(
                "%s: the job ends at %s (%.0f s from now); a segment that would run past it stops at a "
                "checkpoint first",
                cell,
                time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(end)),
                left,
            )
            if deadline.step_s and left < deadline.need():
                fix = (
                    "a later --stop-by"
                    if stop_by is not None
                    else (
                        "the train job's runtime (resources.train.runtime, minutes; `aggbench plan` estimates it)"
                    )
                )
                too_short = (
                    f"{cell}: the job ends in {left:.0f} s, but one step ({deadline.step_s:.0f} s at most of the "
                    f"last ones) and its checkpoint ({deadline.need() - STEP_SLACK * deadline.step_s - MARGIN_S:.0f}"
                    f" s) with the {MARGIN_S:.0f} s margin need {deadline.need():.0f} s: raise {fix}"
                )
    # rank 0 decides, every rank follows (each rank's own clock could decide otherwise near the end)
    end, step_s, save_s, too_short = broadcast(
        (deadline.end, deadline.step_s, deadline.save_s, too_short) if main else None
    )
    if too_short:
        raise WalltimeTooShortError(too_short)
    return Deadline(end, step_s, save_s)


def stopped(cell: str, step: int, end: float, checkpoint: str) -> WalltimeStop:
    left = max(end - time.time(), 0.0)
    return WalltimeStop(
        f"{cell}: stopped after step {step}, {left:.0f} s before the job's end (its walltime), to save "
        f"{checkpoint} rather than be killed mid-segment; the retry (or rerun of the same command) "
        f"resumes from step {step}. Raise the job's runtime to finish a segment in one job"
    )
