"""Stand-ins for the tests of the trainer's sampling code (``aggbench.train.sampling``): an engine
that answers every prompt with G fixed responses and counts its calls, and the prompt stream in
file order."""

from __future__ import annotations

from aggbench.rollout.base import Rollouts
from aggbench.train.batching import PromptStream


class CountingEngine:
    """Answers every prompt with G fixed responses and counts the generate calls (one per round)."""

    def __init__(self) -> None:
        self.calls = 0

    def generate(self, prompts, *, n, temperature, top_p, max_new_tokens, seed, top_k=0):
        self.calls += 1
        flat = [(g, p) for g, p in enumerate(prompts) for _ in range(n)]
        return Rollouts(
            [p for _, p in flat],
            [[5, 6]] * len(flat),
            [True] * len(flat),
            ["x"] * len(flat),
            [g for g, _ in flat],
        )


class Ordered(PromptStream):
    """The prompt stream with the identity as every epoch's order (the records in file order)."""

    def _perm(self, epoch: int) -> list[int]:
        return list(range(self.n_data))
