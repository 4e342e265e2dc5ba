"""Per-step diagnostics: what every rule would do to the same batch.

Because a rule is an explicit weighting, its effect on a batch is cheap to measure without another
forward pass: the total gradient weight each advantage sign receives (sum of |effective advantage|
over that sign's tokens), and, given the per-token clipped loss at unit advantage, the policy-
gradient loss the rule would report. Together with the response-length statistics per sign these
are the paper's explanatory variables; the trainer logs them every step for every rule, computed on
the optimiser mini-batches its updates used (a rule weights each mini-batch on its own).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from aggbench.aggregation.contract import AggregationInputError, RuleInstance, builtin_instances, check_inputs
from aggbench.aggregation.ops import Groups, groups_of


def sign_weights(eff_adv: Tensor, advantages: Tensor) -> tuple[float, float]:
    """Total |effective advantage| over the tokens of positive and of negative sequences.

    eff_adv: [B, T]; advantages: [B] -> (weight_pos, weight_neg).
    """
    per_seq = eff_adv.abs().sum(dim=1)
    return float(per_seq[advantages > 0].sum()), float(per_seq[advantages < 0].sum())


def _mean_cv(x: Tensor) -> tuple[float, float]:
    if x.numel() == 0:
        return math.nan, math.nan
    mean = float(x.mean())
    std = float(x.std(unbiased=False)) if x.numel() > 1 else 0.0
    return mean, (std / mean if mean > 0 else math.nan)


def _mean_finite(x: Tensor) -> float:
    """Mean of the finite entries of x [n]; NaN when there are none."""
    x = x[torch.isfinite(x)]
    return float(x.mean()) if x.numel() else math.nan


def _within_group(lengths: Tensor, advantages: Tensor, g: Groups) -> tuple[float, float]:
    """(cv_within, gap_within) of lengths [B] (float64) in the groups ``g`` (every group counted).

    cv_within: mean over groups of >= 2 responses with a positive mean length of std / mean
    (population std, as the pooled ``len/cv``); gap_within: mean over groups holding both a
    positive- and a negative-advantage response of mean(positive lengths) - mean(negative lengths).
    """
    size = g.size.to(lengths.dtype)  # [n]
    mean = g.sum(lengths) / size  # [n]
    var = g.sum((lengths - g.gather(mean)) ** 2) / size  # [n]
    ok = (size >= 2) & (mean > 0)
    cv = torch.where(ok, var.sqrt() / mean.clamp_min(1e-300), torch.full_like(mean, math.nan))
    pos, neg = (advantages > 0).to(lengths.dtype), (advantages < 0).to(lengths.dtype)
    n_pos, n_neg = g.sum(pos), g.sum(neg)  # [n]
    both = (n_pos > 0) & (n_neg > 0)
    gap = g.sum(lengths * pos) / n_pos.clamp_min(1) - g.sum(lengths * neg) / n_neg.clamp_min(1)
    return _mean_finite(cv), _mean_finite(torch.where(both, gap, torch.full_like(gap, math.nan)))


def length_stats(
    mask: Tensor, advantages: Tensor, group_ids: Tensor, *, lengths: Tensor | None = None
) -> dict[str, float]:
    """Response-length statistics by advantage sign, pooled and within group, and the number of
    zero-variance groups.

    mask: [B, T]; advantages: [B]; group_ids: [B]; lengths: optional [B] response lengths in tokens,
    default the mask's row sums. Pass them where the loss mask drops whole responses (the overlong
    filter empties a truncated response's row): the mask would count those as length 0. Keys:
    len/mean, len/cv, len/pos_mean, len/pos_cv, len/neg_mean, len/neg_cv, len/gap (pos_mean -
    neg_mean), len/cv_within, len/gap_within, groups/zero_variance, groups/total. All of the batch given: in the trainer the batch trained on,
    so under dynamic sampling ``groups/zero_variance`` counts only groups left when refills ran out;
    the groups the filter dropped are the trainer's ``groups/filtered`` (``aggbench.train.step_log``).

    The pooled statistics mix prompts: hard prompts draw long wrong answers and easy ones short right
    answers, so the pooled sign split carries prompt difficulty. The within-group ones compare
    responses to the same prompt: ``len/cv_within`` is the mean over groups of >= 2 responses (with a
    positive mean length) of each group's length CV (population std / mean, as ``len/cv``);
    ``len/gap_within`` is the mean over groups holding both a positive- and a negative-advantage
    response of (mean length of its positive responses - mean length of its negative ones). Each is
    NaN when no group qualifies.
    """
    m = check_inputs(mask, advantages, group_ids)
    if lengths is None:
        lengths = m.sum(dim=1)
    elif lengths.shape != advantages.shape:
        raise AggregationInputError(
            f"lengths must be a 1-D tensor [B] as advantages {tuple(advantages.shape)}; got {tuple(lengths.shape)}"
        )
    else:
        lengths = lengths.to(m.dtype)
    out: dict[str, float] = {}
    out["len/mean"], out["len/cv"] = _mean_cv(lengths)
    out["len/pos_mean"], out["len/pos_cv"] = _mean_cv(lengths[advantages > 0])
    out["len/neg_mean"], out["len/neg_cv"] = _mean_cv(lengths[advantages < 0])
    out["len/gap"] = out["len/pos_mean"] - out["len/neg_mean"]
    every = groups_of(advantages, group_ids, include_zero_groups=True)
    out["len/cv_within"], out["len/gap_within"] = _within_group(lengths.to(torch.float64), advantages, every)
    g = groups_of(advantages, group_ids, include_zero_groups=False)
    out["groups/total"] = float(g.n)
    out["groups/zero_variance"] = float(g.n - g.sum(g.counted.to(lengths.dtype)).gt(0).sum())
    return out


def diagnostics(
    mask: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    *,
    instances: Mapping[str, RuleInstance] | None = None,
    unit_loss: Tensor | None = None,
    minibatches: Sequence[Tensor] | None = None,
    lengths: Tensor | None = None,
) -> dict[str, float]:
    """Length statistics plus, for every rule instance, its per-sign weights (and loss if given).

    mask: [B, T]; advantages: [B]; group_ids: [B]; unit_loss: optional [B, T] clipped loss at unit
    advantage of each token's sign (``aggbench.train.objective.unit_pg_loss``); minibatches: the row
    indices ([b_k] long) of each optimiser mini-batch, default one holding every row; lengths:
    optional [B] response lengths for the ``len/*`` statistics (``length_stats``). ``instances``
    defaults to every registered rule at its defaults plus the built-in variants; pass the run's own
    instances merged in so a user's rule is reported too.

    Keys: ``agg/<name>/weight_pos``, ``.../weight_neg``, ``.../weight_ratio``, ``.../weight_sq``,
    ``.../pg_loss``. A rule
    weights each mini-batch on its own (what an update applies; a batch-scoped rule's weights of a
    mini-batch are not its rows of the whole batch's weights), so every value is computed per
    mini-batch from the weights ``inst(mask[rows], advantages[rows], group_ids[rows])`` and averaged
    over the mini-batches with equal weight, each being one optimiser update (every PPO epoch runs
    the same mini-batches with the same weights, so this is the mean over the step's updates; and
    ``weight_sq`` = mean_k sum Â_k ** 2 over mini-batch k's tokens, which tells rules apart where
    ``pg_loss`` cannot (sequence and balanced both give 0 at ratio 1 with binary rewards), comparable
    with the trainer's ``loss/weight_sq``, computed from the weights its loss applied):
    ``weight_pos`` = mean_k sum |Â_k| over the positive-advantage tokens of mini-batch k (likewise
    ``weight_neg``), ``pg_loss`` = mean_k sum |Â_k| x unit_loss, comparable with the trainer's
    ``loss/pg`` (also a mean over updates), and ``weight_ratio`` = weight_pos / weight_neg (the
    ratio of the means, finite where one mini-batch lacks a sign). For the run's own rule these are
    the weights its updates used; for the other rules, what they would have applied to the same
    mini-batches. With one mini-batch they are the whole batch's.
    """
    out = length_stats(mask, advantages, group_ids, lengths=lengths)
    insts = dict(builtin_instances())
    if instances:
        insts.update(instances)
    parts = list(minibatches) if minibatches is not None else [torch.arange(mask.shape[0])]
    with torch.no_grad():
        for name, inst in insts.items():
            wp = wn = loss = sq = 0.0
            for rows in parts:
                if rows.numel() == 0:  # (an empty mini-batch is no update: the trainer skips it)
                    continue
                eff = inst(mask[rows], advantages[rows], group_ids[rows])
                p, n = sign_weights(eff, advantages[rows])
                wp, wn = wp + p, wn + n
                sq += float(eff.double().square().sum())
                if unit_loss is not None:
                    loss += float((eff.abs() * unit_loss[rows]).sum())
            k = max(sum(1 for rows in parts if rows.numel()), 1)
            out[f"agg/{name}/weight_pos"] = wp / k
            out[f"agg/{name}/weight_neg"] = wn / k
            out[f"agg/{name}/weight_ratio"] = wp / wn if wn > 0 else math.nan
            out[f"agg/{name}/weight_sq"] = sq / k
            if unit_loss is not None:
                out[f"agg/{name}/pg_loss"] = loss / k
    return out


TRAINED_KEYS = ("weight_pos", "weight_neg", "weight_ratio", "pg_loss")


def trained_rule(values: dict[str, float], name: str) -> dict[str, float]:
    """The trained rule's own ``agg/<name>/*`` under fixed names, ``train/<key>`` (``TRAINED_KEYS``),
    so every cell's run holds them under one name whatever its rule (the chart view and the metric
    page compare cells by name); ``values``: ``diagnostics``' output for the run's rule ``name``."""
    return {f"train/{k}": values[f"agg/{name}/{k}"] for k in TRAINED_KEYS if f"agg/{name}/{k}" in values}
