"""The smoke DAG, end to end, exactly as `snakemake --cores 2` runs it (results in a temp dir).

One run, then these checks: the run finished; the tables have a row per rule (and the base model)
with a number for every benchmark; the positive/negative length gap lasted to the last step;
`token` weighted the two advantage signs differently from `balanced` on the same batches (otherwise
the smoke grid would compare rules that behave identically); and MLflow as a researcher uses it:
every run FINISHED, cells found by their params, the experiment tagged for the runs view, the
summary tables readable with `mlflow.load_table`. And the outputs equal the golden set of this
CPU class (tests/golden/smoke/<class>/, `make golden` regenerates them) where there is one.

How long the DAG takes is measured by benchmarks/smoke_dag.py, not asserted here: a busy machine
must not fail a correct run. The hard timeout only keeps CI from hanging.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path

import pytest
import yaml

from aggbench import golden
from helpers.smoke_dag import SMOKE_MARKS

# the run is conftest.py's session fixture smoke_run, shared with test_missing_files.py
pytestmark = SMOKE_MARKS


def _cells(wf) -> list[str]:
    cfg = yaml.safe_load(wf.SMOKE.read_text())
    return [f"tiny__tiny__{a['name']}__s0" for a in cfg["aggregations"]]


def _rows(path):
    return list(csv.DictReader(path.open()))


def test_smoke_dag_runs_to_completion(smoke_run):
    results, wall, proc = smoke_run
    assert "100%" in proc.stdout + proc.stderr


def test_tables_have_a_row_per_rule_and_a_number_per_benchmark(wf, smoke_run):
    results, _, _ = smoke_run
    cfg = yaml.safe_load(wf.SMOKE.read_text())
    rules = [a["name"] for a in cfg["aggregations"]]
    benches = cfg["benchmarks"]
    total = cfg["training"]["algorithm"]["total_steps"]
    for name in ("peak.md", "last.md", "peak.csv", "last.csv", "peak.tex", "last.tex"):
        assert (results / "tables" / name).stat().st_size > 0, name

    last = [r for r in _rows(results / "tables" / "last.csv") if r["table"] == "last"]
    by_row = {}
    for r in last:
        by_row.setdefault(r["row"], {})[r["column"]] = r
    assert set(rules) <= set(by_row), sorted(by_row)
    base = [label for label in by_row if label not in rules]
    assert len(base) == 1 and all(r["kind"] == "base" for r in by_row[base[0]].values()), sorted(by_row)
    for label, cols in by_row.items():
        for bench in [*benches, "average"]:
            value = float(cols[bench]["mean"])  # a number, not an empty cell
            assert 0.0 <= value <= 100.0, (label, bench, value)
            assert cols[bench]["flagged"] == "0", (label, "flagged as missing or unfinished")
        if label in rules:
            assert int(cols[benches[0]]["step"]) == total, (label, "last-step table not at the last step")

    peak = _rows(results / "tables" / "peak.csv")
    assert {r["table"] for r in peak} == {"peak_per_benchmark", "peak_best_average"}
    for definition in ("peak_per_benchmark", "peak_best_average"):
        rows = {
            r["row"] for r in peak if r["table"] == definition and r["column"] in benches and r["mean"] != ""
        }
        assert set(rules) <= rows, (definition, rows)
    md = (results / "tables" / "last.md").read_text()
    for rule in rules:
        assert f"| {rule}" in md or f"| **{rule}" in md, rule
    # issue 28, item 7: every cell's grader-disagreement ledger is in the notes
    for rule in rules:
        assert re.search(
            rf"- {rule}: tiny__tiny__{rule}__s0: tiny_test: grader ledger over steps [\d, ]+: \d+ of \d+ verdicts",
            md,
        ), rule


def _metrics(results, cell):
    return [json.loads(line) for line in (results / "runs" / cell / "metrics.jsonl").read_text().splitlines()]


def test_length_gap_persists_to_the_last_step(wf, smoke_run):
    """Correct (positive-advantage) responses stay longer than wrong ones until the end."""
    results, _, _ = smoke_run
    total = yaml.safe_load(wf.SMOKE.read_text())["training"]["algorithm"]["total_steps"]
    for cell in _cells(wf):
        rows = _metrics(results, cell)
        assert [r["step"] for r in rows] == list(range(1, total + 1)), cell
        last = rows[-1]
        assert math.isfinite(last["len/gap"]) and last["len/gap"] > 0, (cell, last["len/gap"])
        assert last["len/pos_mean"] > last["len/neg_mean"], cell
        # not a one-step fluke: the gap is positive over the last checkpoint segment on average
        tail = [r["len/gap"] for r in rows[-4:] if math.isfinite(r["len/gap"])]
        assert tail and sum(tail) / len(tail) > 0, (cell, tail)


def test_token_weights_the_signs_unlike_balanced_on_the_same_batches(wf, smoke_run):
    """Every step logs every rule's per-sign weight on that step's batch. With binary rewards
    balanced gives both signs the same total weight (ratio 1); token-mean weights each sign by its
    token count, so with a length gap its ratio is not 1: the smoke grid compares rules that differ."""
    results, _, _ = smoke_run
    for cell in _cells(wf):
        rows = [r for r in _metrics(results, cell) if math.isfinite(r["agg/token/weight_ratio"])]
        assert rows, cell
        for r in rows:
            assert r["agg/balanced/weight_ratio"] == pytest.approx(1.0, abs=1e-6), (cell, r["step"])
        differ = [abs(r["agg/token/weight_ratio"] - r["agg/balanced/weight_ratio"]) > 0.01 for r in rows]
        assert differ[-1], (cell, "same weights at the last step", rows[-1]["agg/token/weight_ratio"])
        assert sum(differ) >= len(differ) / 2, (cell, [r["agg/token/weight_ratio"] for r in rows])


def test_mlflow_holds_the_diagnostics_once_per_step(wf, smoke_run):
    """The report read MLflow; the same diagnostics are there, one value per training step."""
    from mlflow.tracking import MlflowClient

    results, _, _ = smoke_run
    total = yaml.safe_load(wf.SMOKE.read_text())["training"]["algorithm"]["total_steps"]
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    for cell in _cells(wf):
        run_id = json.loads((results / "runs" / cell / "mlflow_run.json").read_text())["run_id"]
        hist = client.get_metric_history(run_id, "len/gap")
        assert sorted(m.step for m in hist) == list(range(1, total + 1)), cell
        last_file = _metrics(results, cell)[-1]["len/gap"]
        assert next(m.value for m in hist if m.step == total) == pytest.approx(last_file), cell


def _client_and_experiment(results):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    return client, client.get_experiment_by_name("smoke")


def test_every_run_is_finished_and_cells_are_found_by_their_params(wf, smoke_run):
    results, _, _ = smoke_run
    client, exp = _client_and_experiment(results)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"  # MLflow 3: opens on runs
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    by_cell = {r.data.tags["aggbench.cell_id"]: r for r in runs}
    assert sorted(by_cell) == sorted([*_cells(wf), "tiny__base", "smoke__summary"])
    assert {cid: r.info.status for cid, r in by_cell.items()} == dict.fromkeys(by_cell, "FINISHED")
    balanced = client.search_runs([exp.experiment_id], filter_string="params.aggregation = 'balanced'")
    assert [r.data.tags["aggbench.cell_id"] for r in balanced] == ["tiny__tiny__balanced__s0"]
    cfg = yaml.safe_load(wf.SMOKE.read_text())["training"]
    params = balanced[0].data.params
    assert params["algorithm.group_size"] == str(cfg["algorithm"]["group_size"])
    assert float(params["algorithm.lr"]) == cfg["algorithm"]["lr"]
    assert params["sampling.temperature"] == json.dumps(
        float(cfg.get("sampling", {}).get("temperature", 1.0))
    )
    for cid in ("tiny__base", "smoke__summary"):
        assert by_cell[cid].data.params == {}, cid  # not found by a params filter


def test_summary_tables_load_back_with_mlflow(wf, smoke_run, monkeypatch):
    import mlflow

    results, _, _ = smoke_run
    client, exp = _client_and_experiment(results)
    (summary,) = client.search_runs(
        [exp.experiment_id], filter_string="tags.`aggbench.cell_id` = 'smoke__summary'"
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{results / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "smoke")
    last = mlflow.load_table("tables/last.json", run_ids=[summary.info.run_id])
    want = _rows(results / "tables" / "last.csv")
    assert len(last) == len(want) > 0
    rules = [a["name"] for a in yaml.safe_load(wf.SMOKE.read_text())["aggregations"]]
    assert set(rules) < set(last["row"])
    for r in want:
        (got,) = last[(last["row"] == r["row"]) & (last["column"] == r["column"])].itertuples()
        if r["mean"] == "":  # no value (the base row's drop): null in the MLflow table
            assert got.mean is None or math.isnan(got.mean), (r["row"], r["column"], got.mean)
        else:
            assert got.mean == pytest.approx(float(r["mean"])), (r["row"], r["column"])
    peak = mlflow.load_table("tables/peak.json", run_ids=[summary.info.run_id])
    assert len(peak) == len(_rows(results / "tables" / "peak.csv"))


GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "smoke"


def test_outputs_equal_the_golden_ones(wf, smoke_run):
    """Tables and every cell's metrics (time fields left out) equal the golden set of this machine's
    class under tests/golden/smoke/, made in the locked environment (.ci/lock.txt). On a CPU class
    with no set (the warm start trains other weights on another kernel path) the comparison cannot
    be made: skipped, naming the classes that have one and how to add this one."""
    results, _, _ = smoke_run
    here = golden.machine(wf.REPO)
    found = golden.set_for(GOLDEN, here)
    if found is None:
        have = ", ".join(d.name for d in golden.sets(GOLDEN))
        pytest.skip(
            f"cannot compare with the golden outputs: no set for this machine ({golden.slug(here)}; "
            f"sets: {have}); `make golden-machine` at a commit that passes on those adds one"
        )
    golden_machine = json.loads((found / "machine.json").read_text())
    diff = golden.differences(found, results)
    context = f"golden {found.name}, lock {golden_machine['lock_sha256'][:12]}, here {str(here['lock_sha256'])[:12]}"
    assert not diff, f"{len(diff)} differences from {found} ({context}; `make golden` regenerates):\n" + (
        "\n".join(diff[:20])
    )


def test_each_cell_records_its_environment_in_files_and_tags(wf, smoke_run):
    """runs/{cell}/environment.json and the MLflow run's env.* tags: the same description."""
    results, _, _ = smoke_run
    client, exp = _client_and_experiment(results)
    for cell in _cells(wf):
        env = json.loads((results / "runs" / cell / "environment.json").read_text())
        assert env["packages"]["torch"] and env["cpu_capability"], cell
        run_id = json.loads((results / "runs" / cell / "mlflow_run.json").read_text())["run_id"]
        tags = client.get_run(run_id).data.tags
        assert tags["env.sha256"] == env["environment_sha256"], cell
        assert tags["env.transformers"] == env["packages"]["transformers"], cell


