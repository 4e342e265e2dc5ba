"""PNG plots of one model x dataset block, from the data the report read from MLflow.

Per block, under ``out_dir``: ``{model}__{dataset}__eval.png`` (the tabulated metric vs training
step, one panel per benchmark, one line per rule, starting from the base model at step 0),
``__pg_loss.png``, ``__length_by_sign.png`` (mean response length of positive- and negative-advantage
responses) and ``__sign_weights.png`` (the total weight each sign receives under the rule the run
trained with, and their ratio). Lines are means over seeds, bands +- one std when there are several.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aggbench.report.collect import Collected

KINDS = ("eval", "pg_loss", "length_by_sign", "sign_weights")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def seed_curve(histories: Sequence[Mapping[int, float]]) -> tuple[list[int], list[float], list[float]]:
    """(steps, mean, std) over the seeds that have each step; NaN values are left out."""
    by_step: dict[int, list[float]] = {}
    for h in histories:
        for t, v in h.items():
            if not math.isnan(v):
                by_step.setdefault(t, []).append(v)
    steps = sorted(by_step)
    mean = [statistics.fmean(by_step[t]) for t in steps]
    std = [statistics.stdev(by_step[t]) if len(by_step[t]) > 1 else 0.0 for t in steps]
    return steps, mean, std


def _line(ax: Any, histories: Sequence[Mapping[int, float]], **kw: Any) -> None:
    steps, mean, std = seed_curve(histories)
    if not steps:
        return
    (line,) = ax.plot(steps, mean, marker="o" if len(steps) <= 30 else None, markersize=3, **kw)
    if any(std):
        lo = [m - s for m, s in zip(mean, std, strict=True)]
        hi = [m + s for m, s in zip(mean, std, strict=True)]
        ax.fill_between(steps, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)


def _colors(rules: Sequence[str]) -> dict[str, Any]:
    plt = _pyplot()
    cmap = plt.get_cmap("tab10")
    return {r: cmap(i % 10) for i, r in enumerate(rules)}


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110, bbox_inches="tight")
    tmp.replace(path)
    _pyplot().close(fig)
    return path


def plot_block(col: Collected, model: str, dataset: str, out_dir: Path) -> list[Path]:
    """The four figures of one block; returns their paths."""
    plt = _pyplot()
    groups = col.rule_cells(model, dataset)
    colors = _colors(list(groups))
    stem = f"{model}__{dataset}"
    seeds = max((len(s) for s in groups.values()), default=0)
    note = f"mean over {seeds} seeds, band = ±1 std" if seeds > 1 else "one seed"
    paths = []

    # 1. the tabulated metric per benchmark, from the base model at step 0
    benches = col.benchmarks
    ncols = min(3, len(benches))
    nrows = math.ceil(len(benches) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.2 * ncols, 3.2 * nrows + 0.4), squeeze=False, layout="constrained"
    )
    base = col.base.get(model, {})
    for ax, b in zip(axes.flat, benches, strict=False):
        for rule, cells_ in groups.items():
            hists = [{**({0: base[b]} if b in base else {}), **c.evals.get(b, {})} for c in cells_]
            _line(ax, hists, label=rule, color=colors[rule])  # percent, as MLflow holds them
        if b in base:
            ax.plot([0], [base[b]], "k*", markersize=9, label="base (step 0)")
        ax.set_title(b)
        ax.set_xlabel("training step")
        ax.set_ylabel(col.keys[b].rsplit("/", 1)[-1].replace("_at_", "@") + " (%)")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(benches) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{stem}: {col.metric} vs training step ({note})")
    paths.append(_save(fig, out_dir / f"{stem}__eval.png"))

    # 2. policy-gradient loss
    fig, ax = plt.subplots(figsize=(6, 3.8), layout="constrained")
    for rule, cells_ in groups.items():
        _line(ax, [c.train.get("loss/pg", {}) for c in cells_], label=rule, color=colors[rule])
    ax.set(title=f"{stem}: policy-gradient loss ({note})", xlabel="training step", ylabel="loss/pg")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(_save(fig, out_dir / f"{stem}__pg_loss.png"))

    # 3. response length by advantage sign
    fig, ax = plt.subplots(figsize=(6.5, 4), layout="constrained")
    for rule, cells_ in groups.items():
        for key, style, sign in (("len/pos_mean", "-", "A>0"), ("len/neg_mean", "--", "A<0")):
            hists = [c.train.get(key, {}) for c in cells_]
            _line(ax, hists, label=f"{rule} {sign}", color=colors[rule], linestyle=style)
    ax.set(title=f"{stem}: mean response length by sign ({note})", xlabel="training step", ylabel="tokens")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    paths.append(_save(fig, out_dir / f"{stem}__length_by_sign.png"))

    # 4. per-sign aggregation weight of each run's own rule, and the pos/neg ratio
    fig, (ax, ax_r) = plt.subplots(1, 2, figsize=(11, 4), layout="constrained")
    for rule, cells_ in groups.items():
        for sign, style in (("pos", "-"), ("neg", "--")):
            hists = [c.train.get(f"agg/{rule}/weight_{sign}", {}) for c in cells_]
            _line(ax, hists, label=f"{rule} {sign}", color=colors[rule], linestyle=style)
        _line(
            ax_r,
            [c.train.get(f"agg/{rule}/weight_ratio", {}) for c in cells_],
            label=rule,
            color=colors[rule],
        )
    ax.set(title="total weight per sign (solid A>0, dashed A<0)", xlabel="training step", ylabel="weight")
    ax_r.set(title="weight ratio pos / neg", xlabel="training step", ylabel="ratio")
    ax_r.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    for a in (ax, ax_r):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.suptitle(f"{stem}: aggregation weights of each run's rule ({note})")
    paths.append(_save(fig, out_dir / f"{stem}__sign_weights.png"))
    return paths


def plot_all(col: Collected, out_dir: Path) -> list[Path]:
    paths = []
    for model, dataset in col.blocks():
        paths += plot_block(col, model, dataset, out_dir)
    return paths
