"""Kill a small DAG mid-training (Snakemake and its jobs, by process group), run it again.

Grid: the tiny model, one rule, 6 steps, a checkpoint (and a train job) every 2 steps. The kill
comes once the step-2 segment is done and the step-4 segment has started training. The rerun must
finish without redoing finished jobs, resume training from step 2 (not 0) in the same MLflow run,
and leave every training step in MLflow exactly once. The killed run is not FINISHED in MLflow (a
SIGKILL leaves it RUNNING: nothing could say otherwise) until the rerun finishes it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

CELL = "tiny__tiny__balanced__s0"


def _metric_steps(path) -> list[int]:
    if not path.exists():
        return []
    steps = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError, KeyError):  # a line being written
            steps.append(json.loads(line)["step"])
    return steps


def test_interrupted_dag_resumes_without_redoing_or_duplicating(wf, tmp_path, tiny_model):
    work = tmp_path / "work"
    config, results = wf.small_grid(
        tmp_path, "interrupt", tiny_model, total_steps=6, checkpoint_every=2, eval_every=6
    )
    work.mkdir()
    run = results / "runs" / CELL
    marker = {s: run / "segments" / f"step_{s}.done" for s in (2, 4, 6)}
    train_log = results / "logs" / "train" / CELL
    args = ["-s", str(wf.SNAKEFILE), "--cores", "2", "--configfile", str(config)]

    # ---- first run: killed (SIGKILL to its whole process group) during the step-4 segment
    log1 = (tmp_path / "run1.log").open("w")
    proc = subprocess.Popen(
        [wf.exe("snakemake"), *args], cwd=work, stdout=log1, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 420
    try:
        while True:
            assert proc.poll() is None, (
                "snakemake ended before it could be interrupted:\n"
                + (tmp_path / "run1.log").read_text()[-3000:]
            )
            assert time.monotonic() < deadline, "no step-4 training within 7 minutes"
            # the step-4 job is running and has finished step 3 (a step past the last checkpoint)
            step4_started = marker[2].exists() and (train_log / "step_4.log").exists()
            if step4_started and 3 in _metric_steps(run / "metrics.jsonl"):
                break
            time.sleep(0.1)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log1.close()
    assert not marker[4].exists(), "the step-4 segment finished before the kill: nothing was interrupted"
    assert not (run / "checkpoints" / "step_4").exists(), "killed only after the step-4 checkpoint"
    killed_at = _metric_steps(run / "metrics.jsonl")
    assert max(killed_at) in (3, 4), killed_at
    done2_mtime = marker[2].stat().st_mtime_ns
    run_id = json.loads((run / "mlflow_run.json").read_text())["run_id"]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    assert client.get_run(run_id).info.status == "RUNNING", "killed mid-segment: not FINISHED, not SCHEDULED"

    # ---- second run: a killed Snakemake leaves its lock behind; unlock, then run again
    wf.run([*args, "--unlock"], cwd=work)
    proc2 = wf.run(args, cwd=work)
    out = proc2.stdout + proc2.stderr

    # finished, without redoing the finished segment
    assert all(m.exists() for m in marker.values())
    assert marker[2].stat().st_mtime_ns == done2_mtime, "the finished step-2 segment was run again"
    redone = [j for j in wf.jobs(out) if j["rule"] == "train"]
    assert sorted(int(j["wildcards"]["step"]) for j in redone) == [4, 6], redone
    assert not any(j["rule"] in ("prepare_model", "prepare_data", "cell_config") for j in wf.jobs(out))
    assert (results / "tables" / "last.md").exists()

    # training resumed from the step-2 checkpoint, not from scratch
    assert "steps 2 -> 4" in (train_log / "step_4.log").read_text()
    # one line per step in the run files (the killed step 3 was cut off and trained again)
    assert sorted(_metric_steps(run / "metrics.jsonl")) == [1, 2, 3, 4, 5, 6]

    # same MLflow run, every step there exactly once
    assert json.loads((run / "mlflow_run.json").read_text())["run_id"] == run_id
    assert client.get_run(run_id).info.status == "FINISHED"
    runs = client.search_runs(
        [client.get_experiment_by_name("smoke").experiment_id],
        filter_string=f"tags.`aggbench.cell_id` = '{CELL}'",
    )
    assert [r.info.run_id for r in runs] == [run_id]
    for key in ("train/step", "loss/pg", "len/gap", "agg/balanced/weight_ratio"):
        steps = sorted(m.step for m in client.get_metric_history(run_id, key))
        assert steps == [1, 2, 3, 4, 5, 6], (key, steps)
    # the step-6 evaluation, put in by the report's ingest, once
    eval_keys = [k for k in client.get_run(run_id).data.metrics if k.startswith("eval/tiny_test/")]
    assert eval_keys
    for key in eval_keys:
        assert [m.step for m in client.get_metric_history(run_id, key)] == [6], key
