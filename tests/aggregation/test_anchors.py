"""Anchor equivalence: aggbench's batch-scope rules reproduce verl's and TRL's loss aggregation.

aggbench computes effective advantages eff = rule(mask, A, group_ids) [B, T] once, and the loss is
the plain token sum ``pg_loss(logp, old_logp, eff, mask)``. verl and TRL evaluate the clipped
per-token loss with the raw advantage A broadcast over tokens and then aggregate it. On the same
tensors the two must give the same loss and the same gradient w.r.t. logp, because PPO clipping
(including clip-higher and dual clip) depends only on the sign of the advantage.

Mapping (batch scope; N sequences, L_max the configured maximum response length):

    aggbench        verl agg_loss                               TRL GRPOTrainer loss_type
    token           token-mean                                  dapo; bnpo (one micro-batch only)
    sequence        seq-mean-token-mean                         grpo
    seq_sum         seq-mean-token-sum                          -
    constant        seq-mean-token-sum-norm (verl >= 0.7.1)     dr_grpo
    N * constant    seq-mean-token-sum-norm (verl <= 0.6.1)     -

The anchors are reimplemented from the cited sources (a few lines each, in tests/helpers/anchor_refs.py) so
the suite runs without verl; ``test_verl_installed_agg_loss_matches`` calls the real verl functions
when verl is importable. TRL has no standalone loss function (the aggregation lives inside
``GRPOTrainer._compute_loss``), so its lines are reimplemented and cited.

Gradient accumulation and empty responses: test_anchors_micro_batch.py.
"""

from __future__ import annotations

import inspect
import os
from fractions import Fraction

import pytest
import torch

from aggbench.aggregation import mask_from_lengths
from helpers.anchor_refs import (
    DUAL_CLIP,
    EPS_HIGH,
    EPS_LOW,
    SEEDS,
    VERL_MODES,
    aggbench_loss,
    assert_same,
    loss_and_grad,
    random_batch,
    trl_loss,
    trl_per_token_loss,
    verl_agg_loss,
    verl_agg_loss_legacy,
    verl_per_token_loss,
)

# ============================================================================ 1. hand-worked numbers
# Three sequences, lengths 2, 3, 1, padded width T = L_max = 4, A = [1, -1, 0.5], ratio = 1 (so no
# clipping and the per-token loss is -A on every valid token):
#   per-sequence token sums  s = [-2, 3, -0.5] (total 0.5);  token means m = [-1, 1, -0.5];
#   6 tokens, N = 3, L_max = 4.
#   token-mean / dapo / bnpo         = 0.5 / 6            =  1/12
#   seq-mean-token-mean / grpo       = (-1 + 1 - 0.5) / 3 = -1/6
#   seq-mean-token-sum               = 0.5 / 3            =  1/6
#   dr_grpo, verl>=0.7.1 sum-norm    = 0.5 / (3 * 4)      =  1/24
#   verl<=0.6.1 sum-norm             = 0.5 / 4            =  1/8   (= N * the 1/24 above)
HAND_LENGTHS, HAND_T, HAND_ADV = [2, 3, 1], 4, [1.0, -1.0, 0.5]


def _verl(mode):
    return lambda x, m: verl_agg_loss(x, m, mode)


def _legacy(mode):
    return lambda x, m: verl_agg_loss_legacy(x, m, mode)


def _trl(loss_type):
    return lambda x, m: trl_loss(x, m, loss_type, max_completion_length=HAND_T)


TOKEN, SEQ, SEQ_SUM, CONST = ("token", {}), ("sequence", {}), ("seq_sum", {}), ("constant", {"max_length": 4})
HAND_CASES = {  # anchor id: (anchor(per_token_loss, mask), hand value, (aggbench rule, params), scale)
    "verl token-mean": (_verl("token-mean"), Fraction(1, 12), TOKEN, 1),
    "verl seq-mean-token-mean": (_verl("seq-mean-token-mean"), Fraction(-1, 6), SEQ, 1),
    "verl seq-mean-token-sum": (_verl("seq-mean-token-sum"), Fraction(1, 6), SEQ_SUM, 1),
    "verl seq-mean-token-sum-norm": (_verl("seq-mean-token-sum-norm"), Fraction(1, 24), CONST, 1),
    "legacy verl token-mean": (_legacy("token-mean"), Fraction(1, 12), TOKEN, 1),
    "legacy verl seq-mean-token-mean": (_legacy("seq-mean-token-mean"), Fraction(-1, 6), SEQ, 1),
    "legacy verl seq-mean-token-sum": (_legacy("seq-mean-token-sum"), Fraction(1, 6), SEQ_SUM, 1),
    "legacy verl seq-mean-token-sum-norm": (_legacy("seq-mean-token-sum-norm"), Fraction(1, 8), CONST, 3),
    "trl dapo": (_trl("dapo"), Fraction(1, 12), TOKEN, 1),
    "trl bnpo": (_trl("bnpo"), Fraction(1, 12), TOKEN, 1),
    "trl grpo": (_trl("grpo"), Fraction(-1, 6), SEQ, 1),
    "trl dr_grpo": (_trl("dr_grpo"), Fraction(1, 24), CONST, 1),
}


