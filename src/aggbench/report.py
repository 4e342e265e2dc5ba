"""MLflow -> peak and last-step tables (Markdown, CSV, LaTeX).

Per model x dataset, rows are the grid's rule instances plus the base model at step 0, columns the
benchmarks plus their average. A value is the benchmark's headline metric (``avg@n`` unless told
otherwise) in percent, mean +- sample std (ddof=1) over the seeds that have it; one seed shows no
std. Steps are training steps. Three tables per block:

* ``peak_per_benchmark``: each benchmark at its own best step, chosen on the seed-mean curve (the
  step is shown beside each value); the average column averages those per-benchmark peaks.
* ``peak_best_average``: every benchmark at the single step whose seed-mean benchmark average is
  best (one step per row).
* ``last``: every benchmark at the last step that has all benchmarks.

Ties between steps go to the earliest. The best value of each column (rounded as shown) is bold.
A row whose cells are missing, unfinished (trained to fewer than total_steps, or fewer evaluation
steps than the grid expects) or disagree with the run files is marked with a dagger and the
table's footnote names each cell and why; such rows are never dropped. A ``reported:`` block in the
config ({model: {dataset: {aggregation | "base": {benchmark | "average": percent}}}}) adds the
paper's numbers; each value then shows its delta (ours - reported, in points).

Files: ``peak.{md,csv,tex}`` hold the two peak tables of every block, ``last.{md,csv,tex}`` the
last-step table of every block; their CSV is long (one line per row x column), for scripts.
``values.csv`` is the tidy table everything is computed from: one line per (cell, benchmark, step)
with the value read from MLflow (a fraction), base models at step 0.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggbench.grid import Cell, cells, eval_steps, results_dir, total_steps
from aggbench.ingest import SENTINEL, base_id, find_runs
from aggbench.tracking import metric_history

AVERAGE = "average"
BASE_LABEL = "base (step 0)"
DEFINITIONS = {
    "peak_per_benchmark": "peak: each benchmark at its own best step (@step)",
    "peak_best_average": "peak: the single step with the best benchmark average",
    "last": "last evaluated step",
}
TRAIN_KEYS = ("loss/pg", "len/pos_mean", "len/neg_mean", "len/gap", "accuracy", "reward/mean")


# --------------------------------------------------------------------------- reading MLflow


@dataclass
class CellData:
    """One cell's MLflow data. evals: {benchmark: {step: fraction}}; train: {key: {step: value}}."""

    cell: Cell
    run_id: str | None
    has_files: bool
    total: int
    expected: list[int]
    evals: dict[str, dict[int, float]] = field(default_factory=dict)
    train: dict[str, dict[int, float]] = field(default_factory=dict)

    @property
    def trained_to(self) -> int:
        return max(self.train.get(SENTINEL, {}), default=0)

    def complete_steps(self, benchmarks: Sequence[str]) -> list[int]:
        """Evaluation steps at which every benchmark has a value."""
        steps = set.intersection(*(set(self.evals.get(b, {})) for b in benchmarks)) if benchmarks else set()
        return sorted(steps)

    def issue(self, benchmarks: Sequence[str]) -> str | None:
        """Why this cell is missing or unfinished, or None."""
        if self.run_id is None:
            why = "run files exist; run `aggbench ingest`" if self.has_files else "no run files either"
            return f"no MLflow run ({why})"
        parts = []
        if self.trained_to < self.total:
            parts.append(f"trained to step {self.trained_to} of {self.total}")
        have = self.complete_steps(benchmarks)
        if not set(self.expected) <= set(have):
            parts.append(f"evaluated at steps {_steps(have)} of {_steps(self.expected)}")
        return "; ".join(parts) or None


