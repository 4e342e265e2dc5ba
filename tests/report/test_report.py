"""`aggbench report`: peak and last-step tables, plots and the summary run, from a synthetic grid.

Expected numbers are worked out by hand from report_fixtures.EVALS (fractions; tables are in %):

token     tiny_test  s0 {4: .30, 8: .50, 12: .40}  s1 {4: .20, 8: .40, 12: .50}
          math500    s0 {4: .10, 8: .20, 12: .30}  s1 {4: .20, 8: .20, 12: .20}
balanced  tiny_test  s0 {4: .40, 8: .60, 12: .70}  s1 {4: .50, 8: .60, 12: .50}
          math500    s0 {4: .30, 8: .10, 12: .20}  s1 {4: .10, 8: .30, 12: .20}
sequence  s0 only, trained to step 8 of 12: tiny_test {4: .10, 8: .20}, math500 {4: .05, 8: .15}
base      tiny_test .10, math500 .05

Two seeds a, b: mean (a + b) / 2, sample std |a - b| / sqrt(2) (10 points apart -> 7.1, 20 -> 14.1),
95% Student-t half-width t(0.975, 1) * std / sqrt(2) = 12.706 * |a - b| / 2 (10 apart -> 63.5, 20 ->
127.1). One seed: the evaluation's bootstrap bounds, which the fixture writes as value -+ 0.1.
The drop (peak - last of each seed's benchmark average): token 0, 0; balanced 0 (.35, .35, .45)
and 10 points (.30, .45, .35) -> 5.0 +- 63.5; sequence s0 0 (.075, .175).
"""

from __future__ import annotations

import csv
import re

import pytest
from click.testing import CliRunner

from aggbench.cli.report import report_command  # noqa: E402
from aggbench.grid import load_experiment  # noqa: E402
from aggbench.report.collect import metric_name
from aggbench.report.ingest import find_runs, summary_id, tracking_uri
from aggbench.report.tables import check_reported
from aggbench.tracking import init_store
from helpers import report_fixtures as rf  # noqa: E402
from helpers.report_fixtures import md_rows, read_csv

REPORTED = {"tiny": {"tiny": {"token": {"tiny_test": 40.0, "math500": 30.0}, "base": {"tiny_test": 12.0}}}}
ROWS = ["base (step 0)", "token", "balanced", "sequence"]
COLUMNS = ["tiny_test", "math500", "average"]


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """The grid ingested and reported once: (config, out dir, CLI output of the report)."""
    mp = pytest.MonkeyPatch()
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    root = tmp_path_factory.mktemp("report")
    config = rf.make_grid(root, reported=REPORTED)
    out = root / "tables"
    output = rf.ingest_and_report(config, out)
    yield config, out, output
    mp.undo()


def test_every_table_has_a_row_per_rule_and_base_and_a_number_per_benchmark(reported):
    _, out, _ = reported
    for name, tables in (("peak", {"peak_per_benchmark", "peak_best_average"}), ("last", {"last"})):
        data = read_csv(out / f"{name}.csv")
        assert {t for t, _, _ in data} == tables
        for table in tables:
            for row in ROWS:
                for col in COLUMNS:
                    value = data[(table, row, col)]["mean"]
                    assert float(value) > 0, (table, row, col)


