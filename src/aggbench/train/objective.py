"""The clipped policy-gradient objective evaluated with effective advantages, and aux terms.

The policy-gradient loss is the plain SUM over tokens of the PPO clipped objective evaluated with
the effective advantages of an aggregation rule (``aggbench.aggregation``). PPO's clip,
clip-higher (separate low/high epsilons, DAPO) and dual clip depend only on the sign of the
advantage, so scaling an advantage by a positive weight scales the token's term by the same
weight: ``pg_token_loss(..., w*A) == w * pg_token_loss(..., A)``. That is why a rule can be a
weighting, and why a sum over micro-batches (or over data-parallel ranks, all-reduced with SUM)
equals the full mini-batch loss exactly.

KL and entropy are not advantages: they get their own reducer (default token-mean over all
response tokens of the mini-batch), whose per-token weights are likewise computed once on the
whole mini-batch (``aux_token_weights``).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AuxReduction = Literal["token-mean", "seq-mean-token-mean", "sum"]


def pg_token_loss(
    logp: Tensor,
    old_logp: Tensor,
    eff_adv: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Per-token clipped surrogate loss (to minimise) and which tokens were clipped.

    logp, old_logp: [B, T] log-probs of the sampled tokens under the current / behaviour policy;
    eff_adv: [B, T] effective advantages (0 on padding). Returns (loss [B, T], clipped [B, T] bool).
    ``dual_clip`` = c > 1 bounds the loss of negative-advantage tokens at -c * A (Ye et al. 2020).
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = -eff_adv * ratio
    clipped_ratio = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    clipped_term = -eff_adv * clipped_ratio
    loss = torch.maximum(unclipped, clipped_term)
    was_clipped = clipped_term > unclipped
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1 (it bounds -A * ratio at -c * A); got {dual_clip}")
        bound = -eff_adv * dual_clip
        neg = eff_adv < 0
        dual = neg & (loss > bound)
        loss = torch.where(dual, bound, loss)
        was_clipped = was_clipped | dual
    return loss, was_clipped & (eff_adv != 0)


def masked_pg_loss(
    logp: Tensor, old_logp: Tensor, eff_adv: Tensor, mask: Tensor, **clip: float | None
) -> tuple[Tensor, Tensor]:
    """The training loss of one micro-batch: (scalar sum over unmasked tokens of ``pg_token_loss``,
    clipped [B, T] bool). All tensors [B, T]; mask zeroes padding and filtered responses."""
    loss, clipped = pg_token_loss(logp, old_logp, eff_adv, **clip)
    return (loss * mask.to(loss.dtype)).sum(), clipped


def pg_loss(logp: Tensor, old_logp: Tensor, eff_adv: Tensor, mask: Tensor, **clip: float | None) -> Tensor:
    """Scalar policy-gradient loss, exactly what the update step uses (``masked_pg_loss``)."""
    return masked_pg_loss(logp, old_logp, eff_adv, mask, **clip)[0]


def aux_token_weights(mask: Tensor, reduction: AuxReduction = "token-mean") -> Tensor:
    """Per-token weights [B, T] for KL / entropy terms, computed on the WHOLE mini-batch mask [B, T].

    token-mean: 1 / (total tokens); seq-mean-token-mean: 1 / (B * |o_i|); sum: 1.
    The aux loss of any micro-batch is then ``(weights * values).sum()``.
    """
    m = mask.to(torch.float64) if not mask.is_floating_point() else mask
    if reduction == "token-mean":
        return m / m.sum().clamp_min(1.0)
    if reduction == "seq-mean-token-mean":
        return m / (m.sum(dim=1, keepdim=True).clamp_min(1.0) * m.shape[0])
    if reduction == "sum":
        return m.clone()
    raise ValueError(
        f"unknown aux reduction {reduction!r}; valid: 'token-mean', 'seq-mean-token-mean', 'sum'"
    )


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(pi || pi_ref) (Schulman): exp(r) - r - 1 with r = ref - logp. [B, T]."""
    r = ref_logp - logp
    return torch.exp(r) - r - 1.0


def unit_pg_loss(logp: Tensor, old_logp: Tensor, sign: Tensor, **clip: float | None) -> Tensor:
    """Per-token clipped loss at unit-magnitude advantage of each token's sign ([B, T]).

    Because clipping depends only on the sign, the loss of ANY rule is
    ``(|eff_adv| * unit_pg_loss(...)).sum()``: diagnostics use this to report every rule's
    policy-gradient loss on the same batch without another forward pass.
    """
    loss, _ = pg_token_loss(logp, old_logp, sign.to(logp.dtype), **clip)
    return loss