@dataclass
class Collected:
    """Everything the tables and plots need, read from MLflow once."""

    exp: dict
    metric: str  # as shown: avg@4, or avg@n (per benchmark) when n differs
    benchmarks: list[str]
    keys: dict[str, str]  # benchmark -> MLflow key of the tabulated metric
    cells: list[CellData]
    base: dict[str, dict[str, float]]  # model -> benchmark -> fraction at step 0
    base_expected: bool

    def blocks(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys((c.cell.model, c.cell.dataset) for c in self.cells))

    def tidy(self) -> list[dict[str, Any]]:
        """Every tabulated value read from MLflow, one dict per (cell or base, benchmark, step)."""
        rows = [
            {"model": m, "dataset": "", "aggregation": "base", "seed": "", "cell_id": base_id(m), "benchmark": b,
             "step": 0, "value": v}
            for m, by_b in self.base.items() for b, v in by_b.items()
        ]  # fmt: skip
        for c in self.cells:
            for b, by_step in c.evals.items():
                rows += [
                    {"model": c.cell.model, "dataset": c.cell.dataset, "aggregation": c.cell.aggregation,
                     "seed": c.cell.seed, "cell_id": c.cell.id, "benchmark": b, "step": t, "value": v}
                    for t, v in sorted(by_step.items())
                ]  # fmt: skip
        return rows

    def rule_cells(self, model: str, dataset: str) -> dict[str, list[CellData]]:
        """{rule instance: its cells (one per seed)}, in the config's order."""
        out: dict[str, list[CellData]] = {}
        for c in self.cells:
            if (c.cell.model, c.cell.dataset) == (model, dataset):
                out.setdefault(c.cell.aggregation, []).append(c)
        return out


def _steps(steps: Iterable[int]) -> str:
    return ", ".join(map(str, steps)) or "none"


def metric_name(benchmark: str, metric: str, exp: dict) -> str:
    """``avg@n``, ``maj@n``, ``pass@n`` with n = the benchmark's samples per problem (the grid's
    ``evaluation.n``, else the benchmark's own); any other name (``pass@1``) as it is."""
    if not metric.endswith("@n"):
        return metric
    n = exp.get("evaluation", {}).get("n")
    if not n:
        from aggbench.data import load_benchmark_spec

        n = load_benchmark_spec(benchmark).sampling.n
    return f"{metric[:-2]}@{n}"


def metric_key(benchmark: str, metric: str, exp: dict) -> str:
    """MLflow key of ``metric`` for one benchmark (see ``metric_name``)."""
    from aggbench.evaluate import mlflow_key

    return mlflow_key(benchmark, metric_name(benchmark, metric, exp))


def metric_label(benchmarks: Sequence[str], metric: str, exp: dict) -> str:
    """``avg@4``, or ``avg@n (a: avg@4, b: avg@16)`` when n differs between benchmarks."""
    names = {b: metric_name(b, metric, exp) for b in benchmarks}
    if len(set(names.values())) == 1:
        return next(iter(names.values()))
    return f"{metric} (" + ", ".join(f"{b}: {m}" for b, m in names.items()) + ")"


def collect(
    exp: dict, client: Any, *, metric: str = "avg@n", train_keys: Sequence[str] = TRAIN_KEYS
) -> Collected:
    """Read every cell's and base model's metrics (through ``metric_history``) from MLflow."""
    benchmarks = list(exp["benchmarks"])
    keys = {b: metric_key(b, metric, exp) for b in benchmarks}
    runs, _ = find_runs(client, exp["experiment"])
    _check_metric(keys, runs.values())
    root = results_dir(exp)
    out = []
    for c in cells(exp):
        run = runs.get(c.id)
        data = CellData(
            c,
            run.info.run_id if run else None,
            (root / "runs" / c.id).is_dir(),
            total_steps(exp, c.model),
            eval_steps(exp, c.model),
        )
        if run is not None:
            rid = run.info.run_id
            data.evals = {b: metric_history(client, rid, k) for b, k in keys.items()}
            wanted = [
                SENTINEL,
                *train_keys,
                f"agg/{c.aggregation}/weight_pos",
                f"agg/{c.aggregation}/weight_neg",
            ]
            wanted.append(f"agg/{c.aggregation}/weight_ratio")
            data.train = {k: metric_history(client, rid, k) for k in wanted}
        out.append(data)
    base: dict[str, dict[str, float]] = {}
    for model in exp["models"]:
        run = runs.get(base_id(model))
        if run is not None:
            hist = {b: metric_history(client, run.info.run_id, k) for b, k in keys.items()}
            base[model] = {b: h[0] for b, h in hist.items() if 0 in h}
    base_expected = bool(exp.get("evaluation", {}).get("base_model", True))
    label = metric_label(benchmarks, metric, exp)
    return Collected(exp, label, benchmarks, keys, out, base, base_expected)