def test_peak_each_benchmark_at_its_best_step(reported):
    _, out, _ = reported
    data = read_csv(out / "peak.csv")
    got = lambda row, col: data[("peak_per_benchmark", row, col)]  # noqa: E731
    # token tiny_test: seed means 4: .25, 8: .45, 12: .45 -> tie, the earliest: step 8 (.50, .40)
    assert (float(got("token", "tiny_test")["mean"]), got("token", "tiny_test")["step"]) == (45.0, "8")
    assert float(got("token", "tiny_test")["std"]) == pytest.approx(7.0710678, abs=1e-5)
    # token math500: 4: .15, 8: .20, 12: .25 -> step 12 (.30, .20)
    assert (float(got("token", "math500")["mean"]), got("token", "math500")["step"]) == (25.0, "12")
    # token average of the per-benchmark peaks: s0 (.50 + .30) / 2 = .40, s1 (.40 + .20) / 2 = .30
    assert float(got("token", "average")["mean"]) == pytest.approx(35.0)
    assert float(got("token", "average")["std"]) == pytest.approx(7.0710678, abs=1e-5)
    # balanced math500: .20 at every step -> step 4 (.30, .10): 20.0 +- 14.1
    assert (float(got("balanced", "math500")["mean"]), got("balanced", "math500")["step"]) == (20.0, "4")
    assert float(got("balanced", "math500")["std"]) == pytest.approx(14.142136, abs=1e-5)
    # sequence: one seed, no std
    assert (got("sequence", "tiny_test")["mean"], got("sequence", "tiny_test")["std"]) == ("20.0", "")
    assert got("sequence", "tiny_test")["n_seeds"] == "1"

    assert float(got("token", "tiny_test")["ci_high"]) == pytest.approx(45.0 + 12.7062047 * 10 / 2, abs=1e-4)
    assert got("token", "tiny_test")["interval"] == "t"
    # one seed: its bootstrap interval (value -+ 0.1 in the fixture)
    seq = got("sequence", "tiny_test")
    assert (seq["interval"], float(seq["ci_low"]), float(seq["ci_high"])) == ("bootstrap", 10.0, 30.0)

    rows = md_rows((out / "peak.md").read_text(), "each benchmark at its own best step")
    assert rows["token"][0] == "45.0 ± 63.5 @8 (Δ +5.0)"  # reported 40.0
    # the step is chosen on test: said in each peak table's own title, so a caption pasted alone says it
    captions = [line for line in (out / "peak.tex").read_text().splitlines() if r"\caption{" in line]
    assert len(captions) >= 2 and all(
        "chosen on" in c and "test" in c and "optimistic" in c for c in captions
    )
    assert rows["balanced"] == ["**60.0 ± 0.0** @8", "20.0 ± 127.1 @4", "**40.0 ± 63.5**", "5.0 ± 63.5"]
    assert rows["token"][1] == "**25.0 ± 63.5** @12 (Δ -5.0)"  # best of math500, reported 30.0
    assert rows["token"][3] == "**0.0 ± 0.0**"  # the least drop is the best
    assert rows["sequence †"] == [
        "20.0 [10.0, 30.0] (n=1) @8",
        "15.0 [5.0, 25.0] (n=1) @8",
        "17.5 (n=1)",
        "0.0 (n=1)",  # the least drop, but a flagged row is not bold
    ]
    assert rows["base (step 0)"] == ["10.0 [0.0, 20.0] @0 (Δ -2.0)", "5.0 [0.0, 15.0] @0", "7.5 @0", "—"]


def test_peak_single_step_with_best_average(reported):
    _, out, _ = reported
    rows = md_rows((out / "peak.md").read_text(), "the single step with the best benchmark average")
    # token seed-mean averages: 4: .20, 8: (.35 + .30) / 2 = .325, 12: (.35 + .35) / 2 = .35 -> 12
    assert rows["token"][:3] == ["12", "45.0 ± 63.5 (Δ +5.0)", "**25.0 ± 63.5** (Δ -5.0)"]
    # average: both seeds .35 -> 35.0 +- 0.0; reported average (40 + 30) / 2 = 35 -> delta 0
    assert rows["token"][3] == "35.0 ± 0.0 (Δ +0.0)"
    # balanced: 4: .325, 8: (.35 + .45) / 2 = .40, 12: (.45 + .35) / 2 = .40 -> tie, step 8
    assert rows["balanced"] == ["8", "**60.0 ± 0.0**", "20.0 ± 127.1", "**40.0 ± 63.5**", "5.0 ± 63.5"]


