"""What every aggregation rule does to one concrete batch: the logic behind ``aggbench explain``.

A batch is a list of responses (length, reward, group). Advantages come from the advantage
registry; every rule instance turns them into effective advantages [B, T], and this module reads
back, per sequence, the per-token weight (effective advantage / advantage), the effective
advantage of each token and the sequence's total weight (sum of |effective advantage| over its
tokens), and per rule the total weight each advantage sign receives.

Input parsing lives here too (not in the click layer) so it is testable without a CLI; it raises
``BatchInputError`` naming the option, which the CLI turns into a usage error.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
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


# ----------------------------------------------------------------------------- parsing


def _split(text: str, option: str) -> list[str]:
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(s == "" for s in items):
        raise BatchInputError(option, f"expected a comma-separated list like 10,500,20; got {text!r}")
    return items


def parse_lengths(text: str, option: str = "--lengths") -> list[int]:
    """'10,500,20' -> [10, 500, 20]; every value a non-negative integer (positions are 1-based)."""
    out = []
    for pos, item in enumerate(_split(text, option), start=1):
        try:
            value = int(item)
        except ValueError:
            raise BatchInputError(option, f"value {item!r} at position {pos} is not an integer") from None
        if value < 0:
            raise BatchInputError(
                option, f"value {value} at position {pos} is negative (a length counts tokens)"
            )
        out.append(value)
    return out


def parse_rewards(text: str, option: str = "--rewards") -> list[float]:
    """'1,0,0.5' -> [1.0, 0.0, 0.5]; every value a finite number."""
    out = []
    for pos, item in enumerate(_split(text, option), start=1):
        try:
            value = float(item)
        except ValueError:
            raise BatchInputError(option, f"value {item!r} at position {pos} is not a number") from None
        if not math.isfinite(value):
            raise BatchInputError(option, f"value {item!r} at position {pos} is not a finite number")
        out.append(value)
    return out


def parse_groups(text: str, option: str = "--groups") -> list[GroupLabel]:
    """'0,0,1,1' -> [0, 0, 1, 1]; labels that are not integers stay strings (prompt ids)."""
    out: list[GroupLabel] = []
    for item in _split(text, option):
        try:
            out.append(int(item))
        except ValueError:
            out.append(item)
    return out


def groups_from_size(n: int, group_size: int, option: str = "--group-size") -> list[int]:
    """Consecutive groups of ``group_size``: n=4, size 2 -> [0, 0, 1, 1]."""
    if group_size < 1:
        raise BatchInputError(option, f"must be at least 1; got {group_size}")
    if n % group_size:
        raise BatchInputError(
            option, f"{n} sequences do not split into groups of {group_size}; give --groups for uneven groups"
        )
    return [i // group_size for i in range(n)]


def read_rollouts(path: str | Path) -> tuple[list[int], list[float], list[GroupLabel]]:
    """JSONL with one response per line: {"group": ..., "length": int >= 0, "reward": number}.

    Blank lines are skipped; other fields are ignored. Errors name file:line and the field.
    """
    path = Path(path)
    lengths: list[int] = []
    rewards: list[float] = []
    groups: list[GroupLabel] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BatchInputError("--rollouts", f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise BatchInputError(
                    "--rollouts", f"{where}: expected a JSON object, got {type(row).__name__}"
                )
            for key in ("group", "length", "reward"):
                if key not in row:
                    raise BatchInputError(
                        "--rollouts",
                        f"{where}: missing field {key!r} (each line needs group, length, reward)",
                    )
            length, reward, group = row["length"], row["reward"], row["group"]
            if isinstance(length, bool) or not isinstance(length, int) or length < 0:
                raise BatchInputError(
                    "--rollouts", f"{where}: field 'length' must be an integer >= 0; got {length!r}"
                )
            if isinstance(reward, bool):
                reward = float(reward)  # a verifiable reward stored as true/false
            if not isinstance(reward, int | float) or not math.isfinite(reward):
                raise BatchInputError(
                    "--rollouts", f"{where}: field 'reward' must be a finite number; got {reward!r}"
                )
            if isinstance(group, bool) or not isinstance(group, int | str):
                raise BatchInputError(
                    "--rollouts", f"{where}: field 'group' must be an integer or a string; got {group!r}"
                )
            lengths.append(length)
            rewards.append(float(reward))
            groups.append(group)
    if not lengths:
        raise BatchInputError("--rollouts", f"{path}: no rollouts (the file has no non-blank lines)")
    return lengths, rewards, groups


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
    """Apply one instance to the batch and read back its per-sequence weights."""
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


# ----------------------------------------------------------------------------- table text


def fmt(x: float | None, *, signed: bool = False) -> str:
    """Four significant digits, scientific notation below 1e-4 and from 1e4 up; '-' for None."""
    if x is None:
        return "-"
    return f"{x:+.4g}" if signed and x != 0 else f"{x:.4g}"


def _table(
    headers: Sequence[str], rows: Iterable[Sequence[str]], indent: str = "  ", left: Sequence[int] = ()
) -> list[str]:
    """Aligned text columns (right-aligned numbers; columns in ``left`` left-aligned)."""
    rows = [list(r) for r in rows]
    widths = [max([len(h)] + [len(r[j]) for r in rows]) for j, h in enumerate(headers)]

    def join(cells: Sequence[str]) -> str:
        parts = [
            c.ljust(w) if j in left else c.rjust(w)
            for j, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return (indent + "  ".join(parts)).rstrip()

    out = [join(headers), indent + "-" * (sum(widths) + 2 * (len(widths) - 1))]
    return out + [join(r) for r in rows]


def _params_text(r: RuleReport) -> str:
    params = [f"{k}={v!r}" for k, v in r.params.items()]
    return f"{r.rule} v{r.version}" + (f" ({', '.join(params)})" if params else "")


def batch_title(batch: Batch) -> str:
    n_groups = len(dict.fromkeys(batch.groups))
    adv = ", ".join(f"{k}={v}" for k, v in batch.advantage_params.items())
    adv = f"{batch.advantage}({adv})" if adv else batch.advantage
    return (
        f"{len(batch.lengths)} sequences in {n_groups} group{'s' if n_groups != 1 else ''}, "
        f"advantage {adv}, padded width T={batch.width}"
    )


def format_table(batch: Batch, reports: Mapping[str, RuleReport]) -> str:
    """The terminal view: one block per rule, then a per-sign summary across rules."""
    lines = [
        f"batch: {batch_title(batch)}",
        "  weight/token = eff.adv/token / advantage ('-' where the advantage is 0);",
        "  seq weight = sum over the sequence's tokens of |eff.adv|; totals are per advantage sign.",
    ]
    headers = ["seq", "group", "length", "reward", "advantage", "weight/token", "eff.adv/token", "seq weight"]
    any_nonuniform = False
    for name, r in reports.items():
        lines += ["", f"== {name}: {_params_text(r)}"]
        rows = []
        for i in range(len(batch.lengths)):
            mark = "" if r.uniform[i] else "*"
            any_nonuniform |= not r.uniform[i]
            rows.append(
                [
                    str(i),
                    str(batch.groups[i]),
                    str(batch.lengths[i]),
                    f"{batch.rewards[i]:g}",
                    fmt(batch.advantages[i], signed=True),
                    fmt(r.weight_per_token[i]) + mark,
                    fmt(r.eff_adv_per_token[i], signed=True) + mark,
                    fmt(r.seq_weight[i]),
                ]
            )
        lines += _table(headers, rows)
        lines.append(
            f"  total weight: positive {fmt(r.weight_pos)}   negative {fmt(r.weight_neg)}   "
            f"pos/neg {fmt(r.ratio)}"
        )
    if any_nonuniform:
        lines += ["", "  * the rule weights this sequence's tokens unequally; the value shown is their mean"]
    lines += ["", "== summary: total weight per advantage sign"]
    lines += _table(
        ["rule", "positive", "negative", "pos/neg"],
        [[name, fmt(r.weight_pos), fmt(r.weight_neg), fmt(r.ratio)] for name, r in reports.items()],
        left=(0,),
    )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- plot


def plot(batch: Batch, reports: Mapping[str, RuleReport], path: str | Path) -> Path:
    """Write a two-panel PNG: per-token weight of every sequence under every rule (log scale,
    grouped bars), and each rule's total weight per advantage sign with the pos/neg ratio.

    Uses matplotlib's object API with the Agg canvas, so no display and no global backend change.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = list(reports)
    n_seq, n_rules = len(batch.lengths), len(names)
    fig = Figure(figsize=(max(8.0, 1.1 * n_seq + 4), 9.0), layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, height_ratios=[3, 2])
    colours = [f"C{j % 10}" for j in range(n_rules)]

    width = 0.8 / max(n_rules, 1)
    for j, name in enumerate(names):
        ys = [w if w is not None and w > 0 else float("nan") for w in reports[name].weight_per_token]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(n_seq)]
        top.bar(xs, ys, width=width, color=colours[j], label=name)
    top.set_yscale("log")
    top.set_ylabel("per-token weight (eff. adv. / adv.)")
    top.set_xticks(range(n_seq))
    labels = []
    for i in range(n_seq):
        a = batch.advantages[i]
        sign = "A>0" if a > 0 else "A<0" if a < 0 else "A=0 (no weight)"
        labels.append(f"#{i} group {batch.groups[i]}\nlen {batch.lengths[i]}, r={batch.rewards[i]:g}\n{sign}")
    top.set_xticklabels(labels, fontsize=8)
    top.set_title("Per-token weight of each sequence under each rule")
    top.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), title="rule")
    top.grid(axis="y", which="major", alpha=0.3)

    xs = range(n_rules)
    pos = [reports[n].weight_pos for n in names]
    neg = [reports[n].weight_neg for n in names]
    bottom.bar([x - 0.2 for x in xs], pos, width=0.4, color="tab:green", label="positive-advantage tokens")
    bottom.bar([x + 0.2 for x in xs], neg, width=0.4, color="tab:red", label="negative-advantage tokens")
    if any(v > 0 for v in pos + neg):
        bottom.set_yscale("log")
        bottom.set_ylim(top=max(pos + neg) * 4)  # headroom for the ratio labels
    for x, name in zip(xs, names, strict=True):
        r = reports[name].ratio
        top_y = max(pos[x], neg[x])
        if top_y > 0:
            bottom.annotate(
                f"pos/neg {fmt(r)}",
                (x, top_y),
                ha="center",
                va="bottom",
                fontsize=8,
                xytext=(0, 2),
                textcoords="offset points",
            )
    bottom.set_xticks(list(xs))
    bottom.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
    bottom.set_ylabel("total weight (sum |eff. adv.|)")
    bottom.set_title("Total weight per advantage sign (equal bars: no sign-length coupling)")
    bottom.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    bottom.grid(axis="y", which="major", alpha=0.3)
    fig.suptitle(f"aggbench explain: {batch_title(batch)}", fontsize=10)

    path = Path(path)
    fig.savefig(path, dpi=110)
    return path
