"""`aggbench ingest`: run files -> MLflow, idempotent; and the check that finds disagreements."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench import layout, metric_names
from aggbench.cli.report import ingest_command, report_command  # noqa: E402
from aggbench.evaluation.mlflow import log_eval_metrics
from aggbench.grid import load_experiment  # noqa: E402
from aggbench.report.ingest import base_id, find_runs, tracking_uri, verify
from aggbench.tracking import EXPERIMENT_KIND_TAG, MlflowRun, init_store
from helpers import report_fixtures as rf  # noqa: E402
from helpers.support import EVAL_KEYS_N4  # noqa: E402

CELLS = [rf.cell_id(r, s) for (r, s) in rf.EVALS]  # the five cells with files
EVAL_KEYS = EVAL_KEYS_N4  # what each benchmark's metrics.json (n = 4) puts in MLflow


@pytest.fixture(autouse=True)
def _default_store(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def run_cli(command, *args: str, ok: bool = True):
    res = CliRunner().invoke(command, [*args], catch_exceptions=False)
    if ok:
        assert res.exit_code == 0, res.output
    return res


def store_contents(exp: dict) -> dict[str, dict[str, list[int]]]:
    """{cell id: {key: every logged step, duplicates included}} for every run in the store."""
    client = init_store(tracking_uri(exp))
    runs, dupes = find_runs(client, exp["experiment"])
    assert not dupes
    return {cid: rf.raw_counts(client, r.info.run_id, r.data.metrics) for cid, r in runs.items()}


def test_ingest_is_idempotent_and_complete(tmp_path):
    config = rf.make_grid(tmp_path)
    exp = load_experiment(config)
    first = run_cli(ingest_command, "--config", str(config), "--quiet")
    # 4 complete cells x 12 steps + sequence s0's 8 committed steps (rows 9-10 are past its last
    # checkpoint); 8 eval values per (benchmark, step): 4 cells x 3 steps x 2 + 2 x 2 + base 2 = 30,
    # and the base model's step 0 again in each of the 5 cells: 10 more (benchmark, step) pairs
    assert "56 new training step(s), 360 new evaluation value(s)" in first.output
    before = store_contents(exp)
    assert set(before) == {*CELLS, base_id("tiny")}
    row_keys = set(rf.metrics_row(0, 1)) - {"step", "time"}
    token = before[rf.cell_id("token", 0)]
    for key in row_keys | {"train/step"}:
        assert token[key] == list(range(1, 13)), key
    for bench in rf.BENCHES:
        for k in EVAL_KEYS:
            assert token[f"eval/{bench}/{k}"] == [0, 4, 8, 12]  # step 0: the base model's
            assert before[base_id("tiny")][f"eval/{bench}/{k}"] == [0]
    assert before[rf.cell_id("sequence", 0)]["train/step"] == list(range(1, 9))

    again = run_cli(ingest_command, "--config", str(config), "--quiet")
    assert "0 new training step(s), 0 new evaluation value(s)" in again.output
    assert store_contents(exp) == before
    assert [p for p in verify(exp) if p.is_error] == []

    # values round-trip, NaN included
    client = init_store(tracking_uri(exp))
    runs, _ = find_runs(client, "synth")
    rid = runs[rf.cell_id("token", 1)].info.run_id
    base = {
        m.step: m.value
        for m in client.get_metric_history(runs[base_id("tiny")].info.run_id, "eval/math500/avg_at_4")
    }
    assert {m.step: m.value for m in client.get_metric_history(rid, "eval/math500/avg_at_4")} == {
        0: base[0],
        4: 20.0,  # percent in MLflow; the metrics.json holds 0.20
        8: 20.0,
        12: 20.0,
    }
    ratio = {m.step: m.value for m in client.get_metric_history(rid, "agg/token/weight_ratio")}
    # step 4, rule token (j = 0): weight_pos = 0.4 + 0.01 * (4 % 5), weight_neg = 0.6 - 0.01 * (4 % 3)
    assert math.isnan(ratio[3]) and ratio[4] == pytest.approx(0.44 / 0.59)
    assert runs[rf.cell_id("token", 1)].data.tags["aggregation"] == "token"


def test_ingest_rebuilds_a_deleted_store(tmp_path):
    """The files are the source of truth: a lost database is rebuilt, stale run markers ignored."""
    config = rf.make_grid(tmp_path)
    exp = load_experiment(config)
    run_cli(ingest_command, "--config", str(config), "--quiet")
    marker = tmp_path / "results" / "runs" / rf.cell_id("token", 0) / "mlflow_run.json"
    old_run = json.loads(marker.read_text())["run_id"]
    before = store_contents(exp)
    shutil.copy(rf.empty_store(), tmp_path / "results" / "mlflow.db")  # a new, empty store
    res = run_cli(ingest_command, "--config", str(config), "--quiet")
    assert "56 new training step(s), 360 new evaluation value(s)" in res.output
    assert store_contents(exp) == before
    assert json.loads(marker.read_text())["run_id"] != old_run


def test_a_segment_that_stopped_on_a_full_disk_is_failed_at_the_next_ingest(tmp_path):
    """The trainer writes runs/{cell}/failure.json when it runs out of disk (the store may have been
    full as well, so the run could not be marked then): ingest marks the run FAILED from it."""
    config = rf.make_grid(tmp_path)
    exp = load_experiment(config)
    cid = rf.cell_id("sequence", 0)  # unfinished: 8 of 12 steps committed
    failure = layout.failure_file(tmp_path / "results" / "runs" / cid)
    failure.write_text(json.dumps({"error": "no space left on device", "file": "x", "resumes_from": 8}))
    run_cli(ingest_command, "--config", str(config), "--quiet")
    client = init_store(tracking_uri(exp))
    runs, _ = find_runs(client, exp["experiment"])
    assert runs[cid].info.status == "FAILED"
    assert runs[rf.cell_id("token", 0)].info.status == "FINISHED"
    failure.unlink()  # what the next segment's start does
    run_cli(ingest_command, "--config", str(config), "--quiet")
    assert client.get_run(runs[cid].info.run_id).info.status == "FAILED"  # left for the trainer to set


def test_a_run_holding_a_discarded_attempt_is_rebuilt_from_the_files(tmp_path):
    """Issue 26, item 5: a checkpoint deleted and retrained leaves the store with the first
    attempt's values at steps the files now hold differently (MLflow cannot delete single metric
    values): ingest replaces the run with one rebuilt from the files, and the report's check passes."""
    config = rf.make_grid(tmp_path)
    exp = load_experiment(config)
    run_cli(ingest_command, "--config", str(config), "--quiet")
    cid = rf.cell_id("token", 0)
    client = init_store(tracking_uri(exp))
    old = find_runs(client, exp["experiment"])[0][cid].info.run_id
    metrics = tmp_path / "results" / "runs" / cid / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    for row in rows:
        if row["step"] in (3, 4):  # the retrained steps: other values than the discarded attempt's
            row["loss/pg"] = row["loss/pg"] + 1.0
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert any(p.kind == "different" for p in verify(exp))  # what the report would refuse
    res = run_cli(ingest_command, "--config", str(config), "--quiet")
    assert f"rebuilt from the files (the store held a discarded attempt): {cid}" in res.output
    runs, dupes = find_runs(client, exp["experiment"])
    assert not dupes and runs[cid].info.run_id != old
    assert client.get_run(old).info.lifecycle_stage == "deleted"
    assert [p for p in verify(exp) if p.is_error or p.kind == "extra"] == []
    history = {m.step: m.value for m in client.get_metric_history(runs[cid].info.run_id, "loss/pg")}
    assert history[3] == pytest.approx(rows[2]["loss/pg"]) and sorted(history) == list(range(1, 13))
    again = run_cli(ingest_command, "--config", str(config), "--quiet")  # now nothing to replace
    assert (
        "rebuilt" not in again.output
        and find_runs(client, exp["experiment"])[0][cid].info.run_id == runs[cid].info.run_id
    )


