"""Tensor helpers for writing a rule: masks from lengths, per-group sums and sizes (with the
``include_zero_groups`` convention), per-sequence -> per-token broadcast, safe reciprocals."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aggbench.aggregation.contract import AggregationInputError


def mask_from_lengths(lengths: Tensor | list[int], max_len: int | None = None) -> Tensor:
    """lengths [B] (non-negative ints) -> right-padded bool mask [B, max_len or max(lengths)]."""
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise AggregationInputError(f"lengths must be 1-D [B]; got shape {tuple(lengths.shape)}")
    if lengths.numel() == 0:
        raise AggregationInputError("empty batch: lengths is empty")
    if (lengths < 0).any():
        i = int((lengths < 0).nonzero()[0])
        raise AggregationInputError(f"lengths[{i}] = {int(lengths[i])} is negative; a length counts tokens")
    t = int(lengths.max()) if max_len is None else max_len
    if int(lengths.max()) > t:
        raise AggregationInputError(f"lengths has a value {int(lengths.max())} above max_len={t}")
    return torch.arange(t)[None, :] < lengths[:, None]


# ----------------------------------------------------------------------------- group helpers


@dataclass(frozen=True)
class Groups:
    """Per-sequence group structure of a mini-batch (all tensors on the advantages' device).

    index: [B] long, group of each sequence in 0..n-1; size: [n] sequences per group;
    counted: [B] bool, whether the sequence's group counts in denominators;
    n_counted: number of counted groups (>= 1 to keep divisions finite).
    """

    index: Tensor
    n: int
    size: Tensor
    counted: Tensor
    n_counted: int

    def sum(self, values: Tensor) -> Tensor:
        """values [B] -> per-group sums [n]."""
        return torch.zeros(self.n, dtype=values.dtype, device=values.device).index_add_(0, self.index, values)

    def gather(self, per_group: Tensor) -> Tensor:
        """per_group [n] -> per-sequence [B]."""
        return per_group[self.index]


def groups_of(advantages: Tensor, group_ids: Tensor, include_zero_groups: bool) -> Groups:
    """Group structure; a zero group has every advantage exactly 0 (no learning signal)."""
    _, index = torch.unique(group_ids, return_inverse=True)
    index = index.to(advantages.device)
    n = int(index.max()) + 1
    ones = torch.ones_like(advantages)
    size = torch.zeros(n, dtype=advantages.dtype, device=advantages.device).index_add_(0, index, ones)
    nonzero = torch.zeros(n, dtype=advantages.dtype, device=advantages.device).index_add_(
        0, index, (advantages != 0).to(advantages.dtype)
    )
    group_counted = torch.ones(n, dtype=torch.bool, device=advantages.device)
    if not include_zero_groups:
        group_counted = nonzero > 0
    return Groups(
        index=index,
        n=n,
        size=size,
        counted=group_counted[index],
        n_counted=max(int(group_counted.sum()), 1),
    )


def broadcast(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """per_sequence [B] effective advantage of each token of a sequence -> [B, T], zero where mask is 0."""
    return per_sequence[:, None] * mask


def safe_reciprocal(x: Tensor) -> Tensor:
    """1/x where x > 0, else 0 (an empty set or empty response receives no weight)."""
    return torch.where(x > 0, 1.0 / x.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(x))
