"""MLflow -> peak and last-step tables (Markdown, CSV, LaTeX).

Per model x dataset, rows are the grid's rule instances plus the base model at step 0, columns the
benchmarks, their average and the peak-to-last drop. A value is the benchmark's headline metric
(``avg@n`` unless told otherwise) in percent: with several seeds the mean over the seeds that have
it and a 95% Student-t interval over the per-seed values; with one seed that seed's value and the
evaluation's own bootstrap interval over problems, where it has one (``aggbench.report.stats``
defines both, and the drop). Steps are training steps. Three tables per block:

* ``peak_per_benchmark``: each benchmark at its own best step, chosen on the seed-mean curve (the
  step is shown beside each value); the average column averages those per-benchmark peaks.
* ``peak_best_average``: every benchmark at the single step whose seed-mean benchmark average is
  best (one step per row).

  Both peaks are chosen among the steps every seed of the row has (when a seed stopped early, a
  step only the others reached would otherwise win on fewer, or the best, seeds alone).
* ``last``: every benchmark at the last step that has all benchmarks.
* ``selected`` (only with ``evaluation.selection``, in its own files): each seed's checkpoint
  chosen on a held-out selection benchmark (``{test: selection}``, e.g. tiny_test: tiny_val), the
  test benchmark's value at that step. The peak tables pick the best step on the test benchmark
  itself, which is optimistic; this one does not look at the test benchmark to choose. Selection
  benchmarks are never columns of the tables.

The ``drop`` column is the same in all three: each seed's peak minus last value of its
benchmark-average curve, averaged over seeds (the paper's stability measure; lower is better).
Ties between steps go to the earliest. The best value of each column (rounded as shown) is bold,
among the rows that are neither flagged (below) nor a random-reward control.
A row whose cells are missing, unfinished (trained to fewer than total_steps, or fewer evaluation
steps than the grid expects) or disagree with the run files is marked with a dagger and the
table's footnote names each cell and why; such rows are never dropped. A ``reported:`` block in the
config ({model: {dataset: {aggregation | "base": {benchmark | "average": percent}}}}) adds the
paper's numbers; each value then shows its delta (ours - reported, in points).

Files: ``peak.{md,csv,tex}`` hold the two peak tables of every block, ``last.{md,csv,tex}`` the
last-step table of every block; their CSV is long (one line per row x column), for scripts.
``values.csv`` is the tidy table everything is computed from: one line per (cell, benchmark, step)
with the value read from MLflow (percent, as every table), base models at step 0.

This module assembles the tables; reading MLflow lives in ``aggbench.report.collect`` and the
Markdown/CSV/LaTeX rendering in ``aggbench.report.render``.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aggbench import grid
from aggbench.report.collect import CellData, Collected
from aggbench.report.ingest import base_id
from aggbench.report.notes import MISMATCH_NOTE, base_problem_notes, cell_notes, training_overlap_notes
from aggbench.report.stats import average_curve, curve_drop, t_interval

if TYPE_CHECKING:
    from aggbench.data.overlap import Overlap

AVERAGE = "average"
DROP = "drop"  # peak minus last of each seed's benchmark average (_drop, stats.curve_drop)
BASE_LABEL = "base (step 0)"
DEFINITIONS = {
    # "chosen on the test benchmark" in the title itself: a caption pasted alone (peak.tex) says it
    "peak_per_benchmark": "peak: each benchmark at its own best step, chosen on that test benchmark "
    "(@step; optimistic)",
    "peak_best_average": "peak: the single step with the best benchmark average, chosen on the test "
    "benchmarks (optimistic)",
    "last": "last evaluated step",
    "selected": "selected: each seed's checkpoint chosen on the selection split, its test score",
}
SELECTED_NOTE = (
    "The step of each benchmark is chosen per seed on its selection benchmark ({pairs}; ties: the earlier "
    "step), never on the test benchmark; the steps column lists the seeds' chosen steps"
)


@dataclass
class Entry:
    """One table cell, in percent. step: the training step the value is from; n: the seeds it
    averages; (low, high): its 95% interval, ``interval`` saying which ("t": Student-t over the n
    seeds, "bootstrap": the one seed's evaluation bootstrap over problems, None: none)."""

    mean: float | None = None
    std: float | None = None
    n: int = 0
    step: int | None = None
    reported: float | None = None
    best: bool = False
    low: float | None = None
    high: float | None = None
    interval: str | None = None

    @property
    def delta(self) -> float | None:
        return None if self.mean is None or self.reported is None else self.mean - self.reported


@dataclass
class Row:
    label: str
    kind: str  # "rule" | "base" | "control" (a random-reward control: never marked best)
    entries: dict[str, Entry]
    step: int | None = None
    flagged: bool = False
    steps_text: str | None = None  # the selected table: each seed's chosen step(s), as shown


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
    about: list[str] = field(default_factory=list)  # said under the legend (how the selected table chooses)

    @property
    def title(self) -> str:
        return f"{self.model} / {self.dataset}: {DEFINITIONS[self.definition]}"


def _entry(percents: Sequence[float], step: int | None, boot: tuple[float, float] | None = None) -> Entry:
    """Mean of per-seed values (percent, as MLflow holds them); the t interval over them when there
    are two or more, else ``boot`` (the one seed's bootstrap bounds, percent) when given."""
    if not percents:
        return Entry(step=step)
    pct = list(percents)
    e = Entry(statistics.fmean(pct), None, len(pct), step)
    if len(pct) > 1:
        e.std = statistics.stdev(pct)
        e.low, e.high = t_interval(pct)
        e.interval = "t"
    elif boot is not None:
        e.low, e.high, e.interval = boot[0], boot[1], "bootstrap"
    return e


def _boot(have: Sequence[CellData], bench: str, step: int | None) -> tuple[float, float] | None:
    """The bootstrap bounds of the only seed's evaluation at ``step``, when exactly one seed is tabled."""
    return have[0].ci.get(bench, {}).get(step) if len(have) == 1 and step is not None else None


def _drop(seeds: Sequence[CellData], benches: Sequence[str]) -> Entry:
    """The peak-to-last drop: per seed, then over seeds (an entry like any other, in points). A seed
    whose average curve ends before the last step any seed reached is left out, so the cell shows
    its n: its drop would be over a shorter run (a run stopped at its peak reads 0, "stable")."""
    curves = [c for c in (average_curve(s.evals, benches) for s in seeds) if c]
    last = max((max(c) for c in curves), default=None)
    return _entry([curve_drop(c) for c in curves if max(c) == last], None)


def _argmax(curve: Mapping[int, float]) -> int | None:
    """The step with the highest value; ties (within float rounding) go to the earliest step."""
    return max(curve, key=lambda t: (round(curve[t], 9), -t)) if curve else None


def _shared(curve: Mapping[int, float], step_sets: Iterable[Iterable[int]]) -> dict[int, float]:
    """``curve`` at the steps every seed with a value has (seeds without any do not count), so a
    peak is not chosen where the seed set changed: a step only the best seed reached would win on
    that seed alone. Every step when they share none."""
    sets = [set(s) for s in step_sets]
    shared = set.intersection(*(s for s in sets if s)) if any(sets) else set()
    return {t: v for t, v in curve.items() if t in shared} or dict(curve)


def _at_step(seeds: Sequence[CellData], benches: Sequence[str], step: int) -> dict[str, Entry]:
    """Every benchmark and the average at one step, over the seeds that have all benchmarks there."""
    have = [c for c in seeds if all(step in c.evals.get(b, {}) for b in benches)]
    entries = {b: _entry([c.evals[b][step] for c in have], step, _boot(have, b, step)) for b in benches}
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
            curve = {t: statistics.fmean(vs) for t, vs in by_step.items()}
            best[b] = _argmax(_shared(curve, (c.evals.get(b, {}) for c in seeds)))
            have = [c for c in seeds if best[b] in c.evals.get(b, {})]
            entries[b] = _entry([c.evals[b][best[b]] for c in have], best[b], _boot(have, b, best[b]))
        full = [
            c for c in seeds if all(best[b] is not None and best[b] in c.evals.get(b, {}) for b in benches)
        ]
        entries[AVERAGE] = _entry(
            [statistics.fmean(c.evals[b][best[b]] for b in benches) for c in full], None
        )
        return entries, None
    curve = _seed_mean_avg(seeds, benches)
    if definition == "peak_best_average":
        step = _argmax(_shared(curve, (c.complete_steps(benches) for c in seeds)))
    else:  # the last step any seed reached: an unfinished seed's row is flagged and shows its n
        step = max(curve, default=None)
    if step is None:
        return {b: Entry() for b in [*benches, AVERAGE]}, None
    return _at_step(seeds, benches, step), step


def _selected_row(
    seeds: Sequence[CellData], benches: Sequence[str], chosen_on: Mapping[str, str]
) -> tuple[dict[str, Entry], str]:
    """Every test benchmark at the step each seed's run chose on its selection benchmark (its best
    step there, ties to the earliest, among the steps where the test benchmark was evaluated too);
    the average over benchmarks per seed. Returns (entries, the chosen steps as shown)."""
    picks: dict[str, dict[int, int]] = {}  # bench -> {seed index: step}
    for b in benches:
        sel = chosen_on.get(b)
        picks[b] = {}
        for i, c in enumerate(seeds):
            curve = {t: v for t, v in c.evals.get(sel, {}).items() if t in c.evals.get(b, {})} if sel else {}
            step = _argmax(curve)
            if step is not None:
                picks[b][i] = step
    entries = {}
    for b in benches:
        have = [seeds[i] for i in picks[b]]
        steps = set(picks[b].values())
        step = steps.pop() if len(steps) == 1 else None
        entries[b] = _entry([seeds[i].evals[b][t] for i, t in picks[b].items()], step, _boot(have, b, step))
    full = [i for i in range(len(seeds)) if all(i in picks[b] for b in benches)]
    entries[AVERAGE] = _entry(
        [statistics.fmean(seeds[i].evals[b][picks[b][i]] for b in benches) for i in full], None
    )
    by_seed = []
    for i, c in enumerate(seeds):
        chosen = sorted({picks[b][i] for b in benches if i in picks[b]})
        by_seed.append(f"s{c.cell.seed}@{'/'.join(map(str, chosen)) or '—'}")
    return entries, " ".join(by_seed)


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
    aggs = [a["name"] for a in grid.aggregations(exp)] + ["base"]
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


def _mark_best(rows: Sequence[Row], columns: Sequence[str]) -> None:
    """Bold the best value of each column as shown (rounded): the highest, the least drop. A
    random-reward control is no contender, nor is a flagged row (unfinished or missing seeds, or
    MLflow data that differ from the run files): its values may come from other steps or fewer seeds."""
    for k in columns:
        contends = [r.kind != "control" and not r.flagged for r in rows]
        shown = [
            round(r.entries[k].mean, 1)
            for r, ok in zip(rows, contends, strict=True)
            if ok and r.entries[k].mean is not None
        ]
        top = (min if k == DROP else max)(shown, default=None)
        for r, ok in zip(rows, contends, strict=True):
            e = r.entries[k]
            e.best = ok and e.mean is not None and round(e.mean, 1) == top


def _selected_about(
    chosen_on: Mapping[str, str], benches: Sequence[str], overlaps: Mapping[tuple[str, str], Overlap]
) -> list[str]:
    """What the selected table says under its legend: how it chose, what it could not, and the test
    problems a selection benchmark holds too (``overlaps``: ``data.overlap.shared_problems``)."""
    pairs = ", ".join(f"{t} on {v}" for t, v in chosen_on.items())
    out = [SELECTED_NOTE.format(pairs=pairs)]
    for test, sel in chosen_on.items():
        shared = overlaps.get((sel, test))
        if isinstance(shared, str):
            out.append(f"{sel} not compared with {test} for shared problems: {shared}")
        elif shared:
            out.append(
                f"{sel} holds {shared.describe(test)}: the checkpoint chosen for {test} has seen them scored"
            )
    missing = [b for b in benches if b not in chosen_on]
    if missing:
        out.append(f"no selection benchmark for {', '.join(missing)}: not selected, left empty")
    return out


def build_tables(
    col: Collected,
    *,
    mismatched: Iterable[str] = (),
    reported: bool = True,
    overlaps: Mapping[tuple[str, str], Overlap] | None = None,
    trained: Mapping[tuple[str, str], Overlap] | None = None,
) -> dict[str, list[Table]]:
    """{"peak": [per-benchmark and best-average table of every block], "last": [...]}.

    overlaps: {(selection benchmark, test benchmark): problems both hold, or why they were not
    compared}, noted under the selected table (``data.overlap.shared_problems``; none: no note).
    trained: {(dataset, test benchmark): problems its prepared training file holds too, or why not
    compared}, noted under every table of the dataset's blocks (none: no note).
    mismatched: cell ids whose MLflow data differ from their run files (flagged, not dropped).
    reported: show the config's ``reported:`` numbers and deltas (off for the greedy tables: the
    paper's numbers are of its own sampled protocol, not of greedy decoding).
    """
    check_reported(col.exp)
    bad = set(mismatched)
    selecting = bool(grid.selection(col.exp))
    benches = [b for b in col.benchmarks if b in grid.test_benchmarks(col.exp)]  # the columns
    columns = [*benches, AVERAGE, DROP]
    out: dict[str, list[Table]] = {"peak": [], "last": []}
    definitions = [*DEFINITIONS] if selecting else [d for d in DEFINITIONS if d != "selected"]
    if selecting:
        out["selected"] = []
    for model, dataset in col.blocks():
        chosen_on = grid.selection_for(col.exp, dataset)  # per dataset: a holdout of its own set
        groups = col.rule_cells(model, dataset)
        notes, flagged = cell_notes(groups, col.benchmarks, benches, bad)
        base_vals = col.base.get(model, {})
        missing_base = [b for b in benches if b not in base_vals]
        if col.base_expected and missing_base:
            notes.append(f"base: {base_id(model)}: no step-0 evaluation of {', '.join(missing_base)}")
        sizes, base_unequal = base_problem_notes(
            base_id(model), col.base_problems.get(model, {}), groups, col.benchmarks, benches
        )
        notes += sizes if col.base_expected else []
        base_bad = col.base_expected and base_id(model) in bad  # its MLflow values differ from its files
        notes += [f"base: {base_id(model)}: {MISMATCH_NOTE}"] if base_bad else []
        notes += training_overlap_notes(dataset, benches, trained or {})
        n_seeds = max((len(s) for s in groups.values()), default=0)
        for definition in definitions:
            rows = []
            if col.base_expected:
                base_ci = col.base_ci.get(model, {})
                entries = {
                    b: _entry([base_vals[b]], 0, base_ci.get(b)) if b in base_vals else Entry()
                    for b in benches
                }
                entries[AVERAGE] = _entry(
                    [statistics.fmean(base_vals[b] for b in benches)] if not missing_base else [], 0
                )
                entries[DROP] = Entry()
                rows.append(
                    Row(BASE_LABEL, "base", entries, 0, bool(missing_base) or base_unequal or base_bad)
                )
            for rule, seeds in groups.items():
                steps_text = None
                if definition == "selected":
                    entries, steps_text = _selected_row(seeds, benches, chosen_on)
                    step = None
                else:
                    entries, step = _rule_row(definition, seeds, benches)
                entries[DROP] = _drop(seeds, benches)
                kind = "control" if rule.endswith(grid.RANDOM_SUFFIX) else "rule"
                rows.append(Row(rule, kind, entries, step, rule in flagged, steps_text))
            for row in rows:
                label = "base" if row.kind == "base" else row.label
                rep = _reported(col.exp, model, dataset, label, benches) if reported else {}
                for k, e in row.entries.items():
                    e.reported = rep.get(k)
            _mark_best(rows, columns)
            extra = _selected_about(chosen_on, benches, overlaps or {}) if definition == "selected" else []
            table = Table(model, dataset, definition, col.metric, columns, rows, notes, n_seeds, extra)
            out[definition if definition in ("last", "selected") else "peak"].append(table)
    return out
