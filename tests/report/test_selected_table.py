"""Honest peaks (issue 27, item 3): the "selected" table chooses each seed's checkpoint on a held-out
selection benchmark and reports the test benchmark there, beside the peak tables, which choose on the
test benchmark itself.

The fixture (percent, as MLflow holds them), evaluated at steps 4, 8, 12:

    token s0   tiny_val  40  70  50    tiny_test  30  45  60   -> chosen on tiny_val: step 8, test 45
    token s1   tiny_val  40  50  60    tiny_test  30  44  50   -> step 12, test 50
    seq   s0   tiny_val  55  55  50    tiny_test  20  25  35   -> step 4 (a tie goes to the earlier), test 20

The per-benchmark peak (seed-mean test curve) of token is step 12 (55.0), of sequence 12 (35.0): a
different step from the selected one in both rows.
"""

from __future__ import annotations

import csv
import io

import pytest

from aggbench import grid
from aggbench.data.grid_checks import load_data_specs, selection_problems
from aggbench.report.collect import CellData, Collected
from aggbench.report.render import to_csv, to_markdown, write_tables
from aggbench.report.tables import build_tables
from aggbench.tracking import SENTINEL

STEPS = (4, 8, 12)
CURVES = {
    ("token", 0): {"tiny_val": (40, 70, 50), "tiny_test": (30, 45, 60)},
    ("token", 1): {"tiny_val": (40, 50, 60), "tiny_test": (30, 44, 50)},
    ("sequence", 0): {"tiny_val": (55, 55, 50), "tiny_test": (20, 25, 35)},
}


def _collected(selection: dict | None) -> Collected:
    exp = {
        "experiment": "sel",
        "models": {"tiny": {"source": "tiny"}},
        "datasets": {"tiny": {"spec": "tiny"}},
        "aggregations": [{"name": "token"}, {"name": "sequence"}],
        "seeds": [0, 1],
        "benchmarks": ["tiny_test", "tiny_val"],
        "evaluation": {"selection": selection} if selection else {},
    }
    cells = []
    for (rule, seed), curves in CURVES.items():
        cell = grid.Cell(f"tiny__tiny__{rule}__s{seed}", "tiny", "tiny", rule, seed)
        evals = {b: dict(zip(STEPS, map(float, vals), strict=True)) for b, vals in curves.items()}
        data = CellData(cell, "run", True, 12, list(STEPS), evals=evals)
        data.train = {SENTINEL: {12: 1.0}}
        cells.append(data)
    keys = {b: f"eval/{b}/avg@4" for b in exp["benchmarks"]}
    base = {"tiny": {"tiny_test": 10.0, "tiny_val": 12.0}}
    return Collected(exp, "avg@4", list(exp["benchmarks"]), keys, cells, base, True)


def _row(table, label):
    return next(r for r in table.rows if r.label == label)


def test_the_selected_table_picks_the_step_best_on_the_selection_split():
    tables = build_tables(_collected({"tiny_test": "tiny_val"}))
    (selected,) = tables["selected"]
    assert selected.columns == ["tiny_test", "average", "drop"]  # the selection split is no column
    token, seq = _row(selected, "token"), _row(selected, "sequence")
    assert token.entries["tiny_test"].mean == pytest.approx((45 + 50) / 2)  # steps 8 and 12
    assert token.entries["tiny_test"].step is None and token.entries["tiny_test"].n == 2
    assert token.steps_text == "s0@8 s1@12"
    assert token.entries["average"].mean == pytest.approx(47.5)
    assert seq.entries["tiny_test"].mean == pytest.approx(20.0)  # the tie at 55 goes to step 4
    assert seq.entries["tiny_test"].step == 4 and seq.steps_text == "s0@4"
    # the optimistic peak chose other steps: the best TEST step of the seed-mean curve
    peak = next(t for t in tables["peak"] if t.definition == "peak_per_benchmark")
    assert _row(peak, "token").entries["tiny_test"].step == 12
    assert _row(peak, "token").entries["tiny_test"].mean == pytest.approx(55.0)
    assert _row(peak, "sequence").entries["tiny_test"].mean == pytest.approx(35.0)
    assert "tiny_val" not in peak.columns and "tiny_val" not in tables["last"][0].columns
    # the base row is the same step-0 value in every table
    assert _row(selected, "base (step 0)").entries["tiny_test"].mean == pytest.approx(10.0)