def test_a_rebuilt_store_gives_cell_runs_their_params(tmp_path):
    """A cell's params come back from its config.resolved.yaml (the trainer's copy): the UI's
    filters work on a store rebuilt from the files too."""
    from aggbench.config import dump_config
    from aggbench.grid import cell_train_config
    from aggbench.run_config import flat_config, resume_mutable

    config = rf.make_grid(tmp_path)
    exp = load_experiment(config)
    cid = rf.cell_id("balanced", 0)
    cfg = cell_train_config(exp, cid)
    dump_config(cfg, tmp_path / "results" / "runs" / cid / "config.resolved.yaml")
    run_cli(ingest_command, "--config", str(config), "--quiet")
    client = init_store(tracking_uri(exp))
    eid = client.get_experiment_by_name("synth").experiment_id
    found = client.search_runs([eid], filter_string="params.aggregation = 'balanced'")
    assert [r.data.tags["aggbench.cell_id"] for r in found] == [cid]
    flat = flat_config(cfg)
    assert found[0].data.params == {k: v for k, v in flat.items() if not resume_mutable(k)}
    assert found[0].data.tags["algorithm.total_steps"] == flat["algorithm.total_steps"]
    again = run_cli(ingest_command, "--config", str(config), "--quiet")  # nothing sent twice
    assert "0 new training step(s)" in again.output
    assert client.get_run(found[0].info.run_id).data.params == found[0].data.params


