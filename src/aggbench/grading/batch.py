"""Grading rows of samples in a worker pool: the part ``aggbench grade`` (:mod:`.cli`) and scoring
(:mod:`aggbench.evaluation.score`) share.

A math row holds ``response`` and ``answer`` (a string, a number or a list of acceptable ones); a
code row holds ``response``, ``tests`` (a list of ``{input, output, testtype}``) and optionally
``func_name`` / ``starter_code``. Deadlines: math responses get the pool's hard deadline (default
10 s); a code response gets its per-test timeout (default 6 s) times (tests + 1) plus a slack.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aggbench.grading.math import MathVerdict
    from aggbench.grading.pool import GradingPool

DEFAULT_MATH_TIMEOUT_S = 10.0
DEFAULT_CODE_TIMEOUT_S = 6.0  # per test
CODE_SLACK_S = 10.0  # hard deadline of a code response beyond its tests' own timeouts


def grading_pool(task: str, *, workers: int | None, timeout_s: float | None) -> tuple[GradingPool, float]:
    """(pool, timeout) for ``task`` "math" (timeout: the hard deadline per response) or "code"
    (timeout: the per-test timeout; the pool's deadline adds the slack). ``timeout_s`` None: the
    defaults. Code workers preload nothing: they import ``aggbench.grading.code`` on the first task."""
    from aggbench.grading.pool import GradingPool

    if task == "math":
        timeout = timeout_s or DEFAULT_MATH_TIMEOUT_S
        return GradingPool(workers=workers, timeout_s=timeout), timeout
    if task == "code":
        per_test = timeout_s or DEFAULT_CODE_TIMEOUT_S
        return GradingPool(workers=workers, timeout_s=per_test + CODE_SLACK_S, preload=()), per_test
    raise ValueError(f"unknown grading task {task!r}; valid: math, code")


def gold(answer: Any) -> str | list[str]:
    """A row's ``answer`` as the math grader takes it: a string, or a list of acceptable strings."""
    return [str(a) for a in answer] if isinstance(answer, list) else str(answer)


def grade_math_rows(
    rows: Sequence[Mapping[str, Any]],
    pool: GradingPool,
    options: Sequence[Mapping[str, Any]],
    *,
    progress: Callable[[int], Any] | None = None,
) -> list[MathVerdict]:
    """One verdict per math row; ``options[i]``: row i's grading options (``tolerance``, ``unit``,
    ``multiple_answer``) as :func:`aggbench.grading.math.grading_options` returns them."""
    from aggbench.grading.math import grade_math_batch

    return grade_math_batch(
        [r["response"] for r in rows],
        [gold(r["answer"]) for r in rows],
        pool=pool,
        tolerances=[o.get("tolerance") for o in options],
        units=[o.get("unit") for o in options],
        multiple_answers=[o.get("multiple_answer") for o in options],
        progress=progress,
    )


def grade_code_rows(
    rows: Sequence[Mapping[str, Any]],
    pool: GradingPool,
    per_test: float,
    *,
    progress: Callable[[int], Any] | None = None,
) -> list[dict[str, Any]]:
    """One :func:`aggbench.grading.code.grade_code` result dict per code row (``tests`` already a
    list), graded in the pool's workers: this process never imports the code grader."""
    items = [
        {
            "response": r["response"],
            "tests": r["tests"],
            "func_name": r.get("func_name"),
            "starter_code": r.get("starter_code"),
            "timeout_s": per_test,
        }
        for r in rows
    ]
    deadlines = [per_test * (len(r["tests"]) + 1) + CODE_SLACK_S for r in rows]
    return pool.map("aggbench.grading.code:grade_code_item", items, timeouts=deadlines, progress=progress)