def _check_metric(keys: Mapping[str, str], runs: Iterable[Any]) -> None:
    """A benchmark whose tabulated key no run has, while runs hold other metrics of it, means a
    wrong --metric (or evaluation.n changed): say which names exist instead of an empty table."""
    seen: set[str] = set()
    for r in runs:
        seen.update(r.data.metrics)
    for bench, key in keys.items():
        prefix = f"eval/{bench}/"
        others = sorted(k[len(prefix) :].replace("_at_", "@") for k in seen if k.startswith(prefix))
        if key not in seen and others:
            raise ValueError(
                f"no run has {key} ({bench}); its metrics in MLflow are: {', '.join(others)}; "
                "choose one with --metric (avg@n, maj@n and pass@n use the grid's n)"
            )


# --------------------------------------------------------------------------- tables


@dataclass
class Entry:
    """One table cell, in percent. step: the training step the value is from."""

    mean: float | None = None
    std: float | None = None
    n: int = 0
    step: int | None = None
    reported: float | None = None
    best: bool = False

    @property
    def delta(self) -> float | None:
        return None if self.mean is None or self.reported is None else self.mean - self.reported


@dataclass
class Row:
    label: str
    kind: str  # "rule" | "base"
    entries: dict[str, Entry]
    step: int | None = None
    flagged: bool = False


@dataclass
class Table:
    model: str
    dataset: str
    definition: str
    metric: str
    columns: list[str]
    rows: list[Row]
    notes: list[str]
    seeds: int

    @property
    def title(self) -> str:
        return f"{self.model} / {self.dataset}: {DEFINITIONS[self.definition]}"


def _entry(fractions: Sequence[float], step: int | None) -> Entry:
    if not fractions:
        return Entry(step=step)
    pct = [100.0 * v for v in fractions]
    std = statistics.stdev(pct) if len(pct) > 1 else None
    return Entry(statistics.fmean(pct), std, len(pct), step)


def _argmax(curve: Mapping[int, float]) -> int | None:
    """The step with the highest value; ties (within float rounding) go to the earliest step."""
    return max(curve, key=lambda t: (round(curve[t], 9), -t)) if curve else None


def _at_step(seeds: Sequence[CellData], benches: Sequence[str], step: int) -> dict[str, Entry]:
    """Every benchmark and the average at one step, over the seeds that have all benchmarks there."""
    have = [c for c in seeds if all(step in c.evals.get(b, {}) for b in benches)]
    entries = {b: _entry([c.evals[b][step] for c in have], step) for b in benches}
    entries[AVERAGE] = _entry([statistics.fmean(c.evals[b][step] for b in benches) for c in have], step)
    return entries


def _seed_mean_avg(seeds: Sequence[CellData], benches: Sequence[str]) -> dict[int, float]:
    """{step: mean over seeds (having every benchmark there) of the benchmark average}."""
    steps = set().union(*(c.complete_steps(benches) for c in seeds)) if seeds else set()
    return {
        t: statistics.fmean(
            statistics.fmean(c.evals[b][t] for b in benches) for c in seeds if t in c.complete_steps(benches)
        )
        for t in steps
    }


def _rule_row(
    definition: str, seeds: Sequence[CellData], benches: Sequence[str]
) -> tuple[dict[str, Entry], int | None]:
    if definition == "peak_per_benchmark":
        entries, best = {}, {}
        for b in benches:
            by_step: dict[int, list[float]] = {}
            for c in seeds:
                for t, v in c.evals.get(b, {}).items():
                    by_step.setdefault(t, []).append(v)
            best[b] = _argmax({t: statistics.fmean(vs) for t, vs in by_step.items()})
            values = [c.evals[b][best[b]] for c in seeds if best[b] in c.evals.get(b, {})]
            entries[b] = _entry(values, best[b])
        full = [
            c for c in seeds if all(best[b] is not None and best[b] in c.evals.get(b, {}) for b in benches)
        ]
        entries[AVERAGE] = _entry(
            [statistics.fmean(c.evals[b][best[b]] for b in benches) for c in full], None
        )
        return entries, None
    curve = _seed_mean_avg(seeds, benches)
    step = _argmax(curve) if definition == "peak_best_average" else max(curve, default=None)
    if step is None:
        return {b: Entry() for b in [*benches, AVERAGE]}, None
    return _at_step(seeds, benches, step), step