def test_the_greedy_protocol_runs_in_the_evaluation_jobs_and_reaches_its_tables(wf, smoke_run):
    """evaluation.greedy (issue 28, item 4(b)): the generate and grade jobs of every cell and of the base
    model wrote the greedy n=1 protocol beside the sampled one (no job of their own: the dry-run
    test's job counts are the grid's without it), MLflow holds its greedy@1 and tables/greedy/ shows
    the values the grade jobs computed."""
    from aggbench.tracking import metric_history
    from helpers.report_fixtures import md_rows

    results, _, _ = smoke_run
    cfg = yaml.safe_load(wf.SMOKE.read_text())
    n, total, every = (
        cfg["evaluation"]["n"],
        cfg["training"]["algorithm"]["total_steps"],
        cfg["evaluation"]["every"],
    )
    where = {cell: (results / "runs" / cell, range(every, total + 1, every)) for cell in _cells(wf)}
    where["tiny__base"] = (results / "base" / "tiny", [0])
    greedy: dict[str, dict[int, float]] = {}
    for cell, (run, steps) in where.items():
        for step in steps:
            samples = run / "samples" / f"step_{step}"
            rows = [json.loads(x) for x in (samples / "greedy" / "tiny_test.jsonl").read_text().splitlines()]
            sampled = (samples / "tiny_test.jsonl").read_text().splitlines()
            assert rows and {r["sample"] for r in rows} == {0} and len(sampled) == n * len(rows), (cell, step)
            m = json.loads((run / "eval" / f"step_{step}" / "greedy" / "tiny_test.metrics.json").read_text())
            assert m["n_samples"] == 1 and m["n_problems"] == len(rows), (cell, step)
            greedy.setdefault(cell, {})[step] = 100 * m["avg@1"]

    client, _ = _client_and_experiment(results)
    for cell in _cells(wf):
        run_id = json.loads((results / "runs" / cell / "mlflow_run.json").read_text())["run_id"]
        got = metric_history(client, run_id, "eval/tiny_test/greedy_at_1")
        assert {t: v for t, v in got.items() if t > 0} == pytest.approx(greedy[cell]), cell

    md = (results / "tables" / "greedy" / "last.md").read_text()
    assert "greedy@1 in %" in md
    last = md_rows(md, "last evaluated step")
    for cell in _cells(wf):
        rule = cell.split("__")[2]
        row = last.get(rule) or last[f"**{rule}**"]
        assert row[0] == str(total) and row[1].replace("*", "") == f"{greedy[cell][total]:.1f}", (rule, row)
    base = last["base (step 0)"]
    assert base[1].replace("*", "") == f"{greedy['tiny__base'][0]:.1f}", base

    # everything is up to date: the greedy outputs as declared, so a second run has nothing to do
    again = wf.run(["-n", "--config", f"results_dir={results}"])
    assert "Nothing to be done" in again.stdout + again.stderr, (again.stdout + again.stderr)[-2000:]


