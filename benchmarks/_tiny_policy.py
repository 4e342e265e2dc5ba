"""The policy the rollout benchmarks sample from (benchmarks/rollout_engines.py, kv_cache.py): the
built-in tiny model, briefly warm-started so responses end at realistic lengths, loaded in float32,
and test prompts rendered through its chat template as token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def warm_tiny_policy(
    root: str | Path, *, sft_steps: int, n_prompts: int
) -> tuple[Path, Any, Any, list[list[int]]]:
    """-> (model directory under ``root``, tokenizer, model in eval mode, ``n_prompts`` prompts)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aggbench.tiny.model import build_tiny_model, render_prompt, sft_warm_start
    from aggbench.tiny.task import make_task

    path = build_tiny_model(Path(root) / "model")
    sft_warm_start(path, steps=sft_steps, batch_size=32, progress=False)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    _, test = make_task(0, 16, n_prompts)
    prompts = [tok(render_prompt(tok, r["prompt"]), add_special_tokens=False)["input_ids"] for r in test]
    return path, tok, model, prompts
