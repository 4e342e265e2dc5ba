"""The step's second stage (``aggbench.train.step``): ``score(sampled, scoring) -> ScoredBatch``.

From rewards to what the update trains on, with no model involved:

1. DAPO's soft overlong shaping is added to each verifiable reward (``batching.soft_overlong_penalty``:
   0 up to ``max_new_tokens - buffer``, then linear down to ``-penalty``).
2. The group advantage estimator (``aggregation.advantages``: grpo or drgrpo) turns the shaped
   rewards of each prompt group into advantages [b], in float64.
3. The rollouts are packed into tensors (prompts left-padded, responses right-padded).
4. DAPO's overlong filter (``algorithm.overlong.filter``): a truncated response leaves the loss
   entirely (its mask row and advantage are zeroed); it stays in the batch, so the rule still sees
   the group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggbench.train.batching import PackedBatch, pack, soft_overlong_penalty
from aggbench.train.sampling import SampledBatch


@dataclass(frozen=True)
class Scoring:
    """How rewards become advantages: the estimator (rewards [b], group ids [b] -> advantages [b])
    with its options, DAPO's overlong shaping (``max_new_tokens``, ``overlong_buffer``,
    ``overlong_penalty``) and filter, and the tokenizer's pad id for packing."""

    estimator: Callable[..., Tensor]
    estimator_kwargs: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 0
    overlong_buffer: int = 0
    overlong_penalty: float = 0.0
    overlong_filter: bool = False
    pad_id: int = 0

    @classmethod
    def from_config(cls, cfg: Any, estimator: Callable[..., Tensor], pad_id: int) -> Scoring:
        """The scoring of a cell's ``TrainConfig`` (``advantage``, ``algorithm.overlong``, ``sampling``)."""
        a = cfg.algorithm
        kwargs = (
            {"std": cfg.advantage.std, "eps": cfg.advantage.eps} if cfg.advantage.estimator == "grpo" else {}
        )
        return cls(
            estimator=estimator,
            estimator_kwargs=kwargs,
            max_new_tokens=cfg.sampling.max_new_tokens,
            overlong_buffer=a.overlong.buffer,
            overlong_penalty=a.overlong.penalty,
            overlong_filter=a.overlong.filter,
            pad_id=pad_id,
        )


@dataclass
class ScoredBatch:
    """This rank's rows ready for the update: ``batch`` (packed token ids, attention and response
    masks), ``mask`` [b, T] (the loss mask: the response mask less filtered responses),
    ``advantages`` [b] (float64) and ``group_ids`` [b] (global positions in the step's prompt list)."""

    batch: PackedBatch
    mask: Tensor
    advantages: Tensor
    group_ids: Tensor


def score(sampled: SampledBatch, scoring: Scoring) -> ScoredBatch:
    """Shape the rewards, compute group advantages, pack, and apply the overlong filter."""
    roll = sampled.rollouts
    lengths = [len(r) for r in roll.response_ids]
    penalty = soft_overlong_penalty(
        lengths, scoring.max_new_tokens, scoring.overlong_buffer, scoring.overlong_penalty
    )
    shaped = [r + p for r, p in zip(sampled.rewards, penalty, strict=True)]
    gids = torch.tensor(roll.group, dtype=torch.long)
    adv = scoring.estimator(torch.tensor(shaped, dtype=torch.float64), gids, **scoring.estimator_kwargs)
    batch = pack(roll, scoring.pad_id)
    mask = batch.response_mask.clone()
    if scoring.overlong_filter:  # truncated responses leave the loss entirely (DAPO overlong filter)
        truncated = torch.tensor([not f for f in roll.finished])
        mask[truncated] = False
        adv = torch.where(truncated, torch.zeros_like(adv), adv)
    return ScoredBatch(batch, mask, adv, gids)
