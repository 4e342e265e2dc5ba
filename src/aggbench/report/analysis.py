"""The analysis figures: the paper's explanatory variables over training, per block and across blocks.

Per model x dataset block, under ``out_dir``, ``{model}__{dataset}__analysis.png``: one panel per
key of ``PANELS`` against the training step, one line per rule, the mean over seeds with a +- one std
band (``aggbench.report.plots.seed_curve``): the response-length CV and the positive/negative length
gap, each pooled over the batch (``len/cv``, ``len/gap``: prompt difficulty enters the sign split)
and within group (``len/cv_within``, ``len/gap_within``: responses to the same prompt compared), the
truncated fraction, entropy, clip fraction, gradient norm and the trained rule's own ``loss/pg``.
The counterfactual ``agg/<rule>/pg_loss`` of every rule on the same batches stays in the logs and is
never plotted: it is what a rule's loss would read, not a loss anything was trained on, and next
to ``loss/pg`` it reads as a comparison of training runs it is not.

``cross_cell.png`` (when some block has both a ``token`` and a ``sequence`` cell with evaluations):
one point per block, 2 x 2 panels. x is the block's mean pooled length CV (left column) and mean
pooled gap (right column): each token or sequence cell's mean over its steps, then the mean over
those cells (each cell counts once, whatever its length). y is token minus sequence, in points, of
(top) the last-step benchmark average and (bottom) the peak-to-last drop (``aggbench.report.stats``):
each seed's value, the mean over a rule's seeds, then the difference. Above 0 token is ahead (top)
or drops more (bottom).

Data: the training values come from each cell's ``metrics.jsonl`` (the source of truth), up to its
committed step (the latest complete checkpoint, what ``aggbench ingest`` puts in MLflow; later rows
are redone on resume); the evaluations from what the report read from MLflow (``Collected``). A cell
without the file, or trained under another rule version, is left out; NaN values are dropped. An
unfinished cell enters as the tables treat it: its steps so far, and its own last evaluated step
(so its point is marked: hollow, a dagger in its label); a cell with no evaluation adds no seed.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aggbench import layout
from aggbench.grid import results_dir, test_benchmarks
from aggbench.report.collect import CellData, Collected
from aggbench.report.ingest import Source
from aggbench.report.plots import _colors, _line, _pyplot, _save
from aggbench.report.stats import average_curve, curve_drop
from aggbench.tracking import MetricsLog

PANELS: tuple[tuple[str, str], ...] = (
    ("len/cv", "length CV, pooled"),
    ("len/cv_within", "length CV, within group"),
    ("len/gap", "length gap (A>0 minus A<0), pooled"),
    ("len/gap_within", "length gap (A>0 minus A<0), within group"),
    ("response/truncated_frac", "truncated fraction"),
    ("entropy", "entropy"),
    ("clip_frac", "clip fraction"),
    ("grad_norm", "gradient norm"),
    ("loss/pg", "policy-gradient loss of the trained rule"),
)
X_KEYS = ("len/cv", "len/gap", "len/cv_within", "len/gap_within")  # the cross-cell x means
PAIR = ("token", "sequence")  # the grid's instance names the cross-cell figure compares


def panel_keys() -> list[str]:
    """The metrics.jsonl keys the per-block figure plots, in panel order (no ``agg/*`` key)."""
    return [k for k, _ in PANELS]


def read_train(
    results: str | Path, cell: CellData, keys: Sequence[str]
) -> dict[str, dict[int, float]] | None:
    """{key: {step: value}} of one cell's committed metrics.jsonl rows, finite values only; None when
    the cell has no metrics.jsonl or was trained under another rule version (``CellData.stale``)."""
    run = layout.run_dir(results, cell.cell.id)
    path = layout.metrics_file(run)
    if cell.stale or not path.is_file():
        return None
    rows = MetricsLog(path).read()
    upto = Source(cell.cell.id, run, "cell", total_steps=cell.total).committed_step(rows)
    out: dict[str, dict[int, float]] = {k: {} for k in keys}
    for row in rows:
        step = int(row["step"])
        if step > upto:
            break
        for k in keys:
            v = row.get(k)
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                out[k][step] = float(v)
    return out


Train = dict[str, dict[int, float]]


def read_cells(col: Collected, results: str | Path) -> dict[str, Train | None]:
    """{cell id: ``read_train`` of every key either figure plots}: each metrics.jsonl read once."""
    keys = list(dict.fromkeys([*panel_keys(), *X_KEYS]))
    return {c.cell.id: read_train(results, c, keys) for c in col.cells}


def _block_train(
    col: Collected, train_of: Mapping[str, Train | None], model: str, dataset: str
) -> dict[str, list[Train]]:
    """{rule: the training values of each of its cells that has run files}; rules with none left out."""
    out: dict[str, list[Train]] = {}
    for rule, cells_ in col.rule_cells(model, dataset).items():
        have = [t for c in cells_ if (t := train_of.get(c.cell.id)) is not None]
        if have:
            out[rule] = have
    return out


def plot_block_analysis(
    col: Collected,
    results: Path,
    model: str,
    dataset: str,
    out_dir: Path,
    train_of: Mapping[str, Train | None] | None = None,
) -> Path | None:
    """``{model}__{dataset}__analysis.png``; None when no cell of the block has run files.
    ``train_of``: ``read_cells``' result when the caller has it."""
    train = _block_train(col, train_of if train_of is not None else read_cells(col, results), model, dataset)
    if not train:
        return None
    plt = _pyplot()
    colors = _colors(list(col.rule_cells(model, dataset)))
    seeds = max(len(v) for v in train.values())
    note = f"mean over up to {seeds} seeds, band = ±1 std" if seeds > 1 else "one seed"
    ncols = 3
    nrows = math.ceil(len(PANELS) / ncols)
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(4.4 * ncols, 3.1 * nrows + 0.5), squeeze=False, layout="constrained"
    )
    for ax, (key, title) in zip(axes.flat, PANELS, strict=False):
        for rule, cells_ in train.items():
            _line(ax, [c[key] for c in cells_], label=rule, color=colors[rule])
        if key.startswith("len/gap"):
            ax.axhline(0.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set(title=title, xlabel="training step", ylabel=key)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(PANELS) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.suptitle(f"{model}__{dataset}: training diagnostics from the run files ({note})")
    return _save(fig, out_dir / f"{model}__{dataset}__analysis.png")


@dataclass(frozen=True)
class Point:
    """One block of the cross-cell figure.

    x: {key of X_KEYS: mean over the pair's cells (with run files) of each cell's mean over its
    committed steps}, NaN when none has a value; last, drop: first rule minus second rule of the
    mean over seeds of the last-step benchmark average and of the peak-to-last drop, in points;
    seeds: how many seeds of each rule have an evaluated step; notes: why a cell of the pair is
    missing or unfinished (``CellData.issue``), empty when every cell is complete.
    """

    model: str
    dataset: str
    x: dict[str, float]
    last: float
    drop: float
    seeds: tuple[int, int]
    notes: tuple[str, ...] = field(default=())

    @property
    def label(self) -> str:
        return f"{self.model}/{self.dataset}" + (" †" if self.notes else "")


def _seed_means(cells_: Sequence[CellData], benches: Sequence[str]) -> tuple[float, float, int] | None:
    """(mean last-step benchmark average, mean peak-to-last drop, seeds) over the seeds evaluated at
    some step with every benchmark; None when no seed is."""
    lasts, drops = [], []
    for c in cells_:
        curve = average_curve(c.evals, benches) if not c.stale else {}
        if curve:
            lasts.append(curve[max(curve)])
            drops.append(curve_drop(curve))
    if not lasts:
        return None
    return statistics.fmean(lasts), statistics.fmean(drops), len(lasts)


def _mean_x(train: Sequence[dict[str, dict[int, float]]], key: str) -> float:
    per_cell = [statistics.fmean(t[key].values()) for t in train if t.get(key)]
    return statistics.fmean(per_cell) if per_cell else math.nan


def cross_cell_points(
    col: Collected,
    results: str | Path | None = None,
    pair: tuple[str, str] = PAIR,
    train_of: Mapping[str, Train | None] | None = None,
) -> list[Point]:
    """One Point per block that has both rules of ``pair`` with an evaluated seed each (module
    docstring: how x and y are taken, how a missing or unfinished cell enters)."""
    results = Path(results) if results is not None else results_dir(col.exp)
    train_of = train_of if train_of is not None else read_cells(col, results)
    benches = [b for b in col.benchmarks if b in test_benchmarks(col.exp)]  # no selection split
    points = []
    for model, dataset in col.blocks():
        groups = col.rule_cells(model, dataset)
        if not all(r in groups for r in pair):
            continue
        ys = [_seed_means(groups[r], benches) for r in pair]
        if ys[0] is None or ys[1] is None:
            continue
        train = [t for r in pair for c in groups[r] if (t := train_of.get(c.cell.id)) is not None]
        notes = tuple(f"{c.cell.id}: {why}" for r in pair for c in groups[r] if (why := c.issue(benches)))
        points.append(
            Point(
                model,
                dataset,
                {k: _mean_x(train, k) for k in X_KEYS},
                ys[0][0] - ys[1][0],  # points: the evaluations are in percent
                ys[0][1] - ys[1][1],
                (ys[0][2], ys[1][2]),
                notes,
            )
        )
    return points


def plot_cross_cell(points: Sequence[Point], out_dir: Path, pair: tuple[str, str] = PAIR) -> Path | None:
    """``cross_cell.png`` of ``points``; None when there are none."""
    if not points:
        return None
    plt = _pyplot()
    a, b = pair
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5), squeeze=False, layout="constrained")
    rows = (
        ("last", f"last-step average: {a} − {b} (points)"),
        ("drop", f"peak-to-last drop: {a} − {b} (points)"),
    )
    cols = (
        ("len/cv", "mean response-length CV (pooled)"),
        ("len/gap", "mean length gap A>0 − A<0 (pooled, tokens)"),
    )
    for i, (y_attr, y_label) in enumerate(rows):
        for j, (x_key, x_label) in enumerate(cols):
            ax = axes[i][j]
            for p in points:
                x, y = p.x[x_key], getattr(p, y_attr)
                if not (math.isfinite(x) and math.isfinite(y)):
                    continue
                face = "none" if p.notes else "C0"
                ax.scatter([x], [y], s=40, facecolors=face, edgecolors="C0")
                ax.annotate(p.label, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
            ax.axhline(0.0, color="grey", linewidth=0.8, linestyle=":")
            ax.set(xlabel=x_label, ylabel=y_label)
            ax.locator_params(axis="x", nbins=5)
            ax.grid(alpha=0.3)
    title = f"{a} minus {b} per model × dataset block, against its length statistics"
    if any(p.notes for p in points):
        title += "\n† hollow: a cell is missing or unfinished (the tables' footnotes say which)"
    fig.suptitle(title)
    return _save(fig, out_dir / "cross_cell.png")


def plot_analysis(col: Collected, out_dir: Path, results: str | Path | None = None) -> list[Path]:
    """Every block's analysis figure, then the cross-cell figure; returns the paths written."""
    results = Path(results) if results is not None else results_dir(col.exp)
    train_of = read_cells(col, results)
    paths = [plot_block_analysis(col, results, m, d, out_dir, train_of) for m, d in col.blocks()]
    paths.append(plot_cross_cell(cross_cell_points(col, results, train_of=train_of), out_dir))
    return [p for p in paths if p is not None]
