"""Run under torchrun (gloo, CPU): export an FSDP2-sharded tiny model the way the vLLM sync does.

Usage: torchrun --nproc_per_node 2 vllm_export_worker.py OUT_DIR
Every rank shards ``dp_fixture.tiny_model()`` with ``FSDPRanks.prepare_model`` (the trainer's FSDP2
path), checks that its parameters really are sharded DTensors, and writes what ``export_weights``
gives it (bf16 and uncast) to OUT_DIR/rank{r}.pt for the test to compare with the unsharded export.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from aggbench.rollout.vllm import export_weights
from aggbench.train.parallel.fsdp import FSDPRanks
from helpers.dp_fixture import tiny_model


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=2))
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = FSDPRanks(rank, world, torch.device("cpu"))
    cfg = SimpleNamespace(distributed=SimpleNamespace(activation_checkpointing=False), precision="fp64")
    model = ranks.prepare_model(tiny_model(), cfg, torch.device("cpu"))
    sharded = {n: isinstance(p, DTensor) for n, p in model.named_parameters()}
    local_rows = {n: p.to_local().shape[0] for n, p in model.named_parameters() if isinstance(p, DTensor)}
    result = {
        "sharded": sharded,
        "local_rows": local_rows,
        "bf16": export_weights(model, torch.bfloat16),
        "raw": export_weights(model),
    }
    torch.save(result, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
