"""Rollouts of one step: generate, grade, and (dynamic sampling) refill zero-variance groups.

The step's first stage (``aggbench.train.step``): ``sample(sampler, ...) -> SampledBatch``. What it decides:

1. Prompts come from the epoch stream (``batching.PromptStream``): read in order, so without
   replacement within an epoch, as verl's dataloader. Sampling round ``r`` of a step reads block
   ``r`` (``prompts_per_step`` positions after the cursor); rank k uses the positions of its own
   groups (``Ranks.my_groups``), as it does in round 0. This follows verl's DAPO trainer, where
   every generation round takes the next batch from the dataloader and the groups it does not need
   are dropped: a refill block is consumed whole, but only the prompts a rank is short are
   generated (the first ones of its positions), and the rest of the block is skipped, not put
   back. After the step the cursor moves on by one block per round of the rank that ran the most.
2. What filtering did is counted before it: the groups sampled and the zero-variance groups the
   filter dropped, every round, and the accuracy of the step's own prompts (round 0) before any
   group is dropped (the trained batch's accuracy is biased toward 1/2 by the filter).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aggbench import seeds
from aggbench.rollout.base import Rollouts
from aggbench.train import prompt_fit
from aggbench.train.batching import PromptStream


@dataclass
class SamplingStats:
    """What one rank's sampling of a step did; summed over ranks for the metrics row (``rounds``:
    the maximum). ``correct`` / ``responses``: round 0's responses with reward > 0.5 / all of them,
    before the filter; ``groups_sampled``: groups generated in every round; ``groups_filtered``:
    zero-variance groups the filter dropped (0 without dynamic sampling). With a comparison grader
    (``dataset.compare_grader``): ``compared`` responses graded by both, every round, and those the
    reward alone (``reward_only``) or the comparison alone (``compare_only``) calls correct."""

    rounds: int = 0
    groups_sampled: int = 0
    groups_filtered: int = 0
    correct: int = 0
    responses: int = 0
    compared: int = 0
    reward_only: int = 0
    compare_only: int = 0
    compare_correct: int = 0

    def count_disagreements(self, rewards: list[float], other: list[float]) -> None:
        """Add one graded round: ``rewards`` [n] the training reward's, ``other`` [n] the comparison's."""
        self.compared += len(rewards)
        self.reward_only += sum(r > 0.5 and o <= 0.5 for r, o in zip(rewards, other, strict=True))
        self.compare_only += sum(r <= 0.5 and o > 0.5 for r, o in zip(rewards, other, strict=True))
        self.compare_correct += sum(o > 0.5 for o in other)


@dataclass
class Sampler:
    """What sampling needs that stays fixed for a segment: the cell's config (``algorithm``,
    ``sampling``, ``rollout``, ``seed``), the rollout engine, the tokenizer, the training records,
    the reward function ((responses, answers) -> rewards), the prompt options
    (``prompt_fit.prompt_options``), this process's rank (``rollout.seeding: call``) and an optional
    comparison grader's reward function, counted against the reward on every response, never trained on."""

    cfg: Any
    engine: Any
    tokenizer: Any
    records: list[dict]
    reward_fn: Callable[[list[str], list[Any]], list[float]]
    prompt_kw: dict[str, Any] = field(default_factory=dict)
    rank: int = 0
    compare_fn: Callable[[list[str], list[Any]], list[float]] | None = None


@dataclass
class SampledBatch:
    """One rank's rollouts of one step, whole prompt groups: ``rollouts`` (token ids, texts,
    finished flags; ``group`` = the groups' global ids, positions in the step's prompt list),
    ``records`` {group id: training record}, ``rewards`` [b] (the verifiable reward of each
    response, before any shaping) and what sampling did (``stats``)."""

    rollouts: Rollouts
    records: dict[int, dict]
    rewards: list[float]
    stats: SamplingStats


