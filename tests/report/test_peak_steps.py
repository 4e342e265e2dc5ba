"""Which step a peak table takes when a row's seeds stopped at different steps, and which rows may be
bold (aggbench.report.tables): a peak is chosen among the steps every seed of the row has, and a
flagged row (unfinished seeds) is shown but never marked best.

The fixture (percent), one benchmark, evaluated at steps 4, 8, 12 of 12:

    token     s0  60  62  70     s1  50  52  --     s2  40  --  --    (s1, s2 stopped early: flagged)
    balanced  s0  50  55  90     s1  50  55  90     s2  50  55  --    (s2 stopped at 8: flagged)
    sequence  s0  45  46  47     s1  45  46  47     s2  45  46  47

On the seed-mean curve token's best step would be 12 (70, seed 0 alone) and balanced's 12 (90, two
seeds); among the steps all their seeds share, token's is 4 (50, n = 3) and balanced's 8 (55).
"""

from __future__ import annotations

import pytest

from aggbench import grid
from aggbench.report.collect import CellData, Collected
from aggbench.report.tables import build_tables
from aggbench.tracking import SENTINEL

STEPS = (4, 8, 12)
CURVES = {
    "token": [(60, 62, 70), (50, 52), (40,)],
    "balanced": [(50, 55, 90), (50, 55, 90), (50, 55)],
    "sequence": [(45, 46, 47)] * 3,
}


def _collected() -> Collected:
    exp = {
        "experiment": "peaks",
        "models": {"tiny": {"source": "tiny"}},
        "datasets": {"tiny": {"spec": "tiny"}},
        "aggregations": [{"name": rule} for rule in CURVES],
        "seeds": [0, 1, 2],
        "benchmarks": ["tiny_test"],
        "evaluation": {},
    }
    cells = []
    for rule, seeds in CURVES.items():
        for seed, values in enumerate(seeds):
            cell = grid.Cell(f"tiny__tiny__{rule}__s{seed}", "tiny", "tiny", rule, seed)
            evals = {"tiny_test": dict(zip(STEPS, map(float, values), strict=False))}
            data = CellData(cell, "run", True, 12, list(STEPS), evals=evals)
            data.train = {SENTINEL: {STEPS[len(values) - 1]: 1.0}}
            cells.append(data)
    keys = {"tiny_test": "eval/tiny_test/avg@4"}
    return Collected(exp, "avg@4", ["tiny_test"], keys, cells, {"tiny": {"tiny_test": 10.0}}, True)


def _rows(definition: str) -> dict:
    tables = build_tables(_collected())
    kind = "peak" if definition.startswith("peak") else definition
    (table,) = [t for t in tables[kind] if t.definition == definition]
    return {r.label: r for r in table.rows}


@pytest.mark.parametrize("definition", ["peak_per_benchmark", "peak_best_average"])
def test_a_peak_is_chosen_among_the_steps_every_seed_of_the_row_has(definition):
    rows = _rows(definition)
    token, balanced, sequence = (rows[r].entries["tiny_test"] for r in ("token", "balanced", "sequence"))
    assert (token.step, token.mean, token.n) == (4, 50.0, 3)  # not step 12 at 70.0 from seed 0 alone
    assert (balanced.step, balanced.mean, balanced.n) == (8, 55.0, 3)  # not step 12 at 90.0, n = 2
    assert (sequence.step, sequence.mean, sequence.n) == (12, 47.0, 3)  # complete rows: unchanged


def test_the_last_step_table_keeps_the_last_step_any_seed_reached_with_its_n():
    rows = _rows("last")
    assert (rows["token"].step, rows["token"].entries["tiny_test"].n) == (12, 1)
    assert (rows["balanced"].step, rows["balanced"].entries["tiny_test"].mean) == (12, 90.0)
    assert rows["token"].flagged and rows["balanced"].flagged and not rows["sequence"].flagged


@pytest.mark.parametrize("definition", ["peak_per_benchmark", "peak_best_average", "last"])
def test_a_flagged_row_is_never_bold_even_where_it_is_highest(definition):
    rows = _rows(definition)
    assert not any(e.best for r in ("token", "balanced") for e in rows[r].entries.values())
    # sequence is the only unflagged rule: best in its benchmark column though balanced shows more
    assert rows["sequence"].entries["tiny_test"].best
    assert rows["balanced"].entries["tiny_test"].mean > rows["sequence"].entries["tiny_test"].mean
