"""benchmarks/gpu_fsdp_check.py: the FSDP2 + bf16 training path's GPU check, run here on CPU.

On CPU (``--allow-cpu``, gloo) the script's own checks must pass: one process through a one-rank
FSDP group, stopped after step 2 and resumed from the sharded checkpoint, the export loadable and
changed, next to the plain one-process trainer. Its numbers say nothing about a GPU; the GPU run
(marker ``gpu``) is the one whose output goes into the README.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_fsdp_check.py"
SMALL = ["--prompts", "4", "--group", "4", "--max-new-tokens", "16"]


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "fsdp_check.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *SMALL, *extra, "--workdir", str(tmp_path / "w"), "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return proc, (json.loads(out.read_text()) if out.exists() else {})


@pytest.mark.slow
def test_fsdp_check_passes_on_cpu_through_a_one_rank_group(tmp_path):
    proc, result = _run(tmp_path, "--allow-cpu")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    names = [name for name, ok, _ in result["checks"] if ok]
    assert len(names) == len(result["checks"]) == 4, result["checks"]
    assert "PASS  metrics rows 1, 2, 3 once each" in proc.stdout
    # it really went through FSDP: the run holds the sharded (torch.distributed.checkpoint) state
    assert (tmp_path / "w" / "fsdp" / "checkpoints" / "step_3" / "sharded" / ".metadata").exists()
    assert not (tmp_path / "w" / "plain" / "checkpoints" / "step_3" / "sharded").exists()
    assert result["world"] == 1 and result["peak_memory_bytes"] is None  # no CUDA here
    assert [s["step"] for s in result["steps"]] == [1, 2, 3]
    assert result["update_tokens_per_s"] > 0 and result["generate_tokens_per_s"] > 0
    assert set(result["vs_one_process"]) == {
        "max_relative_param_difference",
        "step1_reward_mean",
        "step1_loss",
    }


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fsdp_check_passes_on_a_gpu(tmp_path):  # pragma: no cover - GPU only
    proc, result = _run(tmp_path)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert result["peak_memory_bytes"] > 0
