"""Verifiable rewards for training: the built-in task's exact match, or the math grader.

The math grader is the same one evaluation uses (``aggbench.grading.math``); it runs in worker
processes with a hard deadline, so a pathological response (``\\boxed{}`` spam, ``10^{10^{10}}``)
is graded wrong instead of stalling the step.
"""

from __future__ import annotations

from typing import Any


class RewardFn:
    """Binary rewards for a batch of responses; ``close()`` stops grading workers."""

    def __init__(self, grader: str, *, workers: int | None = None, timeout_s: float = 10.0) -> None:
        if grader not in ("tiny", "math"):
            raise ValueError(f"unknown grader {grader!r}; valid: 'tiny', 'math'")
        self.grader = grader
        self.timeout_s = timeout_s
        self.workers = workers
        self._pool: Any = None

    def __call__(self, responses: list[str], answers: list[Any]) -> list[float]:
        if self.grader == "tiny":
            from aggbench.tiny.task import task_reward

            return [task_reward(r, str(a)) for r, a in zip(responses, answers, strict=True)]
        from aggbench.grading.math import grade_math_batch
        from aggbench.grading.pool import GradingPool

        if self._pool is None:
            self._pool = GradingPool(workers=self.workers, timeout_s=self.timeout_s)
        verdicts = grade_math_batch(responses, answers, pool=self._pool)
        return [1.0 if v.correct else 0.0 for v in verdicts]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
