"""One GRPO step, read top to bottom: named stages with typed values between them.

    sample(sampler, stream, slots, step) -> SampledBatch   rollouts, rewards, what sampling did
    score(sampled, scoring)              -> ScoredBatch    shaped rewards -> advantages, packed, filtered
    update(policy, scored, rule, ...)    -> UpdateTotals   weights on each WHOLE mini-batch, then
                                                           micro-batches; gradients summed over ranks
    push(...)                            -> EngineStats    the updated weights into the rollout engine
    record(step, parts, rule, totals)    -> metrics row    the whole batch, on rank 0

Each stage lives in its own module (``sampling``, ``scoring``, ``update``, ``engine_checks``,
``step_log``) and is tested there without a model where it needs none (``score``, ``record``) or
with a stand-in engine (``sample``). :func:`run_step` is the step; ``aggbench.train.loop`` sets up
a segment around it, writes what it returns, and checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aggbench.train import engine_checks
from aggbench.train.batching import PromptStream
from aggbench.train.engine_checks import EngineStats
from aggbench.train.parallel import Ranks
from aggbench.train.sampling import SampledBatch, Sampler, sample
from aggbench.train.scoring import Scoring, score
from aggbench.train.step_log import RankPart, StepTiming, record, rollout_rows
from aggbench.train.update import Policy, UpdateSettings, UpdateTotals, update


@dataclass
class Segment:
    """What every step of a segment shares, set up once by the loop: the cell's config, this
    process's ranks, the policy, the three stage settings, the rule instance that trains, the prompt
    stream at its cursor, and the engine's push probe (the (prompt, response) the engine and the
    policy both score after every push; found on the first step)."""

    cfg: Any
    ranks: Ranks
    policy: Policy
    sampler: Sampler
    scoring: Scoring
    updating: UpdateSettings
    rule: Any
    stream: PromptStream
    probe: tuple[list[int], list[int]] | None = None


@dataclass
class StepResult:
    """What a step leaves for the loop to write: the metrics row and the rollout rows (rank 0; on
    another rank ``row`` is None and ``rollouts`` empty)."""

    row: dict | None
    rollouts: list[dict]


def run_step(seg: Segment, step: int, *, after_backward: Callable[[], None] | None = None) -> StepResult:
    """One GRPO step of this rank's share of the batch (under torchrun every rank runs it)."""
    cfg, ranks, policy = seg.cfg, seg.ranks, seg.policy
    per_step = cfg.algorithm.prompts_per_step
    t0 = time.perf_counter()
    # ---- 1. sample: G responses per prompt of this rank's groups, graded; dynamic sampling
    # refills zero-variance groups. vLLM samples from its own copy of the weights: no FSDP gather
    slots = ranks.my_groups(per_step)  # group ids = positions in the step's prompt list
    with policy.autocast(), ranks.full_params(policy.model if cfg.rollout.engine == "hf" else None):
        sampled = sample(seg.sampler, stream=seg.stream, slots=slots, step=step)
    # every round read one block of the stream: the rank that ran the most decides
    seg.stream.advance(ranks.max_over_ranks(sampled.stats.rounds), per_step)
    t_gen = time.perf_counter() - t0
    # ---- 2. score: overlong shaping, group advantages, packing, the overlong filter
    scored = score(sampled, seg.scoring)
    # ---- 3. update: each mini-batch's weights computed once on the whole of it, then micro-batches
    t1 = time.perf_counter()
    totals = update(
        policy, scored, rule=seg.rule, settings=seg.updating, ranks=ranks, after_backward=after_backward
    )
    # ---- 4. push the updated policy into the engine (vLLM; HF shares the weights) and check it
    checks = push(seg, sampled, totals)
    t_upd = time.perf_counter() - t1
    # ---- 5. record: the whole batch's metrics row on rank 0, and the rollouts to keep
    mine = rollout_rows(step, sampled, scored.advantages, cfg.rollout.save_rollouts)
    roll = sampled.rollouts
    lengths = [len(r) for r in roll.response_ids]
    part = RankPart(sampled.rewards, roll.finished, lengths, totals.unit_loss, mine, sampled.stats, checks)
    parts = ranks.gather_to_main(part)
    if parts is None:
        return StepResult(None, [])
    lr = policy.scheduler.get_last_lr()[0]
    timing = StepTiming(generate_s=t_gen, update_s=t_upd)
    row = record(step=step, parts=parts, rule=seg.rule, totals=totals, timing=timing, lr=lr)
    return StepResult(row, [r for p in parts for r in p.rollouts])


def push(seg: Segment, sampled: SampledBatch, totals: UpdateTotals) -> EngineStats | None:
    """Push the updated weights into the rollout engine and say what its checks found: the
    log-prob gap of this step's rollouts to the behaviour log-probs, and (vLLM with
    ``rollout.check_weight_push``) the probe's difference before and after the push. None: the
    engine returns no log-probs (HF)."""
    engine, policy, ranks = seg.sampler.engine, seg.policy, seg.ranks
    roll = sampled.rollouts
    seg.probe = seg.probe or engine_checks.push_probe(seg.cfg.rollout, roll)
    lengths = [len(r) for r in roll.response_ids]
    checks = engine_checks.gap_of(roll, totals.behaviour, lengths)
    probe = seg.probe

    def own() -> list[float]:  # the updated policy's log-probs of the probe (FSDP: gathered)
        with ranks.full_params(policy.model):
            return engine_checks.policy_logprobs(policy.model, *probe, autocast=policy.autocast)

    before, after = engine_checks.push_and_check(engine, policy.model, probe, own)
    if checks is not None:
        checks.push_before, checks.push_after = before, after
    return checks
