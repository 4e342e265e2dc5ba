"""The analysis figures (``aggbench.report.analysis``) and the cross-cell numbers, worked by hand.

The synthetic grid of helpers/report_fixtures.py, with ``Collected`` built here as the report would
read it from MLflow (no store needed): token seeds 0 and 1 complete (12 steps, evaluated at 4, 8,
12); sequence seed 0 stopped after step 10 with checkpoints 4 and 8 (committed to step 8, evaluated
at 4 and 8); sequence seed 1 has no files.

Benchmark averages per seed (tiny_test, math500 -> mean; peak-to-last drop):

    token s0     4: (.30 + .10)/2 = .200   8: .350   12: .350   last .350, drop 0
    token s1     4: .200                   8: .300   12: .350   last .350, drop 0
    balanced s0  4: .350                   8: .350   12: .450   last .450, drop 0
    balanced s1  4: .300                   8: .450   12: .350   last .350, drop .100
    sequence s0  4: .075                   8: .175              last .175, drop 0 (its own last step)
    sequence s1  no files, no evaluation: no seed

token - sequence: last (.350 - .175) = 17.5 points, drop 0; balanced - sequence: last
((.45 + .35)/2 - .175) = 22.5 points, drop (.05 - 0) = 5.0 points.

x: len/gap = (30 + 2t + s) - (20 + t - s) = 10 + t + 2s. Each cell's mean over its committed steps,
then the mean over cells: token s0 steps 1-12: 16.5; token s1: 18.5; sequence s0 steps 1-8 (9, 10
are not committed): 14.5 -> (16.5 + 18.5 + 14.5) / 3 = 16.5.
"""

from __future__ import annotations

import math
import statistics

import pytest

from aggbench import grid
from aggbench.report import analysis
from aggbench.report.collect import CellData, Collected, metric_key
from aggbench.tracking import SENTINEL
from helpers import report_fixtures as rf


@pytest.fixture(scope="module")
def grid_files(tmp_path_factory):
    """(Collected as MLflow would give it, results dir) of the synthetic grid: evaluations in
    percent, MLflow's unit (the fixture's EVALS are metrics.json fractions)."""
    config = rf.make_grid(tmp_path_factory.mktemp("analysis"), store=False)
    exp = grid.load_experiment(config)
    cells = []
    for c in grid.cells(exp):
        key = (c.aggregation, c.seed)
        have = key in rf.EVALS
        committed = rf.PROGRESS[key][1][-1] if have else 0
        data = CellData(
            c, "run" if have else None, have, rf.TOTAL, [4, 8, 12], evals=_percent(rf.EVALS.get(key, {}))
        )
        data.train = {SENTINEL: {committed: 1.0}} if have else {}
        cells.append(data)
    keys = {b: metric_key(b, "avg@n", exp) for b in rf.BENCHES}
    base = {b: 100.0 * v for b, v in rf.BASE.items()}
    col = Collected(exp, "avg@4", list(rf.BENCHES), keys, cells, {rf.MODEL: base}, True)
    return col, grid.results_dir(exp)


def _percent(evals: dict) -> dict:
    return {b: {t: 100.0 * v for t, v in by_step.items()} for b, by_step in evals.items()}


def _cell_mean(key: str, rule: str, seed: int, steps) -> float:
    vals = [rf.metrics_row(seed, t, rf.RULES.index(rule))[key] for t in steps]
    return statistics.fmean(v for v in vals if not math.isnan(v))


def test_cross_cell_points_token_minus_sequence(grid_files):
    col, results = grid_files
    (p,) = analysis.cross_cell_points(col, results)
    assert (p.model, p.dataset) == ("tiny", "tiny")
    assert p.last == pytest.approx(17.5)
    assert p.drop == pytest.approx(0.0)
    assert p.seeds == (2, 1)  # sequence s1 has no evaluation: no seed
    assert p.x["len/gap"] == pytest.approx(16.5)
    # the same rule with the fixture's own values: each cell counts once, committed steps only
    steps = {("token", 0): range(1, 13), ("token", 1): range(1, 13), ("sequence", 0): range(1, 9)}
    for key in ("len/cv", "len/cv_within", "len/gap_within"):  # len/cv_within is NaN at step 2
        want = statistics.fmean(_cell_mean(key, r, s, ts) for (r, s), ts in steps.items())
        assert p.x[key] == pytest.approx(want), key
    # flagged: the unfinished and the missing sequence cells are named
    assert p.label == "tiny/tiny †"
    assert [n.split(":")[0] for n in p.notes] == ["tiny__tiny__sequence__s0", "tiny__tiny__sequence__s1"]


