"""``aggbench explain``'s output: the terminal table and the two-panel PNG figure of what every
rule does to one batch (the numbers come from ``aggbench.aggregation.explain``; this module only
formats and draws them).

Imports neither torch nor matplotlib at module level: the batch's types are read for annotations
only, and matplotlib is imported when a figure is drawn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aggbench.aggregation.explain import Batch, RuleReport


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
