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

The anchors are reimplemented here from the cited sources (a few lines each) so the suite runs
without verl; ``test_verl_installed_agg_loss_matches`` calls the real verl functions when verl
is importable. TRL has no standalone loss function (the aggregation lives inside
``GRPOTrainer._compute_loss``), so its lines are reimplemented and cited.
"""

from __future__ import annotations

import inspect
from fractions import Fraction

import pytest
import torch

from aggbench.aggregation import RuleInstance, mask_from_lengths
from aggbench.objective import pg_loss

EPS_LOW, EPS_HIGH, DUAL_CLIP = 0.2, 0.28, 3.0
SEEDS = [0, 1, 2, 3, 4, 5]


# ============================================================================ anchors, from source
# --- TRL 1.16.0, trl/trainer/grpo_trainer.py (installed copy; GRPOTrainer._compute_loss) --------
# L3083-3095: log_ratio = logp - old_logp; coef_1 = exp(log_ratio) (importance_sampling_level="token")
# L3112-3120: coef_2 = clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high);
#             per_token_loss = -min(coef_1 * A, coef_2 * A)  (args.delta=None: no two-sided clip)
# L3153-3175: the aggregation per loss_type (below). L2498: num_items_in_batch is the loss-mask
# token count of the whole generation batch, gathered over processes. L285:
# loss_is_scaled_for_ga = True, so transformers' Trainer does not divide again: the accumulated
# gradient is the SUM of the micro-batch losses returned here.
# The same grpo / bnpo / dr_grpo formulas (without the /grad_accum and without dapo) are at
# huggingface/trl commit d2b69d769dab6f77acbfd33252bcd7d22765571b, same file, _compute_loss.


def trl_per_token_loss(logp, old_logp, adv, eps_low=EPS_LOW, eps_high=EPS_HIGH):
    """TRL's clipped per-token loss. logp, old_logp: [B, T]; adv: [B] -> [B, T]."""
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    a = adv.unsqueeze(1)
    return -torch.min(coef_1 * a, coef_2 * a)


def trl_loss(
    per_token_loss,
    mask,
    loss_type,
    *,
    max_completion_length,
    num_items_in_batch=None,
    grad_accum=1,
    steps_per_generation=1,
    num_processes=1,
):
    """TRL's aggregation of one micro-batch (train mode). per_token_loss, mask: [b, T] -> scalar."""
    mask = mask.to(per_token_loss.dtype)
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / grad_accum
    if loss_type == "bnpo":
        return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0) / grad_accum
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length) / grad_accum
    if loss_type == "dapo":
        if num_items_in_batch is None:  # the micro-batch is the whole generation batch
            num_items_in_batch = mask.sum()
        normalizer = torch.as_tensor(num_items_in_batch, dtype=mask.dtype).clamp(min=1.0) / num_processes
        normalizer = normalizer * grad_accum / steps_per_generation
        return (per_token_loss * mask).sum() / normalizer
    raise ValueError(loss_type)


# --- verl: per-token loss of compute_policy_loss_vanilla (verl 0.9.1 wheel,
# verl/trainer/ppo/core_algos.py L1286; the same lines are in compute_policy_loss at volcengine/verl
# commit 26b5d6b2bbf0202683e49d9999f9174179ab5af3). Dual clip (clip_ratio_c = 3.0, verl's default)
# caps the loss of negative-advantage tokens at -A * c; the log-ratio is clamped to [-20, 20].


def verl_per_token_loss(logp, old_logp, adv, clip_low=EPS_LOW, clip_high=EPS_HIGH, clip_ratio_c=DUAL_CLIP):
    """verl's clipped per-token loss. logp, old_logp: [B, T]; adv: [B] (broadcast) -> [B, T]."""
    adv = adv.unsqueeze(1).expand_as(logp)
    ratio = torch.exp(torch.clamp(logp - old_logp, min=-20.0, max=20.0))
    losses1 = -adv * ratio
    losses2 = -adv * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip1 = torch.maximum(losses1, losses2)
    clip2 = torch.min(-adv * clip_ratio_c, clip1)
    return torch.where(adv < 0, clip2, clip1)


# --- verl agg_loss, current form: verl 0.9.1 wheel, verl/trainer/ppo/core_algos.py L1140 (agg_loss)
# (identical in the 0.7.1 and 0.8.0 wheels). Global counts make it micro-batch invariant; empty
# sequences are dropped from the sequence count. seq-mean-token-mean divides by (length + 1e-8),
# with the length summed in the MASK's dtype, as verl does: for a bool mask (what verl's ppo_loss
# passes) that is int64, int64 + 1e-8 is a float32 tensor, and the 1e-8 rounds away for every
# length >= 1 (an empty sequence gets 0 / 1e-8 = 0). So the mode is exact for bool masks.