def _reported(exp: dict, model: str, dataset: str, row: str, benches: Sequence[str]) -> dict[str, float]:
    """The paper's numbers for one row: benchmarks, and the average (given, or of all benchmarks)."""
    by_model = (exp.get("reported") or {}).get(model) or {}
    rep = dict((by_model.get(dataset) or {}).get(row) or {})
    if AVERAGE not in rep and benches and all(b in rep for b in benches):
        rep[AVERAGE] = statistics.fmean(float(rep[b]) for b in benches)
    return {k: float(v) for k, v in rep.items()}


def check_reported(exp: dict) -> None:
    """Raise ValueError naming any ``reported:`` key that is not in the grid."""
    rep = exp.get("reported") or {}
    aggs = [a["name"] for a in exp["aggregations"]] + ["base"]
    cols = [*exp["benchmarks"], AVERAGE]
    problems = []
    for model, by_ds in rep.items():
        if model not in exp["models"]:
            problems.append(f"reported.{model}: unknown model; known: {', '.join(exp['models'])}")
            continue
        for ds, by_agg in (by_ds or {}).items():
            if ds not in exp["datasets"]:
                problems.append(
                    f"reported.{model}.{ds}: unknown dataset; known: {', '.join(exp['datasets'])}"
                )
                continue
            for agg, by_b in (by_agg or {}).items():
                if agg not in aggs:
                    problems.append(f"reported.{model}.{ds}.{agg}: unknown row; known: {', '.join(aggs)}")
                    continue
                for b, v in (by_b or {}).items():
                    if b not in cols:
                        problems.append(
                            f"reported.{model}.{ds}.{agg}.{b}: unknown column; known: {', '.join(cols)}"
                        )
                    elif not isinstance(v, int | float) or isinstance(v, bool):
                        problems.append(f"reported.{model}.{ds}.{agg}.{b}: {v!r} is not a number (percent)")
    if problems:
        raise ValueError("invalid `reported:` block:\n  " + "\n  ".join(problems))


def build_tables(col: Collected, *, mismatched: Iterable[str] = ()) -> dict[str, list[Table]]:
    """{"peak": [per-benchmark and best-average table of every block], "last": [...]}.

    mismatched: cell ids whose MLflow data differ from their run files (flagged, not dropped).
    """
    check_reported(col.exp)
    bad = set(mismatched)
    benches = col.benchmarks
    columns = [*benches, AVERAGE]
    out: dict[str, list[Table]] = {"peak": [], "last": []}
    for model, dataset in col.blocks():
        groups = col.rule_cells(model, dataset)
        notes, flagged = [], set()
        for rule, seeds in groups.items():
            for c in seeds:
                why = [w for w in [c.issue(benches)] if w]
                if c.cell.id in bad:
                    why.append("MLflow differs from the run files (reported with --allow-mismatch)")
                if why:
                    flagged.add(rule)
                    notes.append(f"{rule}: {c.cell.id}: {'; '.join(why)}")
        base_vals = col.base.get(model, {})
        missing_base = [b for b in benches if b not in base_vals]
        if col.base_expected and missing_base:
            notes.append(f"base: {base_id(model)}: no step-0 evaluation of {', '.join(missing_base)}")
        n_seeds = max((len(s) for s in groups.values()), default=0)
        for definition in DEFINITIONS:
            rows = []
            if col.base_expected:
                entries = {b: _entry([base_vals[b]], 0) if b in base_vals else Entry() for b in benches}
                entries[AVERAGE] = _entry(
                    [statistics.fmean(base_vals[b] for b in benches)] if not missing_base else [], 0
                )
                rows.append(Row(BASE_LABEL, "base", entries, 0, bool(missing_base)))
            for rule, seeds in groups.items():
                entries, step = _rule_row(definition, seeds, benches)
                rows.append(Row(rule, "rule", entries, step, rule in flagged))
            for row in rows:
                rep = _reported(col.exp, model, dataset, "base" if row.kind == "base" else row.label, benches)
                for k, e in row.entries.items():
                    e.reported = rep.get(k)
            for k in columns:
                shown = [round(r.entries[k].mean, 1) for r in rows if r.entries[k].mean is not None]
                for r in rows:
                    e = r.entries[k]
                    e.best = bool(shown) and e.mean is not None and round(e.mean, 1) == max(shown)
            table = Table(model, dataset, definition, col.metric, columns, rows, notes, n_seeds)
            out["last" if definition == "last" else "peak"].append(table)
    return out


