"""aggbench rules inside TRL's GRPOTrainer (aggbench.integrations.trl), on the built-in tiny model.

Real TRL throughout: the trainer samples with the tiny model, scores with the task's reward, and
steps its own optimiser. The equivalences are TRL's invariant-test style: the first step's gradient
equals aggbench's own trainer's for the same batch and advantages, and 16 rows x 1 accumulation
step gives the gradient of 2 rows x 8.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from transformers import AutoModelForCausalLM  # noqa: E402

from aggbench.aggregation import make_instance  # noqa: E402
from aggbench.integrations import trl as adapter  # noqa: E402
from helpers.trl_support import G, group_seeded_rollout, grpo_args, recording_trainer, reward  # noqa: E402

HERE = Path(__file__).resolve().parent


def _aggbench_gradient(model_dir, batch, rule, *, micro_batch_size=4):
    """aggbench's own update (train/update.py) on TRL's generation batch with TRL's advantages."""
    from aggbench.train.batching import PackedBatch
    from aggbench.train.scoring import ScoredBatch
    from aggbench.train.update import LossSettings, MiniBatch, accumulate_gradients

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    mask = batch["seen_loss_mask"].bool()
    packed = PackedBatch(
        input_ids=torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1),
        attention_mask=torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1),
        response_mask=mask,
        prompt_lens=batch["prompt_mask"].sum(1),
        response_lens=batch["completion_mask"].sum(1),
    )
    adv = batch["seen_advantages"].double()
    b = adv.shape[0]
    gids = torch.arange(b) // G
    eff = rule(mask, adv, gids)
    rows = torch.arange(b)
    settings = LossSettings(clip_low=0.2, clip_high=0.28, micro_batch_size=micro_batch_size)
    scored = ScoredBatch(packed, mask, adv, gids)
    accumulate_gradients(model, scored, MiniBatch.whole(rows, eff, torch.zeros_like(eff)), settings)
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _scale(g):
    return max(float(v.abs().max()) for v in g.values())


