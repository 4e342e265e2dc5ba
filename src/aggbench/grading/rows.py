"""The per-row checks of rows to grade, shared by ``aggbench grade`` (:mod:`.cli`) and
``aggbench score`` (:mod:`aggbench.evaluation.score`): a row that would reach a grader with a wrong type
fails here, naming ``file:line: field 'x'`` and what is expected, instead of being graded as wrong
(or, worse, right) and turned into an accuracy number.

A math row holds ``response`` and ``answer`` (a string, a number or a non-empty list of them),
optionally ``grading`` (an object: OlympiadBench ``error``/``tolerance``, ``unit``) or top-level
``tolerance``/``unit``. A code row holds ``response`` and ``tests``: a non-empty list (or that list
as a JSON string, as LiveCodeBench keeps it) of ``{input, output, testtype}`` objects with string
``input``/``output`` and testtype ``stdin`` (the default) or ``functional``, all of one type;
functional tests need ``func_name`` or ``starter_code``. A tiny row's ``answer`` is one string or
number.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aggbench.data.jsonl import DataError
from aggbench.graders import get_grader

TESTTYPES = ("stdin", "functional")


def check_row(path: str | Path, line: int, row: Mapping[str, Any], task: str) -> None:
    """Raise :class:`DataError` (``path:line: field 'x': why``) unless ``row`` can be graded by the
    ``task`` grader (any registered grader: its sample fields, then its own row check)."""
    spec = get_grader(task)
    needed = spec.sample_fields()[1:]  # a row to grade needs no id (aggbench grade numbers them)
    for field in needed:
        if field not in row:
            raise DataError(
                path, line, field, f"missing (a {task} line needs {' and '.join(map(repr, needed))})"
            )
    if not isinstance(row["response"], str):
        raise DataError(path, line, "response", f"expected a string, got {_kind(row['response'])}")
    check = spec.row_check()
    if check is not None:
        check(path, line, row)


def check_tiny_row(path: str | Path, line: int, row: Mapping[str, Any]) -> None:
    if not _scalar(row["answer"]):
        raise DataError(path, line, "answer", f"expected a string or a number, got {row['answer']!r:.80}")


def _scalar(value: Any) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def check_math_row(path: str | Path, line: int, row: Mapping[str, Any]) -> None:
    answer = row["answer"]
    ok = _scalar(answer) or (isinstance(answer, list) and bool(answer) and all(map(_scalar, answer)))
    if not ok:
        raise DataError(
            path,
            line,
            "answer",
            f"expected a string, a number or a non-empty list of them, got {answer!r:.80}",
        )
    if row.get("grading") is not None and not isinstance(row["grading"], dict):
        raise DataError(path, line, "grading", f"expected an object, got {_kind(row['grading'])}")
    try:
        math_options(row)
    except ValueError as exc:
        raise DataError(path, line, "tolerance", str(exc)) from None


def math_options(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row's grading options (``tolerance``, ``unit``): its ``grading`` object, with top-level
    ``tolerance``/``unit`` on top. A tolerance that is not a number raises ValueError."""
    from aggbench.grading.math import grading_options

    options = dict(row.get("grading") or {})
    for key in ("tolerance", "unit"):
        if row.get(key) is not None:
            options[key] = row[key]
    return grading_options(options)


def decode_tests(row: Mapping[str, Any]) -> Any:
    """The row's ``tests``, decoded when they are a JSON string (LiveCodeBench keeps them so)."""
    tests = row["tests"]
    return json.loads(tests) if isinstance(tests, str) else tests


def check_code_row(path: str | Path, line: int, row: Mapping[str, Any]) -> None:
    try:
        tests = decode_tests(row)
    except json.JSONDecodeError as exc:
        raise DataError(path, line, "tests", f"a string that is not JSON ({exc.msg})") from None
    if not isinstance(tests, list) or not tests:
        raise DataError(
            path, line, "tests", "expected a non-empty list of test objects {input, output, testtype}"
        )
    for i, test in enumerate(tests):
        check_test(path, line, f"tests[{i}]", test)
    kinds = sorted({t.get("testtype", "stdin") for t in tests})
    if len(kinds) > 1:
        mixed = " and ".join(map(repr, kinds))
        raise DataError(
            path,
            line,
            "tests",
            f"mixes testtypes {mixed}; a problem's tests are all 'stdin' or all 'functional'",
        )
    for key in ("func_name", "starter_code"):
        if row.get(key) is not None and not isinstance(row[key], str):
            raise DataError(path, line, key, "expected a string or null")
    if kinds == ["functional"] and not (row.get("func_name") or row.get("starter_code")):
        raise DataError(
            path, line, "func_name", "functional tests need 'func_name' (or 'starter_code' with a def)"
        )


def check_test(path: str | Path, line: int, field: str, test: Any) -> None:
    """One code test: an object with string ``input`` and ``output`` and a known ``testtype``."""
    if not isinstance(test, dict):
        raise DataError(
            path, line, field, f"expected an object {{input, output, testtype}}, got {_kind(test)}"
        )
    for key in ("input", "output"):
        if key not in test:
            raise DataError(path, line, field, f"missing {key!r} (a test is {{input, output, testtype}})")
        if not isinstance(test[key], str):
            raise DataError(path, line, field, f"{key!r} must be a string, got {_kind(test[key])}")
    testtype = test.get("testtype", "stdin")
    if testtype not in TESTTYPES:
        raise DataError(
            path, line, field, f"unknown testtype {testtype!r}; use 'stdin' or 'functional' (default 'stdin')"
        )
