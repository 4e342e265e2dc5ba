"""What every aggregation rule does to one concrete batch: the computation behind ``aggbench explain``.

A batch is a list of responses (length, reward, group). Advantages come from the advantage
registry; every rule instance turns them into effective advantages [B, T], and this module reads
back, per sequence, the per-token weight (effective advantage / advantage), the effective
advantage of each token and the sequence's total weight (sum of |effective advantage| over its
tokens), and per rule the total weight each advantage sign receives.

Only the computation lives here: the command's option parsing and the rollouts JSONL reader are in
``aggbench.cli.explain``, the text table and the figure in ``aggbench.report.explain_render``. A bad
batch raises ``BatchInputError`` naming the option, which the CLI turns into a usage error.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from aggbench.aggregation.advantages import get_advantage
from aggbench.aggregation.contract import RuleInstance
from aggbench.aggregation.diagnostics import sign_weights
from aggbench.aggregation.ops import mask_from_lengths
from aggbench.errors import InputError

GroupLabel = int | str


class BatchInputError(InputError, ValueError):
    """A bad batch description; ``option`` names the CLI option (or file) at fault."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")
        self.option = option
        self.message = message


# ----------------------------------------------------------------------------- the batch


@dataclass(frozen=True)
class Batch:
    """One mini-batch as ``explain`` sees it; ``width`` is the padded width T of the mask."""

    lengths: list[int]
    rewards: list[float]
    groups: list[GroupLabel]
    advantages: list[float]
    advantage: str
    advantage_params: dict[str, Any]
    width: int

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> mask [B, width] bool, advantages [B] float64, group ids [B] long (first-seen order)."""
        mask = mask_from_lengths(self.lengths, max_len=self.width)
        return mask, torch.tensor(self.advantages, dtype=torch.float64), group_ids(self.groups)

    def to_json(self) -> dict[str, Any]:
        return {
            "lengths": self.lengths,
            "rewards": self.rewards,
            "groups": self.groups,
            "advantages": self.advantages,
            "advantage": {"estimator": self.advantage, **self.advantage_params},
            "width": self.width,
        }


def group_ids(labels: Sequence[GroupLabel]) -> torch.Tensor:
    """Group labels -> [B] long ids numbered in order of first appearance ("b", "a", "b" -> 0, 1, 0)."""
    ids: dict[GroupLabel, int] = {}
    return torch.tensor([ids.setdefault(g, len(ids)) for g in labels], dtype=torch.long)


def check_counts(lengths: Sequence[int], rewards: Sequence[float]) -> None:
    """One reward per length, and at least one sequence."""
    if len(lengths) != len(rewards):
        raise BatchInputError(
            "--rewards",
            f"got {len(rewards)} rewards for {len(lengths)} lengths; give one reward per sequence",
        )
    if not lengths:
        raise BatchInputError("--lengths", "the batch is empty; give at least one sequence")


def make_batch(
    lengths: Sequence[int],
    rewards: Sequence[float],
    groups: Sequence[GroupLabel] | None = None,
    *,
    advantage: str = "grpo",
    std: str | None = None,
    max_length: int | None = None,
) -> Batch:
    """Check the pieces agree and compute the advantages with the registered estimator.

    ``groups=None`` puts every sequence in one group. ``std`` is passed to estimators that take it
    (grpo); ``max_length`` pads the mask to that width (what ``constant`` reads as L_max when it
    has no ``max_length`` of its own); default: the longest response (at least 1).
    """
    lengths, rewards = list(lengths), list(rewards)
    check_counts(lengths, rewards)
    groups = [0] * len(lengths) if groups is None else list(groups)
    if len(groups) != len(lengths):
        raise BatchInputError("--groups", f"got {len(groups)} group labels for {len(lengths)} sequences")
    longest = max(lengths)
    if max_length is None:
        width = max(longest, 1)
    elif max_length < longest or max_length < 1:
        raise BatchInputError(
            "--max-length",
            f"{max_length} is below the longest response ({longest}); it must be >= every length",
        )
    else:
        width = max_length
    try:
        estimator = get_advantage(advantage)
    except ValueError as exc:
        raise BatchInputError("--advantage", str(exc)) from None
    params: dict[str, Any] = {}
    if std is not None:
        if "std" not in inspect.signature(estimator).parameters:
            raise BatchInputError("--std", f"advantage estimator {advantage!r} takes no std option")
        params["std"] = std
    adv = estimator(torch.tensor(rewards, dtype=torch.float64), group_ids(groups), **params)
    if "std" in inspect.signature(estimator).parameters and "std" not in params:
        params["std"] = inspect.signature(estimator).parameters["std"].default  # record the default used
    return Batch(lengths, rewards, groups, [float(a) for a in adv], advantage, params, width)


# ----------------------------------------------------------------------------- per-rule report


@dataclass(frozen=True)
class RuleReport:
    """What one rule instance does to the batch (lists are per sequence, in batch order).

    weight_per_token: effective advantage / advantage, None where the advantage is 0 or the
    sequence is empty; eff_adv_per_token: None for an empty sequence; when a rule gives the tokens
    of one sequence different weights (``uniform`` False) both are the mean over its tokens.
    seq_weight: sum of |effective advantage| over the sequence's tokens.
    """

    name: str
    rule: str
    version: str
    params: dict[str, Any]
    weight_per_token: list[float | None]
    eff_adv_per_token: list[float | None]
    seq_weight: list[float]
    uniform: list[bool]
    weight_pos: float
    weight_neg: float

    @property
    def ratio(self) -> float | None:
        """pos / neg total weight; None when the negative side has no weight."""
        return self.weight_pos / self.weight_neg if self.weight_neg > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "version": self.version,
            "params": self.params,
            "weight_per_token": self.weight_per_token,
            "eff_adv_per_token": self.eff_adv_per_token,
            "seq_weight": self.seq_weight,
            "uniform_within_sequence": self.uniform,
            "weight_pos": self.weight_pos,
            "weight_neg": self.weight_neg,
            "pos_neg_ratio": self.ratio,
        }


def explain_rule(inst: RuleInstance, batch: Batch) -> RuleReport:
    """Apply one instance to the batch and read back its per-sequence weights.

    The instance maps ``batch.tensors()`` (mask [B, T], advantages [B], group ids [B]) to effective
    advantages [B, T]; the report's lists are per sequence [B], its totals per advantage sign.
    """
    mask, adv, gids = batch.tensors()
    with torch.no_grad():
        eff = inst(mask, adv, gids).to(torch.float64)
    per_tok, weights, uniform = [], [], []
    for i, n in enumerate(batch.lengths):
        if n == 0:
            per_tok.append(None)
            weights.append(None)
            uniform.append(True)
            continue
        vals = eff[i, :n]
        mean = float(vals.mean())
        per_tok.append(mean)
        uniform.append(bool(torch.allclose(vals, vals[0].expand_as(vals), rtol=1e-9, atol=0.0)))
        a = batch.advantages[i]
        weights.append(mean / a if a != 0 else None)
    seq_weight = [float(x) for x in eff.abs().sum(dim=1)]
    wp, wn = sign_weights(eff, adv)
    return RuleReport(
        name=inst.name,
        rule=inst.rule,
        version=inst.spec.version,
        params=dict(inst.params),
        weight_per_token=weights,
        eff_adv_per_token=per_tok,
        seq_weight=seq_weight,
        uniform=uniform,
        weight_pos=wp,
        weight_neg=wn,
    )


def explain(batch: Batch, instances: Mapping[str, RuleInstance]) -> dict[str, RuleReport]:
    """Every instance's report, in the mapping's order."""
    return {name: explain_rule(inst, batch) for name, inst in instances.items()}


def to_json(batch: Batch, reports: Mapping[str, RuleReport]) -> dict[str, Any]:
    """One object: "batch" plus a key per rule instance (an instance may not be named "batch")."""
    if "batch" in reports:
        raise ValueError(
            "a rule instance named 'batch' clashes with the JSON output's 'batch' key; rename it"
        )
    return {"batch": batch.to_json(), **{name: r.to_json() for name, r in reports.items()}}