# --------------------------------------------------------------------------- formatting


def _num(x: float) -> str:
    return f"{x:.1f}"


def _cell_text(e: Entry, *, show_step: bool, latex: bool = False) -> str:
    if e.mean is None:
        return "--" if latex else "—"
    pm = r" $\pm$ " if latex else " ± "
    text = _num(e.mean) + (pm + _num(e.std) if e.std is not None else "")
    if e.best:
        text = rf"\textbf{{{text}}}" if latex else f"**{text}**"
    if show_step and e.step is not None:
        text += rf"\,@{e.step}" if latex else f" @{e.step}"
    if e.delta is not None:
        d = f"{e.delta:+.1f}"
        text += rf" ($\Delta$ {d})" if latex else f" (Δ {d})"
    return text


def _legend(t: Table) -> str:
    seeds = f"mean ± std over {t.seeds} seeds (sample std)" if t.seeds > 1 else "one seed"
    extra = (
        "; Δ = ours − reported (points)"
        if any(e.reported is not None for r in t.rows for e in r.entries.values())
        else ""
    )
    return f"{t.metric} in %, {seeds}; steps are training steps; best per column in bold{extra}."


def to_markdown(tables: Sequence[Table], heading: str) -> str:
    parts = [f"# {heading}", ""]
    for t in tables:
        with_step = t.definition != "peak_per_benchmark"
        head = ["rule", *(["step"] if with_step else []), *t.columns]
        parts += [f"## {t.title}", "", _legend(t), ""]
        parts.append("| " + " | ".join(head) + " |")
        parts.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|")
        for r in t.rows:
            label = r.label + (" †" if r.flagged else "")
            step = [str(r.step) if r.step is not None else "—"] if with_step else []
            cells_ = [_cell_text(r.entries[c], show_step=not with_step) for c in t.columns]
            parts.append("| " + " | ".join([label, *step, *cells_]) + " |")
        if t.notes:
            parts += ["", "† missing or unfinished, never dropped:"]
            parts += [f"- {n}" for n in t.notes]
        parts.append("")
    return "\n".join(parts)


CSV_FIELDS = [
    "table", "model", "dataset", "metric", "row", "kind", "column", "mean", "std", "n_seeds",
    "step", "reported", "delta", "best", "flagged",
]  # fmt: skip


TIDY_FIELDS = ["model", "dataset", "aggregation", "seed", "cell_id", "benchmark", "step", "value"]


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
                        "n_seeds": e.n, "step": "" if e.step is None else e.step, "reported": opt(e.reported),
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
        head = ["Rule", *(["Step"] if with_step else []), *t.columns]
        parts += [
            r"\begin{table}[t]",
            r"\centering",
            rf"\caption{{{_tex(t.title)}. {_tex(_legend(t))}}}",
            r"\begin{tabular}{l" + "r" * (len(head) - 1) + "}",
            r"\toprule",
            " & ".join(_tex(h) for h in head) + r" \\",
            r"\midrule",
        ]
        for r in t.rows:
            label = _tex(r.label) + (r"$^{\dagger}$" if r.flagged else "")
            step = [str(r.step) if r.step is not None else "--"] if with_step else []
            cells_ = [_cell_text(r.entries[c], show_step=not with_step, latex=True) for c in t.columns]
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
    the tables were made from, as fractions) when ``col`` is given; atomic writes; returns the paths."""
    from aggbench.evaluate import write_atomic

    headings = {"peak": f"Peak tables: {experiment}", "last": f"Last-step tables: {experiment}"}
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