@pytest.mark.parametrize(("anchor", "expected", "rule", "scale"), HAND_CASES.values(), ids=HAND_CASES.keys())
def test_hand_worked_anchor_numbers(anchor, expected, rule, scale):
    mask = mask_from_lengths(HAND_LENGTHS, HAND_T)
    adv = torch.tensor(HAND_ADV, dtype=torch.float64)
    logp = torch.full((3, HAND_T), -0.7, dtype=torch.float64)  # ratio = 1 everywhere
    per_token = trl_per_token_loss(logp, logp, adv)
    assert_same(per_token, -adv[:, None].expand(3, HAND_T))  # ratio 1: the per-token loss is -A
    assert_same(verl_per_token_loss(logp, logp, adv), per_token)
    want = torch.tensor(float(expected), dtype=torch.float64)
    assert_same(anchor(per_token, mask), want)
    name, params = rule
    assert_same(scale * aggbench_loss(name, logp, logp, adv, mask, **params), want)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_batches_exercise_every_clipping_regime(seed):
    """Guard: the equivalence tests below are not vacuous; every clip branch is hit."""
    logp, old_logp, adv, mask, _ = random_batch(seed)
    ratio, a, m = torch.exp(logp - old_logp), adv[:, None], mask
    assert ((ratio > 1 + EPS_HIGH) & (a > 0) & m).any()  # clipped high
    assert ((ratio < 1 - EPS_LOW) & (a < 0) & m).any()  # clipped low
    assert ((ratio > 1.2) & (ratio <= 1 + EPS_HIGH) & (a > 0) & m).any()  # clip-higher band
    assert ((ratio > DUAL_CLIP) & (a < 0) & m).any()  # dual clip
    # and the per-token losses really differ with and without dual clip on this batch
    assert not torch.allclose(
        verl_per_token_loss(logp, old_logp, adv) * m, trl_per_token_loss(logp, old_logp, adv) * m
    )


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("mode", "rule", "params", "scale"), VERL_MODES, ids=[m[0] for m in VERL_MODES])
def test_random_equivalence_verl(seed, mode, rule, params, scale):
    logp, old_logp, adv, mask, gid = random_batch(seed)

    def anchor(x):
        return verl_agg_loss(verl_per_token_loss(x, old_logp, adv), mask, mode)

    def ours(x):
        return scale * aggbench_loss(rule, x, old_logp, adv, mask, gid, dual_clip=DUAL_CLIP, **params)

    (la, ga), (lo, go) = loss_and_grad(anchor, logp), loss_and_grad(ours, logp)
    assert_same(lo, la)
    assert_same(go, ga)
    assert ga.abs().sum() > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_random_equivalence_verl_configured_max_length(seed):
    """constant(max_length=L) == verl>=0.7.1 sum-norm with loss_scale_factor=L, L above the width."""
    logp, old_logp, adv, mask, gid = random_batch(seed)

    def anchor(x):
        return verl_agg_loss(
            verl_per_token_loss(x, old_logp, adv), mask, "seq-mean-token-sum-norm", loss_scale_factor=16
        )

    def ours(x):
        return aggbench_loss("constant", x, old_logp, adv, mask, gid, dual_clip=DUAL_CLIP, max_length=16)

    (la, ga), (lo, go) = loss_and_grad(anchor, logp), loss_and_grad(ours, logp)
    assert_same(lo, la)
    assert_same(go, ga)


LEGACY_MODES = [
    ("token-mean", "token", {}, lambda n: 1),
    ("seq-mean-token-mean", "sequence", {}, lambda n: 1),
    ("seq-mean-token-sum", "seq_sum", {}, lambda n: 1),
    ("seq-mean-token-sum-norm", "constant", {}, lambda n: n),  # no 1/N: N * constant
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("mode", "rule", "params", "scale"), LEGACY_MODES, ids=[m[0] for m in LEGACY_MODES])
def test_random_equivalence_verl_legacy(seed, mode, rule, params, scale):
    logp, old_logp, adv, mask, gid = random_batch(seed)
    n = adv.shape[0]

    def anchor(x):
        return verl_agg_loss_legacy(verl_per_token_loss(x, old_logp, adv), mask, mode)

    def ours(x):
        return scale(n) * aggbench_loss(rule, x, old_logp, adv, mask, gid, dual_clip=DUAL_CLIP, **params)

    (la, ga), (lo, go) = loss_and_grad(anchor, logp), loss_and_grad(ours, logp)
    assert_same(lo, la)
    assert_same(go, ga)