@pytest.mark.timeout(900)
def test_balanced_trains_two_steps(tiny_sft_model, tmp_path):
    trainer, grads = recording_trainer(tiny_sft_model, tmp_path, dtype=torch.float32, max_steps=2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    assert trainer.state.global_step == 2 and len(grads.steps) == 2
    assert any(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    # what TRL's loss received: the rule's weights times the batch's token count, per token
    for batch in trainer.batches:
        expected = make_instance("balanced")(
            batch["seen_loss_mask"], batch["seen_advantages"].double(), torch.arange(16) // G
        ).float()
        assert batch["advantages"].shape == batch["completion_mask"].shape
        torch.testing.assert_close(batch["seen_effective"], expected)
        torch.testing.assert_close(batch["advantages"], expected * batch["completion_mask"].sum())
    assert any(float(b["seen_advantages"].abs().sum()) > 0 for b in trainer.batches)  # a real signal


@pytest.mark.timeout(900)
@pytest.mark.parametrize("rule", ["balanced", "token", "sequence"])
def test_first_step_gradient_equals_aggbench_trainer(tiny_sft_model, tmp_path, rule):
    """float64: TRL's first optimiser step with the adapter == aggbench's trainer on the same batch
    and the same advantages (TRL's advantage epsilon differs from aggbench's, so the advantages are
    TRL's for both)."""
    trainer, grads = recording_trainer(tiny_sft_model, tmp_path, aggregation=rule)
    trainer.train()
    (batch,) = trainer.batches
    assert float(batch["seen_advantages"].abs().sum()) > 0, (
        "no reward variance: the comparison would be empty"
    )
    ours = _aggbench_gradient(tiny_sft_model, batch, make_instance(rule))
    assert _scale(ours) > 1e-6
    assert _max_diff(grads.steps[0], ours) < 1e-6 * max(1.0, _scale(ours))


@pytest.mark.timeout(900)
def test_sixteen_by_one_equals_two_by_eight(tiny_sft_model, tmp_path):
    """per_device_train_batch_size 16 x accumulation 1 == 2 x 8 (one generation batch of 16 either way;
    the same samples in both through group_seeded_rollout)."""
    # TRL's fused log-prob kernel works in float32 even for a float64 model, so the micro-batch shapes
    # move the gradient at float32 rounding (~2e-7 of its scale measured); a weighting computed per
    # micro-batch would move it by percents
    _layouts_agree(tiny_sft_model, tmp_path)


@pytest.mark.timeout(900)
def test_two_gloo_processes_equal_one_process(tiny_sft_model, tmp_path):
    """A real 2-process CPU run (torch.distributed.run, gloo, DDP's all-reduce): the same two groups as
    the 1-process run, one per rank, and the same first-step gradient."""
    one, g_one = recording_trainer(tiny_sft_model, tmp_path / "one", rollout=group_seeded_rollout)
    one.train()
    out = tmp_path / "two"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")])}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(HERE / "trl_worker.py"), str(tiny_sft_model), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = [torch.load(f"{out}.rank{r}.pt") for r in (0, 1)]
    (whole,) = one.batches
    for r, part in enumerate(ranks):  # rank r holds rows [8r, 8r + 8) of the 1-process batch
        rows = slice(8 * r, 8 * r + 8)
        t = part["batch"]["completion_ids"].shape[1]
        assert torch.equal(part["batch"]["prompt_ids"], whole["prompt_ids"][rows])
        assert torch.equal(part["batch"]["completion_ids"], whole["completion_ids"][rows, :t])
        assert torch.equal(part["batch"]["seen_advantages"], whole["seen_advantages"][rows])
        # the rule ran on the whole batch: each rank's weights are its rows of the 1-process weights
        torch.testing.assert_close(part["batch"]["seen_effective"], whole["seen_effective"][rows, :t])
    assert float(whole["seen_advantages"].abs().sum()) > 0
    g = g_one.steps[0]
    assert _scale(g) > 1e-6
    for part in ranks:  # after the all-reduce every rank holds the same gradient
        assert _max_diff(part["grads"], g) < 1e-6 * max(1.0, _scale(g))


PLUGIN = '''
from aggbench.aggregation import register_rule, broadcast, safe_reciprocal

@register_rule("trl_test_sqrt_length")
def sqrt_length(mask, advantages, group_ids):
    """Each response weighted by 1/sqrt(|o|), normalised by the batch size."""
    m = mask.to(advantages.dtype)
    w = safe_reciprocal(m.sum(1).sqrt()) / m.shape[0]
    return broadcast(advantages * w, m)
'''


@pytest.fixture
def plugin_file(tmp_path):
    """A user's rule module; its registration is removed afterwards (the registry is process-wide,
    and other tests compare every registered rule with what fresh worker processes know)."""
    from aggbench.aggregation.contract import RULES

    plugin = tmp_path / "my_rules.py"
    plugin.write_text(textwrap.dedent(PLUGIN))
    yield plugin
    RULES.remove("trl_test_sqrt_length")
    sys.modules.pop("aggbench_plugin_my_rules", None)


@pytest.mark.timeout(900)
def test_a_users_plugin_rule_runs_through_the_adapter(tiny_sft_model, tmp_path, plugin_file):
    trainer, grads = recording_trainer(
        tiny_sft_model, tmp_path, aggregation="trl_test_sqrt_length", plugins=[str(plugin_file)]
    )
    trainer.train()
    (batch,) = trainer.batches
    m = batch["seen_loss_mask"].double()
    by_hand = (
        batch["seen_advantages"].double()[:, None] * m / m.sum(1, keepdim=True).sqrt().clamp_min(1e-30) / 16
    )
    torch.testing.assert_close(batch["seen_effective"], by_hand * (m.sum(1, keepdim=True) > 0))
    ours = _aggbench_gradient(tiny_sft_model, batch, make_instance("trl_test_sqrt_length"))
    assert _max_diff(grads.steps[0], ours) < 1e-6 * max(1.0, _scale(ours))


# --- refusals: before TRL loads anything (the model name below does not exist) -------------------

REFUSALS = {
    "loss_type": ({"loss_type": "grpo"}, r"loss_type='grpo'.*set loss_type='dapo'"),
    "steps_per_generation": (
        {"steps_per_generation": 2},
        r"steps_per_generation=2 with gradient_accumulation_steps=1.*set steps_per_generation equal",
    ),
    "importance_sampling_level": (
        {
            "importance_sampling_level": "sequence"
        },  # TRL's trainer would reject it with dapo, later and in its words
        r"importance_sampling_level='sequence'.*set importance_sampling_level='token'",
    ),
    "top_entropy_quantile": (
        {"top_entropy_quantile": 0.2},
        r"top_entropy_quantile=0.2.*set top_entropy_quantile=1.0",
    ),
    "entropy_coef": ({"entropy_coef": 0.01}, r"entropy_coef=0.01.*set entropy_coef=0.0"),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_each_inexact_setting_is_refused_before_training(tmp_path, name):
    over, message = REFUSALS[name]
    with pytest.raises(adapter.AdapterConfigError, match=message) as err:
        adapter.AggregationGRPOTrainer(
            model="no/such-model",
            reward_funcs=reward,
            args=grpo_args(tmp_path, **over),
            aggregation="balanced",
        )
    assert "\n" not in str(err.value)


def test_constant_divides_by_trls_completion_budget_not_the_batch_width(tiny_sft_model, tmp_path):
    """Dr. GRPO's L_max through the adapter: GRPOConfig.max_completion_length (48 here, as
    loss_type="dr_grpo" uses), not each batch's padded width (TRL pads a batch to its longest
    completion); an instance's own max_length is kept."""
    trainer, _ = recording_trainer(tiny_sft_model, tmp_path / "a", aggregation="constant")
    assert trainer.aggregation.rule == "constant" and trainer.aggregation.params["max_length"] == 48
    own = make_instance("dr_100", "constant", {"max_length": 100})
    trainer, _ = recording_trainer(tiny_sft_model, tmp_path / "b", aggregation=own)
    assert trainer.aggregation.params["max_length"] == 100


def test_an_unknown_rule_lists_the_valid_names(tmp_path):
    with pytest.raises(Exception, match=r"balanced.*sequence.*token|Known: .*balanced"):
        adapter.AggregationGRPOTrainer(
            model="no/such-model", reward_funcs=reward, args=grpo_args(tmp_path), aggregation="balanced_typo"
        )


# --- the private TRL surface the adapter relies on ----------------------------------------------


def test_the_private_trl_signatures_are_the_ones_the_adapter_relies_on():
    """Fails loudly when TRL changes what the adapter overrides or what its loss reads."""
    import inspect

    from trl import GRPOTrainer

    adapter.check_trl_version(GRPOTrainer)  # the two overridden/called signatures (raises when they change)
    loss_src = inspect.getsource(GRPOTrainer._compute_loss)
    # the (B, T) advantages path and dapo's normaliser (global tokens / processes x GA / SPG)
    assert "advantages.dim() == 1" in loss_src
    assert 'inputs["num_items_in_batch"]' in loss_src and "steps_per_generation" in loss_src
    assert GRPOTrainer.loss_is_scaled_for_ga is True  # the Trainer does not divide by GA again

    class Changed(GRPOTrainer):
        def _generate_and_score_completions(self, inputs, extra):
            raise AssertionError

    with pytest.raises(
        RuntimeError, match=r"_generate_and_score_completions has parameters \['self', 'inputs', 'extra'\]"
    ):
        adapter.check_trl_version(Changed)


def _layouts_agree(model_dir, tmp_path, steps=1, **over):
    """16 rows x 1 accumulation step and 2 x 8 on the same samples: each optimiser step's gradient."""
    whole, g_whole = recording_trainer(
        model_dir, tmp_path / "a", rollout=group_seeded_rollout, per_device_train_batch_size=16, **over
    )
    split, g_split = recording_trainer(
        model_dir,
        tmp_path / "b",
        rollout=group_seeded_rollout,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=8,
        **over,
    )
    whole.train()
    split.train()
    whole.grads = g_whole
    for a, b in zip(whole.batches, split.batches, strict=True):
        for key in ("prompt_ids", "completion_ids", "completion_mask", "seen_advantages"):
            assert torch.equal(a[key], b[key]), f"the two runs sampled different batches ({key})"
    assert len(g_whole.steps) == len(g_split.steps) == steps
    for a, b in zip(g_whole.steps, g_split.steps, strict=True):
        assert _scale(a) > 1e-6
        assert _max_diff(a, b) < 1e-6 * max(1.0, _scale(a))
    return whole


@pytest.mark.timeout(900)
def test_beta_above_zero_is_exact_under_accumulation(tiny_sft_model, tmp_path):
    """The KL term (TRL's token mean over the generation batch under dapo) keeps 16 x 1 == 2 x 8 over
    two steps. The first step starts at the reference model, where the KL gradient is 0; at the
    second it is on: that step's gradient differs from a beta = 0 run's on the same samples."""
    with_kl = _layouts_agree(tiny_sft_model, tmp_path / "kl", steps=2, beta=0.5, max_steps=2)
    plain, g_plain = recording_trainer(
        tiny_sft_model,
        tmp_path / "plain",
        rollout=group_seeded_rollout,
        per_device_train_batch_size=16,
        max_steps=2,
    )
    plain.train()
    for a, b in zip(with_kl.batches, plain.batches, strict=True):
        assert torch.equal(a["completion_ids"], b["completion_ids"])  # the same samples at both steps
    g_kl = with_kl.grads.steps
    assert _max_diff(g_kl[0], g_plain.steps[0]) < 1e-9 * _scale(g_plain.steps[0])
    assert _max_diff(g_kl[1], g_plain.steps[1]) > 1e-4 * _scale(g_plain.steps[1])


@pytest.mark.timeout(900)
def test_num_iterations_two_is_exact_under_accumulation(tiny_sft_model, tmp_path):
    """Two optimiser steps on one generation batch (num_iterations=2: the second at ratio != 1, with
    TRL's old log-probs): each step's gradient is the same at 16 x 1 and 2 x 8, and the rule's
    weights are the batch's both times."""
    trainer = _layouts_agree(tiny_sft_model, tmp_path, steps=2, num_iterations=2, max_steps=2)
    assert len(trainer.batches) == 1  # one generation batch served both steps


@pytest.mark.timeout(900)
def test_mask_truncated_completions_reaches_the_rule(tiny_sft_model, tmp_path):
    """Truncated completions masked out by TRL are masked for the rule too: the rule saw TRL's loss
    mask (truncated rows all 0), and the first step's gradient equals aggbench's update on it."""
    trainer, grads = recording_trainer(
        tiny_sft_model,
        tmp_path,
        aggregation="balanced",
        mask_truncated_completions=True,
        max_completion_length=6,
    )
    trainer.train()
    (batch,) = trainer.batches
    seen = batch["seen_loss_mask"]
    truncated = seen.sum(1) == 0
    assert bool(truncated.any()) and bool((~truncated).any()), "the test needs truncated and finished rows"
    assert torch.equal(seen, batch["completion_mask"])
    assert bool((batch["seen_effective"][truncated] == 0).all())
    assert float(batch["seen_effective"][~truncated].abs().sum()) > 0, "no signal among the finished rows"
    ours = _aggbench_gradient(tiny_sft_model, batch, make_instance("balanced"))
    assert _scale(ours) > 1e-6
    assert _max_diff(grads.steps[0], ours) < 1e-6 * max(1.0, _scale(ours))
