"""`aggbench score` on bad samples: every row gets the checks `aggbench grade` runs, and problems
must have the same number of samples, all before any grading; the summary line names each metric
once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from helpers.jsonl import write_jsonl


@pytest.fixture
def no_grading(monkeypatch):
    """Grading fails the test: bad samples must be refused before it starts."""
    import aggbench.evaluation.score

    def never(*args, **kwargs):
        pytest.fail("the samples were graded before they were checked")

    monkeypatch.setattr(aggbench.evaluation.score, "grade_rows", never)


def score(benchmark: str, samples: Path, out: Path):
    return CliRunner().invoke(
        main, ["score", "--benchmark", benchmark, "--samples", str(samples), "--out", str(out)]
    )


GOOD_MATH = {"benchmark": "math500", "id": "p0", "sample": 0, "response": "\\boxed{2}", "answer": "2"}
TEST = {"input": "1\n", "output": "1\n", "testtype": "stdin"}
GOOD_CODE = {"benchmark": "livecodebench", "id": "p0", "sample": 0, "response": "x", "tests": [TEST]}


@pytest.mark.parametrize(
    ("benchmark", "row", "says"),
    [
        ("math500", {**GOOD_MATH, "answer": {"x": 1}}, "field 'answer': expected a string, a number or"),
        ("math500", {**GOOD_MATH, "answer": None}, "field 'answer': expected a string, a number or"),
        ("math500", {**GOOD_MATH, "answer": []}, "field 'answer': expected a string, a number or"),
        ("math500", {**GOOD_MATH, "tolerance": "abc"}, "field 'tolerance': tolerance must be a number"),
        ("math500", {**GOOD_MATH, "grading": {"error": "x"}}, "field 'tolerance': tolerance must be a number"),
        ("math500", {**GOOD_MATH, "grading": "1e-2"}, "field 'grading': expected an object"),
        ("math500", {**GOOD_MATH, "id": {"a": 1}}, "field 'id': expected a string or an integer"),
        ("livecodebench", {**GOOD_CODE, "tests": "[{bad"}, "field 'tests': a string that is not JSON"),
        ("livecodebench", {**GOOD_CODE, "tests": ["1"]}, "field 'tests[0]': expected an object"),
        ("livecodebench", {**GOOD_CODE, "tests": [{"inpt": "1", "output": "1"}]}, "field 'tests[0]': missing 'input'"),
        ("livecodebench", {**GOOD_CODE, "tests": [{**TEST, "testtype": "stdinn"}]}, "field 'tests[0]': unknown testtype 'stdinn'"),
        ("tiny_test", {"id": "t", "sample": 0, "response": "x", "answer": None}, "field 'answer': expected a string"),
        ("tiny_test", {"id": "t", "sample": 0, "response": "x", "answer": ["a"]}, "field 'answer': expected a string"),
    ],
)  # fmt: skip
def test_score_checks_each_row_like_grade_before_grading(tmp_path, no_grading, benchmark, row, says):
    samples = write_jsonl(tmp_path / "s.jsonl", [row])
    result = score(benchmark, samples, tmp_path / "o.jsonl")
    assert result.exit_code == 1, result.output
    assert f"Error: {samples}:1: {says}" in result.output, result.output
    assert not (tmp_path / "o.jsonl").exists()


def test_score_and_grade_refuse_the_same_row(tmp_path):
    row = {**GOOD_MATH, "tolerance": "abc"}
    samples = write_jsonl(tmp_path / "s.jsonl", [row])
    scored = score("math500", samples, tmp_path / "o.jsonl")
    graded = CliRunner().invoke(
        main, ["grade", "--grader", "math", "--input", str(samples), "--output", str(tmp_path / "g.jsonl")]
    )
    assert scored.exit_code == graded.exit_code == 1
    assert scored.output.splitlines()[-1] == graded.output.splitlines()[-1]


def test_livecodebench_tests_as_a_json_string_are_scored(tmp_path):
    """grade takes the tests as LiveCodeBench's JSON string; score, running its checks, does too."""
    rows = [
        {**GOOD_CODE, "tests": json.dumps([TEST]), "response": "```python\nprint(input())\n```"},
        {**GOOD_CODE, "id": "p1", "tests": json.dumps([TEST]), "response": "```python\nprint(2)\n```"},
    ]
    samples = write_jsonl(tmp_path / "s.jsonl", rows)
    result = score("livecodebench", samples, tmp_path / "o.jsonl")
    assert result.exit_code == 0, result.output
    graded = [json.loads(line) for line in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert [g["correct"] for g in graded] == [True, False]


def ragged_tiny_rows() -> list[dict]:
    """Three problems with 2 samples, one with 1 (listed first, so it is also the minimum)."""
    counts = {"tiny-test-000003": 1, "tiny-test-000000": 2, "tiny-test-000001": 2, "tiny-test-000002": 2}
    return [
        {"benchmark": "tiny_test", "id": pid, "sample": j, "response": "\\boxed{a}", "answer": "a"}
        for pid, n in counts.items()
        for j in range(n)
    ]


def test_uneven_sample_counts_name_the_usual_count_before_grading(tmp_path, no_grading):
    samples = write_jsonl(tmp_path / "s.jsonl", ragged_tiny_rows())
    result = score("tiny_test", samples, tmp_path / "o.jsonl")
    assert result.exit_code == 1, result.output
    assert "3 of 4 problems have 2, but 'tiny-test-000003': 1" in result.output
    assert "aggbench generate" in result.output


def test_a_sample_twice_is_refused_before_grading(tmp_path, no_grading):
    """Two samples files joined (or one appended twice) would pass the even-count check with every
    sample doubled, and score avg@8 of 4 samples each."""
    rows = [r for r in ragged_tiny_rows() if r["id"] != "tiny-test-000003"]
    samples = write_jsonl(tmp_path / "s.jsonl", rows + rows)
    result = score("tiny_test", samples, tmp_path / "o.jsonl")
    assert result.exit_code == 1, result.output
    assert f"{samples}:7: problem 'tiny-test-000000' sample 0 repeats line 1" in result.output
    assert not (tmp_path / "o.jsonl").exists()


def test_summarize_names_the_most_common_count():
    from aggbench.evaluation.metrics import summarize, uneven_samples

    rows = [{"id": r["id"], "correct": True} for r in ragged_tiny_rows()]
    with pytest.raises(ValueError, match=r"3 of 4 problems have 2, but 'tiny-test-000003': 1$"):
        summarize(rows)
    assert uneven_samples({"a": 1, "b": 1}) is None
    many = uneven_samples({f"p{i}": 1 for i in range(8)} | {f"q{i}": 3 for i in range(9)}, show=2)
    assert many is not None and many.endswith("have 3, but 'p0': 1, 'p1': 1 and 6 more")


def test_the_summary_names_pass_at_1_once_when_n_is_1(tmp_path):
    rows = [{"benchmark": "tiny_test", "id": f"p{i}", "sample": 0, "response": "\\boxed{a}", "answer": "a"}
            for i in range(2)]  # fmt: skip
    samples = write_jsonl(tmp_path / "s.jsonl", rows)
    result = score("tiny_test", samples, tmp_path / "o.jsonl")
    assert result.exit_code == 0, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.count("pass@1") == 1, line
    assert line.startswith("tiny_test: avg@1 1.0000") and "(2 problems)" in line


def test_the_summary_names_pass_at_n_when_n_is_above_1():
    from aggbench.cli.evaluate import _summary_line

    m = {"benchmark": "b", "n_samples": 2, "avg@2": 0.5, "ci_low": 0.0, "ci_high": 1.0, "pass@1": 0.5,
         "pass@2": 0.75, "maj@2": 0.5, "n_problems": 2}  # fmt: skip
    assert ", pass@1 0.5000, pass@2 0.7500, maj@2 0.5000 (2 problems)" in _summary_line(m)
