"""Loss aggregation of verl and TRL, reimplemented from the cited sources (a few lines each), and
aggbench's side of the comparison, shared by tests/aggregation/test_anchors.py (hand-worked numbers,
random-batch equivalence, the installed verl) and test_anchors_micro_batch.py (gradient
accumulation, empty responses). See test_anchors.py for the mapping between the three.
"""

from __future__ import annotations

import torch

from aggbench.aggregation import RuleInstance, mask_from_lengths
from aggbench.train.objective import pg_loss

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


VERL_MODES = [
    # (verl mode, aggbench rule, params, scale: aggbench * scale == verl)
    ("token-mean", "token", {}, 1),
    ("seq-mean-token-mean", "sequence", {}, 1),
    ("seq-mean-token-sum", "seq_sum", {}, 1),
    ("seq-mean-token-sum-norm", "constant", {}, 1),  # L_max = padded width T (verl's default)
]
