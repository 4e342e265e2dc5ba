"""Anchor equivalence under gradient accumulation, and empty responses (see test_anchors.py).

TRL sums the gradients of its micro-batches' losses; aggbench computes the weights once on the whole
batch, so its accumulated loss equals the full-batch loss for every rule, while TRL's bnpo does not.
"""

from __future__ import annotations

import pytest
import torch

from aggbench.aggregation import RuleInstance, mask_from_lengths
from aggbench.train.objective import pg_loss
from helpers.anchor_refs import (
    EPS_HIGH,
    EPS_LOW,
    SEEDS,
    aggbench_loss,
    assert_same,
    loss_and_grad,
    random_batch,
    trl_loss,
    trl_per_token_loss,
    verl_agg_loss,
)

# ============================================================================ 3. micro-batches
# TRL splits the generation batch into steps_per_generation (= gradient_accumulation_steps by
# default) equal slices (split_tensor_dict) and SUMS the gradients of the slices' losses.


def trl_accumulated(logp, old_logp, adv, mask, loss_type, k, max_completion_length):
    """TRL's accumulated loss over k equal micro-batches (one process)."""
    b = adv.shape[0] // k
    n_items = mask.sum()
    total = 0.0
    for i in range(k):
        sl = slice(i * b, (i + 1) * b)
        ptl = trl_per_token_loss(logp[sl], old_logp[sl], adv[sl])
        total = total + trl_loss(
            ptl,
            mask[sl],
            loss_type,
            max_completion_length=max_completion_length,
            num_items_in_batch=n_items,
            grad_accum=k,
            steps_per_generation=k,
        )
    return total


def test_micro_batch_hand_worked():
    # 4 sequences in 2 micro-batches, ratio = 1 (per-token loss -A), L_max = 3:
    #   micro-batch 1: lengths [1, 1], A = [1, 1]   -> token sum -2 over 2 tokens
    #   micro-batch 2: lengths [3, 3], A = [-1, -1] -> token sum +6 over 6 tokens
    # token-mean of the whole batch (= dapo accumulated)  = (-2 + 6) / 8      =  0.5
    # bnpo accumulated = (1/2) * (-2/2) + (1/2) * (6/6)                       =  0
    mask = mask_from_lengths([1, 1, 3, 3])
    adv = torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64)
    logp = torch.full((4, 3), -1.0, dtype=torch.float64)
    acc = {t: trl_accumulated(logp, logp, adv, mask, t, 2, 3) for t in ("bnpo", "dapo")}
    assert acc["bnpo"].item() == pytest.approx(0.0, abs=1e-15)
    assert acc["dapo"].item() == pytest.approx(0.5, abs=1e-15)
    full_bnpo = trl_loss(trl_per_token_loss(logp, logp, adv), mask, "bnpo", max_completion_length=3)
    assert full_bnpo.item() == pytest.approx(0.5, abs=1e-15)  # one micro-batch: bnpo is token-mean
    eff = RuleInstance("t", "token", {})(mask, adv, torch.zeros(4, dtype=torch.long))  # whole batch
    ours = sum(pg_loss(logp[s], logp[s], eff[s], mask[s]) for s in (slice(0, 2), slice(2, 4)))
    assert ours.item() == pytest.approx(0.5, abs=1e-15)


@pytest.mark.parametrize("seed", SEEDS)
def test_micro_batch_bnpo_differs_token_does_not(seed):
    logp, old_logp, adv, mask, gid = random_batch(seed)
    halves = (slice(0, 4), slice(4, 8))
    if int(mask[halves[0]].sum()) == int(mask[halves[1]].sum()):
        # equal token counts would make bnpo exact by coincidence: change sequence 0's length by one
        n0 = int(mask[0].sum())
        mask[0] = torch.arange(mask.shape[1]) < (n0 + 1 if n0 < mask.shape[1] else n0 - 1)
    assert int(mask[halves[0]].sum()) != int(mask[halves[1]].sum())

    def full_token(x):
        return aggbench_loss("token", x, old_logp, adv, mask, gid)

    def ours_accumulated(x):
        # weights computed ONCE on the whole batch, then the token sum over each micro-batch
        eff = RuleInstance("t", "token", {"scope": "batch"})(mask, adv, gid)
        return sum(
            pg_loss(x[s], old_logp[s], eff[s], mask[s], clip_low=EPS_LOW, clip_high=EPS_HIGH) for s in halves
        )

    def trl_acc(loss_type):
        return lambda x: trl_accumulated(x, old_logp, adv, mask, loss_type, 2, 10)

    def trl_full(loss_type):
        return lambda x: trl_loss(
            trl_per_token_loss(x, old_logp, adv), mask, loss_type, max_completion_length=10
        )

    lt, gt = loss_and_grad(full_token, logp)
    lo, go = loss_and_grad(ours_accumulated, logp)
    assert_same(lo, lt)
    assert_same(go, gt)
    # dapo normalises by the generation batch's token count: exact under accumulation
    ld, gd = loss_and_grad(trl_acc("dapo"), logp)
    assert_same(ld, lt)
    assert_same(gd, gt)
    # grpo and dr_grpo (equal micro-batch sizes): accumulated == full batch
    for loss_type in ("grpo", "dr_grpo"):
        la, ga = loss_and_grad(trl_acc(loss_type), logp)
        lf, gf = loss_and_grad(trl_full(loss_type), logp)
        assert_same(la, lf)
        assert_same(ga, gf)
    # bnpo normalises per micro-batch: differs from token-mean and from full-batch bnpo
    lb, gb = loss_and_grad(trl_acc("bnpo"), logp)
    lbf, _ = loss_and_grad(trl_full("bnpo"), logp)
    assert_same(lbf, lt)  # full-batch bnpo IS token-mean
    assert (lb - lt).abs() > 1e-6
    assert (gb - gt).abs().max() > 1e-6


# ============================================================================ empty responses


def test_empty_response_counts_in_n_like_trl_grpo_not_verl():
    """A length-0 response: `sequence` counts it in N like TRL grpo; verl >= 0.6.1 drops it from N.

    Lengths [2, 0, 1], A = [1, 2, 1], ratio 1 (per-token loss -A): token means [-1, 0, -1] (the empty
    one is 0/clamp(0, min=1) in TRL), sum -2. TRL grpo: -2/3. verl: seq_mask drops the empty one,
    -2/2 = -1. aggbench sequence (c_i = 1/(N |o_i|) with N = 3): -2/3. (Legacy verl gives NaN.)
    """
    mask = mask_from_lengths([2, 0, 1], 2)
    adv = torch.tensor([1.0, 2.0, 1.0], dtype=torch.float64)
    logp = torch.full((3, 2), -0.3, dtype=torch.float64)
    per_token = trl_per_token_loss(logp, logp, adv)
    ours = aggbench_loss("sequence", logp, logp, adv, mask)
    assert ours.item() == pytest.approx(-2 / 3, rel=1e-12)
    assert trl_loss(per_token, mask, "grpo", max_completion_length=2).item() == pytest.approx(
        -2 / 3, rel=1e-12
    )
    # verl's own 1e-8 keeps 0 / (0 + 1e-8) finite for the empty sequence
    assert verl_agg_loss(per_token, mask, "seq-mean-token-mean").item() == pytest.approx(-1.0, rel=1e-12)
