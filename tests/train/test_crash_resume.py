"""Crash tests: die (os._exit, no cleanup) at named points, rerun, and compare with a clean run.

After the rerun the run has the same steps, resumed from a step above 0, and metrics.jsonl and
what MLflow readers see hold each step exactly once, with the values of the uninterrupted run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from aggbench.tracking import SENTINEL, metric_history
from helpers.trainer_support import metrics_rows, stable, write_cell

STEPS, EVERY = 4, 2


def _train(cell: Path, out: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "AGGBENCH_FAULT"}
    if fault:
        env["AGGBENCH_FAULT"] = fault
    return subprocess.run(
        [sys.executable, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(out), "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_sft_model, tiny_train_data):
    root = tmp_path_factory.mktemp("reference")
    cell = write_cell(
        root / "cell.yaml",
        tiny_sft_model,
        tiny_train_data,
        steps=STEPS,
        every=EVERY,
        tracking_uri=f"sqlite:///{root / 'mlflow.db'}",
    )
    proc = _train(cell, root / "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return metrics_rows(root / "run")


@pytest.mark.slow
@pytest.mark.parametrize(
    "fault",
    ["checkpoint_write:4", "after_metrics:4", "mid_step:3"],
    ids=["during-checkpoint-write", "after-metrics-before-commit", "mid-step"],
)
def test_crash_then_rerun_matches_clean_run(tmp_path, tiny_sft_model, tiny_train_data, reference, fault):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cell = write_cell(
        tmp_path / "cell.yaml", tiny_sft_model, tiny_train_data, steps=STEPS, every=EVERY, tracking_uri=uri
    )
    run = tmp_path / "run"
    crashed = _train(cell, run, fault)
    assert crashed.returncode == 17, f"the fault did not fire: {crashed.stderr[-2000:]}"
    assert "AGGBENCH_FAULT" in crashed.stderr
    assert not (run / "checkpoints" / "step_4").exists(), "a crashed checkpoint must not look complete"
    resumed = _train(cell, run)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "steps 2 -> 4" in resumed.stdout, resumed.stdout  # resumed from step 2, not 0
    rows = metrics_rows(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1)), "each step exactly once in metrics.jsonl"
    assert [stable(r) for r in rows] == [stable(r) for r in reference]
    client = MlflowClient(tracking_uri=uri)
    (mrun,) = client.search_runs([client.get_experiment_by_name("test").experiment_id])
    for key in (SENTINEL, "reward/mean", "agg/balanced/weight_pos", "len/gap"):
        raw = client.get_metric_history(mrun.info.run_id, key)
        assert sorted(int(m.step) for m in raw) == list(range(1, STEPS + 1)), (
            f"{key}: a step missing or doubled"
        )
        hist = metric_history(client, mrun.info.run_id, key)
        if key != SENTINEL:
            assert hist == {r["step"]: pytest.approx(r[key], nan_ok=True) for r in reference}
