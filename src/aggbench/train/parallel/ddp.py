"""DDP: every rank holds the whole model; after a mini-batch's backward passes the gradients are
all-reduced as a SUM (not DDP's mean: a mean would divide the update by the world size). Torch's
DistributedDataParallel wrapper is not used: its bucketed all-reduce averages, and the update needs
nothing from it that one SUM per parameter after the mini-batch does not give."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from aggbench.train.parallel import Ranks


class DDPRanks(Ranks):
    """``distributed.strategy: ddp``: whole models, gradients summed over ranks."""

    strategy: ClassVar[str] = "ddp"

    def finish_backward(
        self, model: torch.nn.Module, batch: Any, owed: int, settings: Any, autocast: Callable
    ) -> None:
        allreduce_grads_sum(model)


def allreduce_grads_sum(model: torch.nn.Module) -> None:
    """Sum every parameter's gradient over ranks (in place; a no-op on one process)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