def verl_agg_loss(
    loss_mat,
    loss_mask,
    mode,
    *,
    dp_size=1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
):
    """loss_mat: [b, T] float; loss_mask: [b, T] (bool in verl) -> scalar."""
    if mode == "token-mean":
        n_tok = loss_mask.sum() if batch_num_tokens is None else batch_num_tokens
        return (loss_mat * loss_mask).sum() / n_tok * dp_size
    lengths = torch.sum(loss_mask, dim=-1)
    seq_mask = (lengths > 0).to(loss_mat.dtype)
    n_seq = seq_mask.sum() if global_batch_size is None else global_batch_size
    if mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        loss = ((loss_mat * loss_mask).sum(-1) * seq_mask).sum() / n_seq * dp_size
        if mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    if mode == "seq-mean-token-mean":
        seq_losses = (loss_mat * loss_mask).sum(-1) / (lengths + 1e-8)
        return (seq_losses * seq_mask).sum() / n_seq * dp_size
    raise ValueError(mode)


# --- verl agg_loss, legacy form: volcengine/verl commit 26b5d6b2bbf0202683e49d9999f9174179ab5af3,
# verl/trainer/ppo/core_algos.py, def agg_loss (same formulas in the 0.4.1, 0.5.0 and 0.6.1 wheels;
# 0.6.1 adds the 1e-8 and drops empty sequences). Per-micro-batch normalisation; the sum-norm
# mode divides the batch token sum by the padded width only, with no 1/N.


def verl_agg_loss_legacy(loss_mat, loss_mask, mode):
    """loss_mat, loss_mask: [b, T] -> scalar."""
    m = loss_mask.to(loss_mat.dtype)
    if mode == "token-mean":
        return (loss_mat * m).sum() / m.sum()
    if mode == "seq-mean-token-sum":
        return (loss_mat * m).sum(-1).mean()
    if mode == "seq-mean-token-mean":
        return ((loss_mat * m).sum(-1) / m.sum(-1)).mean()
    if mode == "seq-mean-token-sum-norm":
        return (loss_mat * m).sum() / loss_mask.shape[-1]
    raise ValueError(mode)


# ============================================================================ aggbench side


def aggbench_loss(rule, logp, old_logp, adv, mask, group_ids=None, *, dual_clip=None, **params):
    """aggbench's loss: effective advantages from the rule at batch scope, then the token sum."""
    if group_ids is None:
        group_ids = torch.zeros(adv.shape[0], dtype=torch.long)
    eff = RuleInstance(f"anchor_{rule}", rule, {"scope": "batch", **params})(mask, adv, group_ids)
    return pg_loss(logp, old_logp, eff, mask, clip_low=EPS_LOW, clip_high=EPS_HIGH, dual_clip=dual_clip)


def loss_and_grad(fn, logp):
    """Evaluate fn(logp) -> scalar and its gradient w.r.t. logp [B, T]."""
    x = logp.detach().clone().requires_grad_(True)
    loss = fn(x)
    (grad,) = torch.autograd.grad(loss, x)
    return loss.detach(), grad


def assert_same(a, b, atol=1e-12, msg=None):
    torch.testing.assert_close(a, b, rtol=0.0, atol=atol, msg=msg)


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


# ============================================================================ random batches


def random_batch(seed, *, n_groups=2, group_size=4, t=10, zero_group=None):
    """(logp, old_logp [B, T], adv [B], mask [B, T] bool, group_ids [B]) in float64.

    Lengths 1..t; ratios exp(N(0, 0.6)) so many tokens are clipped, plus four pinned tokens that
    put every clipping regime in play whatever the seed: A > 0 at ratio 1.25 (inside clip-higher's
    band, outside a symmetric 0.2 one) and 1.5 (clipped high), A < 0 at ratio 0.5 (clipped low) and
    4.0 (dual-clipped at c = 3). ``zero_group`` (default: even seeds) zeroes the last group's
    advantages: verl and TRL still count those sequences in every denominator.
    """
    gen = torch.Generator().manual_seed(seed)
    b = n_groups * group_size
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    mask = mask_from_lengths(lengths, t)
    adv = torch.randn(b, generator=gen, dtype=torch.float64)
    sign = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    adv[:4] = sign * (adv[:4].abs() + 0.1)
    old_logp = -torch.rand(b, t, generator=gen, dtype=torch.float64) * 3 - 0.05
    log_ratio = 0.6 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    log_ratio[:4, 0] = torch.log(torch.tensor([1.25, 0.5, 1.5, 4.0], dtype=torch.float64))
    if zero_group is None:
        zero_group = seed % 2 == 0
    if zero_group:
        adv[-group_size:] = 0.0
    group_ids = torch.arange(n_groups).repeat_interleave(group_size)
    return old_logp + log_ratio, old_logp, adv, mask, group_ids


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


VERL_MODES = [
    # (verl mode, aggbench rule, params, scale: aggbench * scale == verl)
    ("token-mean", "token", {}, 1),
    ("seq-mean-token-mean", "sequence", {}, 1),
    ("seq-mean-token-sum", "seq_sum", {}, 1),
    ("seq-mean-token-sum-norm", "constant", {}, 1),  # L_max = padded width T (verl's default)
]


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
    core_algos = pytest.importorskip(
        "verl.trainer.ppo.core_algos",
        reason="verl not installed (pip install --no-deps verl; then ray, tensordict<=0.10, omegaconf, codetiming)",
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
