"""Group advantage estimators, a small registry of their own.

An estimator maps rewards [B] and group ids [B] (the G samples of one prompt share an id) to
advantages [B]. A group whose rewards are all equal gets advantage 0 for every member, whatever
the estimator (no learning signal), which is what the aggregation rules' ``include_zero_groups``
refers to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from aggbench.registry import Registry

AdvantageFn = Callable[..., Tensor]
ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    def decorator(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGES.add(name, fn, same=lambda a, b: a.__qualname__ == b.__qualname__)
        return fn

    return decorator


def get_advantage(name: str) -> AdvantageFn:
    return ADVANTAGES.get(name)


def _centred(rewards: Tensor, index: Tensor, n: int, mean: Tensor) -> Tensor:
    """rewards - group mean [B], with rounding residue set to exactly 0.

    A reward equal to its group's mean can come out as -2.8e-17, and [0.1] * 6 as 1.4e-17 with a
    positive std; a rule would then give that response a whole sign's weight (a sign is a sign
    whatever its size). Differences below 64 ulp of the group's largest |reward| (at least 1) are
    rounding, not signal: they become 0 here, where zero-variance groups are detected.
    """
    centred = rewards - mean
    scale = torch.zeros(n, dtype=rewards.dtype).scatter_reduce(
        0, index, rewards.abs(), "amax", include_self=True
    )
    tol = 64 * torch.finfo(rewards.dtype).eps * scale.clamp_min(1.0)[index]
    return torch.where(centred.abs() <= tol, torch.zeros_like(centred), centred)


def _group_stats(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """rewards [B], group_ids [B] -> (group index [B], group size [n], group mean gathered [B])."""
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both be 1-D of the same length; got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    if rewards.numel() == 0:
        raise ValueError("empty batch: rewards is empty")
    _, index = torch.unique(group_ids, return_inverse=True)
    n = int(index.max()) + 1
    size = torch.zeros(n, dtype=rewards.dtype).index_add_(0, index, torch.ones_like(rewards))
    mean = torch.zeros(n, dtype=rewards.dtype).index_add_(0, index, rewards) / size
    return index, size, mean[index]


@register_advantage("grpo")
def grpo(
    rewards: Tensor, group_ids: Tensor, *, std: Literal["bessel", "population"] = "bessel", eps: float = 1e-6
) -> Tensor:
    """GRPO: A_i = (r_i - mean_g) / (std_g + eps).

    ``std="bessel"`` (divide by G-1) is what verl and TRL use; ``"population"`` (divide by G) gives
    each sign the total weight sqrt(k(G-k))/G under sequence aggregation for binary rewards.
    A zero-variance group gets 0 (not 0/eps), and so does a reward within rounding of its group's
    mean (``_centred``). rewards [B], group_ids [B] -> [B].
    """
    if std not in ("bessel", "population"):
        raise ValueError(f"advantage std must be 'bessel' or 'population'; got {std!r}")
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    index, size, mean = _group_stats(rewards, group_ids)
    centred = _centred(rewards, index, size.numel(), mean)
    sq = torch.zeros_like(size).index_add_(0, index, centred * centred)
    denom = (size - 1).clamp_min(1) if std == "bessel" else size
    group_std = (sq / denom).sqrt()[index]
    adv = centred / (group_std + eps)
    return torch.where(group_std > 0, adv, torch.zeros_like(adv))


@register_advantage("drgrpo")
def drgrpo(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """Dr. GRPO (arXiv 2503.20783): A_i = r_i - mean_g, no std normalisation. rewards [B] -> [B]."""
    rewards = rewards.to(torch.promote_types(rewards.dtype, torch.float32))
    index, size, mean = _group_stats(rewards, group_ids)
    return _centred(rewards, index, size.numel(), mean)
