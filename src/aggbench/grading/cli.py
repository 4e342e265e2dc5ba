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

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click

# The progress bar is shown by default above this many lines.
_PROGRESS_ABOVE = 256
# Code: the pool's hard deadline for one response is this much beyond its tests' own timeouts.
_CODE_SLACK_S = 10.0


class InputError(click.ClickException):
    """A malformed input line: the message names the file, the line and the field."""

    def __init__(self, path: Path, line: int, field: str | None, message: str) -> None:
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{path}:{line}:{what} {message}")


def _read(path: Path, task: str) -> list[tuple[int, dict[str, Any]]]:
    rows = []
    with path.open(encoding="utf-8") as handle:
        for lineno, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InputError(
                    path, lineno, None, f"invalid JSON ({exc.msg} at column {exc.colno})"
                ) from None
            if not isinstance(row, dict):
                raise InputError(path, lineno, None, f"expected a JSON object, got {type(row).__name__}")
            _check(path, lineno, row, task)
            rows.append((lineno, row))
    return rows


def _check(path: Path, line: int, row: dict[str, Any], task: str) -> None:
    needed = ("response", "answer") if task == "math" else ("response", "tests")
    for field in needed:
        if field not in row:
            raise InputError(
                path, line, field, f"missing (a {task} line needs {' and '.join(map(repr, needed))})"
            )
    if not isinstance(row["response"], str):
        raise InputError(path, line, "response", f"expected a string, got {type(row['response']).__name__}")
    if task == "math":
        answer = row["answer"]
        ok = isinstance(answer, str | int | float) and not isinstance(answer, bool)
        if isinstance(answer, list):
            ok = bool(answer) and all(
                isinstance(a, str | int | float) and not isinstance(a, bool) for a in answer
            )
        if not ok:
            raise InputError(
                path,
                line,
                "answer",
                f"expected a string, a number or a non-empty list of them, got {answer!r:.80}",
            )
        if row.get("grading") is not None and not isinstance(row["grading"], dict):
            raise InputError(
                path, line, "grading", f"expected an object, got {type(row['grading']).__name__}"
            )
        try:
            _math_options(row)
        except ValueError as exc:
            raise InputError(path, line, "tolerance", str(exc)) from None
    else:
        try:
            tests = _tests(row)
        except json.JSONDecodeError as exc:
            raise InputError(path, line, "tests", f"a string that is not JSON ({exc.msg})") from None
        if not isinstance(tests, list) or not tests or not all(isinstance(t, dict) for t in tests):
            raise InputError(
                path, line, "tests", "expected a non-empty list of test objects {input, output, testtype}"
            )
        for key in ("func_name", "starter_code"):
            if row.get(key) is not None and not isinstance(row[key], str):
                raise InputError(path, line, key, "expected a string or null")
        if any(t.get("testtype") == "functional" for t in tests) and not (
            row.get("func_name") or row.get("starter_code")
        ):
            raise InputError(
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


def _gold(answer: Any) -> str | list[str]:
    return [str(a) for a in answer] if isinstance(answer, list) else str(answer)


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
@click.option(
    "--input",
    "input_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    required=True,
    help="JSONL of generations.",
)
@click.option(
    "--output",
    "output_path",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="JSONL to write.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Worker processes [default: usable CPUs, at most 8].",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="math: hard deadline per response [10 s]; code: per-test timeout passed to grade_code [6 s].",
)
@click.option(
    "--progress/--no-progress",
    default=None,
    help="Progress bar on stderr [default: when the input has over 256 lines].",
)
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

    from aggbench.grading.pool import GradingPool

    rows = _read(input_path, task)
    show = progress if progress is not None else len(rows) > _PROGRESS_ABOVE
    if task == "math":
        from aggbench.grading.math import grade_math_batch

        pool = GradingPool(workers=workers, timeout_s=timeout_s or 10.0)
    else:
        per_test = timeout_s or 6.0
        # Workers import aggbench.grading.code on their first task (by name, below); nothing to preload.
        pool = GradingPool(workers=workers, timeout_s=per_test + _CODE_SLACK_S, preload=())
    output_path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{output_path.name}.", suffix=".tmp", dir=output_path.parent)
    tmp = Path(tmp_name)
    n_correct = 0
    try:
        with (
            pool,
            os.fdopen(fd, "w", encoding="utf-8") as out,
            tqdm(total=len(rows), disable=not show, desc=f"grade {task}", unit="resp") as bar,
        ):
            batch = [row for _line, row in rows]
            if task == "math":
                options = [_math_options(r) for r in batch]
                results = grade_math_batch(
                    [r["response"] for r in batch],
                    [_gold(r["answer"]) for r in batch],
                    pool=pool,
                    tolerances=[o.get("tolerance") for o in options],
                    units=[o.get("unit") for o in options],
                    progress=bar.update,
                )
            else:
                items = [
                    {
                        "response": r["response"],
                        "tests": _tests(r),
                        "func_name": r.get("func_name"),
                        "starter_code": r.get("starter_code"),
                        "timeout_s": per_test,
                    }
                    for r in batch
                ]
                deadlines = [per_test * (len(item["tests"]) + 1) + _CODE_SLACK_S for item in items]
                # by name: the worker imports aggbench.grading.code, this process never does
                results = pool.map(
                    "aggbench.grading.code:grade_code_item", items, timeouts=deadlines, progress=bar.update
                )
            for row, result in zip(batch, results, strict=True):
                verdict = _verdict_dict(result)
                n_correct += verdict["correct"]
                out.write(json.dumps({**row, **verdict}, ensure_ascii=False) + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, output_path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if rows:
        click.echo(
            f"graded {len(rows)} lines -> {output_path} ({n_correct / len(rows):.1%} correct)", err=True
        )
