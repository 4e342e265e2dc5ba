"""What another trainer's loss mode does to one batch, and which aggbench rule it equals.

``audit(batch, mode)`` reads the mode's per-token weights [B, T] (``aggbench.audit.modes``) on
``aggbench explain``'s batch, and reports what ``explain`` reports for aggbench's rules: per
response the weight of each token and its total push (sum of |w * A| over its tokens), the total
weight of each advantage sign, the normaliser; plus two checks that can fail:

- layout dependence: the weights under the given micro-batch layout are compared with those
  under one micro-batch, one row per micro-batch and an uneven split, on this batch and on a
  fixed probe batch (distinct lengths, both signs): "no", "unequal micro-batches only" or "yes";
- equivalence: every built-in rule instance's weights (effective advantage / advantage, on the
  tokens whose advantage is not 0) are compared with the mode's, on this batch and on the probe
  batch with the same number of micro-batches, up to ONE positive scale that must be the same on
  both (a scale that follows the batch, like verl token-sum's token count, is not a constant
  factor of the learning rate, so it is no equivalence); the rules that match are listed, the one
  whose scale is closest to 1 first ("none" if none). A mode with a configured length (TRL
  max_completion_length, verl loss_scale_factor, SkyRL max_seq_len) is also compared with
  ``constant(max_length=that length)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggbench.aggregation.contract import RuleInstance, builtin_instances, resolve_instance
from aggbench.aggregation.explain import Batch, BatchInputError, make_batch
from aggbench.audit.modes import Mode

# The probe batch of the checks: lengths and rewards no built-in rule can tell apart by accident
# (every length distinct, both signs in every group of 4, one all-correct group).
# Groups of 3 straddle the probe's micro-batches of 4, so no micro-batch is a group by accident.
_PROBE_LENGTHS = (3, 17, 1, 12, 5, 9, 2, 26, 7, 4, 11, 6)
_PROBE_REWARDS = (1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1)
_PROBE_GROUP = 3
_RTOL = 1e-6  # OpenRLHF's token mean adds 1e-8 to the length


def micro_slices(rows: int, micro_batch_size: int | None) -> list[slice]:
    """Consecutive micro-batches of ``micro_batch_size`` rows (the last may be shorter); None: one."""
    if micro_batch_size is None or micro_batch_size >= rows:
        return [slice(0, rows)]
    if micro_batch_size < 1:
        raise BatchInputError("--micro-batch-size", f"must be at least 1; got {micro_batch_size}")
    return [slice(s, min(s + micro_batch_size, rows)) for s in range(0, rows, micro_batch_size)]


def mode_weights(mode: Mode, batch: Batch, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    """The mode's per-token weights [B, width] on ``batch`` (float64, 0 outside the mask)."""
    mask, _, gids = batch.tensors()
    full = {**settings, "group_ids": gids}
    return mode.weights(mask.to(torch.float64), micro, full).to(torch.float64)


def rule_weights(inst: RuleInstance, batch: Batch) -> Tensor:
    """A rule instance's weight per token [B, width]: effective advantage / advantage (0 where A = 0)."""
    mask, adv, gids = batch.tensors()
    with torch.no_grad():
        eff = inst(mask, adv, gids).to(torch.float64)
    safe = torch.where(adv == 0, torch.ones_like(adv), adv)
    return torch.where((adv != 0)[:, None], eff / safe[:, None], torch.zeros_like(eff))


def match_scale(ours: Tensor, theirs: Tensor, where: Tensor) -> float | None:
    """The positive s with theirs == s * ours on ``where`` [B, T] (bool), or None if there is none."""
    a, b = ours[where], theirs[where]
    if a.numel() == 0 or float(a.abs().sum()) == 0.0 or float(b.abs().sum()) == 0.0:
        return None
    s = float(b.sum() / a.sum())
    if not math.isfinite(s) or s <= 0:
        return None
    ok = torch.allclose(b, s * a, rtol=_RTOL, atol=1e-12 * float(b.abs().max()))
    return s if ok else None


