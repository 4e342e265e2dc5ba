"""The step's last stage (``aggbench.train.step``): ``record(...) -> one metrics.jsonl row``, and
what else a step leaves behind: the sampled rollouts (rollouts/step_N.jsonl) and the progress line.
The row describes the whole batch (every rank's share, gathered to rank 0)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aggbench.aggregation.diagnostics import diagnostics, trained_rule
from aggbench.files import atomic_writer
from aggbench.train import engine_checks
from aggbench.train.engine_checks import EngineStats
from aggbench.train.sampling import SampledBatch, SamplingStats
from aggbench.train.update import UpdateTotals


@dataclass
class RankPart:
    """One rank's share of a step, gathered to rank 0 for the metrics row and the rollouts file:
    rewards, finished flags and lengths (tokens) per response, unit_loss [b, T], rollout rows, what sampling did
    (rounds, groups filtered, accuracy before the filter), and what the rollout engine's checks
    found (None: the engine returns no log-probs)."""

    rewards: list[float]
    finished: list[bool]
    lengths: list[int]
    unit_loss: torch.Tensor
    rollouts: list[dict]
    sampling: SamplingStats
    engine: EngineStats | None = None


@dataclass(frozen=True)
class StepTiming:
    """Wall seconds of the step's stages on rank 0: sampling (generation and grading), and the
    update with the weight push."""

    generate_s: float
    update_s: float


def record(
    *, step: int, parts: list[RankPart], rule: Any, totals: UpdateTotals, timing: StepTiming, lr: float
) -> dict:
    """One metrics row of the whole batch; ``parts``: every rank's share in rank order, the order
    of ``totals.view``; ``lr``: the learning rate the step's updates used.

    ``reward/mean``, ``accuracy`` and the ``len/*``, ``groups/total`` and ``groups/zero_variance``
    statistics describe the batch trained on (after dynamic sampling's filter; ``len/*`` count each
    response's own length, a truncated one's too where the overlong filter takes it out of the loss); what sampling met
    before the filter is ``accuracy_prefilter`` (the step's own prompts, first round),
    ``groups/sampled`` and ``groups/filtered`` (every round). With ``dataset.compare_grader``,
    ``reward/disagree`` counts the responses (every round) that grader and the reward judge
    differently, split by direction (``reward/disagree_reward_only``, ``..._compare_only``). ``agg/*`` are the weights each
    mini-batch's update applied (``aggregation.diagnostics``), the trained rule's also as
    ``train/weight_pos`` ... ``train/pg_loss`` (``diagnostics.trained_rule``).
    """
    upd, t_gen, t_upd = totals, timing.generate_s, timing.update_s
    view = upd.view
    mask, adv, gids = view.mask, view.advantages, view.group_ids
    unit_loss = torch.zeros(mask.shape, dtype=torch.float64)
    at = 0
    for p in parts:
        ul = p.unit_loss
        w = min(ul.shape[1], mask.shape[1])
        unit_loss[at : at + ul.shape[0], :w] = ul[:, :w]
        at += ul.shape[0]
    finished = [f for p in parts for f in p.finished]
    n_upd = max(upd.updates, 1)
    r = torch.tensor([x for p in parts for x in p.rewards], dtype=torch.float64)
    tokens = int(mask.sum())
    row: dict[str, Any] = {"step": step, "time": time.time()}
    row["reward/mean"] = float(r.mean())
    row["accuracy"] = float((r > 0.5).double().mean())
    row["response/truncated_frac"] = 1.0 - sum(finished) / len(finished)
    row["loss/pg"] = upd.pg_loss / n_upd
    row["loss/weight_sq"] = upd.weight_sq / n_upd
    row["loss/kl"] = upd.kl / n_upd
    row["entropy"] = upd.entropy / n_upd
    row["clip_frac"] = upd.clipped / max(upd.tokens, 1.0)
    row["grad_norm"] = upd.grad_norm / n_upd
    row["lr"] = lr
    row["time/generate_s"] = t_gen
    row["time/update_s"] = t_upd
    row["tokens_per_s"] = tokens / max(t_gen + t_upd, 1e-9)
    row["accuracy_prefilter"] = sum(p.sampling.correct for p in parts) / max(
        sum(p.sampling.responses for p in parts), 1
    )
    row["dynamic_sampling/rounds"] = max(p.sampling.rounds for p in parts)
    row["groups/sampled"] = sum(p.sampling.groups_sampled for p in parts)
    row["groups/filtered"] = sum(p.sampling.groups_filtered for p in parts)
    compared = sum(p.sampling.compared for p in parts)
    if compared:  # dataset.compare_grader: how often it and the reward disagree on this step's responses
        reward_only = sum(p.sampling.reward_only for p in parts)
        compare_only = sum(p.sampling.compare_only for p in parts)
        row["reward/compared"] = compared
        row["reward/disagree"] = reward_only + compare_only
        row["reward/disagree_frac"] = (reward_only + compare_only) / compared
        row["reward/disagree_reward_only"] = reward_only  # the reward says right, the comparison wrong
        row["reward/disagree_compare_only"] = compare_only  # the comparison says right, the reward wrong
        # the comparison's accuracy on every response graded (a random-reward control's real accuracy)
        row["reward/compare_accuracy"] = sum(p.sampling.compare_correct for p in parts) / compared
    row.update(engine_checks.merge([p.engine for p in parts]))
    # the responses' own lengths: the overlong filter empties a truncated response's loss-mask row
    lengths = torch.tensor([n for p in parts for n in p.lengths], dtype=torch.long)
    agg = diagnostics(
        mask,
        adv,
        gids,
        instances={rule.name: rule},
        unit_loss=unit_loss,
        minibatches=upd.minibatches,
        lengths=lengths,
    )
    row.update(agg)
    row.update(trained_rule(agg, rule.name))
    return row


def rollout_rows(step: int, sampled: SampledBatch, adv: torch.Tensor, n: int) -> list[dict]:
    """The first ``n`` rollouts of this rank as rollouts/step_N.jsonl rows; adv [b]: their advantages."""
    roll, recs, rewards = sampled.rollouts, sampled.records, sampled.rewards
    rows = []
    for i in range(min(n, len(roll))):
        rec = recs[roll.group[i]]
        rows.append(
            {
                "step": step,
                "group": roll.group[i],
                "id": rec.get("id"),
                "prompt": rec["prompt"],
                "answer": rec["answer"],
                "response": roll.texts[i],
                "length": len(roll.response_ids[i]),
                "finished": roll.finished[i],
                "reward": rewards[i],
                "advantage": float(adv[i]),
            }
        )
    return rows


def save_rollouts(out: Path, step: int, rows: list[dict], n: int) -> None:
    """The first ``n`` of the step's rollout rows (every rank's) in group order (groups are whole
    on one rank)."""
    if n <= 0:
        return
    rows = sorted(rows, key=lambda row: row["group"])[:n]
    with atomic_writer(out / "rollouts" / f"step_{step}.jsonl") as fh:  # whole or the old file
        fh.writelines(json.dumps(row) + "\n" for row in rows)


def progress(steps, quiet: bool, cell: str, *, initial: int, total: int):
    if quiet:
        return steps
    from tqdm.auto import tqdm

    return tqdm(steps, desc=cell, initial=initial, total=total, unit="step", dynamic_ncols=True)


def report(bar, quiet: bool, cell: str, row: dict, total: int) -> None:
    msg = (
        f"reward={row['reward/mean']:.3f} len+={row['len/pos_mean']:.1f} len-={row['len/neg_mean']:.1f} "
        f"pg={row['loss/pg']:.4f} gen={row['time/generate_s']:.1f}s upd={row['time/update_s']:.1f}s"
    )
    if quiet:
        print(f"[{cell}] step {row['step']}/{total} {msg}", flush=True)
    else:
        bar.set_postfix_str(msg)
