"""The report never tables a cell trained under another version of its rule (issue 13, item 1),
and its notes show the prompts the evaluator could not fit in the model's context (item 5).

`balanced` is version 2 since its default reading became `proportional`; a cell trained under
version 1 (its run directory's aggregation.json says so) keeps its row, flagged, with neither of
its numbers in any table: the grid's other seed carries the row alone.
"""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from aggbench.aggregation import make_instance
from aggbench.cli.report import ingest_command, report_command
from helpers import report_fixtures as rf


@pytest.fixture
def grid(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = rf.make_grid(tmp_path)
    return tmp_path, config


def _report(tmp_path, config):
    runner = CliRunner()
    res = runner.invoke(ingest_command, ["--config", str(config), "--quiet"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    out = tmp_path / "tables"
    res = runner.invoke(
        report_command, ["--config", str(config), "--out", str(out), "--no-plots"], catch_exceptions=False
    )
    assert res.exit_code == 0, res.output
    with (out / "last.csv").open(newline="") as fh:
        rows = {(r["table"], r["row"], r["column"]): r for r in csv.DictReader(fh)}
    return rows, (out / "last.md").read_text()


def test_a_cell_of_the_old_rule_version_is_not_tabled(grid):
    tmp_path, config = grid
    assert make_instance("balanced").spec.version == "2"
    old = tmp_path / "results" / "runs" / rf.cell_id("balanced", 0)
    (old / "aggregation.json").write_text(
        json.dumps({"instance": "balanced", "rule": "balanced", "version": "1"})
    )
    now = tmp_path / "results" / "runs" / rf.cell_id("balanced", 1)
    (now / "aggregation.json").write_text(
        json.dumps({"instance": "balanced", "rule": "balanced", "version": "2"})
    )
    rows, md = _report(tmp_path, config)
    # last step 12: seed 1 alone (tiny_test .50, math500 .20), not the two-seed mean (.60, .20)
    assert float(rows[("last", "balanced", "tiny_test")]["mean"]) == pytest.approx(50.0)
    assert rows[("last", "balanced", "tiny_test")]["n_seeds"] == "1"
    assert rows[("last", "balanced", "tiny_test")]["flagged"] == "1"
    assert (
        f"{rf.cell_id('balanced', 0)}: trained under balanced version 1, but the grid's rule is version 2"
        in md
    )
    assert "not tabled" in md


def test_prompts_beyond_the_context_are_in_the_table_notes(grid):
    tmp_path, config = grid
    path = (
        tmp_path / "results" / "runs" / rf.cell_id("token", 0) / "eval" / "step_12" / "math500.metrics.json"
    )
    metrics = json.loads(path.read_text())
    path.write_text(json.dumps({**metrics, "not_generated": 3, "context_capped": 5, "not_judged": 2}))
    _, md = _report(tmp_path, config)
    assert (
        f"token: {rf.cell_id('token', 0)}: math500: responses not generated (their prompt is longer than "
        "the model's context), graded wrong: 3 at step 12"
    ) in md
    assert md.count("responses not generated") == 1  # one note, under the one last-step table
    assert "math500: responses whose max_tokens the model's context cut short: 5 at step 12" in md
    assert (
        "math500: responses the grading harness decided (a time-out, a crashed worker, an error), graded "
        "wrong: 2 at step 12"
    ) in md


def test_a_benchmark_graded_on_public_tests_only_is_footnoted(grid):
    """Issue 28, item 4(d): a cell whose code benchmark was graded on its public tests only (the
    offline LiveCodeBench copy) gets a footnote under its tables saying so and what it means."""
    tmp_path, config = grid
    path = tmp_path / "results" / "runs" / rf.cell_id("token", 1) / "eval" / "step_8" / "math500.metrics.json"
    metrics = json.loads(path.read_text())
    path.write_text(json.dumps({**metrics, "public_tests_only": True, "notes": ["public tests only"]}))
    _, md = _report(tmp_path, config)
    note = (
        f"token: {rf.cell_id('token', 1)}: math500: public tests only (the offline copy has no private tests)"
    )
    assert note in md
    assert md.count("public tests only (the offline copy") == 1  # the one cell, under the one last table


def test_the_grader_ledger_is_in_the_table_notes(grid):
    """Issue 28, item 7: a cell's grader ledger (metrics.json's ledger_* counts, via MLflow) is a
    note under its tables, summed over its evaluated steps."""
    tmp_path, config = grid
    run = tmp_path / "results" / "runs" / rf.cell_id("balanced", 0) / "eval"
    for step, (disagree, timeouts) in {4: (2, 0), 12: (5, 1)}.items():
        path = run / f"step_{step}" / "math500.metrics.json"
        ledger = {"ledger_verdicts": 40, "ledger_disagree": disagree, "ledger_vs_math_verify": 1}
        ledger |= {"ledger_vs_dapo": disagree, "grading_timeouts": timeouts}
        path.write_text(json.dumps({**json.loads(path.read_text()), **ledger}))
    _, md = _report(tmp_path, config)
    assert (
        f"balanced: {rf.cell_id('balanced', 0)}: math500: grader ledger over steps 4, 12: 7 of 80 verdicts "
        "differ among the benchmark's grader, plain math-verify and the DAPO verifier (2 vs math-verify, "
        "7 vs DAPO), 1 grading time-outs"
    ) in md


def test_a_cell_trained_under_another_config_than_the_grids_is_flagged_with_the_fields(grid):
    """A grid edited after training (a finished cell is not retrained: train.smk reads its cell
    config as ancient): the report compares each cell's stored resolved config with the config the
    grid gives it now, as a resume would, and flags the row naming the fields. A field a resume may
    change (total_steps, paths) does not count, nor does an unchanged config. The stored configs
    go through the trainer's own path: the workflow's cell.yaml, read by load_train_config and
    written by dump_config."""
    import yaml

    from aggbench import layout
    from aggbench.config import dump_config, load_train_config
    from aggbench.grid import cell_train_config, load_experiment

    tmp_path, config = grid
    exp = load_experiment(config)
    root = tmp_path / "results" / "runs"
    for rule, seed in (("token", 0), ("token", 1), ("balanced", 0)):
        cfg = cell_train_config(exp, rf.cell_id(rule, seed)).model_dump(mode="json")
        if (rule, seed) == ("token", 1):
            cfg["algorithm"]["lr"] = cfg["algorithm"]["lr"] * 2  # trained before the grid's lr changed
        if rule == "balanced":
            cfg["algorithm"]["total_steps"] = 99  # resume-mutable: not a change of experiment
        run = root / rf.cell_id(rule, seed)
        layout.cell_config(run).write_text(yaml.safe_dump(cfg))
        dump_config(load_train_config(layout.cell_config(run)), layout.resolved_config_file(run))
    rows, md = _report(tmp_path, config)
    assert (
        f"token: {rf.cell_id('token', 1)}: trained under another config than the grid's now (algorithm.lr: "
        in md
    )
    assert "| token † |" in md and "| balanced |" in md
    assert md.count("trained under another config") == 1


def test_config_changes_reads_each_spec_once_and_flags_an_unreadable_stored_config(grid, monkeypatch):
    """``collect.config_changes`` (run once per report, for the avg@n and greedy tables alike) reads
    each cell's stored config through ``run_config.read_resolved``, the reader a resume's check uses,
    and loads each dataset's spec once, not once per cell. A stored config that is not a mapping is
    the row's flag, not a traceback; a cell with none stored is left out."""
    import yaml

    from aggbench import data, layout
    from aggbench.grid import cell_train_config, cells, load_experiment
    from aggbench.report.collect import config_changes

    tmp_path, config = grid
    exp = load_experiment(config)
    root = tmp_path / "results" / "runs"
    ids = [c.id for c in cells(exp)]
    for cid in ids[1:]:
        cfg = cell_train_config(exp, cid).model_dump(mode="json")
        layout.resolved_config_file(root / cid).parent.mkdir(parents=True, exist_ok=True)
        layout.resolved_config_file(root / cid).write_text(yaml.safe_dump(cfg))
    layout.resolved_config_file(root / ids[1]).write_text("- a list, not a mapping\n")
    loads = []
    real = data.load_training_spec
    monkeypatch.setattr(data, "load_training_spec", lambda name: loads.append(name) or real(name))
    got = config_changes(exp)
    assert len(loads) == len(exp["datasets"]) == 1
    assert ids[0] not in got  # nothing stored yet
    assert got[ids[1]] == ["config.resolved.yaml unreadable (not a mapping)"]
    assert all(got[cid] == [] for cid in ids[2:]) and len(ids) > 2


def test_a_cell_scored_on_fewer_problems_is_flagged_naming_the_counts(grid):
    """A cell evaluated on fewer problems than another cell at the same step (an evaluation.limit, a
    trimmed samples file) has a score over another problem set: the report compares each
    benchmark's n_problems step by step across a table's cells, notes the counts and flags the row
    (the full-set cells stay unflagged, however many cells were trimmed)."""
    tmp_path, config = grid
    runs = tmp_path / "results" / "runs"
    for rule, seed in (("balanced", 0), ("token", 0), ("token", 1)):  # most cells trimmed
        path = runs / rf.cell_id(rule, seed) / "eval" / "step_12" / "tiny_test.metrics.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "n_problems": 8}))
    rows, md = _report(tmp_path, config)
    assert (
        f"balanced: {rf.cell_id('balanced', 0)}: tiny_test: scored on fewer problems than other cells at "
        "the same step (8 of 16 at step 12): not comparable"
    ) in md
    assert rows[("last", "balanced", "tiny_test")]["flagged"] == "1"
    assert rows[("last", "token", "tiny_test")]["flagged"] == "1"
    assert "sequence: " not in "".join(x for x in md.splitlines() if "fewer problems" in x)  # full set
    assert md.count("scored on fewer problems") == 3


def test_a_base_model_scored_on_other_problems_than_the_cells_flags_the_base_row(grid):
    """The base row is step 0 of every rule's gain: a base evaluation on 8 of the cells' 16 problems
    (a limit set after it ran) is noted with both counts, and its row flagged; the cells are not."""
    tmp_path, config = grid
    path = tmp_path / "results" / "base" / rf.MODEL / "eval" / "step_0" / "tiny_test.metrics.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "n_problems": 8}))
    rows, md = _report(tmp_path, config)
    assert (
        f"base: {rf.MODEL}__base: tiny_test: scored on 8 problems, the cells on 16 at every evaluated "
        "step: gains over the base row are over other problem sets"
    ) in md, md
    assert rows[("last", "base (step 0)", "tiny_test")]["flagged"] == "1"
    assert rows[("last", "token", "tiny_test")]["flagged"] == "0"
    assert "math500: scored on" not in md  # its counts agree


def test_test_problems_the_prepared_training_file_holds_are_noted_under_every_table(grid):
    """Every cell of a block trained on its dataset's prepared file: `aggbench report` counts the
    test problems that file holds (data.overlap, its instruction template taken off) and notes them
    under the block's tables, peak and last; a benchmark it cannot read says why, once, naming the
    fetched copy relative to the results directory."""
    from aggbench.data import load_benchmark
    from aggbench.layout import data_file

    tmp_path, config = grid
    test = [r["prompt"] for r in load_benchmark("tiny_test")][:3]
    prepared = data_file(tmp_path / "results", "tiny")
    prepared.parent.mkdir(parents=True)
    rows = [*test, test[0], "What is 1 + 1?"]
    prepared.write_text("".join(json.dumps({"prompt": t, "answer": "0"}) + "\n" for t in rows))
    _, md = _report(tmp_path, config)
    note = "training set tiny holds 3 of tiny_test's problems verbatim"
    assert md.count(note) == md.count("## tiny / tiny") >= 1, md
    peak = (tmp_path / "tables" / "peak.md").read_text()
    assert peak.count(note) == peak.count("## tiny / tiny") >= 2  # per benchmark and best average
    [unread] = [line for line in md.splitlines() if "not compared with" in line]
    # the fetched copy named relative to the results directory: the tables read the same everywhere
    assert unread == (
        "- training set tiny not compared with math500 for shared problems: math500: not in the "
        "fetched copy data/benchmarks"
    ), unread
    prepared.unlink()  # no prepared file: said once per test benchmark, named the same way
    _, md = _report(tmp_path, config)
    missing = [line for line in md.splitlines() if "no prepared file" in line]
    assert missing and all(
        f"no prepared file {prepared.relative_to(tmp_path / 'results')} in the results directory" in line
        and str(tmp_path) not in line
        for line in missing
    ), missing


def test_a_base_row_with_more_problems_or_a_step_apart_is_noted_with_those_steps():
    """More problems than the cells count as much as fewer (a limit set after the base ran); the
    steps whose count equals the base's are not listed; a selection benchmark is noted, not flagged;
    a benchmark without a base count is not compared."""
    from aggbench.grid import Cell
    from aggbench.report.collect import CellData
    from aggbench.report.notes import base_problem_notes

    c = CellData(Cell("m__d__token__s0", "m", "d", "token", 0), "run", True, 8, [4, 8])
    c.context = {"n_problems": {"tiny_test": {4: 30.0, 8: 20.0}, "tiny_val": {4: 10.0, 8: 10.0}}}
    groups = {"token": [c]}
    notes, flag = base_problem_notes(
        "m__base", {"tiny_test": 30, "tiny_val": 20}, groups, ["tiny_test", "tiny_val"], ["tiny_test"]
    )
    assert notes == [
        "base: m__base: tiny_test: scored on 30 problems, the cells on 20 at step 8: gains over the base row "
        "are over other problem sets; evaluate both on the same set",
        "base: m__base: tiny_val: scored on 20 problems, the cells on 10 at every evaluated step: gains over "
        "the base row are over other problem sets; evaluate both on the same set",
    ]
    assert flag
    notes, flag = base_problem_notes(
        "m__base", {"tiny_val": 20}, groups, ["tiny_test", "tiny_val"], ["tiny_test"]
    )
    assert len(notes) == 1 and "tiny_val" in notes[0] and not flag  # a selection benchmark: noted only


def test_problem_counts_are_compared_step_by_step_and_a_selection_benchmark_is_noted_only():
    """A limit changed for every cell between two steps leaves each step comparable: no note; a
    selection benchmark (not a column) with fewer problems is noted without flagging the row."""
    from aggbench.grid import Cell
    from aggbench.report.collect import CellData
    from aggbench.report.notes import cell_notes
    from aggbench.tracking import SENTINEL

    def cell(rule, val_at_8):
        c = CellData(Cell(f"m__d__{rule}__s0", "m", "d", rule, 0), "run", True, 8, [4, 8])
        c.train, c.evals = {SENTINEL: {8: 1.0}}, {b: {4: 50.0, 8: 60.0} for b in ("tiny_test", "tiny_val")}
        c.context = {"n_problems": {"tiny_test": {4: 8.0, 8: 30.0}, "tiny_val": {4: 20.0, 8: val_at_8}}}
        return c

    groups = {"token": [cell("token", 20.0)], "sequence": [cell("sequence", 10.0)]}
    notes, flagged = cell_notes(groups, ["tiny_test", "tiny_val"], ["tiny_test"], set())
    assert notes == [
        "sequence: m__d__sequence__s0: tiny_val: scored on fewer problems than other cells at the same "
        "step (10 of 20 at step 8): not comparable; evaluate it on the full set again"
    ]
    assert flagged == set()


def test_a_cell_continued_on_other_training_records_is_flagged(grid):
    """A resume told to go on with other training records (--allow-config-change) leaves two record
    sets in the run's data.json; the report flags the row, naming the step and the new set."""
    from aggbench import layout

    tmp_path, config = grid
    run = tmp_path / "results" / "runs" / rf.cell_id("token", 1)
    sets = [
        {"sha256": "a" * 64, "n_records": 256, "path": "data/tiny.jsonl", "since_step": 0},
        {"sha256": "b" * 64, "n_records": 255, "path": "data/tiny.jsonl", "since_step": 4},
    ]
    layout.data_record_file(run).write_text(json.dumps({"records": sets}))
    rows, md = _report(tmp_path, config)
    assert (
        f"token: {rf.cell_id('token', 1)}: continued on other training records (from step 4: 255 records "
        "of data/tiny.jsonl (sha256 bbbbbbbbbbbb); data.json)"
    ) in md
    assert rows[("last", "token", "tiny_test")]["flagged"] == "1"
    assert md.count("continued on other training records") == 1


def test_a_reason_names_files_relative_to_the_results_directory_only_where_a_path_starts(tmp_path):
    """cli.report._relative: the results directory comes off a path as given or resolved (the
    longer first), never from inside another name."""
    from pathlib import Path

    from aggbench.cli.report import _relative

    root = tmp_path / "results"
    assert _relative(f"x: not in the fetched copy {root}/data/benchmarks", root) == (
        "x: not in the fetched copy data/benchmarks"
    )
    assert _relative(f"'{root}/data/a.jsonl':2: field 'prompt'", root) == "'data/a.jsonl':2: field 'prompt'"
    inside = f"{tmp_path}/myresults/data/b and /other/{root.name}/data/c"
    assert _relative(inside, root) == inside
    assert _relative(f"{root.name}/data/d", Path(root.name)) == "data/d"
