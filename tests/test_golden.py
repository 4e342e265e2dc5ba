"""aggbench.golden: a one-token change of a sampled response is caught and named; one golden set per
machine class, found by its machine.json, and regenerating drops the other classes' stale sets."""

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


def test_a_set_per_machine_class_is_found_and_regenerating_drops_the_others_unless_kept(tmp_path):
    assert golden.slug({"cpu_model": "Intel(R) Xeon(R) Processor", "cpu_capability": "AVX512"}) == (
        "intel-xeon-processor-avx512"
    )
    assert golden.slug({"cpu_model": "AMD EPYC", "cpu_capability": "AVX2"}) == "amd-epyc-avx2"
    here = golden.machine(tmp_path)
    cap = "AVX2" if here["cpu_capability"] != "AVX2" else "AVX512"
    other_machine = {**here, "cpu_capability": cap}
    root, results = tmp_path / "golden", _results(tmp_path / "r")
    for keep in (True, False):
        other = root / golden.slug(other_machine)
        golden.copy_results(results, other)
        (other / "machine.json").write_text(json.dumps(other_machine))
        assert golden.set_for(root, here) in (None, root / golden.slug(here))  # None the first time
        written = golden.regenerate(root, tmp_path, results, keep_others=keep)
        assert written == root / golden.slug(here) and golden.set_for(root, here) == written
        assert golden.differences(written, results) == []
        assert json.loads((written / "machine.json").read_text())["cpu_capability"] == here["cpu_capability"]
        assert golden.set_for(root, other_machine) == (other if keep else None)
        assert golden.sets(root) == sorted([written, other] if keep else [written])


def test_each_committed_set_is_named_for_its_machine_and_complete():
    from pathlib import Path

    root = Path(__file__).resolve().parent / "golden" / "smoke"
    found = golden.sets(root)
    assert found, root
    for d in found:
        assert d.name == golden.slug(json.loads((d / "machine.json").read_text())), d
        assert sorted(p.name for p in (d / "tables").glob("*.csv")) == ["last.csv", "peak.csv", "values.csv"]
        assert len(list(d.glob("runs/*/metrics.jsonl"))) == 3, d
    assert not list(root.glob("*.json")) and not (root / "tables").exists()  # nothing outside a set
