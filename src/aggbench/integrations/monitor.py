"""What a run's own batches say about aggregation bias: the metrics the TRL and verl monitors log.

One function, ``monitor_metrics``, computed on a whole generation batch (every process's rows)
by the TRL monitor (``aggbench.integrations.trl_monitor``) and the verl hook, without changing the
training. Keys (all under ``aggbench/``):

- ``len/cv``, ``len/gap``, ``len/cv_within``, ``len/gap_within``: response-length CV and the
  right-minus-wrong length gap, pooled and within group (``aggregation.diagnostics.length_stats``,
  as aggbench's trainer logs ``len/*``), of the loss mask's lengths: a response the run's loss masks
  out whole (TRL's ``mask_truncated_completions``) counts as length 0 here, where aggbench's
  trainer counts its own length;
- ``run/weight_pos``, ``run/weight_neg``, ``run/weight_ratio``: the total weight each advantage sign
  gets under the run's OWN loss mode (``aggbench.audit``'s weights of that library's mode, at
  importance ratio 1, times |A|, summed over the sign's tokens);
- ``agg/{token,sequence,balanced}/weight_{pos,neg,ratio}``: what those aggbench rules would have
  given the same batch (``aggregation.diagnostics``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from aggbench.aggregation import builtin_instances
from aggbench.aggregation.diagnostics import diagnostics, sign_weights
from aggbench.audit import get_mode, micro_slices

PREFIX = "aggbench/"
COMPARED = ("token", "sequence", "balanced")
LENGTH_KEYS = ("len/cv", "len/gap", "len/cv_within", "len/gap_within")


def monitor_metrics(
    mask: Tensor,
    advantages: Tensor,
    group_ids: Tensor,
    *,
    library: str,
    mode: str,
    micro_batch_size: int | None = None,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, float]:
    """The monitor's metrics for one batch (module docstring).

    mask: [B, T] the loss mask; advantages: [B] the run's advantages; group_ids: [B] prompt groups;
    ``library``/``mode``: the run's loss setting (e.g. "trl", "dapo"); ``micro_batch_size``: rows
    per micro-batch over accumulation steps (what layout-dependent modes such as TRL's bnpo read);
    ``settings``: the values that mode reads (e.g. max_completion_length). -> {key: float}.
    """
    mask = mask.bool()
    adv = advantages.to(torch.float64)
    own = get_mode(library, mode)
    values = {k: v for k, v in dict(settings or {}).items() if k in own.defaults}
    insts = {name: builtin_instances()[name] for name in COMPARED}
    diag = diagnostics(mask, adv, group_ids, instances=insts)
    out = {PREFIX + k: diag[k] for k in LENGTH_KEYS}
    with torch.no_grad():
        w = own.weights(
            mask.to(torch.float64),
            micro_slices(mask.shape[0], micro_batch_size),
            {**own.defaults, **values, "group_ids": group_ids},
        )
        wp, wn = sign_weights(w * adv[:, None], adv)
    out[PREFIX + "run/weight_pos"] = wp
    out[PREFIX + "run/weight_neg"] = wn
    out[PREFIX + "run/weight_ratio"] = wp / wn if wn > 0 else math.nan
    for name in COMPARED:
        for key in ("weight_pos", "weight_neg", "weight_ratio"):
            out[f"{PREFIX}agg/{name}/{key}"] = diag[f"agg/{name}/{key}"]
    return out