def test_the_selected_table_is_named_so_it_cannot_be_taken_for_a_peak(tmp_path):
    tables = build_tables(_collected({"tiny_test": "tiny_val"}))
    md = to_markdown(tables["selected"], "x")
    assert "selected: each seed's checkpoint chosen on the selection split" in md
    assert "tiny_test on tiny_val" in md and "chosen step (per seed)" in md
    assert "| token | s0@8 s1@12 | **47.5" in md
    csv_text = to_csv(tables["selected"])
    assert "selected,tiny,tiny,avg@4,token,rule,tiny_test,47.5" in csv_text
    rows = list(csv.DictReader(io.StringIO(csv_text)))
    token = next(r for r in rows if (r["row"], r["column"]) == ("token", "tiny_test"))
    assert token["step"] == "s0@8 s1@12"  # the seeds chose different steps: the CSV keeps which
    seq = next(r for r in rows if (r["row"], r["column"]) == ("sequence", "tiny_test"))
    assert seq["step"] == "4"
    paths = write_tables(tables, tmp_path, "sel")
    assert {p.name for p in paths} >= {"selected.md", "selected.csv", "selected.tex", "peak.md", "last.md"}
    peak_md = (tmp_path / "peak.md").read_text()
    assert "ON THE TEST BENCHMARK: optimistic; see selected.md" in peak_md.splitlines()[0]


def test_without_selection_the_tables_are_as_before():
    tables = build_tables(_collected(None))
    assert set(tables) == {"peak", "last"}
    peak = next(t for t in tables["peak"] if t.definition == "peak_per_benchmark")
    assert peak.columns == ["tiny_test", "tiny_val", "average", "drop"]


def test_a_selection_that_is_not_held_out_is_refused():
    exp = grid.load_experiment(grid.REPO_ROOT / "configs" / "smoke.yaml")
    problems = {
        "tiny_test: tiny_val": ["the selection benchmark 'tiny_val' is not in benchmarks"],
        "tiny_test: tiny_test": ["'tiny_test' is a test benchmark"],
        "math500: tiny_test": ["'math500' is not in benchmarks"],
    }
    for spec, messages in problems.items():
        test, sel = spec.split(": ")
        exp["evaluation"]["selection"] = {test: sel}
        found = selection_problems(exp, grid.selection(exp), load_data_specs(exp))
        for m in messages:
            assert any(m in p for p in found), (spec, found)
    exp["benchmarks"] = ["tiny_test", "tiny_val"]
    exp["evaluation"]["selection"] = {"tiny_test": "tiny_val"}
    assert selection_problems(exp, grid.selection(exp), load_data_specs(exp)) == []
    grid.validate_experiment(exp)


def test_each_dataset_is_selected_on_the_holdout_of_its_own_training_set():
    """Per-dataset selection ({test: {dataset: benchmark}}, as configs/paper.yaml): the cells of
    dataset a choose on val_a, those of b on val_b, even where the other split would pick another
    step; neither split is a column."""
    exp = {
        "experiment": "sel2",
        "models": {"tiny": {"source": "tiny"}},
        "datasets": {"a": {"spec": "tiny"}, "b": {"spec": "tiny"}},
        "aggregations": [{"name": "token"}],
        "seeds": [0],
        "benchmarks": ["tiny_test", "val_a", "val_b"],
        "evaluation": {"selection": {"tiny_test": {"a": "val_a", "b": "val_b"}}},
    }
    curves = {  # val_a peaks at 8 in a and at 12 in b; val_b at 12 in a and at 4 in b
        "a": {"val_a": (10, 90, 20), "val_b": (10, 20, 90), "tiny_test": (30, 40, 50)},
        "b": {"val_a": (10, 20, 90), "val_b": (90, 20, 10), "tiny_test": (35, 45, 55)},
    }
    cells = []
    for dataset, by_bench in curves.items():
        cell = grid.Cell(f"tiny__{dataset}__token__s0", "tiny", dataset, "token", 0)
        evals = {b: dict(zip(STEPS, map(float, v), strict=True)) for b, v in by_bench.items()}
        data = CellData(cell, "run", True, 12, list(STEPS), evals=evals)
        data.train = {SENTINEL: {12: 1.0}}
        cells.append(data)
    keys = {b: f"eval/{b}/avg@4" for b in exp["benchmarks"]}
    col = Collected(exp, "avg@4", list(exp["benchmarks"]), keys, cells, {}, False)
    by_dataset = {t.dataset: t for t in build_tables(col)["selected"]}
    assert set(by_dataset) == {"a", "b"}
    for dataset, step, value, split in (("a", 8, 40.0, "val_a"), ("b", 4, 35.0, "val_b")):
        table = by_dataset[dataset]
        assert table.columns == ["tiny_test", "average", "drop"]
        token = _row(table, "token")
        assert token.steps_text == f"s0@{step}" and token.entries["tiny_test"].mean == pytest.approx(value)
        assert f"tiny_test on {split}" in " ".join(table.about)


