"""A cell's MLflow run as researchers use it: the resolved config as params, checked on resume; a
status that says how training ended (SCHEDULED between segments, FINISHED, FAILED, KILLED on
SIGTERM). Real MLflow, SQLite stores under tmp. (MlflowRun alone: tests/test_tracking.py.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from aggbench.config import TrainConfig, load_train_config
from aggbench.config_errors import ConfigError
from aggbench.run_config import flat_config, resume_mutable
from aggbench.train import loop
from helpers import report_fixtures as rf
from helpers.tiny_models import tiny_model_for_tests
from helpers.trainer_support import metrics_rows, train_config, write_cell


@pytest.fixture
def uri(tmp_path) -> str:
    """A migrated, empty SQLite store (a copy: MLflow's migrations take seconds)."""
    shutil.copy(rf.empty_store(), tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


@pytest.fixture(scope="module")
def untrained(tmp_path_factory) -> Path:
    """The untrained tiny model (about a second): these tests check bookkeeping, not learning."""
    return tiny_model_for_tests(tmp_path_factory.mktemp("untrained"))


def _cfg(uri: str, **over) -> TrainConfig:
    data = {
        "model": {"path": "/models/tiny"},
        "dataset": {"path": "/data/train.jsonl"},
        "aggregation": {"name": "balanced_batch", "rule": "balanced", "params": {"scope": "batch"}},
        "tracking": {"tracking_uri": uri, "experiment": "params"},
    }
    return train_config(data, over)


def _run(uri: str, experiment: str, cell: str):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    (run,) = client.search_runs([exp.experiment_id], filter_string=f"tags.`aggbench.cell_id` = '{cell}'")
    return run


# --------------------------------------------------------------------------- params


def test_cell_params_are_the_config_without_what_a_resume_may_change(uri, tmp_path):
    cfg = _cfg(uri)
    run = loop.open_tracker(cfg, tmp_path / "run")
    got = run.client.get_run(run.run_id).data
    assert got.params["aggregation"] == "balanced_batch" and got.params["algorithm.lr"] == "1e-06"
    assert got.params["sampling.temperature"] == "1.0" and got.params["aggregation.params.scope"] == "batch"
    # fields a resume may change (RESUME_MUTABLE) are tags, which can change with them
    for key in ("algorithm.total_steps", "model.path", "tracking.experiment", "checkpoint.every"):
        assert key not in got.params
    assert got.tags["algorithm.total_steps"] == "20" and got.tags["model.path"] == "/models/tiny"
    assert set(got.params) == {k for k in flat_config(cfg) if not resume_mutable(k)}
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("params").experiment_id
    found = client.search_runs([exp], filter_string="params.aggregation = 'balanced_batch'")
    assert [r.info.run_id for r in found] == [run.run_id]
    assert client.search_runs([exp], filter_string="params.aggregation = 'balanced'") == []


def test_resume_with_the_same_config_passes_and_a_changed_param_is_refused(uri, tmp_path):
    first = loop.open_tracker(_cfg(uri, **{"algorithm.total_steps": 4}), tmp_path / "run")
    # the same config (a resume may lengthen the run: total_steps is a tag, not a param)
    again = loop.open_tracker(_cfg(uri, **{"algorithm.total_steps": 8}), tmp_path / "run")
    assert again.run_id == first.run_id
    assert again.client.get_run(first.run_id).data.tags["algorithm.total_steps"] == "8"
    # another --out for the same cell id and experiment finds the same MLflow run by its tag
    with pytest.raises(ConfigError) as err:
        loop.open_tracker(_cfg(uri, **{"algorithm.lr": 1e-3}), tmp_path / "elsewhere")
    msg = str(err.value)
    assert "was trained with a different config; resuming would mix two experiments" in msg
    assert "algorithm.lr: '1e-06' -> '0.001'" in msg and first.run_id in msg
    assert "--allow-config-change" in msg
    params = first.client.get_run(first.run_id).data.params
    assert params["algorithm.lr"] == "1e-06"  # nothing was changed
    # on purpose: the run keeps its first values and says what changed
    kept = loop.open_tracker(_cfg(uri, **{"algorithm.lr": 1e-3}), tmp_path / "elsewhere", allow_change=True)
    data = kept.client.get_run(kept.run_id).data
    assert kept.run_id == first.run_id and data.params["algorithm.lr"] == "1e-06"
    assert data.tags["aggbench.config_changes"] == "at step 0: algorithm.lr: '1e-06' -> '0.001'"


# --------------------------------------------------------------------------- status


def test_segments_are_scheduled_then_finished(uri, tmp_path, untrained, tiny_train_data):
    cfg = load_train_config(
        write_cell(tmp_path / "cell.yaml", untrained, tiny_train_data, steps=2, every=1, tracking_uri=uri)
    )
    out = tmp_path / "run"
    loop.train(cfg, out, until_step=1, quiet=True)
    run = _run(uri, "test", cfg.resolved_cell_id)
    assert run.info.status == "SCHEDULED"  # between segments: more to come, nothing trains it
    assert run.data.params["aggregation"] == "balanced"
    loop.train(cfg, out, quiet=True)
    assert _run(uri, "test", cfg.resolved_cell_id).info.status == "FINISHED"
    loop.train(cfg, out, quiet=True)  # nothing left to train: still FINISHED
    assert _run(uri, "test", cfg.resolved_cell_id).info.status == "FINISHED"


def test_an_exception_marks_the_run_failed(uri, tmp_path, untrained, tiny_train_data, monkeypatch):
    cfg = load_train_config(
        write_cell(tmp_path / "cell.yaml", untrained, tiny_train_data, steps=2, every=2, tracking_uri=uri)
    )

    def boom(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(loop.step_log, "report", boom)
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="injected"):
        loop.train(cfg, tmp_path / "run", quiet=True)
    run = _run(uri, "test", cfg.resolved_cell_id)
    assert run.info.status == "FAILED" and run.info.end_time is not None
    assert signal.getsignal(signal.SIGTERM) is handler  # the trainer's handler is gone again


def test_sigterm_marks_the_run_killed_and_exits_nonzero(uri, tmp_path, untrained, tiny_train_data):
    cell = write_cell(
        tmp_path / "cell.yaml", untrained, tiny_train_data, steps=200, every=100, tracking_uri=uri
    )
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(out), "--quiet"]
    env = {k: v for k, v in os.environ.items() if k != "AGGBENCH_FAULT"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not ((out / "metrics.jsonl").exists() and metrics_rows(out)):  # inside the training loop
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no training step within 4 minutes"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert len(metrics_rows(out)) < 200, "training was not interrupted"
    # one log line says what happened and how to go on (before the fix: none)
    said = [line for line in err.splitlines() if "terminated by SIGTERM" in line]
    assert len(said) == 1, err[-3000:]
    assert "tiny__tiny__balanced__s0" in said[0] and "MLflow run marked KILLED" in said[0]
    assert "rerun the same command to resume from step 0 (the start model)" in said[0]
    run = _run(uri, "test", "tiny__tiny__balanced__s0")
    assert run.info.status == "KILLED" and run.info.end_time is not None
