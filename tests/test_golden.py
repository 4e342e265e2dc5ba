"""aggbench.golden's comparison: a one-token change of a sampled response is caught and named."""

from __future__ import annotations

import csv
import json

from aggbench import golden

ROWS = [
    {"step": 1, "len/pos_mean": 21.5, "len/gap": 3.25, "reward/mean": 0.375, "time/step_s": 1.7},
    {"step": 2, "len/pos_mean": 22.0, "len/gap": float("nan"), "reward/mean": 0.5, "tokens_per_s": 90.0},
]
TABLE = [
    {"table": "last", "row": "token", "column": "average", "mean": "79.7"},
    {"table": "last", "row": "balanced", "column": "average", "mean": "81.6"},
]


def _results(root, rows=ROWS, table=TABLE):
    run = root / "runs" / "tiny__tiny__token__s0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "tables").mkdir()
    with (root / "tables" / "last.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    return root


def test_identical_results_and_other_times_pass(tmp_path):
    other = [{**ROWS[0], "time/step_s": 9.9}, {**ROWS[1], "tokens_per_s": 1.0}]
    assert golden.differences(_results(tmp_path / "g"), _results(tmp_path / "r", other)) == []


def test_one_token_longer_response_fails_naming_file_row_field(tmp_path):
    """One of 64 responses one token longer moves the positive mean by 1/64 and the gap with it."""
    one_token = [{**ROWS[0], "len/pos_mean": 21.5 + 1 / 64, "len/gap": 3.25 + 1 / 64}, ROWS[1]]
    diff = golden.differences(_results(tmp_path / "g"), _results(tmp_path / "r", one_token))
    assert diff == [
        "runs/tiny__tiny__token__s0/metrics.jsonl row 1 (step 1) field len/gap: golden 3.25, got 3.265625",
        "runs/tiny__tiny__token__s0/metrics.jsonl row 1 (step 1) field len/pos_mean: golden 21.5, got 21.515625",
    ]


def test_a_table_cell_and_a_missing_file_are_reported(tmp_path):
    table = [TABLE[0], {**TABLE[1], "mean": "81.5"}]
    g, r = _results(tmp_path / "g"), _results(tmp_path / "r", table=table)
    (r / "runs" / "tiny__tiny__token__s0" / "metrics.jsonl").unlink()
    assert golden.differences(g, r) == [
        "tables/last.csv row 2 (row balanced) field mean: golden '81.6', got '81.5'",
        "runs/tiny__tiny__token__s0/metrics.jsonl: 2 rows in the golden, 0 got",
    ]


def test_another_cpu_is_a_machine_difference_and_the_same_is_none(tmp_path):
    here = golden.machine(tmp_path)
    assert golden.machine_differences(here, dict(here)) == []
    # a capability other than this machine's (it was AVX512 where the golden was made, AVX2 elsewhere)
    cap = "AVX2" if here["cpu_capability"] != "AVX2" else "AVX512"
    other = {**here, "cpu_capability": cap, "lock_sha256": "x"}
    assert golden.machine_differences(other, here) == [
        f"cpu_capability: golden {cap!r}, here {here['cpu_capability']!r}"
    ]


def test_copy_then_compare_round_trips(tmp_path):
    r = _results(tmp_path / "r")
    golden.copy_results(r, tmp_path / "g")
    assert golden.differences(tmp_path / "g", r) == []
