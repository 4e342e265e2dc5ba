"""The rollout protocol and the result container."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class Rollouts:
    """G samples for each of P prompts, flattened prompt-major: sequence i belongs to group i // G.

    prompt_ids / response_ids: token ids per sequence (the response includes its EOS when it
    finished); finished: ended with EOS (False = truncated at max_new_tokens); texts: decoded
    responses (special tokens removed); logprobs: the engine's own sampling log-probs per response
    token where it returns them (vLLM), else None.
    """

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    finished: list[bool]
    texts: list[str]
    group: list[int]
    logprobs: list[list[float]] | None = None

    def __len__(self) -> int:
        return len(self.response_ids)

    def select(self, rows: list[int]) -> Rollouts:
        """The sub-batch of the given sequence indices (order kept)."""
        return Rollouts(
            prompt_ids=[self.prompt_ids[i] for i in rows],
            response_ids=[self.response_ids[i] for i in rows],
            finished=[self.finished[i] for i in rows],
            texts=[self.texts[i] for i in rows],
            group=[self.group[i] for i in rows],
            logprobs=None if self.logprobs is None else [self.logprobs[i] for i in rows],
        )

    @staticmethod
    def concat(parts: list[Rollouts]) -> Rollouts:
        out = Rollouts(
            [], [], [], [], [], logprobs=[] if all(p.logprobs is not None for p in parts) else None
        )
        for p in parts:
            out.prompt_ids += p.prompt_ids
            out.response_ids += p.response_ids
            out.finished += p.finished
            out.texts += p.texts
            out.group += p.group
            if out.logprobs is not None:
                out.logprobs += p.logprobs or []
        return out


class RolloutEngine(Protocol):
    """What the trainer and the evaluator need from a generator."""

    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int | list[int],
        seed: int | list[int] | None,
        top_k: int = 0,
    ) -> Rollouts:
        """Sample ``n`` responses for each tokenised prompt; groups are numbered 0..len(prompts)-1.

        top_k: sample among the k most likely tokens only; 0 (or -1, verl's and vLLM's spelling) is off.

        max_new_tokens: one budget for every prompt, or one per prompt. seed: one int seeds the call
        (its prompts still draw independent samples), a list seeds each prompt (results then do not
        depend on which other prompts share the call), None is unseeded (not bit-reproducible).
        """
        ...

    def sync_weights(self, model: Any) -> None:
        """Make the engine sample from ``model``'s current weights (no-op when it shares them)."""
        ...
