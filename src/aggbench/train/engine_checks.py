"""What the trainer checks of a rollout engine that samples from its own copy of the weights (vLLM).

Two per-step diagnostics, as verl and TRL log them:

- ``rollout/logprob_gap_mean`` / ``_max``: |engine log-prob - trainer log-prob| of every sampled
  response token, the trainer's being the behaviour log-probs the update used (same temperature).
  Kernels and dtypes make it small but non-zero; a jump means the engine samples from something
  other than the policy (a failed push, stale prefix cache, a top-p the trainer does not apply).
- ``rollout/push_diff_before`` / ``_after``: after each weight push, the engine's log-probs of one
  fixed (prompt, response) (the run's first rollout, scored with ``prompt_logprobs``) against the
  updated policy's own; ``before`` is the same comparison just before the push (the control:
  non-zero whenever the update moved the weights), ``after`` must be ~0 (float32: < 1e-3).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from aggbench.train.logprobs import response_logprobs


@dataclass
class EngineStats:
    """One rank's share: gap sums over its response tokens and its push comparison (max abs)."""

    gap_sum: float = 0.0
    gap_max: float = 0.0
    gap_tokens: int = 0
    push_before: float | None = None
    push_after: float | None = None


def push_probe(rollout_cfg: Any, roll: Any) -> tuple[list[int], list[int]] | None:
    """The fixed (prompt, response) of ``rollout.check_weight_push``: this rank's first rollout."""
    if rollout_cfg.engine != "vllm" or not rollout_cfg.check_weight_push or not len(roll):
        return None
    return list(roll.prompt_ids[0]), list(roll.response_ids[0])


def gap_of(roll: Any, behaviour: Tensor, lengths: list[int]) -> EngineStats | None:
    """This rank's log-prob gap to the engine, when the engine returned log-probs (vLLM)."""
    return None if roll.logprobs is None else logprob_gap(roll.logprobs, behaviour, lengths)


def logprob_gap(engine_lps: list[list[float]], trainer: Tensor, lengths: list[int]) -> EngineStats:
    """Gap sums of one rank. engine_lps: per response, one log-prob per token; trainer: [B, T]
    behaviour log-probs, response-aligned (token t of row i at ``trainer[i, t]``)."""
    stats = EngineStats()
    for i, (lps, n) in enumerate(zip(engine_lps, lengths, strict=True)):
        if not n:
            continue
        if len(lps) != n:
            raise ValueError(
                f"the engine returned {len(lps)} log-probs for a response of {n} tokens (row {i})"
            )
        d = (torch.tensor(lps, dtype=torch.float64) - trainer[i, :n].double()).abs()
        stats.gap_sum += float(d.sum())
        stats.gap_max = max(stats.gap_max, float(d.max()))
        stats.gap_tokens += n
    return stats


@torch.no_grad()
def policy_logprobs(
    model: torch.nn.Module,
    prompt: list[int],
    response: list[int],
    autocast: Callable = contextlib.nullcontext,
) -> list[float]:
    """The model's own log-probs [T] of ``response`` after ``prompt`` (temperature 1, one row)."""
    dev = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(response)], device=dev)
    with autocast():
        logp, _ = response_logprobs(model, ids, torch.ones_like(ids), len(response))
    return logp[0].double().cpu().tolist()


def max_abs_diff(a: list[float], b: list[float]) -> float:
    return float((torch.tensor(a, dtype=torch.float64) - torch.tensor(b, dtype=torch.float64)).abs().max())


def push_and_check(
    engine: Any,
    model: torch.nn.Module,
    probe: tuple[list[int], list[int]] | None,
    own: Callable[[], list[float]],
) -> tuple[float | None, float | None]:
    """Push ``model`` into ``engine``; with a probe, (before, after) max abs log-prob differences
    between the engine and ``own()`` (the updated policy's log-probs of the probe)."""
    if probe is None:
        engine.sync_weights(model)
        return None, None
    before = engine.score(*probe)
    engine.sync_weights(model)
    after = engine.score(*probe)
    mine = own()
    return max_abs_diff(before, mine), max_abs_diff(after, mine)


def merge(parts: list[EngineStats | None]) -> dict[str, float]:
    """The metrics row's entries from every rank's share (empty when the engine returned none)."""
    got = [p for p in parts if p is not None]
    if not got:
        return {}
    row: dict[str, float] = {}
    tokens = sum(p.gap_tokens for p in got)
    if tokens:
        row["rollout/logprob_gap_mean"] = sum(p.gap_sum for p in got) / tokens
        row["rollout/logprob_gap_max"] = max(p.gap_max for p in got)
    before = [p.push_before for p in got if p.push_before is not None]
    after = [p.push_after for p in got if p.push_after is not None]
    if before:
        row["rollout/push_diff_before"] = max(before)
    if after:
        row["rollout/push_diff_after"] = max(after)
    return row


def push_roundtrip(
    engine: Any, model: torch.nn.Module, prompt: list[int], response: list[int], *, seed: int = 0
) -> dict[str, float]:
    """The zero-then-perturb-then-restore proof of an engine's weight push (max abs log-prob diffs).

    zeroed_vs_uniform: zeroed weights must give -ln V at every position (~0); zeroed_vs_own: the
    control (large: the push changed what the engine computes); perturbed: weights moved by noise
    must give the moved model's log-probs (~0; a push that reached only some layers, e.g. a tied
    lm_head left stale, fails here and not with zeros, where any head gives zero logits);
    perturbed_vs_own: that the noise mattered (large); restored: ``model`` again (~0). The engine
    ends with ``model``'s weights.
    """
    import copy
    import math

    own = policy_logprobs(model, prompt, response)
    zeroed = copy.deepcopy(model)
    moved = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in zeroed.parameters():
            p.zero_()
        for p in moved.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen).to(p.device, p.dtype))
    out: dict[str, float] = {}
    try:
        engine.sync_weights(zeroed)
        got = engine.score(prompt, response)
        vocab = model.get_output_embeddings().weight.shape[0]
        out["zeroed_vs_uniform"] = max_abs_diff(got, [-math.log(vocab)] * len(got))
        out["zeroed_vs_own"] = max_abs_diff(got, own)
        mine = policy_logprobs(moved, prompt, response)
        engine.sync_weights(moved)
        out["perturbed"] = max_abs_diff(engine.score(prompt, response), mine)
        out["perturbed_vs_own"] = max_abs_diff(mine, own)
    finally:
        engine.sync_weights(model)
    out["restored"] = max_abs_diff(engine.score(prompt, response), own)
    return out
