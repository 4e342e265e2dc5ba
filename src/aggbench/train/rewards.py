"""Verifiable rewards for training, from the grader registry (``aggbench.graders``): the built-in
task's exact match, the math grader, or any registered grader with a ``reward``.

The math grader is the same one evaluation uses (``aggbench.grading.math``); it runs in worker
processes with a hard deadline, so a pathological response (``\\boxed{}`` spam, ``10^{10^{10}}``)
is graded wrong instead of stalling the step.
"""

from __future__ import annotations

from typing import Any

from aggbench.graders import get_grader, grader_names


class RewardFn:
    """Binary rewards for a batch of responses; ``close()`` stops grading workers."""

    def __init__(self, grader: str, *, workers: int | None = None, timeout_s: float = 10.0) -> None:
        valid = grader_names(rewards=True)
        if grader not in valid:
            raise ValueError(f"unknown grader {grader!r}; valid: {', '.join(map(repr, valid))}")
        self.grader = grader
        self.entry = get_grader(grader)
        self.timeout_s = timeout_s
        self.workers = workers
        self._pool: Any = None

    def __call__(self, responses: list[str], answers: list[Any]) -> list[float]:
        reward = self.entry.reward_fn()
        if self.entry.pooled and self._pool is None:
            from aggbench.grading.pool import GradingPool

            self._pool = GradingPool(workers=self.workers, timeout_s=self.timeout_s)
        return reward(responses, answers, self._pool)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