def _delete_step(db: Path, run_id: str, step: int) -> int:
    with sqlite3.connect(db) as con:
        n = con.execute("DELETE FROM metrics WHERE run_uuid = ? AND step = ?", (run_id, step)).rowcount
    return n


def test_report_detects_mismatch_between_files_and_mlflow(tmp_path):
    config = rf.make_grid(tmp_path)
    exp = load_experiment(config)
    run_cli(ingest_command, "--config", str(config), "--quiet")
    client = init_store(tracking_uri(exp))
    runs, _ = find_runs(client, "synth")
    # MLflow lost token s0's step 12 (training metrics and evaluation) ...
    assert _delete_step(tmp_path / "results" / "mlflow.db", runs[rf.cell_id("token", 0)].info.run_id, 12) > 60
    # ... and a metrics.json was re-graded after it was ingested
    f = (
        tmp_path
        / "results"
        / "runs"
        / rf.cell_id("balanced", 1)
        / "eval"
        / "step_8"
        / "tiny_test.metrics.json"
    )
    f.write_text(json.dumps(rf.eval_metrics("tiny_test", 0.65)))

    out = tmp_path / "tables"
    res = run_cli(report_command, "--config", str(config), "--out", str(out), ok=False)
    assert res.exit_code != 0
    n_lost = len(set(rf.metrics_row(0, 1)) - {"step", "time"}) + len(rf.BENCHES) * len(EVAL_KEYS)
    assert f"{rf.cell_id('token', 0)}: {n_lost} values in the files are missing in MLflow at step(s) 12" in (
        res.output
    )
    assert (
        f"{rf.cell_id('balanced', 1)}: 6 values differ between the files and MLflow at step(s) 8 "
        "(eval/tiny_test/avg_at_4 @ 8: 65.0 vs 60.0;" in (res.output)
    )
    assert not out.exists(), "a failed check must not leave tables behind"

    res = run_cli(
        report_command, "--config", str(config), "--out", str(out), "--allow-mismatch", "--no-plots"
    )
    md = (out / "last.md").read_text()
    assert "| token † |" in md and "| balanced † |" in md
    assert f"{rf.cell_id('balanced', 1)}: MLflow differs from the run files" in md

    # ingest fills in the lost step, and rebuilds the run whose values differ from its files (the
    # files are the source of truth; MLflow cannot overwrite single values): the re-graded
    # metrics.json's avg@4 and the values derived from it (avg@4, pass@1, pass@4, maj@4, ci_low,
    # ci_high) are what MLflow holds afterwards
    res = run_cli(ingest_command, "--config", str(config), "--quiet")
    assert f"(the store held a discarded attempt): {rf.cell_id('balanced', 1)}" in res.output
    assert [p for p in verify(exp) if p.is_error] == []
    runs, _ = find_runs(client, "synth")
    history = client.get_metric_history(
        runs[rf.cell_id("balanced", 1)].info.run_id, "eval/tiny_test/avg_at_4"
    )
    assert {m.step: m.value for m in history}[8] == 65.0


