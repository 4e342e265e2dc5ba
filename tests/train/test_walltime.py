"""A segment stops before its job's end at a checkpoint of the step it reached, and a rerun resumes
from there to the same result as an uninterrupted run (``aggbench.train.walltime``)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from aggbench.config_errors import ConfigError
from aggbench.layout import STATE_FILE, checkpoint_dir, complete_steps
from aggbench.train import walltime
from aggbench.train.loop import train
from helpers.trainer_support import metrics_rows, stable, train_config, write_cell


def test_the_stop_rule_adds_the_slowest_step_a_save_and_the_margin():
    d = walltime.Deadline(end=1000.0)
    m = walltime.MARGIN_S
    # before any save, a save is taken to cost a step: 1.25 x 100 + 100 + margin
    assert d.stop_after(100.0, now=1000.0 - (225.0 + m) + 1) is True
    assert d.stop_after(100.0, now=1000.0 - (225.0 + m) - 1) is False
    d.saved(10.0)  # a measured save replaces the guess
    assert d.stop_after(40.0, now=1000.0 - (135.0 + m) - 1) is False  # the slowest step (100) counts
    assert d.stop_after(40.0, now=1000.0 - (135.0 + m) + 1) is True
    assert walltime.Deadline(end=None).stop_after(1e9, now=1e12) is False  # no known end: never


def test_a_resumed_segment_starts_from_the_runs_own_timings(tmp_path):
    """The slowest of the last 5 steps (generate + update) and the latest save (its COMPLETE
    marker's time less its step's row time) seed the rule, so the first stop decision of a job does
    not guess the save from a step; a job whose end leaves less than that refuses to start."""
    rows = [
        {"step": s, "time": 1000.0 + s, "time/generate_s": 10.0 * s, "time/update_s": 1.0}
        for s in range(1, 8)
    ]
    complete = tmp_path / "COMPLETE"
    complete.write_text("{}")
    os.utime(complete, (rows[-1]["time"] + 30.0, rows[-1]["time"] + 30.0))
    assert walltime.past_timings(rows, complete) == (71.0, 30.0)  # steps 3..7: the slowest is 7's
    assert walltime.past_timings([], None) == (0.0, None)
    # a copied run directory (its mtimes the copy's): a "save" of hours is no save, it is ignored
    os.utime(complete, (rows[-1]["time"] + 86400.0, rows[-1]["time"] + 86400.0))
    assert walltime.past_timings(rows, complete) == (71.0, None)
    d = walltime.for_segment("c", time.time() + 1e6, main=True, broadcast=lambda x: x, timings=(71.0, 30.0))
    assert (d.step_s, d.save_s) == (71.0, 30.0) and d.need() == 1.25 * 71.0 + 30.0 + walltime.MARGIN_S
    with pytest.raises(
        walltime.WalltimeTooShortError, match=r"the job ends in \d+ s, but one step .*raise a later --stop-by"
    ):
        walltime.for_segment("c", time.time() + 100.0, main=True, broadcast=lambda x: x, timings=(71.0, 30.0))
    # no past steps (a run's first segment): nothing to judge by, it starts
    walltime.for_segment("c", time.time() + 1.0, main=True, broadcast=lambda x: x)


def test_the_end_comes_from_stop_by_then_slurm(monkeypatch, tmp_path):
    monkeypatch.delenv(walltime.END_ENV, raising=False)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert walltime.job_end(None) is None  # not a SLURM job: unchanged behaviour
    assert walltime.job_end(123.5) == 123.5
    monkeypatch.setenv(walltime.END_ENV, "1900000000")
    assert walltime.job_end(None) == 1900000000.0
    assert walltime.job_end(5.0) == 5.0  # --stop-by wins
    for bad in ("soon", "nan", "inf", "1e300"):
        monkeypatch.setenv(walltime.END_ENV, bad)
        assert walltime.job_end(None) is None, bad  # unreadable: a warning, not a crash
    with pytest.raises(ConfigError, match="is not a Unix time"):
        walltime.job_end(float("inf"))  # --stop-by inf: one line, before any rank waits on rank 0
    # an older Slurm sets no end variable: the job's id, and squeue cannot be run here -> None
    monkeypatch.delenv(walltime.END_ENV)
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("PATH", str(tmp_path))  # no squeue on PATH
    assert walltime.job_end(None) is None


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_train_data):
    """A 2-step segment (checkpoint.every 2) whose job's end has passed: the CLI stops after step 1;
    then the same command without it, and an uninterrupted reference run."""
    from helpers.tiny_models import tiny_model_for_tests

    root = tmp_path_factory.mktemp("walltime")
    model = tiny_model_for_tests(root)
    uri = f"sqlite:///{root / 'mlflow.db'}"
    cell = write_cell(root / "cell.yaml", model, tiny_train_data, steps=2, every=2, tracking_uri=uri)
    run, ref = root / "run", root / "reference"
    env = {**os.environ, walltime.END_ENV: str(time.time())}  # as SLURM 23.02+ sets it in a job
    cmd = [sys.executable, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(run), "--quiet"]
    stopped = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    after_stop = {
        "steps": complete_steps(run),
        "state": (checkpoint_dir(run, 1) / STATE_FILE).is_file(),
        "rows": [r["step"] for r in metrics_rows(run)],
    }
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "test"]
    status_after_stop = client.search_runs([exp.experiment_id])[0].info.status
    resumed = train(train_config(cell), run, quiet=True)
    status_after_rerun = client.search_runs([exp.experiment_id])[0].info.status
    train(train_config(cell, {"tracking.enabled": False}), ref, quiet=True)
    return {
        "stopped": stopped,
        "after_stop": after_stop,
        "statuses": (status_after_stop, status_after_rerun),
        "resumed": resumed,
        "run": run,
        "ref": ref,
    }


def test_a_segment_past_its_jobs_end_saves_the_step_it_reached_and_exits_143(runs):
    proc = runs["stopped"]
    assert proc.returncode == 143, proc.stderr[-2000:]
    assert "stopped after step 1" in proc.stderr and "resumes from step 1" in proc.stderr
    # step 1 is off the checkpoint.every grid (2): saved because of the stop, with its trainer state
    assert runs["after_stop"] == {"steps": [1], "state": True, "rows": [1]}
    assert runs["statuses"] == ("KILLED", "FINISHED")


def test_the_rerun_resumes_there_and_equals_an_uninterrupted_run(runs):
    assert (runs["resumed"]["start_step"], runs["resumed"]["end_step"]) == (1, 2)
    got, want = metrics_rows(runs["run"]), metrics_rows(runs["ref"])
    assert [r["step"] for r in got] == [1, 2]
    assert [stable(r) for r in got] == [stable(r) for r in want]
