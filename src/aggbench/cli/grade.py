"""``aggbench grade``: grade a JSONL file of generations with any registered grader.

``--grader NAME`` picks an entry of :mod:`aggbench.graders` (built in: ``math``, the evaluation's
lenient math-verify grader; ``dapo``, the DAPO recipe's string reward; ``code``, the sandboxed
LiveCodeBench-style tests; ``tiny``, the built-in task; ``evalplus``; plus whatever ``--plugin``
modules register). Each input line carries ``response`` and what that grader's records carry: for
the answer graders ``answer`` (a string, a number or a list of acceptable strings; for ``math`` an
optional ``grading`` dict with OlympiadBench ``error``/``unit``, or top-level ``tolerance``/``unit``),
for ``code`` ``tests`` (a list of ``{input, output, testtype}`` dicts, or that list as a JSON string)
and, for functional tests, ``func_name`` or ``starter_code``. Each output line is the input line,
unchanged, plus the grader's verdict: ``correct``, ``extracted`` and ``reason`` (programs add
``n_tests``, ``test_results`` and ``error_kind``). Every line is checked before any grading starts
(:mod:`aggbench.grading.rows`, the checks ``aggbench score`` runs too; an input without a line is an
error), and the output is written to a temporary file renamed into place at the end, so a bad line
or a crash never leaves a half-written OUT. ``--task`` is the old name of ``--grader``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from aggbench.cli.common import click_errors, in_file_option, out_file_option, timeout_option, workers_option
from aggbench.data.jsonl import DataError, iter_jsonl

# The progress bar is shown by default above this many lines.
_PROGRESS_ABOVE = 256


def _read(path: Path, grader: str) -> list[dict[str, Any]]:
    """Every line of ``path``, checked; a bad line raises DataError naming file, line and field,
    and a file without a line to grade raises it too (the output is then left as it was)."""
    from aggbench.grading.rows import check_row

    rows = []
    for lineno, row in iter_jsonl(path):
        check_row(path, lineno, row, grader)
        rows.append(row)
    if not rows:
        raise DataError(path, None, None, "no samples in the file (nothing to grade)")
    return rows


def _grader(name: str | None, task: str | None, plugins: Sequence[str]) -> str:
    """The registered grader the options name (plugins imported first), or a usage error listing
    the valid names."""
    from aggbench.graders import get_grader
    from aggbench.registry import RegistryError, load_plugins

    if name and task and name != task:
        raise click.UsageError(f"--grader {name} and --task {task} disagree: give --grader only")
    name = name or task
    if not name:
        raise click.UsageError("missing option '--grader' (which registered grader to use)")
    try:
        load_plugins(plugins, search_paths=[Path.cwd()])
    except RegistryError as exc:
        raise click.BadParameter(str(exc), param_hint="'--plugin'") from None
    try:
        get_grader(name)
    except RegistryError as exc:
        raise click.BadParameter(str(exc), param_hint="'--grader'") from None
    return name


@click.command(name="grade")
@click.option(
    "--grader",
    "grader_name",
    default=None,
    metavar="NAME",
    help="A registered grader: math, dapo, code, tiny, evalplus, or one a --plugin registers.",
)
@click.option("--task", default=None, hidden=True, help="Old name of --grader.")
@click.option(
    "--plugin",
    "plugins",
    multiple=True,
    metavar="MODULE",
    help="A module or .py file that registers graders (repeatable), imported first.",
)
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
    grader_name: str | None,
    task: str | None,
    plugins: tuple[str, ...],
    input_path: Path,
    output_path: Path,
    workers: int | None,
    timeout_s: float | None,
    progress: bool | None,
) -> None:
    """Grade generations from a JSONL file with a registered grader."""
    from aggbench.evaluation.score import grade_rows
    from aggbench.files import atomic_writer

    grader = _grader(grader_name, task, plugins)
    rows = _read(input_path, grader)
    show = progress if progress is not None else len(rows) > _PROGRESS_ABOVE
    verdicts = grade_rows(grader, rows, workers=workers, timeout_s=timeout_s, progress=show)
    n_correct = 0
    with atomic_writer(output_path) as out:  # renamed into place only once every line is written
        for row, verdict in zip(rows, verdicts, strict=True):
            n_correct += bool(verdict["correct"])
            kept = {k: v for k, v in verdict.items() if k != "layers"}  # sandbox internals
            out.write(json.dumps({**row, **kept}, ensure_ascii=False) + "\n")
    click.echo(f"graded {len(rows)} lines -> {output_path} ({n_correct / len(rows):.1%} correct)", err=True)
