"""A stand-in ``vllm`` module for the CPU tests of aggbench's vLLM paths (vLLM itself needs a GPU)."""

from __future__ import annotations

import sys
import types


def install(monkeypatch, llm_cls: type) -> type:
    """Put a ``vllm`` module whose ``LLM`` is ``llm_cls`` (and ``SamplingParams`` a plain dict) in
    ``sys.modules`` for one test, outside torchrun; empties ``llm_cls.made``."""
    mod = types.ModuleType("vllm")
    mod.LLM = llm_cls
    mod.SamplingParams = dict
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    llm_cls.made = []
    return llm_cls
