"""The trainer under dynamic sampling, on the tiny model: every sampling round reads the next block
of the epoch's prompt stream, the stream's cursor is checkpointed, and a run resumed from a
checkpoint reads the same prompts as the uninterrupted run. With two mini-batches, the logged
``agg/token/*`` weights are those each mini-batch's update applied, recomputed here by hand from
the rollouts file (token rule: a sequence's weight is length x |advantage| / tokens of its
mini-batch)."""

from __future__ import annotations

import json

import pytest
import torch

from aggbench.config import load_train_config
from aggbench.data.training import read_training_records
from aggbench.train.batching import PromptStream
from aggbench.train.loop import train
from helpers.trainer_support import metrics_rows, stable, write_cell

P, STEPS = 4, 4


def _rollouts(run, step):
    return [json.loads(line) for line in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_dynamic_sampling_reads_the_stream_on_and_resumes_exactly(tmp_path, tiny_sft_model, tiny_train_data):
    cell = write_cell(
        tmp_path / "cell.yaml",
        tiny_sft_model,
        tiny_train_data,
        rule="token",
        steps=STEPS,
        every=2,
        prompts_per_step=P,
        group_size=2,
        dynamic_sampling=True,
        dynamic_sampling_max_rounds=2,
        mini_batches=2,
    )
    cfg = load_train_config(cell, {"tracking.enabled": False, "rollout.save_rollouts": P * 2})
    train(cfg, tmp_path / "a", quiet=True)
    train(cfg, tmp_path / "b", until_step=2, quiet=True)
    train(cfg, tmp_path / "b", quiet=True)  # resumed from step 2
    a, b = metrics_rows(tmp_path / "a"), metrics_rows(tmp_path / "b")
    assert [stable(r) for r in a] == [stable(r) for r in b]
    for step in range(1, STEPS + 1):
        assert _rollouts(tmp_path / "a", step) == _rollouts(tmp_path / "b", step), step

    # the prompts each step trained on come from the blocks it read, one per sampling round,
    # starting where the previous step stopped (not at (step - 1) * P)
    records = read_training_records(cfg.dataset.path, name=cfg.dataset.name)
    index = {r["id"]: i for i, r in enumerate(records)}
    stream = PromptStream(len(records), cfg.seed)
    for row in a:
        rounds = row["dynamic_sampling/rounds"]
        read = stream.take(stream.cursor, rounds * P)
        used = [index[r["id"]] for r in _rollouts(tmp_path / "a", row["step"])]
        assert set(used) <= set(read), row["step"]
        stream.advance(rounds, P)
        # counted before the filter: every group sampled is trained on or was filtered out
        assert row["groups/sampled"] == row["groups/total"] + row["groups/filtered"], row["step"]
        assert row["groups/filtered"] > 0 or rounds == 1
        assert 0.0 <= row["accuracy_prefilter"] <= 1.0
    assert any(r["dynamic_sampling/rounds"] > 1 for r in a), "no step refilled: the test shows nothing"

    differs = False
    for row in a:
        rows = _rollouts(tmp_path / "a", row["step"])
        groups = sorted({r["group"] for r in rows})
        half = (len(groups) + 1) // 2  # torch.tensor_split of the group ids into 2 mini-batches
        applied, whole = [], [0.0, 0.0]
        total = sum(r["length"] for r in rows)
        parts = [p for p in (groups[:half], groups[half:]) if p]  # (an empty one is no update)
        for part in parts:
            mb = [r for r in rows if r["group"] in part]
            tokens = sum(r["length"] for r in mb)
            pos = sum(r["length"] * abs(r["advantage"]) for r in mb if r["advantage"] > 0) / tokens
            neg = sum(r["length"] * abs(r["advantage"]) for r in mb if r["advantage"] < 0) / tokens
            applied.append((pos, neg))
            whole[0] += sum(r["length"] * r["advantage"] for r in mb if r["advantage"] > 0) / total
            whole[1] -= sum(r["length"] * r["advantage"] for r in mb if r["advantage"] < 0) / total
        pos, neg = (sum(x[0] for x in applied) / len(parts), sum(x[1] for x in applied) / len(parts))
        assert row["agg/token/weight_pos"] == pytest.approx(pos, rel=1e-6), row["step"]
        assert row["agg/token/weight_neg"] == pytest.approx(neg, rel=1e-6), row["step"]
        differs |= abs(pos - whole[0]) > 1e-3 * whole[0]
    assert differs, "the whole batch's weights equal the applied ones in every step: nothing shown"
    state = torch.load(tmp_path / "b" / "checkpoints" / "step_4" / "trainer_state.pt", weights_only=False)
    assert state["prompt_cursor"] == stream.cursor
