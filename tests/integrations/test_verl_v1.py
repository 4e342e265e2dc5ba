"""verl 0.9's default trainer (``trainer.use_v1=true``) through the gradient, with a real TransferQueue.

The v1 trainer keeps the step batch in TransferQueue (``transfer_queue``, from verl's ``verl-core``
extra, which the documented ``pip install -e ".[verl]"`` installs) and differs from the legacy
driver before the update: ``_balance_batch`` pads the batch to a multiple of the mini-batch rows
and reorders it to balance tokens over the data-parallel ranks, and ``_compute_advantage`` reads the
rows back from the store as nested tensors, calls ``compute_advantage_for_multi_trajectories``
(which hands a non-GRPO estimator such as ours the whole batch) and writes nested advantages.

Here those two methods of verl's ``PPOTrainer`` run unchanged on a stand-in ``self`` that has only the
attributes they read (the config, the tokenizer, the actor's data-parallel ranks), against a local
Ray + TransferQueue (its own controller and storage actors). Their output then goes through verl's
actor update as tests/integrations/test_verl.py runs it (helpers/verl_support.py: verl's
mini-batch iterator, micro-batches and ``ppo_loss``, two ranks), and must equal aggbench's own
gradient for the rule. Runs in the `make test-verl` leg (the documented environment).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

if os.environ.get("AGGBENCH_REQUIRE_VERL"):  # the verl leg: a broken install fails, never skips
    import ray
    import transfer_queue as tq
else:
    ray = pytest.importorskip("ray")
    tq = pytest.importorskip(
        "transfer_queue", reason="verl's v1 trainer needs verl[verl-core]: the `make test-verl` leg"
    )
    pytest.importorskip("omegaconf", reason="verl's config stack: the `make test-verl` leg")

from aggbench.aggregation import make_instance  # noqa: E402
from aggbench.integrations import verl as adapter  # noqa: E402
from helpers import verl_support as vs  # noqa: E402

SUM = adapter.SUM_MODE
DP = 2  # data-parallel ranks of the actor (verl_support.overrides' trainer.n_gpus_per_node)


@pytest.fixture(scope="module")
def store():
    """A local Ray with TransferQueue's controller and storage actors. Ray's CPUs here are logical
    slots for those actors (they idle), not cores; TransferQueue caps its threads at the real cores."""
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        tq.init()
        yield
    finally:
        try:
            tq.close()
        finally:
            ray.shutdown()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from helpers.tiny_models import tiny_model_for_tests

    return tiny_model_for_tests(tmp_path_factory.mktemp("verl-v1-tiny"))


class _Driver:
    """What ``PPOTrainer._balance_batch`` and ``._compute_advantage`` read of the trainer, nothing else."""

    from verl.trainer.ppo.v1.trainer_base import PPOTrainer as _V1

    _balance_batch = _V1._balance_batch
    _get_required_batch_multiple = _V1._get_required_batch_multiple
    _compute_advantage = _V1._compute_advantage

    def __init__(self, config, tokenizer):
        from types import SimpleNamespace

        self.config = config
        self.tokenizer = tokenizer
        self.use_critic = False
        self.global_steps = 1
        self.actor_rollout_wg = SimpleNamespace(_dispatch_info={"actor": list(range(DP))})


def _put_rollouts(batch, partition: str):
    """The step batch into TransferQueue as verl's v1 agent loop writes it (agent_loop_tq.py): one
    key ``{uid}_{session}_{index}`` per response, unpadded fields, a ``seq_len`` tag. -> KVBatchMeta"""
    from verl.utils.tensordict_utils import list_of_dict_to_tensordict

    t = batch.batch
    p_width = t["prompts"].shape[1]
    keys, fields, tags = [], [], []
    for i in range(len(batch)):
        prompt = t["prompts"][i][t["attention_mask"][i, :p_width].bool()]
        n = int(t["response_mask"][i].sum())
        response = t["responses"][i, :n]
        ids = torch.cat([prompt, response])
        uid = str(batch.non_tensor_batch["uid"][i])
        keys.append(f"{uid}_{i % vs.N}_0")
        fields.append(
            {
                "prompts": prompt,
                "responses": response,
                "response_mask": torch.ones(n, dtype=torch.int64),
                "loss_mask": torch.ones(n, dtype=torch.int64),
                "rm_scores": t["token_level_rewards"][i, :n].float(),
                "old_log_probs": t["old_log_probs"][i, :n],
                "input_ids": ids,
                "attention_mask": torch.ones_like(ids),
                "position_ids": torch.arange(len(ids)),
                "uid": uid,
            }
        )
        tags.append({"status": "success", "prompt_len": len(prompt), "response_len": n, "seq_len": len(ids)})
    return tq.kv_batch_put(
        keys=keys, partition_id=partition, fields=list_of_dict_to_tensordict(fields), tags=tags
    )


def test_the_v1_trainers_balance_and_advantage_then_verls_update_equal_aggbenchs_gradient(store, model_dir):
    from transformers import AutoTokenizer

    extra = ["trainer.use_v1=true", "trainer.balance_batch=true"]  # verl's defaults, as documented
    config = adapter.compose_config(
        vs.overrides("aggbench_balanced", SUM, mini_batches=1, dp=DP, extra=extra)
    )
    assert bool(config.trainer.use_v1)
    model = vs.load_model(model_dir)
    batch = vs.make_batch(model_dir)
    vs.add_old_logprobs(model, batch)
    meta = _put_rollouts(batch, "train")
    key_row = {k: i for i, k in enumerate(meta.keys)}

    driver = _Driver(config, AutoTokenizer.from_pretrained(model_dir))
    metrics: dict = {}
    meta = driver._balance_batch(meta, metrics=metrics)
    order = [key_row[k] for k in meta.keys]
    assert sorted(order) == list(range(len(batch)))  # nothing padded: 16 rows, a multiple of 2 x 16
    assert order != sorted(order)  # the control: the v1 trainer did reorder the rows across ranks
    driver._compute_advantage(meta, metrics=metrics)  # our estimator, through verl's v1 dispatch

    got = tq.kv_batch_get(keys=meta.keys, partition_id="train", select_fields=["advantages", "returns"])
    v1_adv = got["advantages"].to_padded_tensor(padding=0.0)  # [B, longest response], v1 order
    # what the legacy driver's call writes for the same rows (B x the rule on the whole batch;
    # tests/integrations/test_verl.py checks that against the rule itself)
    legacy = vs.compute_advantage(vs.make_batch(model_dir), config).batch["advantages"][order]
    torch.testing.assert_close(v1_adv.double(), legacy[:, : v1_adv.shape[1]].double(), rtol=1e-6, atol=1e-7)
    assert float(legacy[:, v1_adv.shape[1] :].abs().sum()) == 0.0
    assert float(v1_adv.abs().max()) > 0  # the rule gave the mixed groups a signal

    # verl's actor update on the batch as the v1 trainer hands it over: its row order, its advantages
    ordered = batch.select_idxs(order)
    adv = torch.zeros_like(ordered.batch["old_log_probs"])
    adv[:, : v1_adv.shape[1]] = v1_adv.to(adv.dtype)
    ordered.batch["advantages"] = adv * ordered.batch["response_mask"]
    [(rows, grads)] = vs.verl_update_gradients(model, ordered, config)
    assert sorted(rows) == list(range(len(batch)))
    want = vs.aggbench_gradient(model, ordered, rows, make_instance("balanced"))
    assert vs.relative_difference(grads, want) < 1e-6
    tq.kv_clear(keys=meta.keys, partition_id="train")


def test_the_v1_trainers_padding_rows_get_no_weight_and_shrink_the_step_as_verls_own_modes_do(
    store, model_dir
):
    """A step with fewer prompts than configured (an async or filtered step): the v1 trainer appends
    empty padding rows (``upsample_batch_to_divisible_size``: one padding uid, no response tokens, no
    reward) before the estimator runs, so the estimator sees the configured row count. The padding
    rows get zero advantages, and each real row gets what the rule gives it on the real rows x
    (real prompt groups / groups with the padding one, here 3 / 4 = real rows / configured rows): the
    padding is one more all-zero group of the batch. verl's own seq-mean modes shrink a short step
    by the same factor (they divide by the configured mini-batch rows)."""
    from transformers import AutoTokenizer
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    extra = ["trainer.use_v1=true", "trainer.balance_batch=true"]
    config = adapter.compose_config(
        vs.overrides("aggbench_balanced", SUM, mini_batches=1, dp=DP, extra=extra)
    )
    model = vs.load_model(model_dir)
    batch = vs.make_batch(model_dir)
    vs.add_old_logprobs(model, batch)
    real = len(batch) - vs.N  # one prompt group fewer than configured
    short = batch.select_idxs(np.arange(real))
    meta = _put_rollouts(short, "short")
    key_row = {k: i for i, k in enumerate(meta.keys)}
    driver = _Driver(config, AutoTokenizer.from_pretrained(model_dir))
    meta = driver._balance_batch(meta, metrics={})
    assert len(meta) == len(batch)  # padded up to the mini-batch rows, which the row check expects
    padding = [bool(tag.get("is_padding")) for tag in meta.tags]
    assert sum(padding) == vs.N
    driver._compute_advantage(meta, metrics={})
    got = tq.kv_batch_get(keys=meta.keys, partition_id="short", select_fields=["advantages"])
    v1_adv = [row for row in got["advantages"].unbind()]
    assert all(float(a.abs().sum()) == 0.0 for a, pad in zip(v1_adv, padding, strict=True) if pad)

    t = short.batch
    grpo, _ = compute_grpo_outcome_advantage(
        t["token_level_rewards"], t["response_mask"], short.non_tensor_batch["uid"]
    )
    alone = adapter.effective_advantages(  # the rule on the real rows alone, x 3 / 4
        make_instance("balanced"), grpo, t["response_mask"], short.non_tensor_batch["uid"]
    ) * (real / len(batch))
    for a, key, pad in zip(v1_adv, meta.keys, padding, strict=True):
        if not pad:
            row = key_row[key]
            n = int(t["response_mask"][row].sum())
            torch.testing.assert_close(a.double(), alone[row, :n].double(), rtol=1e-6, atol=1e-7)
    assert float(alone.abs().max()) > 0
    tq.kv_clear(keys=meta.keys, partition_id="short")


def test_the_monitor_under_the_v1_trainer_leaves_its_grpo_advantages_and_queues_the_metrics(store, model_dir):
    """algorithm.adv_estimator=aggbench_monitor_grpo through the v1 trainer's _compute_advantage gives
    the advantages v1 gives ``grpo`` (its own per-session GRPO branch), row for row, and queues the
    aggbench/* metrics for the step's next Tracking.log."""
    from transformers import AutoTokenizer

    from aggbench.integrations import verl_monitor

    tok = AutoTokenizer.from_pretrained(model_dir)
    extra = ["trainer.use_v1=true", "trainer.balance_batch=true"]
    batch = vs.make_batch(model_dir)
    vs.add_old_logprobs(vs.load_model(model_dir), batch)
    got = {}
    for name in ("grpo", verl_monitor.NAME):
        config = adapter.compose_config(
            vs.overrides(name, "seq-mean-token-mean", mini_batches=1, dp=DP, extra=extra)
        )
        meta = _put_rollouts(batch, name)
        meta = _Driver(config, tok)._balance_batch(meta, metrics={})
        verl_monitor._PENDING.clear()
        _Driver(config, tok)._compute_advantage(meta, metrics={})
        pending = dict(verl_monitor._PENDING)
        out = tq.kv_batch_get(keys=meta.keys, partition_id=name, select_fields=["advantages"])
        rows = [k.rsplit("_", 2)[0] + "_" + k.rsplit("_", 2)[1] for k in meta.keys]
        got[name] = (dict(zip(rows, out["advantages"].unbind(), strict=True)), pending)
        tq.kv_clear(keys=meta.keys, partition_id=name)
    (plain, none), (monitored, metrics) = got["grpo"], got[verl_monitor.NAME]
    assert not none and plain.keys() == monitored.keys()
    for key, adv in plain.items():
        torch.testing.assert_close(monitored[key], adv, rtol=0, atol=0)
    assert any(float(a.abs().sum()) > 0 for a in plain.values())
    for key in (
        "len/cv",
        "len/gap",
        "run/weight_ratio",
        "agg/balanced/weight_ratio",
        "agg/token/weight_ratio",
    ):
        assert f"aggbench/{key}" in metrics, key
    # the run's own mode here is seq-mean-token-mean: the sequence rule
    assert metrics["aggbench/run/weight_ratio"] == pytest.approx(
        metrics["aggbench/agg/sequence/weight_ratio"]
    )