def test_last_step_table(reported):
    _, out, _ = reported
    md = (out / "last.md").read_text()
    rows = md_rows(md, "last evaluated step")
    assert rows["balanced"] == ["12", "**60.0 ± 127.1**", "20.0 ± 0.0", "**40.0 ± 63.5**", "5.0 ± 63.5"]
    assert rows["token"][0] == "12"
    # the unfinished rule keeps its row, at its own last step, flagged; one seed of two: n=1
    assert rows["sequence †"] == [
        "8",
        "20.0 [10.0, 30.0] (n=1)",
        "15.0 [5.0, 25.0] (n=1)",
        "17.5 (n=1)",
        "0.0 (n=1)",  # the least drop, but a flagged row is not bold
    ]
    assert "tiny__tiny__sequence__s0: trained to step 8 of 12; evaluated at steps 4, 8 of 4, 8, 12" in md
    assert "tiny__tiny__sequence__s1: no MLflow run (no run files either)" in md
    data = read_csv(out / "last.csv")
    assert data[("last", "sequence", "average")]["flagged"] == "1"
    assert data[("last", "token", "average")]["flagged"] == "0"
    assert data[("last", "balanced", "tiny_test")]["best"] == "1"
    assert "avg@4 in %, mean over 2 seeds ± the half-width of a 95% Student-t interval" in md
    assert "(df = n − 1: t = 12.71 with 2 seeds)" in md


def test_tidy_values_csv_holds_every_value_read(reported):
    _, out, _ = reported
    with (out / "values.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    # 4 complete cells x 3 steps x 2 benchmarks + sequence s0 2 x 2 + base 2
    assert len(rows) == 24 + 4 + 2
    got = {(r["cell_id"], r["benchmark"], int(r["step"])): float(r["value"]) for r in rows}
    for (rule, seed), by_bench in rf.EVALS.items():
        for bench, by_step in by_bench.items():
            for step, value in by_step.items():
                assert got[(rf.cell_id(rule, seed), bench, step)] == 100.0 * value  # percent
    assert got[("tiny__base", "math500", 0)] == 100.0 * rf.BASE["math500"]


def test_reported_deltas_in_csv(reported):
    _, out, _ = reported
    data = read_csv(out / "last.csv")
    row = data[("last", "token", "tiny_test")]
    assert (float(row["reported"]), float(row["delta"])) == (40.0, 5.0)
    assert float(data[("last", "token", "average")]["reported"]) == 35.0
    assert data[("last", "balanced", "tiny_test")]["reported"] == ""


def test_latex_is_well_formed(reported):
    _, out, _ = reported
    for name, n_tables in (("peak", 2), ("last", 1)):
        tex = (out / f"{name}.tex").read_text()
        assert tex.count(r"\begin{tabular}") == tex.count(r"\end{tabular}") == n_tables
        depth = 0
        for ch in tex.replace(r"\{", "").replace(r"\}", ""):
            depth += {"{": 1, "}": -1}.get(ch, 0)
            assert depth >= 0
        assert depth == 0
        assert tex.count("$") % 2 == 0
        for body in re.findall(r"\\toprule\n(.*?)\\bottomrule", tex, re.S):
            lines = [ln for ln in body.splitlines() if ln.endswith(r"\\")]
            assert len(lines) == 1 + len(ROWS)  # header + rows
            assert len({ln.count(" & ") for ln in lines}) == 1
        assert r"sequence$^{\dagger}$" in tex and r"\textbf{60.0" in tex


def test_plots_are_nontrivial_pngs(reported):
    import matplotlib.image as mpimg

    _, out, _ = reported
    for kind in ("eval", "pg_loss", "length_by_sign", "sign_weights", "analysis"):
        path = out / "plots" / f"tiny__tiny__{kind}.png"
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        img = mpimg.imread(path)
        assert img.shape[0] > 200 and img.shape[1] > 300
        assert img[..., :3].std() > 0.05, f"{kind}: nearly blank"


def test_summary_run_holds_the_artifacts_and_is_replaced_not_duplicated(reported, monkeypatch):
    config, out, _ = reported
    exp = load_experiment(config)
    client = init_store(tracking_uri(exp))

    def summary():
        runs, dupes = find_runs(client, "synth")
        assert summary_id("synth") not in dupes
        run = runs[summary_id("synth")]
        arts = {
            d: sorted(f.path for f in client.list_artifacts(run.info.run_id, d)) for d in ("tables", "plots")
        }
        return run.info.run_id, arts

    run_id, arts = summary()
    files = [f"tables/{n}.{e}" for n in ("last", "peak") for e in ("csv", "md", "tex")] + [
        "tables/values.csv"
    ]
    mlflow_tables = [f"tables/{n}.json" for n in ("last", "peak", "values")]
    assert arts["tables"] == sorted(files + mlflow_tables)
    assert len(arts["plots"]) == 6  # 5 figures of the one block + cross_cell.png
    # OUT holds exactly what the Snakemake `report` rule declares (TABLES and plots/ in
    # workflow/rules/common.smk); no mlflow_run.json marker for the summary run
    assert sorted(p.name for p in out.iterdir()) == sorted([w.split("/", 1)[1] for w in files] + ["plots"])
    res = CliRunner().invoke(report_command, ["--config", str(config), "--out", str(out), "--no-plots"])
    assert res.exit_code == 0, res.output
    run_id2, arts2 = summary()
    assert run_id2 == run_id
    assert arts2 == {"tables": arts["tables"], "plots": []}  # replaced: this report made no plots
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri(exp))  # load_table searches the default store
    rows = client.load_table(
        client.get_experiment_by_name("synth").experiment_id, "tables/last.json", [run_id]
    )
    assert len(rows) == len(read_csv(out / "last.csv"))  # replaced, not appended to


