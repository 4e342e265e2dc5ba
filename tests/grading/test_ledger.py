"""The grader-disagreement ledger (issue 28, item 7; aggbench.grading.ledger): per answer
benchmark, how many verdicts of its grader a plain math-verify call and the DAPO verifier disagree
with, and the grading time-outs; written by `aggbench score`, tabled in the report's notes."""

from __future__ import annotations

import json

from click.testing import CliRunner

from aggbench.cli import main
from aggbench.grading.ledger import counts, plain_verdict
from helpers.jsonl import read_jsonl, write_jsonl

ROWS = [
    ("so the answer is \\boxed{025}", "25"),  # math: 025 == 25; math-verify too; DAPO: "025" != "25"
    ("Work.\nAnswer: 42", "42"),  # all three right
    ("I give up.", "7"),  # all three wrong
    ("The final answer is 12, I think.", "12"),  # math: a stated final answer; DAPO: no Answer line
]


def test_counts_against_a_hand_table():
    rows = [{"response": r, "answer": a} for r, a in ROWS]
    assert [plain_verdict((r, a)) for r, a in ROWS] == [True, True, False, True]
    verdicts = [
        {"correct": True},
        {"correct": True},
        {"correct": False},
        {"correct": True, "reason": "timeout"},
    ]
    got = counts(rows, verdicts)
    assert got == {
        "ledger_verdicts": 4,
        "ledger_disagree": 2,  # rows 0 and 3: DAPO says wrong
        "ledger_vs_math_verify": 0,
        "ledger_vs_dapo": 2,
        "grading_timeouts": 1,  # the grader's (a made-up verdict: the count reads the reason)
    }
    # a math-verify verdict the pool could not give (None: its deadline) is a time-out and a disagreement
    pooled = [{**v, "math_verify": mv} for v, mv in zip(verdicts, [True, None, False, True], strict=True)]
    got = counts(rows, pooled)
    assert (got["ledger_vs_math_verify"], got["ledger_disagree"], got["grading_timeouts"]) == (1, 3, 2)


def test_score_writes_the_ledger_and_each_rows_plain_verdict(tmp_path, shared_data, monkeypatch):
    from aggbench.data.benchmarks import load_benchmark

    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(shared_data))
    records = load_benchmark("math500", data_dir=shared_data, limit=3)
    samples = []
    for rec in records:
        for j, response in enumerate((f"\\boxed{{{rec['answer']}}}", f"Answer: {rec['answer']}", "no idea")):
            samples.append({"id": rec["id"], "sample": j, "response": response, "answer": rec["answer"]})
    src = write_jsonl(tmp_path / "math500.jsonl", samples)
    out = tmp_path / "eval" / "math500.jsonl"
    args = ["score", "--benchmark", "math500", "--samples", str(src), "--out", str(out), "--workers", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    graded = read_jsonl(out)
    assert all(isinstance(r["math_verify"], bool) for r in graded)
    metrics = json.loads((tmp_path / "eval" / "math500.metrics.json").read_text())
    assert metrics["ledger_verdicts"] == 9 and metrics["grading_timeouts"] == 0
    expected_dapo = sum(
        r["correct"] != (r["response"].startswith("Answer:") or r["response"] == f"\\boxed{{{r['answer']}}}")
        for r in graded
    )
    assert metrics["ledger_vs_dapo"] == expected_dapo
    assert metrics["ledger_vs_math_verify"] == sum(r["correct"] != r["math_verify"] for r in graded)
