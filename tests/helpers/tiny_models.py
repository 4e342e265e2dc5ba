"""The built-in tiny model for tests: untrained, or briefly warm-started."""

from __future__ import annotations

from pathlib import Path

from aggbench.tiny.model import build_tiny_model, sft_warm_start


def tiny_model_for_tests(
    tmp_dir: str | Path, *, sft_steps: int = 0, seed: int = 0, batch_size: int = 16
) -> Path:
    """A tiny model directory for tests anywhere in the project: untrained (``sft_steps=0``, about a
    second) or briefly warm-started (a few steps of a small batch: seconds)."""
    out = build_tiny_model(Path(tmp_dir) / f"tiny-seed{seed}-sft{sft_steps}", seed=seed)
    if sft_steps:
        sft_warm_start(out, steps=sft_steps, batch_size=batch_size, seed=seed, progress=False)
    return out
