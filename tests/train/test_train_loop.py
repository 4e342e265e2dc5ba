"""The trainer on the tiny model: it learns, logs, checkpoints, and is deterministic."""

from __future__ import annotations

import math

import pytest
import torch
from mlflow.tracking import MlflowClient
from safetensors.torch import load_file

from aggbench.aggregation import builtin_instances
from aggbench.config import load_train_config
from aggbench.layout import complete_steps
from aggbench.report.lab_v2 import rule_problem
from aggbench.tracking import metric_history
from aggbench.train.loop import train
from helpers.trainer_support import metrics_rows, stable, write_cell


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["token", "sequence", "balanced"])
def test_trains_and_logs(tmp_path, tiny_sft_model, tiny_train_data, rule):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = load_train_config(
        write_cell(
            tmp_path / "cell.yaml",
            tiny_sft_model,
            tiny_train_data,
            rule=rule,
            steps=2,
            every=2,
            tracking_uri=uri,
        )
    )
    run = tmp_path / "runs" / cfg.resolved_cell_id
    summary = train(cfg, run, quiet=True)
    assert summary == {"cell_id": f"tiny__tiny__{rule}__s0", "start_step": 0, "end_step": 2}
    before = load_file(str(next(tiny_sft_model.glob("*.safetensors"))))
    after = load_file(str(run / "checkpoints" / "step_2" / "model.safetensors"))
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "no parameter changed after 2 GRPO steps"
    rows = metrics_rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        for name in builtin_instances():  # diagnostics of EVERY rule on the same batch
            assert f"agg/{name}/weight_pos" in r and f"agg/{name}/pg_loss" in r
        assert 0.0 <= r["reward/mean"] <= 1.0 and math.isfinite(r["grad_norm"])
    assert any(r["groups/zero_variance"] < r["groups/total"] for r in rows), "no reward variance at all"
    # the loss the trainer applied is the named rule's, and told apart from the others' (lab v2's check)
    assert rule_problem(rows, rule) is None
    assert all(r["loss/weight_sq"] == pytest.approx(r[f"agg/{rule}/weight_sq"], rel=1e-5) for r in rows)
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("test")
    (mrun,) = client.search_runs([exp.experiment_id])
    assert mrun.info.run_name == cfg.resolved_cell_id and mrun.info.status == "FINISHED"
    assert mrun.data.tags["aggregation"] == rule and mrun.data.tags["config_hash"] == cfg.hash()
    hist = metric_history(client, mrun.info.run_id, "reward/mean")
    assert hist == {1: pytest.approx(rows[0]["reward/mean"]), 2: pytest.approx(rows[1]["reward/mean"])}
    assert len(client.get_metric_history(mrun.info.run_id, "reward/mean")) == 2
    assert (run / "rollouts" / "step_1.jsonl").exists() and (run / "config.resolved.yaml").exists()


@pytest.mark.slow
def test_same_seed_same_metrics_and_segments_equal_one_run(tmp_path, tiny_sft_model, tiny_train_data):
    cell = write_cell(tmp_path / "cell.yaml", tiny_sft_model, tiny_train_data, steps=4, every=2)
    cfg = load_train_config(cell, {"tracking.enabled": False})
    train(cfg, tmp_path / "a", quiet=True)
    train(cfg, tmp_path / "b", until_step=2, quiet=True)  # two segments, resumed from step 2
    assert complete_steps(tmp_path / "b") == [2]
    train(cfg, tmp_path / "b", quiet=True)
    a, b = metrics_rows(tmp_path / "a"), metrics_rows(tmp_path / "b")
    assert [r["step"] for r in a] == [1, 2, 3, 4]
    assert [stable(r) for r in a] == [stable(r) for r in b]
    wa = load_file(str(tmp_path / "a" / "checkpoints" / "step_4" / "model.safetensors"))
    wb = load_file(str(tmp_path / "b" / "checkpoints" / "step_4" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
