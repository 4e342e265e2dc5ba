"""Rollout engines behind one protocol: transformers `generate` (CPU/GPU) and vLLM (GPU).

The training loop only sees ``RolloutEngine``: it hands over tokenised prompts and gets token ids
back, so the vLLM engine plugs in without touching the loop. ``base`` holds the protocol and imports
nothing; each engine module imports ``base``; the factory lives here, above both.
"""

from __future__ import annotations

from typing import Any

from aggbench.rollout.base import RolloutEngine, Rollouts

__all__ = ["RolloutEngine", "Rollouts", "make_engine"]


def make_engine(kind: str, model: Any, tokenizer: Any, **options: Any) -> RolloutEngine:
    """Build a rollout engine by name: ``hf`` (transformers) or ``vllm`` (needs the `gpu` extra)."""
    if kind == "hf":
        from aggbench.rollout.hf import HFEngine

        return HFEngine(
            model,
            tokenizer,
            batch_size=options.get("batch_size", 64),
            stop_token_ids=options.get("stop_token_ids"),
        )
    if kind == "vllm":
        from aggbench.rollout.vllm import VLLMEngine

        return VLLMEngine.from_model(model, tokenizer, **options)
    raise ValueError(f"unknown rollout engine {kind!r}; valid: 'hf', 'vllm'")
