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


class RandomReward:
    """The negative control's reward (``dataset.grader: random``): 1.0 with probability ``p``,
    independent of the response, seeded per prompt group.

    The sampler passes each response's group seed (``draw_seeds``: ``seeds.random_reward`` of the
    cell seed, step, sampling round and the group's place in the step, as ``rollout.seeding:
    prompt`` seeds generation), so a resumed run draws the same ones and, for the step's own
    prompts (round 0), they do not depend on how prompts are split over ranks; a dynamic-sampling
    refill is keyed by its rank's own refill slot, as its generation is. Within a group, responses
    draw in order from one stream.
    """

    draws = True  # the sampler passes draw_seeds

    def __init__(self, p: float) -> None:
        if not 0.0 < p < 1.0:
            raise ValueError(f"random reward: p must be in (0, 1), got {p}")
        self.grader = "random"
        self.p = p

    def __call__(self, responses: list[str], answers: list[Any], *, draw_seeds: list[int]) -> list[float]:
        import random

        if len(draw_seeds) != len(responses):
            raise ValueError(f"draw_seeds: {len(draw_seeds)} seeds for {len(responses)} responses")
        streams: dict[int, random.Random] = {}
        out = []
        for s in draw_seeds:
            rng = streams.setdefault(s, random.Random(s))
            out.append(1.0 if rng.random() < self.p else 0.0)
        return out

    def close(self) -> None:
        pass


def make_reward(dataset: Any) -> RewardFn | RandomReward:
    """The training reward of a cell's ``dataset`` config (grader, random_p)."""
    if dataset.grader == "random":
        return RandomReward(dataset.random_p)
    return RewardFn(dataset.grader)