def test_summary_tables_load_back_as_mlflow_tables(reported, monkeypatch):
    """`mlflow.load_table` gives each table file's rows: the long CSV, typed by pandas."""
    import mlflow

    config, out, _ = reported
    exp = load_experiment(config)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri(exp))
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "synth")
    runs, _ = find_runs(init_store(tracking_uri(exp)), "synth")
    run_id = runs[summary_id("synth")].info.run_id
    last = mlflow.load_table("tables/last.json", run_ids=[run_id])
    want = read_csv(out / "last.csv")
    assert len(last) == len(want) == len(ROWS) * (len(COLUMNS) + 1)  # and the drop column
    assert list(last.columns) == list(next(iter(want.values())))
    got = {(r.table, r.row, r.column): r for r in last.itertuples()}
    assert set(got) == set(want)
    # balanced tiny_test at step 12: s0 .70, s1 .50 -> 60.0 +- 14.1 (the module docstring)
    cell = got[("last", "balanced", "tiny_test")]
    assert cell.mean == pytest.approx(60.0) and cell.std == pytest.approx(14.142136) and cell.step == 12
    assert cell.n_seeds == 2 and cell.kind == "rule"
    assert (cell.interval, cell.ci_high) == ("t", pytest.approx(60.0 + 12.7062047 * 20 / 2, abs=1e-4))
    peak = mlflow.load_table("tables/peak.json", run_ids=[run_id])
    assert set(peak["table"]) == {"peak_per_benchmark", "peak_best_average"}
    assert len(peak) == len(read_csv(out / "peak.csv"))
    values = mlflow.load_table("tables/values.json", run_ids=[run_id])
    assert len(values) == sum(1 for _ in (out / "values.csv").open()) - 1


def test_metric_names_and_reported_validation(reported):
    config, _, _ = reported
    exp = load_experiment(config)
    assert metric_name("math500", "avg@n", exp) == "avg@4"  # evaluation.n
    assert metric_name("math500", "pass@1", exp) == "pass@1"
    del exp["evaluation"]["n"]
    assert metric_name("math500", "maj@n", exp) == "maj@4"  # configs/benchmarks/math500.yaml: n 4
    exp["reported"] = {"tiny": {"tiny": {"tokn": {"tiny_test": 1.0}, "token": {"aime": 2.0}}}}
    with pytest.raises(ValueError) as err:
        check_reported(exp)
    assert "reported.tiny.tiny.tokn: unknown row; known: token, balanced, sequence, base" in str(err.value)
    assert "reported.tiny.tiny.token.aime: unknown column" in str(err.value)


def test_unknown_metric_names_the_available_ones(reported, tmp_path):
    config, _, _ = reported
    res = CliRunner().invoke(
        report_command, ["--config", str(config), "--out", str(tmp_path / "t"), "--metric", "avg@7"]
    )
    assert res.exit_code != 0
    assert "no run has eval/tiny_test/avg_at_7 (tiny_test)" in res.output
    assert (
        "avg@4, ci_high, ci_low, maj@4, mean_length, n_problems, pass@1, pass@4, truncation_rate"
        in res.output
    )
    assert not (tmp_path / "t" / "peak.md").exists()
