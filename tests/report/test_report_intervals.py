"""The report's intervals and peak-to-last drop on a complete grid: 2 seeds x 3 rules.

Every expected string is computed here from the definitions, not read back from the code under
test: the mean over seeds, the 95% Student-t half-width t(0.975, n - 1) * s / sqrt(n) with the
t value from a printed t table (12.7062 for df = 1, so 2 seeds), and the drop = each seed's peak
minus last of its benchmark average (steps 4, 8, 12), averaged over seeds.
"""

from __future__ import annotations

import math
import statistics

import pytest

from aggbench.report.render import _legend
from aggbench.report.tables import Table
from helpers import report_fixtures as rf
from helpers.report_fixtures import md_rows, read_csv

T_TABLE = {1: 12.7062, 2: 4.3027}  # two-sided 95% Student-t quantiles, from any t table
BENCHES = list(rf.BENCHES)
EVALS = {
    **{k: v for k, v in rf.EVALS.items() if k[0] != "sequence"},
    ("sequence", 0): {"tiny_test": {4: 0.10, 8: 0.20, 12: 0.30}, "math500": {4: 0.05, 8: 0.15, 12: 0.10}},
    ("sequence", 1): {"tiny_test": {4: 0.20, 8: 0.35, 12: 0.25}, "math500": {4: 0.10, 8: 0.25, 12: 0.05}},
}
RULES = ["token", "balanced", "sequence"]


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The complete grid ingested and reported (tables only); the tables' directory."""
    root = tmp_path_factory.mktemp("intervals")
    with pytest.MonkeyPatch.context() as mp:  # the grid's own embedded store, whatever the shell says
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        rf.ingest_and_report(rf.make_grid(root, evals=EVALS), root / "t", "--no-plots")
    return root / "t"


def by_hand(values_pct: list[float]) -> str:
    """'mean ± half' as the table must render it, from the t formula."""
    n = len(values_pct)
    half = T_TABLE[n - 1] * statistics.stdev(values_pct) / math.sqrt(n)
    return f"{statistics.fmean(values_pct):.1f} ± {half:.1f}"


def avg_curve(rule: str, seed: int) -> dict[int, float]:
    ev = EVALS[(rule, seed)]
    return {t: 100 * (ev["tiny_test"][t] + ev["math500"][t]) / 2 for t in (4, 8, 12)}


def drop_by_hand(rule: str) -> str:
    drops = [max(c.values()) - c[12] for c in (avg_curve(rule, s) for s in (0, 1))]
    return by_hand(drops)


def plain(cell: str) -> str:
    return cell.replace("**", "")


def test_last_step_cells_are_the_mean_and_t_interval_over_the_two_seeds(tables):
    rows = md_rows((tables / "last.md").read_text(), "last evaluated step")
    for rule in RULES:
        want = [by_hand([100 * EVALS[(rule, s)][b][12] for s in (0, 1)]) for b in BENCHES]
        want.append(by_hand([avg_curve(rule, s)[12] for s in (0, 1)]))
        want.append(drop_by_hand(rule))
        assert [plain(c) for c in rows[rule][1:]] == want, rule
        assert rows[rule][0] == "12"
    # sequence: s0 .30/.10 -> avg 20, peak 20 (step 12? no: 8 has .175, 12 has .20) -> drop 0;
    # s1 avg 4: 15, 8: 30, 12: 15 -> drop 15: mean 7.5, half 12.7062 * 10.607 / 1.414 = 95.3
    assert plain(rows["sequence"][-1]) == "7.5 ± 95.3"


def test_csv_holds_the_interval_bounds_and_the_drop(tables):
    data = read_csv(tables / "last.csv")
    vals = [100 * EVALS[("balanced", s)]["tiny_test"][12] for s in (0, 1)]  # 70, 50
    half = T_TABLE[1] * statistics.stdev(vals) / math.sqrt(2)
    row = data[("last", "balanced", "tiny_test")]
    assert (float(row["ci_low"]), float(row["ci_high"])) == pytest.approx((60 - half, 60 + half), abs=1e-3)
    assert (row["interval"], row["n_seeds"]) == ("t", "2")
    drop = data[("last", "balanced", "drop")]
    assert float(drop["mean"]) == pytest.approx(5.0)  # balanced: s0 0, s1 .45 - .35 = 10 points
    assert drop["best"] == "0"
    assert data[("last", "token", "drop")]["best"] == "1"  # token drops 0 on both seeds: the least
    # the drop is one number per rule: the peak tables carry the same
    peak = read_csv(tables / "peak.csv")
    for rule in RULES:
        for t in ("peak_per_benchmark", "peak_best_average"):
            assert peak[(t, rule, "drop")]["mean"] == data[("last", rule, "drop")]["mean"]
    assert data[("last", "base (step 0)", "drop")]["mean"] == ""


def test_legend_states_t_for_the_table_seed_count():
    for seeds, t in ((2, "12.71"), (3, "4.30")):
        table = Table("m", "d", "last", "avg@4", ["x", "average", "drop"], [], [], seeds)
        assert f"t = {t} with {seeds} seeds" in _legend(table)
    one = _legend(Table("m", "d", "last", "avg@4", ["x"], [], [], 1))
    assert "one seed" in one and "bootstrap interval over problems" in one
