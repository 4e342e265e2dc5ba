"""`aggbench grade`: the math grader end to end, bad input lines, atomic output, code, any registered grader by name."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from aggbench.graders import GRADERS
from helpers.jsonl import read_jsonl, write_jsonl

MATH_LINES = [
    {"id": "a", "response": "so the answer is \\boxed{025}", "answer": "25"},
    {"id": "b", "response": "Step 1.\nAnswer: $\\frac12$", "answer": ["$0.5$."]},
    {"id": "c", "response": "I do not know", "answer": 3},
    {"id": "d", "response": "\\boxed{4.25}", "answer": "4.2", "grading": {"error": "1e-1", "unit": "%"}},
    {"id": "e", "response": "\\boxed{166 cm^2}", "answer": "166", "unit": "$cm^2$"},
    {"id": "f", "response": "\\boxed{7}", "answer": "8"},
]


def test_math_lines_are_graded_in_order_and_keep_their_fields(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", MATH_LINES)
    out = tmp_path / "eval" / "out.jsonl"
    result = CliRunner().invoke(
        main, ["grade", "--grader", "math", "--input", str(src), "--output", str(out), "--workers", "2"]
    )
    assert result.exit_code == 0, result.output
    rows = read_jsonl(out)
    assert [r["id"] for r in rows] == ["a", "b", "c", "d", "e", "f"]
    assert [r["correct"] for r in rows] == [True, True, False, True, True, False]
    assert [r["extracted"] for r in rows] == ["025", "\\frac12", None, "4.25", "166 cm^2", "7"]
    assert rows[2]["reason"] == "no_answer"
    assert rows[3]["reason"] == "within_tolerance"
    for row, src_row in zip(rows, MATH_LINES, strict=True):
        assert {k: row[k] for k in src_row} == src_row  # the input line, unchanged
    assert "graded 6 lines" in result.output
    assert [p.name for p in out.parent.iterdir()] == ["out.jsonl"]  # no temporary file left


@pytest.mark.parametrize(
    ("bad_line", "field", "says"),
    [
        ({"response": "\\boxed{1}"}, "answer", "missing"),
        ({"answer": "1"}, "response", "missing"),
        ({"response": "\\boxed{1}", "answer": None}, "answer", "expected a string"),
        ({"response": 5, "answer": "1"}, "response", "expected a string"),
        ({"response": "x", "answer": "1", "grading": {"error": "about 0.1"}}, "tolerance", "number"),
        ("{not json", None, "invalid JSON"),
    ],
)
def test_a_bad_line_names_file_line_and_field_and_writes_nothing(tmp_path, bad_line, field, says):
    src = write_jsonl(tmp_path / "in.jsonl", [MATH_LINES[0], MATH_LINES[1], bad_line, MATH_LINES[2]])
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        main, ["grade", "--grader", "math", "--input", str(src), "--output", str(out)]
    )
    assert result.exit_code != 0
    assert f"{src}:3:" in result.output
    if field:
        assert f"field '{field}'" in result.output
    assert says in result.output
    assert list(tmp_path.iterdir()) == [src]  # neither OUT nor a temporary file


def test_an_existing_output_survives_a_failed_run(tmp_path):
    out = write_jsonl(tmp_path / "out.jsonl", ['{"old": true}'])
    src = write_jsonl(tmp_path / "in.jsonl", [MATH_LINES[0], {"response": "x"}])
    result = CliRunner().invoke(
        main, ["grade", "--grader", "math", "--input", str(src), "--output", str(out)]
    )
    assert result.exit_code != 0
    assert read_jsonl(out) == [{"old": True}]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"response": "print(1)", "answer": "1"}, "field 'tests': missing"),
        ({"response": "print(1)", "tests": []}, "field 'tests': expected a non-empty list"),
        ({"response": "print(1)", "tests": "[{"}, "field 'tests': a string that is not JSON"),
        (
            {"response": "x", "tests": [{"input": "1", "output": "1", "testtype": "functional"}]},
            "field 'func_name': functional tests need",
        ),
    ],
)
def test_bad_code_lines(tmp_path, line, message):
    src = write_jsonl(tmp_path / "in.jsonl", [line])
    result = CliRunner().invoke(
        main, ["grade", "--grader", "code", "--input", str(src), "--output", str(tmp_path / "o.jsonl")]
    )
    assert result.exit_code != 0
    assert f"{src}:1: {message}" in result.output


@pytest.mark.skipif(
    importlib.util.find_spec("aggbench.grading.code") is None, reason="aggbench.grading.code not written yet"
)
def test_code_branch_grades_with_grade_code(tmp_path):
    tests = [{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]
    rows = [
        {"response": "```python\na, b = map(int, input().split())\nprint(a + b)\n```", "tests": tests},
        {"response": "```python\nprint(0)\n```", "tests": json.dumps(tests)},  # LiveCodeBench: a JSON string
    ]
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(
        main, ["grade", "--grader", "code", "--input", str(src), "--output", str(out), "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    graded = read_jsonl(out)
    assert [r["correct"] for r in graded] == [True, False]
    assert all(isinstance(r["reason"], str) for r in graded)
    assert [r["tests"] for r in graded] == [r["tests"] for r in rows]  # input fields unchanged


def test_the_installed_command_runs_in_a_subprocess(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", MATH_LINES[:2])
    out = tmp_path / "out.jsonl"
    exe = Path(sys.executable).with_name("aggbench")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "aggbench.cli"]
    proc = subprocess.run(
        [*cmd, "grade", "--grader", "math", "--input", str(src), "--output", str(out), "--progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert [r["correct"] for r in read_jsonl(out)] == [True, True]
    assert "grade math" in proc.stderr  # the progress bar, on stderr
    assert proc.stdout == ""


def _grade(tmp_path, lines, *args):
    src = write_jsonl(tmp_path / "in.jsonl", lines)
    out = tmp_path / "out.jsonl"
    result = CliRunner().invoke(main, ["grade", *args, "--input", str(src), "--output", str(out)])
    return result, out


def test_grader_dapo_is_the_recipe_reward_and_differs_from_math(tmp_path):
    lines = [
        {"id": "a", "response": "so the answer is \\boxed{025}", "answer": "25"},  # math: 025 == 25
        {"id": "b", "response": "Work.\nAnswer: 25 degrees", "answer": "25"},
        {"id": "c", "response": "the total is 25", "answer": "25"},  # no line, no box
    ]
    result, out = _grade(tmp_path, lines, "--grader", "dapo")
    assert result.exit_code == 0, result.output
    graded = read_jsonl(out)
    assert [r["correct"] for r in graded] == [False, True, False]
    assert [r["reason"] for r in graded] == ["box_mismatch", "answer_line_match", "no_answer"]
    assert "graded 3 lines" in result.output and "33.3% correct" in result.output


def test_grader_tiny_and_the_old_task_spelling(tmp_path):
    lines = [{"response": "\\boxed{7}", "answer": "7"}, {"response": "\\boxed{8}", "answer": 7}]
    result, out = _grade(tmp_path, lines, "--grader", "tiny")
    assert result.exit_code == 0, result.output
    assert [r["correct"] for r in read_jsonl(out)] == [True, False]
    result, out = _grade(tmp_path, lines, "--task", "tiny")  # --task: the old name, same grader
    assert result.exit_code == 0, result.output
    assert [r["correct"] for r in read_jsonl(out)] == [True, False]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--grader", "dapoo"], "Did you mean 'dapo'? Valid names: code, dapo, evalplus, math, tiny"),
        (["--grader", "dapo", "--task", "math"], "disagree"),
        ([], "missing option '--grader'"),
    ],
)
def test_a_bad_grader_option_says_what_is_valid(tmp_path, args, says):
    result, out = _grade(tmp_path, MATH_LINES[:1], *args)
    assert result.exit_code == 2 and says in result.output, result.output
    assert not out.exists()


def test_a_plugin_grader_is_graded_by_name(tmp_path, monkeypatch):
    plugin = tmp_path / "exact_plugin_grade_cli.py"
    plugin.write_text(
        "from aggbench.graders import register_grader\n"
        "@register_grader('exact_cli_test', record='answer')\n"
        "def exact(rows, *, workers=None, timeout_s=None, progress=False):\n"
        "    return [{'correct': r['response'].strip() == str(r['answer']), 'extracted': r['response'].strip(),\n"
        "             'reason': 'exact'} for r in rows]\n"
    )
    monkeypatch.chdir(tmp_path)
    lines = [{"response": " 7 ", "answer": "7"}, {"response": "\\boxed{7}", "answer": "7"}]
    result, out = _grade(tmp_path, lines, "--plugin", str(plugin), "--grader", "exact_cli_test")
    try:
        assert result.exit_code == 0, result.output
        assert [(r["correct"], r["reason"]) for r in read_jsonl(out)] == [(True, "exact"), (False, "exact")]
    finally:
        GRADERS.remove("exact_cli_test")  # other tests see the built-ins only


def test_a_multiple_answer_flag_reaches_the_grader_through_the_cli(tmp_path):
    """OlympiadBench's is_multiple_answer (record["grading"]) reaches grade_math through `aggbench
    grade` (and so `score`): with it an extra boxed answer is wrong even for a one-answer gold."""
    flagged = {"is_multiple_answer": True}
    lines = [
        {
            "response": "\\boxed{(1,8,19)}, \\boxed{(2,7,13)}",
            "answer": ["$(1,8,19), (2,7,13)$"],
            "grading": flagged,
        },
        {"response": "\\boxed{2}, \\boxed{3}", "answer": ["$3$"], "grading": flagged},
        {"response": "\\boxed{2}, \\boxed{3}", "answer": ["$3$"]},  # no flag: the last box decides
    ]
    result, out = _grade(tmp_path, lines, "--grader", "math", "--workers", "1")
    assert result.exit_code == 0, result.output
    assert [r["correct"] for r in read_jsonl(out)] == [True, False, True]
