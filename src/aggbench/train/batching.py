"""Turning rollouts into tensors, cutting mini- and micro-batches, and the prompt stream."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from aggbench import seeds
from aggbench.rollout.base import Rollouts


@dataclass
class PackedBatch:
    """Prompts left-padded to width P, responses right-padded to width T.

    input_ids, attention_mask: [B, P + T]; response_mask: [B, T] bool; prompt_lens,
    response_lens: [B] long.
    """

    input_ids: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    prompt_lens: Tensor
    response_lens: Tensor

    @property
    def prompt_width(self) -> int:
        return self.input_ids.shape[1] - self.response_mask.shape[1]

    def rows(self, idx: Tensor) -> tuple[Tensor, Tensor, Tensor, int]:
        """A micro-batch trimmed to its own widths: (input_ids, attention_mask, response_mask, T').

        Trimming is exact: left padding only shifts positions that the attention mask and the
        position ids (computed from it) already ignore, and right padding comes after every real
        token of a causal model.
        """
        p_w = int(self.prompt_lens[idx].max())
        t_w = max(int(self.response_lens[idx].max()), 1)
        p0 = self.prompt_width
        cols = slice(p0 - p_w, p0 + t_w)
        return (
            self.input_ids[idx][:, cols],
            self.attention_mask[idx][:, cols],
            self.response_mask[idx][:, :t_w],
            t_w,
        )


def pack(rollouts: Rollouts, pad_id: int) -> PackedBatch:
    b = len(rollouts)
    p_lens = torch.tensor([len(p) for p in rollouts.prompt_ids])
    r_lens = torch.tensor([len(r) for r in rollouts.response_ids])
    p_w, t_w = int(p_lens.max()), max(int(r_lens.max()), 1)
    ids = torch.full((b, p_w + t_w), pad_id, dtype=torch.long)
    attn = torch.zeros((b, p_w + t_w), dtype=torch.long)
    for i, (p, r) in enumerate(zip(rollouts.prompt_ids, rollouts.response_ids, strict=True)):
        ids[i, p_w - len(p) : p_w] = torch.tensor(p, dtype=torch.long)
        attn[i, p_w - len(p) : p_w] = 1
        if r:
            ids[i, p_w : p_w + len(r)] = torch.tensor(r, dtype=torch.long)
            attn[i, p_w : p_w + len(r)] = 1
    resp_mask = torch.arange(t_w)[None, :] < r_lens[:, None]
    return PackedBatch(ids, attn, resp_mask, p_lens, r_lens)


def split_groups(group_ids: Tensor, n_parts: int) -> list[Tensor]:
    """Row indices of ``n_parts`` mini-batches that keep every prompt group whole."""
    uniq = torch.unique(group_ids)
    return [
        torch.nonzero(torch.isin(group_ids, part)).flatten() for part in torch.tensor_split(uniq, n_parts)
    ]


def split_rows(rows: Tensor, size: int) -> list[Tensor]:
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def prompt_indices(n_data: int, per_step: int, seed: int, step: int) -> list[int]:
    """Dataset indices of step ``step`` (1-based) when every step reads ``per_step`` prompts
    (no dynamic sampling): stream positions ``(step - 1) * per_step`` on (:class:`PromptStream`).
    """
    return PromptStream(n_data, seed).take((step - 1) * per_step, per_step)


class PromptStream:
    """The training prompts in reading order: epoch after epoch, each a permutation of the dataset.

    Stream position k is entry ``k % n_data`` of epoch ``k // n_data``'s permutation (seeded by
    ``seeds.epoch_order(seed, epoch)``), so reading consecutive positions draws prompts without
    replacement within an epoch, as verl's dataloader (a seeded ``RandomSampler``) does. ``cursor``
    is the position of the next unread prompt: the only state, saved in the trainer state of every
    checkpoint (``prompt_cursor``) so a resumed run reads on where the uninterrupted one would.
    Without dynamic sampling each step reads ``prompts_per_step`` positions and the cursor after
    step s is ``s * prompts_per_step`` (:func:`prompt_indices`).
    """

    def __init__(self, n_data: int, seed: int, cursor: int = 0) -> None:
        if n_data == 0:
            raise ValueError("the training dataset is empty")
        self.n_data, self.seed, self.cursor = n_data, seed, cursor
        self._perms: dict[int, list[int]] = {}

    def _perm(self, epoch: int) -> list[int]:
        if epoch not in self._perms:
            if len(self._perms) > 2:  # the stream moves forward: keep the latest epochs only
                self._perms.pop(min(self._perms))
            gen = torch.Generator().manual_seed(seeds.epoch_order(self.seed, epoch))
            self._perms[epoch] = torch.randperm(self.n_data, generator=gen).tolist()
        return self._perms[epoch]

    def take(self, start: int, count: int) -> list[int]:
        """Dataset indices at stream positions ``start .. start + count - 1`` (the cursor stays)."""
        out = []
        for k in range(start, start + count):
            epoch, pos = divmod(k, self.n_data)
            out.append(self._perm(epoch)[pos])
        return out

    def block(self, round_: int, per_step: int) -> list[int]:
        """The ``per_step`` prompts of sampling round ``round_`` (0: the step's own) of this step."""
        return self.take(self.cursor + round_ * per_step, per_step)

    def advance(self, rounds: int, per_step: int) -> None:
        """After a step that ran ``rounds`` sampling rounds: each round read one block."""
        self.cursor += rounds * per_step


def soft_overlong_penalty(lengths: list[int], max_len: int, buffer: int, penalty: float) -> list[float]:
    """DAPO's soft overlong punishment: 0 up to max_len - buffer, then linear down to -penalty."""
    if buffer <= 0:
        return [0.0] * len(lengths)
    start = max_len - buffer
    return [0.0 if n <= start else -penalty * min(n - start, buffer) / buffer for n in lengths]
