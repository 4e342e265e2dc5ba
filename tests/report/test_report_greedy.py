"""The greedy n=1 protocol's tables (issue 28, item 4(b)): with ``evaluation.greedy`` the report writes
tables/greedy/ from the ``greedy@1`` values beside the avg@n tables, which stay as they were.

The synthetic grid of report_fixtures, plus a greedy metrics.json per evaluation whose accuracy is
1 - the sampled avg@4 (so the two protocols rank differently). By hand, at the last step (12):

token     tiny_test  1 - (.40, .50) = (.60, .50) -> 55.0 ± 63.5   math500 (.70, .80) -> 75.0 ± 63.5
balanced  tiny_test  1 - (.70, .50) = (.30, .50) -> 40.0 ± 127.1  math500 (.80, .80) -> 80.0 ± 0.0
averages  token (.65, .65) -> 65.0 ± 0.0; balanced (.55, .65) -> 60.0 ± 63.5
drops     token: seed curves (.80, .65, .65) and (.80, .70, .65) -> 15, 15 -> 15.0 ± 0.0;
          balanced (.65, .65, .55) and (.70, .55, .65) -> 10, 5 -> 7.5 ± 31.8 (12.706 x 5 / 2)
base      tiny_test 1 - .10 = 90.0, math500 95.0
"""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from aggbench.cli.report import report_command
from aggbench.report.ingest import find_runs, summary_id, tracking_uri
from aggbench.tracking import init_store, metric_history
from helpers import report_fixtures as rf
from helpers.report_fixtures import md_rows

REPORTED = {"tiny": {"tiny": {"token": {"tiny_test": 40.0, "math500": 30.0}, "base": {"tiny_test": 12.0}}}}


def _greedy_metrics(bench: str, value: float) -> dict:
    """A greedy protocol's metrics.json as ``aggbench score`` writes it for n = 1."""
    return {
        "benchmark": bench,
        "n_problems": 16,
        "n_samples": 1,
        "avg@1": value,
        "pass@1": value,
        "maj@1": value,
        "metrics": ["avg@1", "pass@1", "maj@1"],
        "ci_low": max(0.0, value - 0.2),
        "ci_high": min(1.0, value + 0.2),
        "mean_length": 30.0,
        "truncation_rate": 0.0,
    }


def _write_greedy(run_dir, by_bench) -> None:
    for bench, by_step in by_bench.items():
        for step, value in by_step.items():
            d = run_dir / "eval" / f"step_{step}" / "greedy"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{bench}.metrics.json").write_text(json.dumps(_greedy_metrics(bench, 1 - value)))


