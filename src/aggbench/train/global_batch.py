"""Data parallelism that keeps the aggregation exact.

Each rank holds some whole prompt groups of the optimiser mini-batch. The rule's weights must be
computed on the WHOLE mini-batch, so the ranks all-gather the three things a rule reads (response
lengths, advantages, group ids: a few numbers per sequence, never logits), compute the weights of
the whole mini-batch identically, and each takes its own rows. Every rank's loss is then a plain
token sum with global weights, and gradients are all-reduced with SUM (not the mean DDP uses: a
mean would divide the update by the world size).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from aggbench.aggregation import mask_from_lengths


@dataclass
class GlobalView:
    """The whole mini-batch as every rank sees it after the all-gather.

    mask [N, T_max], advantages [N], group_ids [N] of all ranks in rank order; ``offset`` and
    ``count``: where this rank's rows sit in it.
    """

    mask: Tensor
    advantages: Tensor
    group_ids: Tensor
    offset: int
    count: int

    def row_map(self) -> Tensor:
        """[N] long: position in the global mini-batch -> row in this rank's local batch (-1 elsewhere)."""
        out = torch.full((self.mask.shape[0],), -1, dtype=torch.long)
        out[self.offset : self.offset + self.count] = torch.arange(self.count)
        return out

    def local_in(self, rows: Tensor) -> Tensor:
        """[k] long: the positions inside ``rows`` (global row indices [M]) that this rank holds."""
        return torch.nonzero(self.row_map()[rows] >= 0).flatten()


def world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather_minibatch(lengths: Tensor, advantages: Tensor, group_ids: Tensor) -> GlobalView:
    """All-gather (lengths [n], advantages [n], group ids [n]) of every rank's rows.

    Group ids must be globally unique (e.g. offset by rank); a group must not span ranks.
    """
    rank, size = world()
    local = (lengths.tolist(), advantages.double().tolist(), group_ids.tolist())
    parts: list = [None] * size
    if size > 1:
        dist.all_gather_object(parts, local)
    else:
        parts = [local]
    counts = [len(p[0]) for p in parts]
    all_len = torch.tensor([x for p in parts for x in p[0]], dtype=torch.long)
    all_adv = torch.tensor([x for p in parts for x in p[1]], dtype=advantages.dtype)
    all_gid = torch.tensor([x for p in parts for x in p[2]], dtype=torch.long)
    return GlobalView(
        mask=mask_from_lengths(all_len),
        advantages=all_adv,
        group_ids=all_gid,
        offset=sum(counts[:rank]),
        count=counts[rank],
    )
