"""Rendering the report's tables: Markdown, long CSV, LaTeX (booktabs), and writing the files.

The tables themselves are assembled in ``aggbench.report.tables`` (``build_tables``); this module only
formats them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aggbench.report.collect import Collected
    from aggbench.report.tables import Entry, Row, Table


def _num(x: float) -> str:
    return f"{x:.1f}"


def _cell_text(e: Entry, *, show_step: bool, seeds: int, latex: bool = False) -> str:
    """``mean ± half`` (t interval over seeds), ``mean [low, high]`` (one seed's bootstrap), plus
    ``(n=k)`` where the cell has fewer seeds than the table, the step, and the delta to the paper."""
    if e.mean is None:
        return "--" if latex else "—"
    pm = r" $\pm$ " if latex else " ± "
    text = _num(e.mean)
    if e.interval == "t" and e.low is not None and e.high is not None:
        text += pm + _num((e.high - e.low) / 2)
    elif e.interval == "bootstrap" and e.low is not None and e.high is not None:
        text += f" [{_num(e.low)}, {_num(e.high)}]"
    if e.best:
        text = rf"\textbf{{{text}}}" if latex else f"**{text}**"
    if 0 < e.n < seeds:
        text += f" (n={e.n})"
    if show_step and e.step is not None:
        text += rf"\,@{e.step}" if latex else f" @{e.step}"
    if e.delta is not None:
        d = f"{e.delta:+.1f}"
        text += rf" ($\Delta$ {d})" if latex else f" (Δ {d})"
    return text


def _legend(t: Table) -> str:
    from aggbench.report.stats import t_quantile

    if t.seeds > 1:
        seeds = (
            f"mean over {t.seeds} seeds ± the half-width of a 95% Student-t interval over the per-seed "
            f"values (df = n − 1: t = {t_quantile(t.seeds - 1):.2f} with {t.seeds} seeds); a cell with "
            "fewer seeds says n=k, and one seed shows its evaluation's 95% bootstrap interval over problems "
            "[low, high]"
        )
    else:
        seeds = "one seed, [low, high] its evaluation's 95% bootstrap interval over problems (avg@n only)"
    extra = (
        "; Δ = ours − reported (points)"
        if any(e.reported is not None for r in t.rows for e in r.entries.values())
        else ""
    )
    drop = "drop = peak − last of each seed's benchmark average (points), over seeds as the other columns"
    return (
        f"{t.metric} in %, {seeds}; {drop}; steps are training steps; best per column in bold "
        f"(drop: the least; not a † row){extra}."
    )


def _step_text(r, none: str) -> str:
    """The step column: the row's step, or (the selected table) each seed's chosen steps."""
    if r.steps_text is not None:
        return r.steps_text
    return str(r.step) if r.step is not None else none


def to_markdown(tables: Sequence[Table], heading: str) -> str:
    parts = [f"# {heading}", ""]
    for t in tables:
        with_step = t.definition != "peak_per_benchmark"
        step_head = "chosen step (per seed)" if t.definition == "selected" else "step"
        head = ["rule", *([step_head] if with_step else []), *t.columns]
        parts += [f"## {t.title}", "", _legend(t), ""]
        parts += [*(f"{line}." for line in t.about), *([""] if t.about else [])]
        parts.append("| " + " | ".join(head) + " |")
        parts.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
        for r in t.rows:
            label = r.label + (" †" if r.flagged else "")
            step = [_step_text(r, "—")] if with_step else []
            cells_ = [
                _cell_text(r.entries[c], show_step=not with_step, seeds=t.seeds if r.kind != "base" else 0)
                for c in t.columns
            ]
            parts.append("| " + " | ".join([label, *step, *cells_]) + " |")
        if t.notes:
            # not all of them flag a row: overlap, context and ledger notes are read, not flagged
            parts += [
                "",
                "Notes († flags a row whose cells are missing, unfinished or in doubt; never dropped):",
            ]
            parts += [f"- {n}" for n in t.notes]
        parts.append("")
    return "\n".join(parts)


CSV_FIELDS = [
    "table", "model", "dataset", "metric", "row", "kind", "column", "mean", "std", "ci_low", "ci_high",
    "interval", "n_seeds", "step", "reported", "delta", "best", "flagged",
]  # fmt: skip


TIDY_FIELDS = ["model", "dataset", "aggregation", "seed", "cell_id", "benchmark", "step", "value"]


def _csv_step(e: Entry, r: Row, column: str) -> int | str:
    """The entry's step; where its seeds chose different steps (the selected table), the row's
    chosen steps as the Markdown shows them ("s0@8 s1@4"), so the CSV does not lose which (not
    under drop, which is over the whole curve)."""
    if e.step is not None:
        return e.step
    return r.steps_text or "" if e.mean is not None and column != "drop" else ""


def to_csv(tables: Sequence[Table]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    opt = lambda x: "" if x is None else round(x, 6)  # noqa: E731
    for t in tables:
        for r in t.rows:
            for c in t.columns:
                e = r.entries[c]
                w.writerow(
                    {
                        "table": t.definition, "model": t.model, "dataset": t.dataset, "metric": t.metric,
                        "row": r.label, "kind": r.kind, "column": c, "mean": opt(e.mean), "std": opt(e.std),
                        "ci_low": opt(e.low), "ci_high": opt(e.high), "interval": e.interval or "",
                        "n_seeds": e.n, "step": _csv_step(e, r, c), "reported": opt(e.reported),
                        "delta": opt(e.delta), "best": int(e.best), "flagged": int(r.flagged),
                    }
                )  # fmt: skip
    return buf.getvalue()


def _tex(s: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("_", r"\_"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("#", r"\#"),
        ("$", r"\$"),
    ):
        s = s.replace(a, b)
    return s.replace("±", r"$\pm$").replace("Δ", r"$\Delta$").replace("−", "-")


def to_latex(tables: Sequence[Table]) -> str:
    """booktabs tables, one per block and definition."""
    parts = ["% generated by `aggbench report`; needs \\usepackage{booktabs}", ""]
    for t in tables:
        with_step = t.definition != "peak_per_benchmark"
        step_head = "Chosen step (per seed)" if t.definition == "selected" else "Step"
        head = ["Rule", *([step_head] if with_step else []), *t.columns]
        parts += [
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{_tex(t.title)}. {_tex(' '.join([_legend(t), *(f'{a}.' for a in t.about)]))}}}",
            r"\begin{tabular}{l" + "r" * (len(head) - 1) + "}",
            r"\toprule",
            " & ".join(_tex(h) for h in head) + r" \\",
            r"\midrule",
        ]
        for r in t.rows:
            label = _tex(r.label) + (r"$^{\dagger}$" if r.flagged else "")
            step = [_tex(_step_text(r, "--"))] if with_step else []
            cells_ = [
                _cell_text(
                    r.entries[c],
                    show_step=not with_step,
                    seeds=t.seeds if r.kind != "base" else 0,
                    latex=True,
                )
                for c in t.columns
            ]
            parts.append(" & ".join([label, *step, *cells_]) + r" \\")
        parts += [r"\bottomrule", r"\end{tabular}"]
        if t.notes:
            parts.append(r"\par\footnotesize $^{\dagger}$ " + _tex("; ".join(t.notes)))
        parts += [r"\end{table}", ""]
    return "\n".join(parts)


def write_tables(
    tables: Mapping[str, Sequence[Table]], out_dir: Path, experiment: str, col: Collected | None = None
) -> list[Path]:
    """``{peak,last}.{md,csv,tex}`` under out_dir, and ``values.csv`` (``col.tidy()``: every value
    the tables were made from, in percent) when ``col`` is given; atomic writes; returns the paths."""
    from aggbench.files import write_atomic

    headings = {
        "peak": f"Peak tables: {experiment}",
        "last": f"Last-step tables: {experiment}",
        "selected": f"Selected-checkpoint tables (chosen on a held-out selection split, not on the test "
        f"benchmark): {experiment}",
    }
    if "selected" in tables:  # the reader of peak.md alone must not mistake it for the honest choice
        headings["peak"] += " (each at its best step ON THE TEST BENCHMARK: optimistic; see selected.md)"
    paths = []
    for name, ts in tables.items():
        paths.append(write_atomic(out_dir / f"{name}.md", to_markdown(ts, headings[name])))
        paths.append(write_atomic(out_dir / f"{name}.csv", to_csv(ts)))
        paths.append(write_atomic(out_dir / f"{name}.tex", to_latex(ts)))
    if col is not None:
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=TIDY_FIELDS, lineterminator="\n")
        w.writeheader()
        w.writerows(col.tidy())
        paths.append(write_atomic(out_dir / "values.csv", buf.getvalue()))
    return paths