@pytest.fixture(scope="module")
def greedy_grid(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path_factory.mktemp("greedy")
    config = rf.make_grid(root, reported=REPORTED)
    results = root / "results"
    for (rule, seed), by_bench in rf.EVALS.items():
        _write_greedy(results / "runs" / rf.cell_id(rule, seed), by_bench)
    _write_greedy(results / "base" / rf.MODEL, {b: {0: v} for b, v in rf.BASE.items()})
    # the greedy protocol scored on fewer problems in one evaluation, the sampled one did not
    trimmed = (
        results / "runs" / rf.cell_id("sequence", 0) / "eval" / "step_8" / "greedy" / "tiny_test.metrics.json"
    )
    trimmed.write_text(json.dumps({**json.loads(trimmed.read_text()), "n_problems": 8}))
    exp = yaml.safe_load(config.read_text())
    exp["evaluation"]["greedy"] = True
    config.write_text(yaml.safe_dump(exp, sort_keys=False))
    out = root / "tables"
    output = rf.ingest_and_report(config, out)
    yield config, out, output
    mp.undo()


def _plain(cells: list[str]) -> list[str]:
    return [c.replace("**", "") for c in cells]


def test_greedy_tables_hold_the_greedy_values(greedy_grid):
    _, out, output = greedy_grid
    md = (out / "greedy" / "last.md").read_text()
    rows = md_rows(md, "last evaluated step")
    assert _plain(rows["token"]) == ["12", "55.0 ± 63.5", "75.0 ± 63.5", "65.0 ± 0.0", "15.0 ± 0.0"]
    assert _plain(rows["balanced"]) == ["12", "40.0 ± 127.1", "80.0 ± 0.0", "60.0 ± 63.5", "7.5 ± 31.8"]
    assert _plain(rows["base (step 0)"])[:4] == ["0", "90.0", "95.0", "92.5"]
    assert "greedy@1 in %" in md and "greedy decoding (n=1, temperature 0)" in md
    # the paper's numbers are of its sampled protocol: no delta against them in the greedy tables
    assert "Δ" not in md and "Δ" not in (out / "greedy" / "peak.md").read_text()
    for name in ("peak.md", "peak.csv", "peak.tex", "last.csv", "last.tex", "values.csv"):
        assert (out / "greedy" / name).is_file(), name
    assert str(out / "greedy" / "last.md") in output


def test_the_sampled_tables_are_unchanged_by_the_greedy_protocol(greedy_grid):
    _, out, _ = greedy_grid
    md = (out / "last.md").read_text()
    rows = md_rows(md, "last evaluated step")
    # test_report.py's values for the same grid without greedy files
    assert rows["balanced"] == ["12", "**60.0 ± 127.1**", "20.0 ± 0.0", "**40.0 ± 63.5**", "5.0 ± 63.5"]
    assert "avg@4 in %" in md and "greedy" not in md


def test_mlflow_holds_greedy_at_1_and_the_summary_run_the_greedy_tables(greedy_grid):
    config, _, _ = greedy_grid
    from aggbench.grid import load_experiment

    exp = load_experiment(config)
    client = init_store(tracking_uri(exp))
    runs, _ = find_runs(client, exp["experiment"])
    token0 = runs[rf.cell_id("token", 0)].info.run_id
    # steps 4, 8, 12: 1 - (.30, .50, .40); step 0 is the base model's (1 - .10), as for avg@4
    got = metric_history(client, token0, "eval/tiny_test/greedy_at_1")
    assert got == pytest.approx({0: 90.0, 4: 70.0, 8: 50.0, 12: 60.0})
    assert metric_history(client, token0, "eval/tiny_test/avg_at_4")[12] == pytest.approx(40.0)
    summary = runs[summary_id(exp["experiment"])].info.run_id
    names = {a.path for a in client.list_artifacts(summary, "tables/greedy")}
    assert {"tables/greedy/last.md", "tables/greedy/peak.csv", "tables/greedy/values.csv"} <= names


def test_a_changed_greedy_file_is_a_mismatch_the_report_refuses(greedy_grid):
    config, out, _ = greedy_grid
    run = out.parent / "results" / "runs" / rf.cell_id("balanced", 1)
    path = run / "eval" / "step_8" / "greedy" / "math500.metrics.json"
    before = path.read_text()
    try:
        path.write_text(json.dumps(_greedy_metrics("math500", 0.99)))
        res = CliRunner().invoke(report_command, ["--config", str(config), "--out", str(out.parent / "x")])
        assert res.exit_code != 0
        assert "greedy_at_1" in res.output and rf.cell_id("balanced", 1) in res.output, res.output
    finally:
        path.write_text(before)


def test_the_greedy_tables_compare_the_greedy_protocols_own_problem_counts(greedy_grid):
    """The greedy protocol scores its own samples file (metric_names.count_key): one greedy evaluation
    on 8 of 16 problems is noted in the greedy tables only, and MLflow holds both counts."""
    config, out, _ = greedy_grid
    note = (
        f"sequence: {rf.cell_id('sequence', 0)}: tiny_test: scored on fewer problems than other cells at "
        "the same step (8 of 16 at step 8): not comparable"
    )
    assert note in (out / "greedy" / "last.md").read_text()
    assert "fewer problems" not in (out / "last.md").read_text()  # (sequence is flagged as unfinished)
    from aggbench.grid import load_experiment

    exp = load_experiment(config)
    client = init_store(tracking_uri(exp))
    runs, _ = find_runs(client, exp["experiment"])
    seq0 = runs[rf.cell_id("sequence", 0)].info.run_id
    assert metric_history(client, seq0, "eval/tiny_test/greedy_n_problems") == {0: 16.0, 4: 16.0, 8: 8.0}
    assert metric_history(client, seq0, "eval/tiny_test/n_problems") == {0: 16.0, 4: 16.0, 8: 16.0}
