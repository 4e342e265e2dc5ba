"""One optimiser mini-batch: weights computed once, gradients accumulated over micro-batches.

``accumulate_gradients`` runs forward/backward over the rows it is given (all of the mini-batch on
one process; this rank's shard under data parallelism) with effective advantages and aux weights
that were computed on the WHOLE mini-batch. The caller clips and steps. Because every micro-batch
loss is a plain token sum with global weights, the accumulated gradient (summed over ranks) is
the full-batch gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aggbench.train.batching import PackedBatch, split_rows
from aggbench.train.logprobs import response_logprobs
from aggbench.train.objective import AuxReduction, aux_token_weights, kl_k3, masked_pg_loss, unit_pg_loss


@dataclass(frozen=True)
class LossSettings:
    clip_low: float = 0.2
    clip_high: float = 0.28
    dual_clip: float | None = None
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    aux_reduction: AuxReduction = "token-mean"
    temperature: float = 1.0
    micro_batch_size: int = 16

    @property
    def clip(self) -> dict[str, float | None]:
        return {"clip_low": self.clip_low, "clip_high": self.clip_high, "dual_clip": self.dual_clip}


def minibatch_weights(
    rule: Any, mask: Tensor, adv: Tensor, gids: Tensor, reduction: AuxReduction
) -> tuple[Tensor, Tensor]:
    """Effective advantages [b, T] and KL/entropy token weights [b, T] of one WHOLE mini-batch."""
    return rule(mask, adv, gids), aux_token_weights(mask, reduction)


def forward_logprobs(
    model: torch.nn.Module,
    batch: PackedBatch,
    rows: Tensor,
    *,
    grad: bool,
    temperature: float,
    autocast: Callable = contextlib.nullcontext,
) -> tuple[Tensor, Tensor, int]:
    """Log-probs and entropies [len(rows), T'] of ``rows``, trimmed to their own widths T'."""
    ids, attn, _, t_w = batch.rows(rows)
    dev = next(model.parameters()).device
    with torch.set_grad_enabled(grad), autocast():
        logp, ent = response_logprobs(
            model, ids.to(dev), attn.to(dev), t_w, with_entropy=True, temperature=temperature
        )
    wide = torch.float64 if next(model.parameters()).dtype == torch.float64 else torch.float32
    return logp.to(wide), ent, t_w


@torch.no_grad()
def fixed_logprobs(
    model: torch.nn.Module, batch: PackedBatch, settings: LossSettings, autocast: Callable
) -> Tensor:
    """Log-probs [B, T] of every row under ``model`` (behaviour policy or frozen reference)."""
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float64)
    for rows in split_rows(torch.arange(out.shape[0]), settings.micro_batch_size):
        logp, _, t_w = forward_logprobs(
            model, batch, rows, grad=False, temperature=settings.temperature, autocast=autocast
        )
        out[rows, :t_w] = logp.double().cpu()
    return out


def accumulate_gradients(
    model: torch.nn.Module,
    batch: PackedBatch,
    mask: Tensor,
    adv: Tensor,
    mb: Tensor,
    local: Tensor,
    eff: Tensor,
    aux_w: Tensor,
    settings: LossSettings,
    *,
    old: Tensor | None = None,
    ref: Tensor | None = None,
    autocast: Callable = contextlib.nullcontext,
    unit_loss_out: Tensor | None = None,
    logp_out: Tensor | None = None,
    after_backward: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Backward over micro-batches of ``mb[local]``; returns loss statistics (sums).

    batch: the packed rollout batch; mask [B, T] (loss mask, may exclude filtered responses);
    adv [B]; mb: row indices of this mini-batch in the batch; local: positions inside ``mb`` this
    process handles; eff, aux_w: [len(mb), T] computed on the whole mini-batch; old / ref: [B, T]
    behaviour / reference log-probs (``old=None``: on-policy, ratio 1 with the gradient of logp);
    unit_loss_out / logp_out [B, T]: filled with each row's unit PG loss / log-probs when given.
    """
    stats = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clipped": 0.0, "tokens": 0.0}
    for pos in split_rows(local, settings.micro_batch_size):
        rows = mb[pos]
        logp, ent, t_w = forward_logprobs(
            model, batch, rows, grad=True, temperature=settings.temperature, autocast=autocast
        )
        dev, dt = logp.device, logp.dtype
        m = mask[rows, :t_w].to(dev, dt)
        o = old[rows, :t_w].to(dev, dt) if old is not None else logp.detach()
        pg, clipped = masked_pg_loss(logp, o, eff[pos, :t_w].to(dev, dt), m, **settings.clip)
        w = aux_w[pos, :t_w].to(dev, dt)
        loss = pg
        kl = torch.zeros((), device=dev, dtype=dt)
        if ref is not None and settings.kl_coef > 0:
            kl = (w * kl_k3(logp, ref[rows, :t_w].to(dev, dt))).sum()
            loss = loss + settings.kl_coef * kl
        ent_term = (w * ent.to(dt)).sum()
        if settings.entropy_coef > 0:
            loss = loss - settings.entropy_coef * ent_term
        loss.backward()
        if after_backward is not None:
            after_backward()
        if unit_loss_out is not None:
            sign = torch.sign(adv[rows])[:, None].to(dev, dt) * m
            unit_loss_out[rows, :t_w] = (
                unit_pg_loss(logp.detach(), o.detach(), sign, **settings.clip).double().cpu()
            )
        if logp_out is not None:
            logp_out[rows, :t_w] = logp.detach().double().cpu()
        stats["pg_loss"] += float(pg.detach())
        stats["kl"] += float(kl.detach())
        stats["entropy"] += float(ent_term.detach())
        stats["clipped"] += float((clipped & m.bool()).sum())
        stats["tokens"] += float(m.sum())
    return stats