def probe_batch(batch: Batch, rows: int) -> Batch:
    """``rows`` probe responses (cycled from the fixed table), groups of 3, the batch's estimator."""
    lengths = [_PROBE_LENGTHS[i % len(_PROBE_LENGTHS)] for i in range(rows)]
    rewards = [float(_PROBE_REWARDS[i % len(_PROBE_REWARDS)]) for i in range(rows)]
    std = batch.advantage_params.get("std")
    return make_batch(
        lengths,
        rewards,
        [i // _PROBE_GROUP for i in range(rows)],
        advantage=batch.advantage,
        std=std,
        max_length=32,
    )


@dataclass(frozen=True)
class Equivalent:
    name: str
    rule: str
    params: dict[str, Any]
    scale: float  # the mode's weights = scale x the rule's, on the audited batch

    def to_json(self) -> dict[str, Any]:
        return {"instance": self.name, "rule": self.rule, "params": self.params, "scale": self.scale}


@dataclass(frozen=True)
class AuditReport:
    """One mode on one batch. ``weights``: per response, its tokens' weights (length |o_i| each)."""

    mode: Mode
    settings: dict[str, Any]
    micro_batch_size: int | None
    weights: list[list[float]]
    push: list[float]
    weight_pos: float
    weight_neg: float
    layout: str  # layout_dependence()'s answer
    equivalents: list[Equivalent] = field(default_factory=list)
    # rules whose weights it equals on every batch times a factor that changes with the batch
    # (verl token-sum: token x the batch's token count); scale: this batch's factor
    proportional: list[Equivalent] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return self.weight_pos / self.weight_neg if self.weight_neg > 0 else None

    @property
    def equivalent(self) -> str:
        return self.equivalents[0].name if self.equivalents else "none"

    def to_json(self) -> dict[str, Any]:
        return {
            "library": self.mode.library,
            "mode": self.mode.name,
            "source": self.mode.source,
            "normaliser": self.mode.normaliser,
            "settings": self.settings,
            "micro_batch_size": self.micro_batch_size,
            "layout_dependent": self.layout,
            "weights": self.weights,
            "push": self.push,
            "weight_pos": self.weight_pos,
            "weight_neg": self.weight_neg,
            "pos_neg_ratio": self.ratio,
            "equivalent": self.equivalent,
            "equivalents": [e.to_json() for e in self.equivalents],
            "proportional_per_batch": [e.to_json() for e in self.proportional],
        }


def layout_dependence(
    mode: Mode, batches: list[Batch], micro_batch_size: int | None, settings: Mapping[str, Any]
) -> str:
    """ "no", "unequal micro-batches only" or "yes": do the weights change with the row split?

    Equal splits (the given layout, one micro-batch, one row each) and an uneven one (the first
    row alone, then the rest: what verl's dynamic batch sizes can make) are compared per batch.
    """
    equal_ok = uneven_ok = True
    for b in batches:
        n = len(b.lengths)
        ref = mode_weights(mode, b, micro_slices(n, micro_batch_size), settings)
        for lay in ([slice(0, n)], [slice(i, i + 1) for i in range(n)]):
            equal_ok &= torch.allclose(mode_weights(mode, b, lay, settings), ref, rtol=_RTOL, atol=0.0)
        if n >= 3:
            uneven = [slice(0, 1), slice(1, n)]
            uneven_ok &= torch.allclose(mode_weights(mode, b, uneven, settings), ref, rtol=_RTOL, atol=0.0)
    if not equal_ok:
        return "yes"
    return "no" if uneven_ok else "unequal micro-batches only"


def equivalents(
    mode: Mode,
    batch: Batch,
    micro_batch_size: int | None,
    settings: Mapping[str, Any],
    instances: Mapping[str, RuleInstance] | None = None,
) -> tuple[list[Equivalent], list[Equivalent]]:
    """The rule instances whose weights match the mode's up to one positive scale (module docstring),
    and those that match up to a scale that differs between the batch and the probe."""
    instances = dict(builtin_instances() if instances is None else instances)
    for key in ("max_completion_length", "loss_scale_factor", "max_seq_len"):
        if key in mode.defaults and settings.get(key) is not None:
            name = f"constant(max_length={settings[key]})"
            entry = {"name": name, "rule": "constant", "params": {"max_length": int(settings[key])}}
            instances[name] = resolve_instance(entry)  # the one place instances are built
    micro = micro_slices(len(batch.lengths), micro_batch_size)
    # the probe has as many micro-batches as the batch: 4 rows each (12 rows in one micro-batch)
    probe = probe_batch(batch, 12 if len(micro) == 1 else 4 * len(micro))
    probe_micro = micro_slices(len(probe.lengths), None if len(micro) == 1 else 4)
    found, follows = [], []
    for name, inst in instances.items():
        scales = []
        for b, mic in ((batch, micro), (probe, probe_micro)):
            mask, adv, _ = b.tensors()
            where = mask & (adv != 0)[:, None]
            s = match_scale(rule_weights(inst, b), mode_weights(mode, b, mic, settings), where)
            if s is None:
                break
            scales.append(s)
        else:
            eq = Equivalent(name, inst.rule, dict(inst.params), scales[0])
            (found if math.isclose(scales[0], scales[1], rel_tol=_RTOL) else follows).append(eq)
    order = lambda e: abs(math.log(e.scale))  # noqa: E731
    return sorted(found, key=order), follows  # follows: in the built-in order (token first)


def audit(
    batch: Batch,
    mode: Mode,
    *,
    micro_batch_size: int | None = None,
    settings: Mapping[str, Any] | None = None,
) -> AuditReport:
    """The mode's weighting of ``batch`` under the layout, with its checks (module docstring)."""
    unknown = sorted(set(settings or {}) - set(mode.defaults))
    if unknown:
        known = ", ".join(mode.defaults) or "(none)"
        raise BatchInputError(
            f"--{unknown[0].replace('_', '-')}", f"{mode.label} reads no such setting; it reads: {known}"
        )
    settings = {**mode.defaults, **(settings or {})}
    micro = micro_slices(len(batch.lengths), micro_batch_size)
    w = mode_weights(mode, batch, micro, settings)
    _, adv, _ = batch.tensors()
    eff = (w * adv[:, None]).abs()
    pos, neg = adv > 0, adv < 0
    probe = probe_batch(batch, 12)
    same, follows = equivalents(mode, batch, micro_batch_size, settings)
    return AuditReport(
        mode=mode,
        settings=settings,
        micro_batch_size=micro_batch_size,
        weights=[[float(x) for x in w[i, :n]] for i, n in enumerate(batch.lengths)],
        push=[float(x) for x in eff.sum(dim=1)],
        weight_pos=float(eff[pos].sum()),
        weight_neg=float(eff[neg].sum()),
        layout=layout_dependence(mode, [batch, probe], micro_batch_size, settings),
        equivalents=same,
        proportional=follows,
    )