def test_a_torn_metrics_json_is_one_error_line_in_report_as_in_ingest(tmp_path):
    config = rf.make_grid(tmp_path)
    run_cli(ingest_command, "--config", str(config), "--quiet")
    f = tmp_path / "results" / "runs" / rf.cell_id("token", 0) / "eval" / "step_4" / "tiny_test.metrics.json"
    f.write_text(f.read_text()[:-5])  # a write cut short
    for command, args in ((report_command, ["--no-plots"]), (ingest_command, ["--quiet"])):
        res = CliRunner().invoke(command, ["--config", str(config), *args])
        assert res.exit_code == 1 and not isinstance(res.exception, ValueError), res.output
        assert f"{f}: not valid JSON" in res.output and "re-run its grade job" in res.output, res.output


def test_ingest_rejects_unknown_cell(tmp_path):
    config = rf.make_grid(tmp_path)
    res = run_cli(ingest_command, "--config", str(config), "--cell", "nope__s0", ok=False)
    assert res.exit_code != 0 and "nope__s0: not in this grid" in res.output


def test_ingest_leaves_no_run_running(tmp_path):
    """Complete cells and the base model FINISHED; a run ingest created for an unfinished cell
    SCHEDULED; a complete cell's run a trainer left RUNNING (killed after its last checkpoint) FINISHED."""
    config = rf.make_grid(tmp_path)
    exp = load_experiment(config)
    client = init_store(tracking_uri(exp))
    left = MlflowRun(tracking_uri(exp), "synth", rf.cell_id("token", 0), None)
    assert client.get_run(left.run_id).info.status == "RUNNING"
    run_cli(ingest_command, "--config", str(config), "--quiet")
    runs, _ = find_runs(client, "synth")
    status = {cid: r.info.status for cid, r in runs.items()}
    assert status == {
        **{cid: "FINISHED" for cid in CELLS if cid != rf.cell_id("sequence", 0)},
        rf.cell_id("sequence", 0): "SCHEDULED",  # trained to step 10 of 12
        base_id("tiny"): "FINISHED",
    }
    assert runs[rf.cell_id("token", 0)].info.run_id == left.run_id
    exp_tags = client.get_experiment_by_name("synth").tags
    assert exp_tags[EXPERIMENT_KIND_TAG] == "custom_model_development"


