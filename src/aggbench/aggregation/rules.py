"""The built-in aggregation rules, each a weighting over the whole mini-batch.

Every rule returns effective advantages [B, T] = c_i * A_i on each token of sequence i (0 on
padding); the loss is the token SUM of the clipped objective evaluated with them. Notation: N
sequences in the mini-batch, |o_i| the response length of sequence i, G_g the size of group g,
n_g the number of groups. ``scope="batch"`` applies the formula to the whole mini-batch (verl's
and TRL's behaviour when the mini-batch is one backward pass); ``scope="group"`` applies it inside
each prompt group and averages the groups (1/n_g). ``include_zero_groups`` says whether groups
whose advantages are all zero (no learning signal) still count in the denominators (verl and TRL
count them: True).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

from aggbench.aggregation.contract import Scope, check_inputs, register_rule
from aggbench.aggregation.ops import broadcast, groups_of, safe_reciprocal


def _lengths_and_groups(mask: Tensor, advantages: Tensor, group_ids: Tensor, include_zero_groups: bool):
    m = check_inputs(mask, advantages, group_ids)
    g = groups_of(advantages, group_ids, include_zero_groups)
    return m, m.sum(dim=1), g, g.counted.to(advantages.dtype)


@register_rule("token", version="1")
def token(
    mask: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    *,
    scope: Scope = "batch",
    include_zero_groups: bool = True,
) -> Tensor:
    """DAPO token-mean: c_i = 1 / sum_j |o_j| (every token of the mini-batch counts equally).

    Source: DAPO (arXiv 2503.14476) token-level policy-gradient loss. Equals verl
    ``loss_agg_mode="token-mean"`` with the global token count and TRL ``loss_type="dapo"``; TRL
    ``bnpo`` equals it only when the mini-batch is one micro-batch. Group scope: c_i = 1 / (n_g * T_g).

    mask: [B, T]; advantages: [B]; group_ids: [B] -> [B, T].
    """
    m, lengths, g, cnt = _lengths_and_groups(mask, advantages, group_ids, include_zero_groups)
    if scope == "batch":
        coef = safe_reciprocal((lengths * cnt).sum()).expand_as(lengths)
    else:
        coef = safe_reciprocal(g.gather(g.sum(lengths * cnt))) / g.n_counted
    return broadcast(coef * cnt * advantages, m)


@register_rule("sequence", version="1", sign_balanced=True)
def sequence(
    mask: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    *,
    scope: Scope = "batch",
    include_zero_groups: bool = True,
) -> Tensor:
    """GRPO seq-mean-token-mean: c_i = 1 / (N * |o_i|) (token mean per sequence, then sequence mean).

    Source: GRPO (DeepSeekMath, arXiv 2402.03300). Equals verl ``seq-mean-token-mean`` and TRL
    ``loss_type="grpo"``. Group scope: c_i = 1 / (n_g * G_g * |o_i|) (the same when groups are equal).

    mask: [B, T]; advantages: [B]; group_ids: [B] -> [B, T].
    """
    m, lengths, g, cnt = _lengths_and_groups(mask, advantages, group_ids, include_zero_groups)
    if scope == "batch":
        per_seq = safe_reciprocal(cnt.sum()).expand_as(lengths)
    else:
        per_seq = safe_reciprocal(g.gather(g.sum(cnt))) / g.n_counted
    return broadcast(per_seq * safe_reciprocal(lengths) * cnt * advantages, m)


@register_rule("seq_sum", version="1", sign_balanced=False)
def seq_sum(
    mask: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    *,
    scope: Scope = "batch",
    include_zero_groups: bool = True,
) -> Tensor:
    """seq-mean-token-sum: c_i = 1 / N (token sum per sequence, then sequence mean).

    Source: verl ``loss_agg_mode="seq-mean-token-sum"``. Group scope: c_i = 1 / (n_g * G_g).

    mask: [B, T]; advantages: [B]; group_ids: [B] -> [B, T].
    """
    m, lengths, g, cnt = _lengths_and_groups(mask, advantages, group_ids, include_zero_groups)
    if scope == "batch":
        coef = safe_reciprocal(cnt.sum()).expand_as(lengths)
    else:
        coef = safe_reciprocal(g.gather(g.sum(cnt))) / g.n_counted
    return broadcast(coef * cnt * advantages, m)


@register_rule("constant", version="1")
def constant(
    mask: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    *,
    max_length: int | None = None,
    scope: Scope = "batch",
    include_zero_groups: bool = True,
) -> Tensor:
    """Dr. GRPO: c_i = 1 / (N * L_max), a constant normaliser (L_max = configured max response length).

    Source: Dr. GRPO (arXiv 2503.20783). Equals TRL ``loss_type="dr_grpo"`` (L_max =
    max_completion_length) and verl >= 0.7.1 ``seq-mean-token-sum-norm`` (sum / (N * L_max) with
    global counts); verl <= 0.6.1's ``seq-mean-token-sum-norm`` is the batch token sum / L_max, i.e.
    this rule times N (tests/aggregation/test_anchors.py checks both). ``max_length=None`` uses
    the mini-batch's padded width T, which is only stable if responses are padded to the
    configured maximum: the trainer always passes the configured ``sampling.max_new_tokens``.

    mask: [B, T]; advantages: [B]; group_ids: [B] -> [B, T].
    """
    m, lengths, g, cnt = _lengths_and_groups(mask, advantages, group_ids, include_zero_groups)
    l_max = float(max_length if max_length is not None else mask.shape[1])
    if l_max <= 0:
        raise ValueError(f"constant: max_length must be positive; got {max_length}")
    if scope == "batch":
        coef = safe_reciprocal(cnt.sum()).expand_as(lengths)
    else:
        coef = safe_reciprocal(g.gather(g.sum(cnt))) / g.n_counted
    return broadcast(coef * cnt * advantages / l_max, m)


@register_rule("balanced", version="2", sign_balanced=True)
def balanced(
    mask: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    *,
    scope: Scope = "group",
    variant: Literal["proportional", "mass", "count"] = "proportional",
    include_zero_groups: bool = True,
) -> Tensor:
    """Balanced Aggregation: token mean inside each sign subset, subsets weighted by sequence share.

    Source: "Balanced Aggregation: Understanding and Fixing Aggregation Bias in GRPO" (arXiv
    2605.04077). Per unit u (a group at ``scope="group"``, the mini-batch at ``"batch"``) of n_u
    sequences, with S+ = {A_i > 0}, S- = {A_i < 0}, T_S the token count of subset S, M_S = sum_{i in
    S} |A_i| and k = |S+|:

        binary rewards:  L_BA = (k/n_u) (1/T+) sum_{S+} sum_t l  +  ((n_u-k)/n_u) (1/T-) sum_{S-} sum_t l

    For non-binary rewards the paper weights by "advantage mass"; its exact formula is not available,
    so ``variant`` picks a reading (all three are identical for binary rewards at group scope; at
    batch scope |A| differs between groups of one sign, and they differ):
      - ``proportional`` (default since version 2): token of i in S gets A_i * M_S / (n_u * sum_{j
        in S} |A_j| |o_j|). The binary formula averages l_{i,t}, which contains A_i, over a subset's
        tokens; this keeps A_i inside that token mean AND fixes each sign's total at M_S / n_u, the
        two things the paper states. A response's weight goes to 0 with its advantage (an
        overlong-penalised correct answer is pushed less than a clean one: docs/aggregations.md).
      - ``mass`` (version 1's default; the instance ``balanced_mass``): every token of S gets
        sign(S) * M_S / (n_u * T_S): tokens count equally inside a sign whatever their own |A_i|;
        same per-sign total M_S / n_u.
      - ``count``: the displayed formula literally, A_i * |S| / (n_u * T_S) (weights k/n_u, (n_u-k)/n_u
        whatever the advantages' sizes; not sign-balanced for non-binary rewards).
    Zero-advantage sequences carry no gradient. Group scope averages the groups (1/n_g).

    mask: [B, T]; advantages: [B]; group_ids: [B] -> [B, T].
    """
    m, lengths, g, cnt = _lengths_and_groups(mask, advantages, group_ids, include_zero_groups)
    pos = advantages > 0
    neg = advantages < 0
    dtype = advantages.dtype
    if scope == "group":
        unit = g.index
        n_units = g.n
        unit_size = g.gather(g.sum(cnt))
        scale = 1.0 / g.n_counted
    else:
        unit = g.index.new_zeros(g.index.shape)
        n_units = 1
        unit_size = cnt.sum().expand_as(lengths)
        scale = 1.0
    # one bin per (unit, sign): 2u for S+, 2u+1 for S-; zero-advantage sequences add nothing
    subset = unit * 2 + neg.long()
    in_subset = (pos | neg).to(dtype) * cnt

    def per_subset(values: Tensor) -> Tensor:
        sums = values.new_zeros(2 * n_units).index_add_(0, subset, values * in_subset)
        return sums[subset]

    abs_adv = advantages.abs()
    tokens_s = per_subset(lengths)
    if variant == "mass":
        sign = pos.to(dtype) - neg.to(dtype)
        per_seq = sign * per_subset(abs_adv) * safe_reciprocal(tokens_s)
    elif variant == "proportional":
        per_seq = advantages * per_subset(abs_adv) * safe_reciprocal(per_subset(abs_adv * lengths))
    elif variant == "count":
        per_seq = advantages * per_subset(torch_ones_like(lengths)) * safe_reciprocal(tokens_s)
    else:  # guarded by RuleInstance; direct callers get a clear error too
        raise ValueError(f"balanced: variant must be 'proportional', 'mass' or 'count'; got {variant!r}")
    per_seq = per_seq * safe_reciprocal(unit_size) * scale * in_subset
    return broadcast(per_seq, m)


def torch_ones_like(x: Tensor) -> Tensor:
    return x.new_ones(x.shape)