def test_a_store_rebuilt_from_the_run_files_has_every_tag_the_trainer_set(
    wf, smoke_run, tmp_path, monkeypatch
):
    """Issue 26, item 2: delete the MLflow store and ingest the run files again: every cell's run has
    each tag its trainer gave it (commit, package versions, config hash, the rule's identity and
    parameters, the environment), from runs/{cell}/tags.json; before, those were in no run file."""
    import shutil

    from aggbench.cli.report import ingest_command

    results, _, _ = smoke_run
    copy = tmp_path / "results"
    shutil.copytree(results, copy, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts"))
    _in_copy(wf, copy, monkeypatch, ingest_command, "--quiet")
    (old, old_exp), (new, new_exp) = _client_and_experiment(results), _client_and_experiment(copy)
    for cell in _cells(wf):
        (was,) = old.search_runs([old_exp.experiment_id], f"tags.`aggbench.cell_id` = '{cell}'")
        (now,) = new.search_runs([new_exp.experiment_id], f"tags.`aggbench.cell_id` = '{cell}'")
        assert was.info.run_id != now.info.run_id  # a new store, rebuilt
        set_by_aggbench = {k: v for k, v in was.data.tags.items() if not k.startswith("mlflow.")}
        lost = {k: (v, now.data.tags.get(k)) for k, v in set_by_aggbench.items() if now.data.tags.get(k) != v}
        assert not lost, f"{cell}: tags not rebuilt from the run files: {lost}"
        provenance = ("git_sha", "versions", "config_hash", "aggregation.rule", "aggregation.version")
        assert {*provenance, "aggregation.scope", "env.sha256"} <= set(set_by_aggbench), cell
        assert now.data.params == was.data.params, cell


def test_a_copied_results_directory_reads_and_writes_only_itself(wf, smoke_run, tmp_path, monkeypatch):
    """Issue 26, item 1: `cp -a results elsewhere/results`, then ingest and report in the copy: no file
    under the original is written (before the fix, the report rewrote 26 artifact files of the
    original's mlartifacts: the copied store names absolute artifact locations), and the copy's
    artifacts are its own."""
    import hashlib
    import shutil

    from aggbench.cli.report import ingest_command, report_command

    def snapshot(root: Path) -> dict[str, tuple]:
        """Every file's bytes and mtime: a write of the same bytes (the report's plots are
        deterministic) still counts as a write into the original."""
        return {
            p.relative_to(root).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()
        }

    results, _, _ = smoke_run
    before = snapshot(results)
    copy = tmp_path / "moved" / "results"
    shutil.copytree(results, copy, symlinks=True)
    _in_copy(wf, copy, monkeypatch, ingest_command, "--quiet")
    _in_copy(wf, copy, monkeypatch, report_command)
    after = snapshot(results)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    assert not changed, f"the copy's ingest and report changed the original: {changed[:10]}"
    client, exp = _client_and_experiment(copy)
    assert Path(_local(exp.artifact_location)).resolve() == (copy / "mlartifacts").resolve()
    (summary,) = client.search_runs([exp.experiment_id], "tags.`aggbench.cell_id` = 'smoke__summary'")
    where = Path(_local(summary.info.artifact_uri)).resolve()
    assert where.is_relative_to((copy / "mlartifacts").resolve()), where
    assert any(p.suffix == ".png" for p in where.rglob("*")), "the report's plots are in the copy"


def _local(uri: str) -> str:
    from urllib.parse import unquote, urlparse

    return unquote(urlparse(uri).path)


def _in_copy(wf, copy: Path, monkeypatch, command, *args: str) -> None:
    """Run an aggbench command on the smoke config with ``results_dir`` = ``copy`` (the embedded store)."""
    from click.testing import CliRunner

    cfg = yaml.safe_load(wf.SMOKE.read_text())
    cfg["results_dir"] = str(copy)
    config = copy.parent / "smoke.yaml"
    config.write_text(yaml.safe_dump(cfg))
    monkeypatch.chdir(wf.REPO)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    res = CliRunner().invoke(command, ["--config", str(config), *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output


def test_run_files_record_paths_relative_to_the_results_directory(wf, smoke_run):
    """Issue 26, item 1: what the jobs record (generation.json's checkpoint, each metrics file's
    samples, mlflow_run.json's store) names files relative to itself, so a copy resolves to its own;
    before, they held this results directory's absolute path. (cell.yaml holds the paths as the
    config gives them: the embedded default's results_dir is relative.)"""
    results, _, _ = smoke_run
    here = str(results.resolve())
    records = [p for d in ("runs", "base") for p in (results / d).rglob("*.json*") if p.is_file()]
    holding = sorted(str(p.relative_to(results)) for p in records if here in p.read_text())
    assert records and not holding, holding[:10]
    cell = _cells(wf)[0]
    run = results / "runs" / cell
    generation = json.loads((run / "samples" / "step_4" / "generation.json").read_text())
    assert (run / "samples" / "step_4" / generation["checkpoint"]).resolve() == (
        run / "checkpoints" / "step_4"
    ).resolve()
    metrics = json.loads((run / "eval" / "step_4" / "tiny_test.metrics.json").read_text())
    assert (run / "eval" / "step_4" / metrics["samples"]).resolve() == (
        run / "samples" / "step_4" / "tiny_test.jsonl"
    ).resolve()
    marker = json.loads((run / "mlflow_run.json").read_text())
    assert (run / marker["store"]).resolve() == (
        results / "mlflow.db"
    ).resolve() and "tracking_uri" not in marker


def test_every_compute_job_leaves_its_wall_time_and_the_breakdown_reads_them(wf, smoke_run, capsys):
    """benchmarks/cell_time.py (issue 27, item 5's measurement) on the smoke run: one benchmark file per
    compute job, and the train jobs' time split into steps and what lies outside them."""
    import importlib.util

    results, _, _ = smoke_run
    spec = importlib.util.spec_from_file_location("cell_time", wf.REPO / "benchmarks" / "cell_time.py")
    cell_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cell_time)
    walls = cell_time.job_walls(results)
    counts = {kind: len(jobs) for kind, jobs in walls.items()}
    assert counts == {
        "prepare_model": 1,
        "train": 9,
        "generate": 9,
        "generate_base": 1,
        "grade": 9,
        "grade_base": 1,
        "report": 1,
    }
    gen, upd, outside = cell_time.train_split(results, walls["train"])
    assert gen > 0 and upd > 0 and gen + upd + outside == pytest.approx(sum(w for _, w in walls["train"]))
    cell_time.main([str(results)])
    assert "outside steps" in capsys.readouterr().out


def test_the_probability_metric_agrees_with_sampled_accuracy(wf, smoke_run, tmp_path):
    """The built-in task's probability metric (aggbench.tiny.probability) on the smoke DAG's own
    500-step model and its checkpoints: avg@4 of each evaluation lies in [prob_correct, prob_correct +
    prob_uncovered] up to its sampling error (4 standard errors, from the per-problem probabilities),
    and its gate (prob_usable) says whether the uncovered mass is below 0.02 (the base model's is);
    then 64 samples of 32 problems (one standard error under 1.2 points) lie within 4 of them of it."""
    results, _, _ = smoke_run
    evaluations = [
        m for m in results.glob("*/*/eval/step_*/tiny_test.metrics.json") if "eval_seed" not in str(m)
    ]
    assert len(evaluations) == 10  # the base model and 3 cells x 3 checkpoints
    for path in evaluations:
        metrics = json.loads(path.read_text())
        run = path.parents[2]
        gen = json.loads((run / "samples" / path.parent.name / "generation.json").read_text())
        per = gen["benchmarks"]["tiny_test"]["probability"]["per_problem"]
        var = sum(p * (1 - p) for p, _ in per.values()) / 4 / len(per) ** 2
        low, high = metrics["prob_correct"], metrics["prob_correct"] + metrics["prob_uncovered"]
        assert low - 4 * var**0.5 <= metrics["avg@4"] <= high + 4 * var**0.5, (path, metrics)
        assert metrics["prob_uncovered"] < 0.1, path  # the warm start's styles cover the answers
        assert metrics["prob_usable"] is (metrics["prob_uncovered"] < 0.02), (path, metrics)
    base_metrics = [
        json.loads(p.read_text()) for p in evaluations if p.relative_to(results).parts[0] == "base"
    ]
    assert len(base_metrics) == 1 and base_metrics[0]["prob_usable"] is True, base_metrics  # the warm start
    from click.testing import CliRunner

    from aggbench.cli import main

    base = results / "models" / "tiny"
    out = tmp_path / "many"
    for args in (
        ["generate", "--checkpoint", str(base), "--benchmarks", "tiny_test", "--out", str(out), "--n", "64",
         "--limit", "32", "--quiet"],
        ["score", "--benchmark", "tiny_test", "--samples", str(out / "tiny_test.jsonl"), "--out",
         str(tmp_path / "many.jsonl"), "--quiet"],
    ):  # fmt: skip
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
    m = json.loads((tmp_path / "many.metrics.json").read_text())
    per = json.loads((out / "generation.json").read_text())["benchmarks"]["tiny_test"]["probability"][
        "per_problem"
    ]
    se = (sum(p * (1 - p) for p, _ in per.values()) / 64 / len(per) ** 2) ** 0.5
    assert se < 0.012 and m["prob_usable"] is True, m  # the base model: where the metric is used
    assert m["prob_correct"] - 4 * se <= m["avg@64"] <= m["prob_correct"] + m["prob_uncovered"] + 4 * se, m
