"""``aggbench grade``: grade a JSONL file of generations (math or code) in worker processes.

Each input line carries ``response`` and, for ``--task math``, ``answer`` (a string, a number or a
list of acceptable strings; optional ``grading`` dict with OlympiadBench ``error``/``unit``, or
top-level ``tolerance``/``unit``), or, for ``--task code``, ``tests`` (a list of
``{input, output, testtype}`` dicts, or that list as a JSON string) and, for functional tests,
``func_name`` or ``starter_code``; code is graded by :func:`aggbench.grading.code.grade_code`.
Each output line is the input line, unchanged, plus ``correct``, ``extracted`` and ``reason``.
Every line is checked before any grading starts (:mod:`.rows`, the checks ``aggbench score`` runs
too; an input without a line is an error), and the output is written to a temporary file renamed
into place at the end, so a bad line or a crash never leaves a half-written OUT.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from aggbench.cli.common import click_errors, in_file_option, out_file_option, timeout_option, workers_option
from aggbench.data.jsonl import DataError, iter_jsonl
from aggbench.grading.rows import check_row, decode_tests, math_options

# The progress bar is shown by default above this many lines.
_PROGRESS_ABOVE = 256


def _read(path: Path, task: str) -> list[dict[str, Any]]:
    """Every line of ``path``, checked; a bad line raises DataError naming file, line and field,
    and a file without a line to grade raises it too (the output is then left as it was)."""
    rows = []
    for lineno, row in iter_jsonl(path):
        check_row(path, lineno, row, task)
        rows.append(row)
    if not rows:
        raise DataError(path, None, None, "no samples in the file (nothing to grade)")
    return rows


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

    from aggbench.files import atomic_writer
    from aggbench.grading.batch import grade_code_rows, grade_math_rows, grading_pool

    rows = _read(input_path, task)
    show = progress if progress is not None else len(rows) > _PROGRESS_ABOVE
    pool, timeout = grading_pool(task, workers=workers, timeout_s=timeout_s)
    n_correct = 0
    with atomic_writer(output_path) as out:  # renamed into place only once every line is written
        with pool, tqdm(total=len(rows), disable=not show, desc=f"grade {task}", unit="resp") as bar:
            if task == "math":
                options = [math_options(r) for r in rows]
                results = grade_math_rows(rows, pool, options, progress=bar.update)
            else:
                coded = [{**r, "tests": decode_tests(r)} for r in rows]
                results = grade_code_rows(coded, pool, timeout, progress=bar.update)
        for row, result in zip(rows, results, strict=True):
            verdict = _verdict_dict(result)
            n_correct += verdict["correct"]
            out.write(json.dumps({**row, **verdict}, ensure_ascii=False) + "\n")
    click.echo(f"graded {len(rows)} lines -> {output_path} ({n_correct / len(rows):.1%} correct)", err=True)