def test_cross_cell_points_drop_and_pair(grid_files):
    col, results = grid_files
    (p,) = analysis.cross_cell_points(col, results, pair=("balanced", "sequence"))
    assert p.last == pytest.approx(22.5)
    assert p.drop == pytest.approx(5.0)
    assert p.seeds == (2, 1)
    assert analysis.cross_cell_points(col, results, pair=("token", "balanced"))[0].notes == ()
    assert analysis.cross_cell_points(col, results, pair=("token", "dr_grpo")) == []  # not in the grid


def test_a_missing_metrics_file_is_skipped(grid_files, tmp_path):
    col, results = grid_files
    # results elsewhere: no cell has run files, so x is NaN but the evaluation difference stands
    (p,) = analysis.cross_cell_points(col, tmp_path)
    assert math.isnan(p.x["len/cv"]) and p.last == pytest.approx(17.5)
    assert analysis.plot_block_analysis(col, tmp_path, "tiny", "tiny", tmp_path / "plots") is None
    assert analysis.read_train(results, col.cells[-1], ["len/cv"]) is None  # sequence s1: no files


def test_agg_pg_loss_is_never_plotted():
    keys = analysis.panel_keys()
    assert not [k for k in keys if k.startswith("agg/")]
    assert {"len/cv", "len/cv_within", "len/gap", "len/gap_within", "loss/pg"} <= set(keys)
    assert {"response/truncated_frac", "entropy", "clip_frac", "grad_norm"} <= set(keys)


def test_figures_are_nontrivial_pngs(grid_files, tmp_path):
    import matplotlib.image as mpimg

    col, results = grid_files
    paths = analysis.plot_analysis(col, tmp_path, results)
    assert [p.name for p in paths] == ["tiny__tiny__analysis.png", "cross_cell.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(path)
        assert img.shape[0] > 400 and img.shape[1] > 600
        assert img[..., :3].std() > 0.05, f"{path.name}: nearly blank"


def test_one_rule_block_gets_its_figure_and_no_cross_cell(grid_files, tmp_path):
    col, results = grid_files
    only_token = Collected(
        col.exp,
        col.metric,
        col.benchmarks,
        col.keys,
        [c for c in col.cells if c.cell.aggregation == "token"],
        col.base,
        True,
    )
    paths = analysis.plot_analysis(only_token, tmp_path, results)
    assert [p.name for p in paths] == ["tiny__tiny__analysis.png"]


def test_a_selection_split_is_not_in_the_cross_cell_average(grid_files):
    """With evaluation.selection, the selection benchmark is evaluated like the others but is no
    test column: the token - sequence difference stays the test benchmarks' (17.5), however far apart
    the rules are on it (here 0 vs 100 points)."""
    import copy

    col, results = grid_files
    exp = copy.deepcopy(col.exp)
    exp["benchmarks"] = [*exp["benchmarks"], "tiny_val"]
    exp.setdefault("evaluation", {})["selection"] = {"tiny_test": "tiny_val"}
    cells = []
    for c in col.cells:
        data = copy.copy(c)
        val = 0.0 if c.cell.aggregation == "token" else 100.0
        data.evals = {**c.evals, "tiny_val": {t: val for t in c.evals.get("tiny_test", {})}}
        cells.append(data)
    keys = {**col.keys, "tiny_val": col.keys["tiny_test"].replace("tiny_test", "tiny_val")}
    with_val = Collected(exp, col.metric, [*col.benchmarks, "tiny_val"], keys, cells, col.base, True)
    (p,) = analysis.cross_cell_points(with_val, results)
    assert p.last == pytest.approx(17.5)
