"""The TRL monitor (aggbench.integrations.trl_monitor) and the TRL adapter's start-up checks.

Real TRL on the built-in tiny model: one step of an unmodified GRPOTrainer and one of
MonitoredGRPOTrainer on the same samples (group_seeded_rollout) give the same gradient (the monitor
does not change the training), and the monitor's values in TRL's log history equal aggbench's own
diagnostics (aggregation.diagnostics) and audit weights recomputed here on the recorded batch.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from aggbench.aggregation import builtin_instances  # noqa: E402
from aggbench.aggregation.diagnostics import diagnostics, length_stats, sign_weights  # noqa: E402
from aggbench.integrations import trl as adapter  # noqa: E402
from aggbench.integrations import trl_monitor  # noqa: E402
from aggbench.integrations.trl_probe import check_dapo_normaliser  # noqa: E402
from helpers.trl_support import G, Grads, dataset, group_seeded_rollout, grpo_args, reward  # noqa: E402


def _run(cls, model_dir, tmp_path, callbacks=(), **over):
    class Recording(cls):
        batches: list = []

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.batches.append({k: v.clone() for k, v in out.items() if torch.is_tensor(v)})
            return out

    Recording.batches = []
    grads = Grads()
    trainer = Recording(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64),
        reward_funcs=reward,
        args=grpo_args(tmp_path, **over),
        train_dataset=dataset(),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[grads, *callbacks],
        rollout_func=group_seeded_rollout,
    )
    trainer.train()
    return trainer, grads


@pytest.mark.timeout(900)
def test_the_monitor_logs_aggbenchs_diagnostics_and_does_not_change_the_training(tiny_sft_model, tmp_path):
    callback = trl_monitor.AggregationMonitorCallback(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    plain, g_plain = _run(trl.GRPOTrainer, tiny_sft_model, tmp_path / "plain", loss_type="dapo")
    mon, g_mon = _run(
        trl_monitor.MonitoredGRPOTrainer, tiny_sft_model, tmp_path / "mon", [callback], loss_type="dapo"
    )
    (a,), (b,) = plain.batches, mon.batches
    for key in ("completion_ids", "completion_mask", "advantages"):
        assert torch.equal(a[key], b[key]), key
    assert float(b["advantages"].abs().sum()) > 0, "no reward variance: the comparison would be empty"
    (before,), (after,) = g_plain.steps, g_mon.steps
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)

    # the values TRL logged == aggbench's own diagnostics on the recorded batch
    logged = next(row for row in mon.state.log_history if "aggbench/len/cv" in row)
    mask, adv = b["completion_mask"].bool(), b["advantages"].double()
    gids = torch.arange(mask.shape[0]) // G
    stats = length_stats(mask, adv, gids)
    insts = {n: builtin_instances()[n] for n in ("token", "sequence", "balanced")}
    diag = diagnostics(mask, adv, gids, instances=insts)
    expected = {f"aggbench/{k}": stats[k] for k in ("len/cv", "len/gap", "len/cv_within", "len/gap_within")}
    for name in insts:
        expected[f"aggbench/agg/{name}/weight_ratio"] = diag[f"agg/{name}/weight_ratio"]
    # the run's own mode, dapo: every token weighs 1 / (the batch's tokens)
    wp, wn = sign_weights(mask.double() / mask.sum() * adv[:, None], adv)
    expected["aggbench/run/weight_ratio"] = wp / wn
    for key, value in expected.items():
        if math.isnan(value):
            assert math.isnan(logged[key]), key
        else:
            assert logged[key] == pytest.approx(value, rel=1e-6), key
    # dapo is the token rule: the run's own ratio is token's; balanced's differs (a real batch)
    assert logged["aggbench/run/weight_ratio"] == pytest.approx(logged["aggbench/agg/token/weight_ratio"])

    # and MLflow got them through aggbench.tracking
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    (run,) = client.search_runs([client.get_experiment_by_name("aggbench-monitor").experiment_id])
    assert run.data.metrics["aggbench/len/cv"] == pytest.approx(logged["aggbench/len/cv"])


def test_an_untested_trl_is_refused_unless_allowed(monkeypatch):
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    monkeypatch.delenv(adapter.ALLOW_UNTESTED_TRL, raising=False)
    with pytest.raises(
        RuntimeError, match=r"tested with trl 1\.16\.x, found 1\.17\.0; install 'trl>=1\.16,<1\.17'"
    ):
        adapter.check_trl_version(trl.GRPOTrainer)
    monkeypatch.setenv(adapter.ALLOW_UNTESTED_TRL, "1")
    with pytest.warns(UserWarning, match="untested"):
        adapter.check_trl_version(trl.GRPOTrainer)


def test_a_changed_dapo_normaliser_is_refused():
    """A TRL whose dapo loss divides by the micro-batch's tokens (the meaning the adapter must not
    silently lose) fails the behaviour probe; TRL 1.16's own passes it."""
    check_dapo_normaliser(trl.GRPOTrainer)

    class Changed(trl.GRPOTrainer):
        def _compute_loss(self, model, inputs):
            local = inputs["completion_mask"].sum()
            return trl.GRPOTrainer._compute_loss(self, model, {**inputs, "num_items_in_batch": local})

    with pytest.raises(RuntimeError, match="no longer divides by the generation batch's token count"):
        check_dapo_normaliser(Changed)
