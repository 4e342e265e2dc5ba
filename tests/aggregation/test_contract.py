"""Contract tests, parametrised over the registry: every rule instance must satisfy them."""

from __future__ import annotations

import math

import pytest
import torch

from aggbench.aggregation.advantages import grpo
from aggbench.aggregation.diagnostics import sign_weights
from aggbench.train.objective import pg_loss
from helpers.support import contract_instances, instance_ids, random_batch

INSTANCES = contract_instances()


def _batch(seed, **kw):
    mask, rewards, gids = random_batch(seed, **kw)
    adv = grpo(rewards, gids, std="bessel")
    return mask, adv, gids


@pytest.mark.parametrize("inst", INSTANCES, ids=instance_ids(INSTANCES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_finite_masked_signed(inst, seed):
    mask, adv, gids = _batch(seed, binary=seed != 2, zero_group=seed == 1)
    eff = inst(mask, adv, gids)
    assert eff.shape == mask.shape and eff.dtype == adv.dtype
    assert torch.isfinite(eff).all()
    assert (eff[~mask] == 0).all(), "effective advantages must be zero on padding"
    # a weighting: same sign as the advantage on every real token, zero where A == 0
    signs = torch.sign(adv)[:, None].expand_as(eff)
    assert (torch.sign(eff[mask]) == signs[mask]).all()
    assert (eff[adv == 0] == 0).all()


@pytest.mark.parametrize("inst", INSTANCES, ids=instance_ids(INSTANCES))
def test_permutation_invariant(inst):
    mask, adv, gids = _batch(3, binary=False)
    perm = torch.randperm(mask.shape[0], generator=torch.Generator().manual_seed(5))
    eff = inst(mask, adv, gids)
    eff_p = inst(mask[perm], adv[perm], gids[perm])
    torch.testing.assert_close(eff_p, eff[perm], rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("inst", INSTANCES, ids=instance_ids(INSTANCES))
def test_microbatch_and_rank_split_sum_to_full_loss(inst):
    """Weights computed once on the whole mini-batch, the per-slice loss sums are the full loss,
    and so are the gradients w.r.t. the log-probs (linear pipeline check; the transformer-level
    version is tests/aggregation/test_exactness.py)."""
    mask, adv, gids = _batch(4)
    gen = torch.Generator().manual_seed(9)
    old = -torch.rand(mask.shape, generator=gen, dtype=torch.float64)
    logp = (old + 0.3 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)).requires_grad_()
    eff = inst(mask, adv, gids)
    clip = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}
    full = pg_loss(logp, old, eff, mask, **clip)
    (g_full,) = torch.autograd.grad(full, logp)
    perm = torch.randperm(mask.shape[0], generator=gen)
    total = 0.0
    g_acc = torch.zeros_like(logp)
    for idx in torch.tensor_split(perm, 5):
        part = pg_loss(logp[idx], old[idx], eff[idx], mask[idx], **clip)
        (g,) = torch.autograd.grad(part, logp)
        g_acc += g
        total = total + part.detach()
    torch.testing.assert_close(total, full.detach(), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(g_acc, g_full, rtol=1e-12, atol=1e-14)


def _population_batch(lengths, rewards):
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    rewards = torch.tensor(rewards, dtype=torch.float64)
    gids = torch.zeros(len(lengths), dtype=torch.long)
    return mask, grpo(rewards, gids, std="population", eps=0.0), gids


BALANCED = [i for i in INSTANCES if i.spec.sign_balanced and i.params.get("scope", "group") == "group"]


@pytest.mark.parametrize("inst", BALANCED, ids=instance_ids(BALANCED))
@pytest.mark.parametrize(
    "lengths,rewards",
    [
        ([3, 10, 4, 7, 20], [1, 0, 1, 0, 0]),
        ([1, 2, 50, 4], [1, 1, 1, 0]),
        ([8, 8, 2, 30, 5, 6], [0, 1, 0, 0, 0, 1]),
    ],
)
def test_sign_balanced_rules_give_each_sign_sqrt_k_g_minus_k_over_g(inst, lengths, rewards):
    mask, adv, gids = _population_batch(lengths, rewards)
    g, k = len(rewards), sum(rewards)
    wp, wn = sign_weights(inst(mask, adv, gids), adv)
    expected = math.sqrt(k * (g - k)) / g
    assert wp == pytest.approx(expected, rel=1e-12)
    assert wn == pytest.approx(expected, rel=1e-12)


def test_sign_balance_over_several_groups_is_the_group_average():
    mask, rewards, gids = random_batch(11, n_groups=5, group_size=6)
    adv = grpo(rewards, gids, std="population", eps=0.0)
    expected = 0.0
    for gid in gids.unique():
        r = rewards[gids == gid]
        k, g = float(r.sum()), r.numel()
        expected += math.sqrt(k * (g - k)) / g / 5
    for inst in BALANCED:
        wp, wn = sign_weights(inst(mask, adv, gids), adv)
        assert wp == pytest.approx(expected, rel=1e-12), inst.name
        assert wn == pytest.approx(expected, rel=1e-12), inst.name


def test_bessel_std_keeps_signs_equal_scaled_by_sqrt_g_minus_1_over_g():
    lengths, rewards = [3, 10, 4, 7, 20], [1, 0, 1, 0, 0]
    mask = torch.arange(20)[None, :] < torch.tensor(lengths)[:, None]
    r = torch.tensor(rewards, dtype=torch.float64)
    gids = torch.zeros(5, dtype=torch.long)
    adv = grpo(r, gids, std="bessel", eps=0.0)
    for inst in BALANCED:
        wp, wn = sign_weights(inst(mask, adv, gids), adv)
        assert wp == pytest.approx(wn, rel=1e-12)
        assert wp == pytest.approx(math.sqrt(2 * 3) / 5 * math.sqrt(4 / 5), rel=1e-12)


TOKEN_SCOPES = [i for i in INSTANCES if i.rule == "token"]


@pytest.mark.parametrize("inst", TOKEN_SCOPES, ids=instance_ids(TOKEN_SCOPES))
def test_token_is_unbalanced_exactly_when_mean_lengths_differ(inst):
    # mean length of positives 5, of negatives 20: unequal weights
    mask, adv, gids = _population_batch([4, 6, 10, 30, 20], [1, 1, 0, 0, 0])
    wp, wn = sign_weights(inst(mask, adv, gids), adv)
    assert wp != pytest.approx(wn, rel=1e-6)
    # token-mean: w_S = T_S |A_S| / T, so w+/w- = mean_len+ / mean_len-
    assert wp / wn == pytest.approx(5 / 20, rel=1e-12)
    # equal mean lengths (different individual lengths): balanced
    mask, adv, gids = _population_batch([4, 6, 10, 2, 3], [1, 1, 0, 0, 0])
    wp, wn = sign_weights(inst(mask, adv, gids), adv)
    assert wp == pytest.approx(wn, rel=1e-12)