TRL_TYPES = [
    # (TRL loss_type, aggbench rule, params builder from max_completion_length)
    ("dapo", "token", lambda lmax: {}),
    ("bnpo", "token", lambda lmax: {}),  # the whole batch is one micro-batch here
    ("grpo", "sequence", lambda lmax: {}),
    ("dr_grpo", "constant", lambda lmax: {"max_length": lmax}),
]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("max_completion_length", [10, 16])
@pytest.mark.parametrize(("loss_type", "rule", "params"), TRL_TYPES, ids=[t[0] for t in TRL_TYPES])
def test_random_equivalence_trl(seed, max_completion_length, loss_type, rule, params):
    logp, old_logp, adv, mask, gid = random_batch(seed)  # padded width 10

    def anchor(x):
        return trl_loss(
            trl_per_token_loss(x, old_logp, adv), mask, loss_type, max_completion_length=max_completion_length
        )

    def ours(x):
        return aggbench_loss(rule, x, old_logp, adv, mask, gid, **params(max_completion_length))

    (la, ga), (lo, go) = loss_and_grad(anchor, logp), loss_and_grad(ours, logp)
    assert_same(lo, la)
    assert_same(go, ga)


# ============================================================================ 2. the real verl


def _verl_losses(core_algos, actor_config_cls, mode, batch):
    """Three ways to get verl's loss on one batch, each a function of logp [B, T] -> scalar."""
    _, old_logp, adv, mask, _ = batch
    adv_bt = adv[:, None].expand_as(old_logp).contiguous()

    def agg(x):
        return core_algos.agg_loss(verl_per_token_loss(x, old_logp, adv), mask, mode)

    def full(x):
        cfg = actor_config_cls(
            strategy="fsdp", rollout_n=4, ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=4,
            clip_ratio=EPS_LOW, clip_ratio_low=EPS_LOW, clip_ratio_high=EPS_HIGH, clip_ratio_c=DUAL_CLIP,
            loss_agg_mode=mode,
        )  # fmt: skip
        loss, _ = core_algos.compute_policy_loss_vanilla(old_logp, x, adv_bt, mask, mode, cfg)
        return loss

    def micro(x):
        # two unequal micro-batches with verl's global batch info, summed: equals the full batch
        kw = {"batch_num_tokens": mask.sum(), "global_batch_size": mask.shape[0]}
        parts = (slice(0, 3), slice(3, mask.shape[0]))
        return sum(
            core_algos.agg_loss(verl_per_token_loss(x[s], old_logp[s], adv[s]), mask[s], mode, **kw)
            for s in parts
        )

    return {"agg_loss": agg, "compute_policy_loss_vanilla": full, "agg_loss over micro-batches": micro}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("mode", "rule", "params", "scale"), VERL_MODES, ids=[m[0] for m in VERL_MODES])
def test_verl_installed_agg_loss_matches(seed, mode, rule, params, scale):
    """Call the installed verl's agg_loss and compute_policy_loss_vanilla on random tensors.

    Needs verl (pip install --no-deps verl) plus ray, tensordict<=0.10, omegaconf and codetiming,
    which verl imports at module level on the way to core_algos.
    """
    if os.environ.get("AGGBENCH_REQUIRE_VERL"):  # the verl leg (`make test-verl`): never skip there
        import verl.trainer.ppo.core_algos as core_algos
    else:
        core_algos = pytest.importorskip(
            "verl.trainer.ppo.core_algos",
            reason="verl's config stack (omegaconf) is installed only in its own environment: `make test-verl`",
        )
    from verl.workers.config import ActorConfig

    assert {"batch_num_tokens", "global_batch_size", "loss_scale_factor"} <= set(
        inspect.signature(core_algos.agg_loss).parameters
    ), "this test handles verl >= 0.7.1's agg_loss; older verl is covered by verl_agg_loss_legacy"
    batch = random_batch(seed)
    logp, old_logp, adv, mask, gid = batch

    def ours(x):
        return scale * aggbench_loss(rule, x, old_logp, adv, mask, gid, dual_clip=DUAL_CLIP, **params)

    def local(x):
        return verl_agg_loss(verl_per_token_loss(x, old_logp, adv), mask, mode)

    (lo, go), (ll, gl) = loss_and_grad(ours, logp), loss_and_grad(local, logp)
    for name, fn in _verl_losses(core_algos, ActorConfig, mode, batch).items():
        lv, gv = loss_and_grad(fn, logp)
        drift = f"{name}: the local reimplementation no longer matches the installed verl"
        assert_same(lv, ll, msg=drift)
        assert_same(gv, gl, msg=drift)
        assert_same(lv, lo, msg=f"{name} vs aggbench {rule}: loss")
        assert_same(gv, go, msg=f"{name} vs aggbench {rule}: gradient")
