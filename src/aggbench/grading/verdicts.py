"""The built-in graders' functions behind ``aggbench.graders``: sample rows -> verdict dicts, and the
training rewards.

A verdict is ``{"correct", "extracted", "reason"}`` (+ for programs: ``n_tests``, ``test_results``,
``error_kind``, ``layers``). math: math-verify in worker processes with a hard deadline; code: the
sandbox, from worker processes; tiny: exact match of the last box; evalplus: HumanEval+/MBPP+
(threads driving sandboxes, ground truth computed once per dataset).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

_CHUNK = 256  # samples per grading call, so the progress bar moves


def grade_tiny(rows: Sequence[Mapping[str, Any]], **_: Any) -> list[dict[str, Any]]:
    from aggbench.tiny.task import extract_boxed, task_reward

    out = []
    for r in rows:
        extracted = extract_boxed(r["response"])
        correct = task_reward(r["response"], str(r["answer"])) > 0
        reason = "exact_match" if correct else ("no_answer" if extracted is None else "mismatch")
        out.append({"correct": correct, "extracted": extracted, "reason": reason})
    return out


def grade_dapo(rows: Sequence[Mapping[str, Any]], **_: Any) -> list[dict[str, Any]]:
    """The DAPO recipe's verdict (:mod:`aggbench.grading.dapo`): string work, no pool."""
    from aggbench.grading.dapo import dapo_verdict, ground_truth

    return [dapo_verdict(str(r["response"]), ground_truth(r["answer"]))._asdict() for r in rows]


def grade_evalplus(
    rows: Sequence[Mapping[str, Any]], *, workers: int | None = None, **_: Any
) -> list[dict[str, Any]]:
    from aggbench.grading.evalplus_grader import grade_rows

    return grade_rows(rows, workers=workers)


def _pooled(
    task: str,
    rows: Sequence[Mapping[str, Any]],
    chunk: Callable[[Sequence[Mapping[str, Any]], Any, float], list[dict[str, Any]]],
    *,
    workers: int | None,
    timeout_s: float | None,
    progress: bool | None,
) -> list[dict[str, Any]]:
    """Grade ``rows`` in chunks through one GradingPool. ``progress``: True shows a bar on stderr,
    None shows it on a terminal only (evaluation inside snakemake logs), False never."""
    from tqdm.auto import tqdm

    from aggbench.grading.batch import grading_pool

    pool, per_test = grading_pool(task, workers=workers, timeout_s=timeout_s)
    out: list[dict[str, Any]] = []
    show = progress is True or (progress is None and sys.stderr.isatty())
    with pool, tqdm(total=len(rows), desc=f"grade {task}", unit="sample", disable=not show) as bar:
        for start in range(0, len(rows), _CHUNK):
            batch = rows[start : start + _CHUNK]
            out.extend(chunk(batch, pool, per_test))
            bar.update(len(batch))
    return out


def grade_math(
    rows: Sequence[Mapping[str, Any]],
    *,
    workers: int | None = None,
    timeout_s: float | None = None,
    progress: bool | None = False,
    ledger: bool = False,
) -> list[dict[str, Any]]:
    """``ledger``: also each row's plain math-verify verdict (``math_verify``, for the grader
    ledger of ``aggbench score``), in the same workers under the same deadline."""
    chunk = _math_chunk_with_plain if ledger else _math_chunk
    return _pooled("math", rows, chunk, workers=workers, timeout_s=timeout_s, progress=progress)


def grade_code(
    rows: Sequence[Mapping[str, Any]],
    *,
    workers: int | None = None,
    timeout_s: float | None = None,
    progress: bool | None = False,
) -> list[dict[str, Any]]:
    return _pooled("code", rows, _code_chunk, workers=workers, timeout_s=timeout_s, progress=progress)


def _math_chunk(rows: Sequence[Mapping[str, Any]], pool: Any, _per_test: float) -> list[dict[str, Any]]:
    from aggbench.grading.batch import grade_math_rows
    from aggbench.grading.rows import math_options

    options = [math_options(r) for r in rows]
    return [v.to_dict() for v in grade_math_rows(rows, pool, options)]


def _math_chunk_with_plain(
    rows: Sequence[Mapping[str, Any]], pool: Any, per_test: float
) -> list[dict[str, Any]]:
    from aggbench.grading.ledger import plain_verdicts

    verdicts = _math_chunk(rows, pool, per_test)
    for v, mv in zip(verdicts, plain_verdicts(rows, pool), strict=True):  # the ledger's, same deadline
        v["math_verify"] = mv
    return verdicts


def _code_chunk(rows: Sequence[Mapping[str, Any]], pool: Any, per_test: float) -> list[dict[str, Any]]:
    from aggbench.grading.batch import grade_code_rows
    from aggbench.grading.rows import decode_tests

    coded = [{**r, "tests": decode_tests(r)} for r in rows]  # a JSON string (LiveCodeBench) -> list
    out = []
    for res in grade_code_rows(coded, pool, per_test):
        tests = res.get("tests") or []
        failed = next((t for t in tests if not t.get("passed")), None)
        kind = failed["error_kind"] if failed else None
        if not res.get("correct") and kind is None:  # no code, or the pool's own failure
            kind = str(res.get("reason", "")).split(":", 1)[0] or "error"
        out.append(
            {
                "correct": bool(res.get("correct")),
                "extracted": res.get("extracted"),
                "reason": str(res.get("reason", "")),
                "n_tests": res.get("n_tests"),
                "test_results": tests,
                "error_kind": kind,
                "layers": res.get("layers", {}),
            }
        )
    return out


# --------------------------------------------------------------------------- training rewards


def tiny_rewards(responses: list[str], answers: list[Any], pool: Any = None) -> list[float]:
    """The built-in task's exact match of the last box (1.0 / 0.0)."""
    from aggbench.tiny.task import task_reward

    return [task_reward(r, str(a)) for r, a in zip(responses, answers, strict=True)]


def dapo_rewards(responses: list[str], answers: list[Any], pool: Any = None) -> list[float]:
    """The DAPO recipe's reward (verl's +1/-1 as 1.0 / 0.0)."""
    from aggbench.grading.dapo import dapo_verdict, ground_truth

    return [float(dapo_verdict(r, ground_truth(a)).correct) for r, a in zip(responses, answers, strict=True)]


def math_rewards(responses: list[str], answers: list[Any], pool: Any) -> list[float]:
    """The evaluation's math grader (math-verify behind the pool's hard deadline): 1.0 / 0.0."""
    from aggbench.grading.math import grade_math_batch

    verdicts = grade_math_batch(responses, answers, pool=pool)
    return [1.0 if v.correct else 0.0 for v in verdicts]
