"""The step's third stage (``aggbench.train.step``): ``update(policy, scored, ...) -> UpdateTotals``.

``ppo_epochs`` x ``mini_batches`` optimiser updates on one rollout batch. Each mini-batch's weights
(effective advantages and KL/entropy token weights) are computed once on the WHOLE mini-batch
(``minibatch_weights``, from the all-gathered view of every rank's rows), then
``accumulate_gradients`` runs forward/backward over the rows this process holds, in micro-batches.
Because every micro-batch loss is a plain token sum with global weights, the accumulated gradient
(summed over ranks) is the full-batch gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from aggbench.train import batching
from aggbench.train.batching import PackedBatch, split_rows
from aggbench.train.global_batch import GlobalView, gather_minibatch
from aggbench.train.logprobs import response_logprobs
from aggbench.train.objective import AuxReduction, aux_token_weights, kl_k3, masked_pg_loss, unit_pg_loss
from aggbench.train.scoring import ScoredBatch

if TYPE_CHECKING:
    from aggbench.train.parallel import Ranks


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

    @classmethod
    def from_config(cls, cfg: Any) -> LossSettings:
        """The loss settings of a cell's ``TrainConfig`` (``algorithm``, ``sampling.temperature``)."""
        a = cfg.algorithm
        return cls(
            clip_low=a.clip_low,
            clip_high=a.clip_high,
            dual_clip=a.dual_clip,
            kl_coef=a.kl_coef,
            entropy_coef=a.entropy_coef,
            aux_reduction=a.aux_reduction,
            temperature=cfg.sampling.temperature,
            micro_batch_size=a.micro_batch_size,
        )


@dataclass(frozen=True)
class UpdateSettings:
    """How one rollout batch is trained on: the loss, ``ppo_epochs`` passes over ``mini_batches``
    optimiser mini-batches (whole prompt groups each), gradient clipping (None: none)."""

    loss: LossSettings
    ppo_epochs: int = 1
    mini_batches: int = 1
    max_grad_norm: float | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> UpdateSettings:
        a = cfg.algorithm
        return cls(LossSettings.from_config(cfg), a.ppo_epochs, a.mini_batches, a.max_grad_norm)


@dataclass
class Policy:
    """The trained model and what updates it; ``ref_model`` only with a KL term; ``autocast``: a
    context factory for forward passes (bf16 autocast, or a null context)."""

    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    autocast: Callable = contextlib.nullcontext


@dataclass
class MiniBatch:
    """One optimiser mini-batch of M rows as this process runs it.

    rows [M] long: each row's index in this process's batch (-1: another rank's row); local [k]
    long: the positions in 0..M-1 this process computes; eff [M, T] and aux [M, T]: effective
    advantages and KL/entropy token weights, computed on the WHOLE mini-batch.
    """

    rows: Tensor
    local: Tensor
    eff: Tensor
    aux: Tensor

    @classmethod
    def whole(cls, rows: Tensor, eff: Tensor, aux: Tensor) -> MiniBatch:
        """One process holding all of it: ``rows`` [M] of its batch, every position computed."""
        return cls(rows, torch.arange(len(rows)), eff, aux)


@dataclass
class UpdateTotals:
    """What one step's optimiser updates add up to (summed over ranks and updates).

    view: the whole batch every rank saw (mask [N, T], advantages [N], group ids [N], rank order);
    minibatches: the row indices into ``view`` of each optimiser mini-batch (every epoch runs the
    same ones), the weights of each computed on it alone: what the ``agg/*`` diagnostics use;
    unit_loss: [b, T] this rank's per-token unit PG loss of the first epoch (diagnostics);
    behaviour: [b, T] this rank's log-probs of the sampled tokens before the update (``old``);
    weight_sq: the sum over updates of sum(eff ** 2) over the tokens each update's loss weighted, from
    the weights the loss itself applied (``loss/weight_sq``; checked against ``agg/<rule>/weight_sq``).
    """

    pg_loss: float
    kl: float
    entropy: float
    clipped: float
    tokens: float
    grad_norm: float
    updates: int
    unit_loss: torch.Tensor
    view: GlobalView
    behaviour: torch.Tensor
    minibatches: list[torch.Tensor] | None = None
    weight_sq: float = 0.0


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
    scored: ScoredBatch,
    mb: MiniBatch,
    settings: LossSettings,
    *,
    old: Tensor | None = None,
    ref: Tensor | None = None,
    autocast: Callable = contextlib.nullcontext,
    unit_loss_out: Tensor | None = None,
    logp_out: Tensor | None = None,
    after_backward: Callable[[], None] | None = None,
) -> dict[str, float]:
    """Backward over micro-batches of this process's part of ``mb``; returns loss statistics (sums).

    scored: this process's rows (packed batch, loss mask [B, T] that may exclude filtered responses,
    advantages [B]); mb: the mini-batch, its weights computed on the whole of it; old / ref: [B, T]
    behaviour / reference log-probs (``old=None``: on-policy, ratio 1 with the gradient of logp);
    unit_loss_out / logp_out [B, T]: filled with each row's unit PG loss / log-probs when given.
    """
    batch, mask, adv = scored.batch, scored.mask, scored.advantages
    eff, aux_w = mb.eff, mb.aux
    stats = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clipped": 0.0, "tokens": 0.0, "weight_sq": 0.0}
    for pos in split_rows(mb.local, settings.micro_batch_size):
        rows = mb.rows[pos]
        logp, ent, t_w = forward_logprobs(
            model, batch, rows, grad=True, temperature=settings.temperature, autocast=autocast
        )
        dev, dt = logp.device, logp.dtype
        m = mask[rows, :t_w].to(dev, dt)
        o = old[rows, :t_w].to(dev, dt) if old is not None else logp.detach()
        e = eff[pos, :t_w].to(dev, dt)
        pg, clipped = masked_pg_loss(logp, o, e, m, **settings.clip)
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
        stats["weight_sq"] += float((e.double().square() * m).sum())  # the weights this loss applied
    return stats