def test_a_base_evaluation_logged_live_finishes_its_run(tmp_path):
    """`aggbench evaluate` on a base model (results/base/<model>) logs step 0 and ends the run."""
    results = tmp_path / "results"
    base = layout.base_dir(results, "tiny")
    cell = layout.run_dir(results, rf.cell_id("token", 0))
    assert layout.is_base_dir(base) and not layout.is_base_dir(cell)
    shutil.copy(rf.empty_store(), tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    metrics = {b: rf.eval_metrics(b, 0.1) for b in rf.BENCHES}
    res = log_eval_metrics(base, base_id("tiny"), 0, metrics, tracking_uri=uri, experiment="e", finish=True)
    client = init_store(uri)
    assert client.get_run(res["run_id"]).info.status == "FINISHED"
    assert client.get_run(res["run_id"]).data.metrics["eval/math500/avg_at_4"] == 10.0  # percent
    res = log_eval_metrics(cell, rf.cell_id("token", 0), 4, metrics, tracking_uri=uri, experiment="e")
    assert client.get_run(res["run_id"]).info.status == "RUNNING"  # a cell's trainer says how it ends


def test_a_cells_step_0_copy_is_for_curves_not_for_its_peak(tmp_path):
    """Ingest copies the base model's step 0 into each cell run (its curves start at 0), but the
    tables read a rule's checkpoints only: a rule that never beats the base still peaks at a
    trained step, and the base value stays in the base row."""
    from aggbench.report.collect import collect
    from aggbench.report.stats import average_curve, curve_drop

    worse = {b: {4: 0.01, 8: 0.03, 12: 0.02} for b in rf.BENCHES}  # every value below rf.BASE
    config = rf.make_grid(tmp_path, evals={("token", 0): worse})
    run_cli(ingest_command, "--config", str(config), "--quiet")
    exp = load_experiment(config)
    client = init_store(tracking_uri(exp))
    token_run = find_runs(client, exp["experiment"])[0][rf.cell_id("token", 0)]
    key = metric_names.mlflow_key("tiny_test", "avg@4")
    assert rf.raw_counts(client, token_run.info.run_id, [key])[key] == [0, 4, 8, 12]  # the curve's step 0
    got = collect(exp, client)
    (token,) = [c for c in got.cells if c.cell.id == rf.cell_id("token", 0)]
    assert {b: sorted(v) for b, v in token.evals.items()} == {b: [4, 8, 12] for b in rf.BENCHES}
    assert got.base["tiny"] == pytest.approx({b: 100.0 * v for b, v in rf.BASE.items()})  # percent
    # peak 3% (step 8) minus last 2%; with step 0 (10%/5%) counted it would be 7.5 - 2 points
    assert curve_drop(average_curve(token.evals, list(rf.BENCHES))) == pytest.approx(1.0)


def test_mlflow_values_without_files_behind_them_are_errors_until_ingest_rebuilds_the_run(tmp_path):
    """A data-integrity review's three cases. (1) An evaluation whose metrics.json is gone after it
    was ingested: MLflow's value is an error (it was a warning only for training steps), and ingest
    rebuilds the run from the files. (2) An evaluation past the committed step (the checkpoint it
    read was discarded: sequence s0 is committed to step 8) is neither ingested nor expected.
    (3) A run directory deleted to retrain the cell: its old MLflow run is an error, and the
    report, when told to go on, flags the row instead of tabling the deleted attempt as the grid's."""
    config = rf.make_grid(tmp_path)
    exp = load_experiment(config)
    runs_dir = tmp_path / "results" / "runs"
    seq = rf.cell_id("sequence", 0)
    past = runs_dir / seq / "eval" / "step_12"
    past.mkdir(parents=True)
    (past / "tiny_test.metrics.json").write_text(json.dumps(rf.eval_metrics("tiny_test", 0.99)))
    run_cli(ingest_command, "--config", str(config), "--quiet")
    assert "eval/tiny_test/avg_at_4" in store_contents(exp)[seq]
    assert 12 not in store_contents(exp)[seq]["eval/tiny_test/avg_at_4"]  # (2)
    assert [p for p in verify(exp) if p.is_error] == []

    token = rf.cell_id("token", 1)
    (runs_dir / token / "eval" / "step_8" / "math500.metrics.json").unlink()  # (1)
    problems = [p for p in verify(exp) if p.is_error]
    assert {(p.cell_id, p.kind, p.step) for p in problems} == {(token, "extra", 8)}
    assert {p.key for p in problems} >= {"eval/math500/avg_at_4", "eval/math500/ci_low"}
    res = run_cli(ingest_command, "--config", str(config), "--quiet")
    assert f"(the store held a discarded attempt): {token}" in res.output
    assert [p for p in verify(exp) if p.is_error] == []
    assert 8 not in store_contents(exp)[token]["eval/math500/avg_at_4"]

    balanced = rf.cell_id("balanced", 0)
    shutil.rmtree(runs_dir / balanced)  # (3)
    assert [(p.cell_id, p.kind) for p in verify(exp) if p.is_error] == [(balanced, "no_files")]
    out = tmp_path / "tables"
    res = run_cli(report_command, "--config", str(config), "--out", str(out), ok=False)
    assert (
        res.exit_code != 0
        and f"{balanced}: MLflow holds a run for this cell but its run files are gone" in (res.output)
    )
    run_cli(report_command, "--config", str(config), "--out", str(out), "--allow-mismatch", "--no-plots")
    assert "| balanced † |" in (out / "last.md").read_text()
    # a retrain that has started (its directory again, nothing committed yet): the old run's values
    # are extra, which the report's ingest clears by rebuilding the run from the files
    (runs_dir / balanced).mkdir()
    kinds = {(p.cell_id, p.kind) for p in verify(exp) if p.is_error}
    assert kinds == {(balanced, "extra")}
    run_cli(ingest_command, "--config", str(config), "--quiet")
    assert [p for p in verify(exp) if p.is_error] == []
