"""``aggbench grade``: grade a JSONL file of generations (math or code) in worker processes.

Each input line carries ``response`` and, for ``--task math``, ``answer`` (a string, a number or a
list of acceptable strings; optional ``grading`` dict with OlympiadBench ``error``/``unit``, or
top-level ``tolerance``/``unit``), or, for ``--task code``, ``tests`` (a list of
``{input, output, testtype}`` dicts, or that list as a JSON string) and, for functional tests,
``func_name`` or ``starter_code``; code is graded by :func:`aggbench.grading.code.grade_code`.
Each output line is the input line, unchanged, plus ``correct``, ``extracted`` and ``reason``. Every line is checked before any grading starts, and the output is written to a
temporary file renamed into place at the end, so a bad line or a crash never leaves a half-written
OUT.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from aggbench.cli_common import click_errors, in_file_option, out_file_option, timeout_option, workers_option
from aggbench.data.jsonl import DataError, iter_jsonl

# The progress bar is shown by default above this many lines.
_PROGRESS_ABOVE = 256


def _read(path: Path, task: str) -> list[dict[str, Any]]:
    """Every line of ``path``, checked; a bad line raises DataError naming file, line and field."""
    rows = []
    for lineno, row in iter_jsonl(path):
        _check(path, lineno, row, task)
        rows.append(row)
    return rows


def _check(path: Path, line: int, row: dict[str, Any], task: str) -> None:
    needed = ("response", "answer") if task == "math" else ("response", "tests")
    for field in needed:
        if field not in row:
            raise DataError(
                path, line, field, f"missing (a {task} line needs {' and '.join(map(repr, needed))})"
            )
    if not isinstance(row["response"], str):
        raise DataError(path, line, "response", f"expected a string, got {type(row['response']).__name__}")
    if task == "math":
        answer = row["answer"]
        ok = isinstance(answer, str | int | float) and not isinstance(answer, bool)
        if isinstance(answer, list):
            ok = bool(answer) and all(
                isinstance(a, str | int | float) and not isinstance(a, bool) for a in answer
            )
        if not ok:
            raise DataError(
                path,
                line,
                "answer",
                f"expected a string, a number or a non-empty list of them, got {answer!r:.80}",
            )
        if row.get("grading") is not None and not isinstance(row["grading"], dict):
            raise DataError(path, line, "grading", f"expected an object, got {type(row['grading']).__name__}")
        try:
            _math_options(row)
        except ValueError as exc:
            raise DataError(path, line, "tolerance", str(exc)) from None
    else:
        try:
            tests = _tests(row)
        except json.JSONDecodeError as exc:
            raise DataError(path, line, "tests", f"a string that is not JSON ({exc.msg})") from None
        if not isinstance(tests, list) or not tests or not all(isinstance(t, dict) for t in tests):
            raise DataError(
                path, line, "tests", "expected a non-empty list of test objects {input, output, testtype}"
            )
        for key in ("func_name", "starter_code"):
            if row.get(key) is not None and not isinstance(row[key], str):
                raise DataError(path, line, key, "expected a string or null")
        if any(t.get("testtype") == "functional" for t in tests) and not (
            row.get("func_name") or row.get("starter_code")
        ):
            raise DataError(
                path, line, "func_name", "functional tests need 'func_name' (or 'starter_code' with a def)"
            )


def _tests(row: dict[str, Any]) -> Any:
    tests = row["tests"]
    return json.loads(tests) if isinstance(tests, str) else tests  # LiveCodeBench keeps a JSON string


def _math_options(row: dict[str, Any]) -> dict[str, Any]:
    from aggbench.grading.math import grading_options

    options = dict(row.get("grading") or {})
    for key in ("tolerance", "unit"):
        if row.get(key) is not None:
            options[key] = row[key]
    return grading_options(options)


def _verdict_dict(result: Any) -> dict[str, Any]:
    if hasattr(result, "to_dict"):
        return result.to_dict()
    return {
        "correct": bool(result.get("correct", False)),
        "extracted": result.get("extracted"),
        "reason": str(result.get("reason", "")),
    }


@click.command(name="grade")
@click.option("--task", type=click.Choice(["math", "code"]), required=True, help="Which grader to use.")
@in_file_option("--input", "input_path", help="JSONL of generations.")
@out_file_option("--output", "output_path", help="JSONL to write.")
@workers_option
@timeout_option
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar on stderr [default: when the input has over 256 lines].",
)
@click_errors
def command(
    task: str,
    input_path: Path,
    output_path: Path,
    workers: int | None,
    timeout_s: float | None,
    progress: bool | None,
) -> None:
    """Grade generations (math or code) from a JSONL file."""
    from tqdm import tqdm

    from aggbench.atomic import atomic_writer
    from aggbench.grading.batch import grade_code_rows, grade_math_rows, grading_pool

    rows = _read(input_path, task)
    show = progress if progress is not None else len(rows) > _PROGRESS_ABOVE
    pool, timeout = grading_pool(task, workers=workers, timeout_s=timeout_s)
    n_correct = 0
    with atomic_writer(output_path) as out:  # renamed into place only once every line is written
        with pool, tqdm(total=len(rows), disable=not show, desc=f"grade {task}", unit="resp") as bar:
            if task == "math":
                options = [_math_options(r) for r in rows]
                results = grade_math_rows(rows, pool, options, progress=bar.update)
            else:
                coded = [{**r, "tests": _tests(r)} for r in rows]
                results = grade_code_rows(coded, pool, timeout, progress=bar.update)
        for row, result in zip(rows, results, strict=True):
            verdict = _verdict_dict(result)
            n_correct += verdict["correct"]
            out.write(json.dumps({**row, **verdict}, ensure_ascii=False) + "\n")
    if rows:
        click.echo(
            f"graded {len(rows)} lines -> {output_path} ({n_correct / len(rows):.1%} correct)", err=True
        )