def _check_prefix(mask: Tensor, ranks: Ranks) -> None:
    """mask [B, T]: each row's scored tokens come first. The global view is rebuilt from each row's
    token count (``gather_minibatch``), so a mask with holes (a masked tool turn, say) would put the
    rule's weights on other tokens: refused here instead of trained on silently. Every rank refuses
    together (one all-reduce): a rank refusing alone would leave the others waiting in the gather."""
    prefix = torch.arange(mask.shape[1], device=mask.device) < mask.sum(1, keepdim=True)
    rows = (mask.bool() != prefix).any(1).nonzero().flatten().tolist()
    if ranks.max_over_ranks(1 if rows else 0):
        where = f"the loss mask of rows {rows[:5]}" if rows else "another rank's loss mask"
        raise RuntimeError(
            f"update(): {where} has holes (a masked token before a scored one); "
            "the whole-batch weights are rebuilt from token counts, so they would land on other tokens"
        )


def update(
    policy: Policy,
    scored: ScoredBatch,
    *,
    rule: Any,
    settings: UpdateSettings,
    ranks: Ranks,
    after_backward: Callable[[], None] | None = None,
) -> UpdateTotals:
    """``ppo_epochs`` x ``mini_batches`` optimiser updates on one rollout batch.

    ``scored`` holds this rank's rows (all of them on one process); the weights of every mini-batch
    come from the whole batch's (lengths, advantages, group ids), all-gathered into ``view``.
    Mini-batches are cut from the global group ids (whole prompt groups), the same every epoch.
    """
    model, loss = policy.model, settings.loss
    batch, mask = scored.batch, scored.mask
    _check_prefix(mask, ranks)  # before the forward passes; every rank together
    with ranks.full_params(model):
        multi = settings.ppo_epochs * settings.mini_batches > 1
        old = fixed_logprobs(model, batch, loss, policy.autocast) if multi else None
    with ranks.full_params(policy.ref_model):
        ref = (
            fixed_logprobs(policy.ref_model, batch, loss, policy.autocast)
            if policy.ref_model is not None
            else None
        )
    view = gather_minibatch(mask.sum(1), scored.advantages, scored.group_ids)  # every rank's rows
    view.mask = _widen(view.mask, ranks.max_over_ranks(mask.shape[1]))  # the batch's width
    row_map = view.row_map()  # position in the view -> this rank's row (-1: another rank's)
    unit_loss = torch.zeros(mask.shape, dtype=torch.float64)
    # the behaviour log-probs: `old` when computed, else those of the one (on-policy) pass
    seen = torch.zeros(mask.shape, dtype=torch.float64) if old is None else None
    sums = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clipped": 0.0, "tokens": 0.0, "weight_sq": 0.0}
    norms = []
    # under dynamic sampling fewer groups than mini-batches can be left, and an empty mini-batch is
    # no update (a rule needs rows; every rank skips it: the split is global)
    minibatches = [mb for mb in batching.split_groups(view.group_ids, settings.mini_batches) if len(mb)]
    for epoch in range(settings.ppo_epochs):
        for rows in minibatches:
            eff, aux_w = minibatch_weights(  # once, on the whole mini-batch
                rule, view.mask[rows], view.advantages[rows], view.group_ids[rows], loss.aux_reduction
            )
            local = view.local_in(rows)  # this rank's part of it
            owed = ranks.missing_passes(len(local), loss.micro_batch_size)
            mb = MiniBatch(row_map[rows], local, _widen(eff, mask.shape[1]), _widen(aux_w, mask.shape[1]))
            stats = accumulate_gradients(
                model,
                scored,
                mb,
                loss,
                old=old,
                ref=ref,
                autocast=policy.autocast,
                unit_loss_out=unit_loss if epoch == 0 else None,
                logp_out=seen if epoch == 0 else None,
                after_backward=after_backward,
            )
            ranks.finish_backward(model, batch, owed, loss, policy.autocast)  # SUM over ranks
            norms.append(ranks.clip_grad_norm(model, settings.max_grad_norm))
            policy.optimizer.step()
            policy.optimizer.zero_grad(set_to_none=True)
            for k, v in stats.items():
                sums[k] += v
    sums = ranks.sum_over_ranks(sums)
    return UpdateTotals(
        **sums,
        grad_norm=sum(norms),
        updates=len(norms),
        unit_loss=unit_loss,
        view=view,
        behaviour=old.float() if old is not None else seen.float(),
        minibatches=minibatches,
    )


def _widen(x: Tensor, width: int) -> Tensor:
    """[B, T] -> [B, max(T, width)], zero-padded on the right (weights of padding are zero)."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1])) if x.shape[1] < width else x
