"""The SLURM leg: a minimal grid through exactly `snakemake --profile slurm`, on a real local SLURM.

CI brings SLURM up with `bash .ci/slurm_up.sh` (slurmctld + slurmd on this machine, accounting by
slurmdbd, so the shipped profile runs unmodified). Checks: every non-local job of the run was a
SLURM job that completed (sacct, matched by the rule name the executor plugin puts in each job's
comment), no local rule went to SLURM, and the tables were written. Bounded by a subprocess timeout:
it fails rather than hangs.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from collections import Counter
from datetime import datetime

import pytest

TIMEOUT_S = 540  # the Snakemake run; it fails rather than hangs
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(TIMEOUT_S + 300)]
LOCAL_RULES = {"prepare_model", "prepare_data", "fetch_benchmarks", "experiment_config", "cell_config", "all"}


def _slurm_up() -> str | None:
    """None when SLURM accepts jobs here, else why not."""
    if shutil.which("sinfo") is None or shutil.which("sacct") is None:
        return "SLURM client tools (sinfo, sacct) are not installed; run `bash .ci/slurm_up.sh` as root"
    try:
        state = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=15)
        acct = subprocess.run(["sacct", "-n", "-X"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo/sacct did not answer within 15 s; SLURM is not up (`bash .ci/slurm_up.sh`)"
    if state.returncode != 0 or not any(s.startswith(("idle", "mix", "alloc")) for s in state.stdout.split()):
        return f"no SLURM node is up (sinfo: {(state.stdout + state.stderr).strip()!r}); run `bash .ci/slurm_up.sh`"
    if acct.returncode != 0:
        return (
            f"SLURM accounting does not answer (sacct: {acct.stderr.strip()!r}); run `bash .ci/slurm_up.sh`"
        )
    return None


def _cancel(prefix: str) -> None:
    """Cancel this test's jobs still queued or running (after a timeout or a failure)."""
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        q = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=15)
        ids = [
            line.split()[0]
            for line in q.stdout.splitlines()
            if line.split()[1:2] and line.split()[1].startswith(prefix)
        ]
        if ids:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=15)


def test_minimal_grid_runs_through_the_slurm_profile(wf, tmp_path, tiny_model):
    why = _slurm_up()
    if why:
        pytest.skip(why)
    # one rule instance, two steps (one train segment), one benchmark of 4 problems x 2 samples
    config, results = wf.small_grid(
        tmp_path, "slurm", tiny_model, total_steps=2, checkpoint_every=2, eval_every=2
    )
    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    prefix = f"aggbenchtest{os.getpid()}"  # our jobs' names start with it: found, or cancelled

    t0, t_submit = time.monotonic(), time.time()
    # Exactly the documented command, from the repository root. The extra flags only set the pace
    # of the status checks (the plugin waits 40 s before its first by default) and prefix the job
    # names, so that a failed run's jobs can be found and cancelled.
    try:
        proc = wf.run(
            [
                "--profile",
                "slurm",
                "--configfile",
                str(config),
                "--slurm-init-seconds-before-status-checks",
                "5",
                "--slurm-jobname-prefix",
                prefix,
            ],
            cwd=wf.REPO,
            timeout=TIMEOUT_S,
        )
    finally:
        _cancel(prefix)
    wall = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    print(f"\nSLURM leg: {wall:.0f} s wall")
    # no tracking server: the workflow says so when it submits, not only `aggbench grid check`
    assert "WARNING: tracking_uri is null, so every job would write one SQLite file" in out, out[-3000:]

    # what Snakemake ran, by rule
    ran = Counter(j["rule"] for j in wf.jobs(out))
    remote = {r: n for r, n in ran.items() if r not in LOCAL_RULES}
    assert remote == {"train": 1, "generate": 1, "grade": 1, "report": 1}, ran

    # what SLURM ran: the plugin puts the rule (and wildcards) in each job's comment
    acct = subprocess.run(
        ["sacct", "-n", "-X", "-P", "-S", start, "-o", "JobID,JobName,State,Comment"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert acct.returncode == 0, acct.stderr
    rows = [line.split("|", 3) for line in acct.stdout.splitlines() if line.strip()]
    ours = [r for r in rows if r[1].startswith(prefix)]
    by_rule: Counter = Counter()
    for _, _, state, comment in ours:
        rule = next(
            (n for n in ran if comment == f"rule_{n}" or comment.startswith(f"rule_{n}_wildcards_")), comment
        )
        assert state == "COMPLETED", (comment, state)
        by_rule[rule] += 1
    # every non-local job was a SLURM job, and no local rule went to SLURM
    assert dict(by_rule) == remote, f"sacct: {rows}"

    # the train job read its end from SLURM (squeue on Slurm 22.05): inside the job's 30-minute limit
    (train_log,) = (results / "logs" / "train").rglob("step_2.log")
    ends = re.findall(r"the job ends at (\S+) \(", train_log.read_text())
    assert len(ends) == 1, train_log.read_text()[-3000:]
    end = datetime.fromisoformat(ends[0]).timestamp()
    assert t_submit < end <= time.time() + 30 * 60, (ends, t_submit)

    # and the table was written
    last = results / "tables" / "last.md"
    assert last.exists() and "balanced" in last.read_text()