def sample(sampler: Sampler, *, stream: PromptStream, slots: list[int], step: int) -> SampledBatch:
    """Generate, grade, and (dynamic sampling) refill zero-variance groups; returns whole groups.

    stream: the prompt stream at this step's cursor (not moved here: the caller advances it by the
    rounds of every rank); slots: the positions in the step's block this rank samples, which become
    the (globally unique) group ids of the groups kept, in order.
    """
    from aggbench.prompts import encode_prompts

    cfg, records = sampler.cfg, sampler.records
    a, s = cfg.algorithm, cfg.sampling
    per_step = a.prompts_per_step
    kept, kept_recs, kept_rewards = [], [], []
    stats = SamplingStats()
    block = stream.block(0, per_step)
    pending, keys = [block[j] for j in slots], [("p", j) for j in slots]
    while True:
        recs = [records[i] for i in pending]
        texts = [prompt_fit.prompt_text(cfg, r) for r in recs]
        ids = encode_prompts(sampler.tokenizer, texts, max_tokens=s.max_prompt_tokens, **sampler.prompt_kw)
        roll = generate(sampler, ids, step=step, rounds=stats.rounds, keys=keys)
        answers = [recs[g]["answer"] for g in roll.group]
        if getattr(sampler.reward_fn, "draws", False):  # the random-reward control: seeded per group
            group_seeds = [seeds.random_reward(cfg.seed, step, stats.rounds, key) for key in keys]
            rewards = sampler.reward_fn(roll.texts, answers, draw_seeds=[group_seeds[g] for g in roll.group])
        else:
            rewards = sampler.reward_fn(roll.texts, answers)
        if sampler.compare_fn is not None:
            stats.count_disagreements(rewards, sampler.compare_fn(roll.texts, answers))
        if stats.rounds == 0:
            stats.correct = sum(r > 0.5 for r in rewards)
            stats.responses = len(rewards)
        stats.groups_sampled += len(recs)
        for g in range(len(recs)):
            rows = [i for i in range(len(roll)) if roll.group[i] == g]
            r = [rewards[i] for i in rows]
            if a.dynamic_sampling and min(r) == max(r):
                stats.groups_filtered += 1
                continue
            part = roll.select(rows)
            part.group = [len(kept)] * len(rows)
            kept.append(part)
            kept_recs.append(recs[g])
            kept_rewards.extend(r)
        stats.rounds += 1
        short = len(slots) - len(kept)
        if not a.dynamic_sampling or short <= 0 or stats.rounds > a.dynamic_sampling_max_rounds:
            break
        block = stream.block(stats.rounds, per_step)  # the next unread prompts (point 1)
        pending, keys = [block[j] for j in slots[:short]], [("r", j) for j in slots[:short]]
    if a.dynamic_sampling and len(kept) > len(slots):
        kept, kept_recs = kept[: len(slots)], kept_recs[: len(slots)]
        kept_rewards = kept_rewards[: len(slots) * a.group_size]
    if kept:
        roll, recs, rewards = Rollouts.concat(kept), kept_recs, kept_rewards
    else:  # every group had zero variance even after refills: train on the last draw (no signal)
        stats.groups_filtered -= len(recs)  # (so those were not dropped)
    roll.group = [slots[g] for g in roll.group]
    return SampledBatch(roll, {slots[g]: rec for g, rec in enumerate(recs)}, rewards, stats)


def generate(sampler: Sampler, ids: list[list[int]], *, step: int, rounds: int, keys: list) -> Rollouts:
    """G samples of each prompt (token ids) in one engine call, seeded as ``rollout.seeding`` says;
    ``keys``: each prompt's place in the step, (``"p"``: the step's own / ``"r"``: a refill, slot)."""
    cfg = sampler.cfg
    a, s = cfg.algorithm, cfg.sampling
    seeding = cfg.rollout.seeding
    if seeding == "prompt":  # a function of the prompt's position in the step, not of the rank split
        seed = [seeds.prompt_group(cfg.seed, step, rounds, key) for key in keys]
    elif seeding == "call":
        seed = seeds.rollout_call(cfg.seed, step, rounds, sampler.rank)
    else:
        seed = None
    return sampler.engine.generate(
        ids,
        n=a.group_size,
        temperature=s.temperature,
        top_p=s.top_p,
        max_new_tokens=s.max_new_tokens,
        seed=seed,
        top_k=s.top_k,
    )