def test_test_problems_a_selection_split_holds_are_noted_under_the_selected_table():
    """data.overlap.shared_problems' counts (the report reads them from the fetched copy) are a note
    under the selected table only, naming both benchmarks; a pair it could not compare says why;
    a pair sharing none says nothing."""
    from aggbench.data.overlap import Shared

    col = _collected({"tiny_test": "tiny_val"})
    md = to_markdown(build_tables(col, overlaps={("tiny_val", "tiny_test"): Shared(3)})["selected"], "x")
    assert "tiny_val holds 3 of tiny_test's problems verbatim (verbatim: " in md
    near = Shared(0, 2, ("tiny_test id 7 against tiny_val id 3", "tiny_test id 9 against tiny_val id 4"))
    md = to_markdown(build_tables(col, overlaps={("tiny_val", "tiny_test"): near})["selected"], "x")
    assert "tiny_val holds 2 of tiny_test's problems as near copies (" in md and "has seen them scored" in md
    assert "check tiny_test id 7 against tiny_val id 3, tiny_test id 9 against tiny_val id 4)" in md
    unread = build_tables(col, overlaps={("tiny_val", "tiny_test"): "tiny_val: not in the fetched copy X"})
    assert (
        "tiny_val not compared with tiny_test for shared problems: tiny_val: not in the fetched copy X"
        in (to_markdown(unread["selected"], "x"))
    )
    plain = build_tables(
        col, overlaps={("tiny_val", "other"): Shared(2), ("tiny_val", "tiny_test"): Shared(0)}
    )
    assert "verbatim" not in to_markdown(plain["selected"], "x") + to_markdown(plain["last"], "x")


def test_a_base_run_whose_mlflow_values_differ_from_its_files_is_flagged_and_noted():
    """--allow-mismatch tables a cell whose MLflow data differ from its files flagged; the base
    run's row was never flagged (so it could be bold, its number the one in doubt)."""
    from aggbench.report.ingest import base_id

    col = _collected(None)
    plain = build_tables(col)
    assert not _row(plain["last"][0], "base (step 0)").flagged
    tables = build_tables(col, mismatched={base_id("tiny")})
    for table in [*tables["peak"], *tables["last"]]:
        assert _row(table, "base (step 0)").flagged, table.definition
        assert f"base: {base_id('tiny')}: MLflow differs from the run files" in "\n".join(table.notes)


def test_drop_leaves_out_a_seed_whose_run_ends_before_the_others():
    """drop = peak - last of the benchmark average, per seed then over seeds. A seed stopped at step 8,
    its peak, would read 0 ("stable") over a shorter run: it is left out, and the cell says n=2."""
    from aggbench.report.tables import _drop

    full = {"tiny_test": {4: 50.0, 8: 60.0, 12: 55.0}}  # drop 5
    other = {"tiny_test": {4: 50.0, 8: 62.0, 12: 55.0}}  # drop 7
    short = {"tiny_test": {4: 50.0, 8: 60.0}}  # unfinished: peak = last
    seeds = [
        CellData(grid.Cell(f"tiny__tiny__token__s{k}", "tiny", "tiny", "token", k), "run", k < 2, 12, list(STEPS),
                 evals=evals)
        for k, evals in enumerate([full, other, short])
    ]  # fmt: skip
    e = _drop(seeds, ["tiny_test"])
    assert (e.mean, e.n) == (6.0, 2)
    assert _drop(seeds[:2], ["tiny_test"]).mean == 6.0  # the same as without the short seed


def test_a_cell_evaluated_at_steps_the_grid_no_longer_has_is_flagged():
    """total_steps lowered (or evaluation.every coarsened) after a cell ran: its evaluations at the
    steps the grid no longer has still enter its peaks and drop, so its row is flagged and says
    which steps, never bold."""
    col = _collected(None)
    token = [c for c in col.cells if c.cell.aggregation == "token"]
    for c in token:
        c.evals["tiny_test"][16] = c.evals["tiny_val"][16] = 99.0
    assert "evaluated at steps 16 that the grid does not evaluate now" in token[0].issue(col.benchmarks)
    peak = build_tables(col)["peak"][0]
    row = _row(peak, "token")
    assert row.flagged and not any(e.best for e in row.entries.values())
