"""2 ranks (torch.distributed, gloo, CPU) give the same raw gradients as 1 rank, for every rule."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aggbench.aggregation import builtin_instances
from aggbench.train.batching import pack
from aggbench.train.scoring import ScoredBatch
from aggbench.train.update import LossSettings, MiniBatch, accumulate_gradients, minibatch_weights
from helpers.dp_fixture import fixed_batch, tiny_model

HERE = Path(__file__).parent


def _single_process_grads() -> dict[str, list[torch.Tensor]]:
    model = tiny_model()
    roll, adv, old = fixed_batch()
    batch = pack(roll, pad_id=0)
    gids = torch.tensor(roll.group)
    settings = LossSettings(clip_low=0.2, clip_high=0.28, dual_clip=3.0, micro_batch_size=16)
    out = {}
    rows = torch.arange(len(roll))
    for name, inst in builtin_instances().items():
        eff, aux_w = minibatch_weights(inst, batch.response_mask, adv, gids, "token-mean")
        model.zero_grad(set_to_none=True)
        scored = ScoredBatch(batch, batch.response_mask, adv, gids)
        accumulate_gradients(model, scored, MiniBatch.whole(rows, eff, aux_w), settings, old=old)
        out[name] = [p.grad.detach().clone() for p in model.parameters()]
    return out


def _torchrun(tmp_path: Path, *extra: str) -> dict[str, list[torch.Tensor]]:
    out = tmp_path / f"grads{'-'.join(extra)}.pt"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), env_path()]),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(HERE / "dp_worker.py"),
        str(out),
        *extra,
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return torch.load(out)


def env_path() -> str:
    return os.environ.get("PYTHONPATH", "")


@pytest.fixture(scope="module")
def single():
    return _single_process_grads()


@pytest.mark.slow
def test_two_ranks_equal_one_rank_for_every_rule(tmp_path, single):
    dp = _torchrun(tmp_path)
    assert set(dp) == set(single) == set(builtin_instances())
    for name in single:
        for a, b in zip(dp[name], single[name], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.slow
def test_mean_allreduce_slip_is_caught(tmp_path, single):
    dp = _torchrun(tmp_path, "--mean")
    for name in single:
        diffs = [float((a - b).abs().max()) for a, b in zip(dp[name], single[name], strict=True)]
        assert max(diffs) > 1e-6, f"{name}: averaging over ranks should halve the gradient"
