"""Per-step diagnostics: what every rule would do to the same batch.

Because a rule is an explicit weighting, its effect on a batch is cheap to measure without another
forward pass: the total gradient weight each advantage sign receives (sum of |effective advantage|
over that sign's tokens), and, given the per-token clipped loss at unit advantage, the policy-
gradient loss the rule would report. Together with the response-length statistics per sign these
are the paper's explanatory variables; the trainer logs them every step for every rule.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from aggbench.aggregation.contract import RuleInstance, builtin_instances, check_inputs
from aggbench.aggregation.ops import groups_of


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


def length_stats(mask: Tensor, advantages: Tensor, group_ids: Tensor) -> dict[str, float]:
    """Response-length statistics by advantage sign, and the number of zero-variance groups.

    mask: [B, T]; advantages: [B]; group_ids: [B]. Keys: len/mean, len/cv, len/pos_mean, len/pos_cv,
    len/neg_mean, len/neg_cv, len/gap (pos_mean - neg_mean), groups/zero_variance, groups/total.
    """
    m = check_inputs(mask, advantages, group_ids)
    lengths = m.sum(dim=1)
    out: dict[str, float] = {}
    out["len/mean"], out["len/cv"] = _mean_cv(lengths)
    out["len/pos_mean"], out["len/pos_cv"] = _mean_cv(lengths[advantages > 0])
    out["len/neg_mean"], out["len/neg_cv"] = _mean_cv(lengths[advantages < 0])
    out["len/gap"] = out["len/pos_mean"] - out["len/neg_mean"]
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
) -> dict[str, float]:
    """Length statistics plus, for every rule instance, its per-sign weights (and loss if given).

    mask: [B, T]; advantages: [B]; group_ids: [B]; unit_loss: optional [B, T] clipped loss at unit
    advantage of each token's sign (``aggbench.train.objective.unit_pg_loss``). ``instances`` defaults to
    every registered rule at its defaults plus the built-in variants; pass the run's own instances
    merged in so a user's rule is reported too. Keys: ``agg/<name>/weight_pos``, ``.../weight_neg``,
    ``.../weight_ratio`` (pos / neg), ``.../pg_loss``.
    """
    out = length_stats(mask, advantages, group_ids)
    insts = dict(builtin_instances())
    if instances:
        insts.update(instances)
    with torch.no_grad():
        for name, inst in insts.items():
            eff = inst(mask, advantages, group_ids)
            wp, wn = sign_weights(eff, advantages)
            out[f"agg/{name}/weight_pos"] = wp
            out[f"agg/{name}/weight_neg"] = wn
            out[f"agg/{name}/weight_ratio"] = wp / wn if wn > 0 else math.nan
            if unit_loss is not None:
                out[f"agg/{name}/pg_loss"] = float((eff.abs() * unit_loss).sum())
    return out
