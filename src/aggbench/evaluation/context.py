"""The evaluator's context policy: every response fits the model's positions, and what did not fit
is counted.

A prompt of p tokens gets ``min(max_tokens, context - p)`` new tokens (vLLM refuses a request whose
prompt + max_tokens exceeds its ``max_model_len``, and transformers would generate past the
positions the model was trained on). A prompt with no room left (p >= context) is not generated:
its row has an empty response with ``finish_reason: "prompt_too_long"`` (graded wrong), and
generation.json counts both kinds per benchmark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROMPT_TOO_LONG = "prompt_too_long"


def model_context(checkpoint: str | Path) -> int | None:
    """The model's positions (``max_position_embeddings`` of its config), or None if it has none."""
    from transformers import AutoConfig

    value = getattr(AutoConfig.from_pretrained(checkpoint), "max_position_embeddings", None)
    return int(value) if value else None


def response_budgets(prompt_lens: list[int], max_tokens: int, context: int | None) -> list[int]:
    """New tokens each prompt may get: ``max_tokens`` capped by the room left; 0 = does not fit."""
    if context is None:
        return [max_tokens] * len(prompt_lens)
    return [max(0, min(max_tokens, context - p)) for p in prompt_lens]


def summary(budgets: list[int], max_tokens: int, context: int | None) -> dict[str, Any]:
    """generation.json's record of the policy for one benchmark."""
    return {
        "max_context": context,
        "prompts_over_context": sum(b == 0 for b in budgets),
        "responses_capped": sum(0 < b < max_tokens for b in budgets),
    }
