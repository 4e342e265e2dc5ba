"""A comparison grader beside the training reward (``dataset.compare_grader``, issue 28 item 1):
it grades every rollout, is never trained on, and each metrics row counts the responses it and the
reward judge differently, by direction. On the tiny model, the counts are recomputed from the
step's rollouts file (every response of the step is saved, no dynamic sampling, so the file holds
every graded response)."""

from __future__ import annotations

import json

import pytest

from aggbench.config import load_train_config
from aggbench.graders import GRADERS, register_grader
from aggbench.grading.dapo import dapo_verdict
from aggbench.train.loop import train
from aggbench.train.sampling import SamplingStats
from helpers.trainer_support import metrics_rows, write_cell

P, G, STEPS = 4, 4, 2


def _rollouts(run, step):
    return [json.loads(line) for line in (run / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]


def test_disagreements_are_counted_by_direction():
    stats = SamplingStats()
    stats.count_disagreements([1.0, 1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 1.0, 0.0, 0.0])
    stats.count_disagreements([0.0], [1.0])
    assert (stats.compared, stats.reward_only, stats.compare_only) == (6, 2, 2)


@pytest.fixture
def always_right():
    @register_grader(
        "always_right_test", record="answer", reward=lambda responses, answers, pool: [1.0] * len(responses)
    )
    def grade(rows, **_):
        return [{"correct": True, "extracted": None, "reason": "always"} for _ in rows]

    yield "always_right_test"
    GRADERS.remove("always_right_test")


def _run(tmp_path, model, data, compare):
    cell = write_cell(tmp_path / f"{compare}.yaml", model, data, rule="token", steps=STEPS, every=STEPS)
    cfg = load_train_config(
        cell, {"tracking.enabled": False, "rollout.save_rollouts": P * G, "dataset.compare_grader": compare}
    )
    assert cfg.dataset.grader == "tiny" and cfg.dataset.compare_grader == compare
    train(cfg, tmp_path / compare, quiet=True)
    return metrics_rows(tmp_path / compare)


@pytest.mark.slow
def test_compare_grader_counts_match_the_rollouts(tmp_path, tiny_sft_model, tiny_train_data, always_right):
    # dapo beside tiny: recomputed per response with the dapo verdict
    rows = _run(tmp_path, tiny_sft_model, tiny_train_data, "dapo")
    assert len(rows) == STEPS
    for row in rows:
        saved = _rollouts(tmp_path / "dapo", row["step"])
        assert len(saved) == P * G == row["reward/compared"]
        pairs = [(r["reward"] > 0.5, dapo_verdict(r["response"], str(r["answer"])).correct) for r in saved]
        assert row["reward/disagree_reward_only"] == sum(t and not d for t, d in pairs)
        assert row["reward/disagree_compare_only"] == sum(d and not t for t, d in pairs)
        assert row["reward/disagree"] == sum(t != d for t, d in pairs)
        assert row["reward/disagree_frac"] == row["reward/disagree"] / row["reward/compared"]
    # a comparison that calls every response right disagrees exactly on the reward's wrong ones,
    # and training is unchanged by it (the reward, not the comparison, is trained on)
    rows2 = _run(tmp_path, tiny_sft_model, tiny_train_data, always_right)
    wrong = 0
    for row, row_dapo in zip(rows2, rows, strict=True):
        saved = _rollouts(tmp_path / always_right, row["step"])
        n_wrong = sum(r["reward"] <= 0.5 for r in saved)
        wrong += n_wrong
        assert (row["reward/disagree_compare_only"], row["reward/disagree_reward_only"]) == (n_wrong, 0)
        assert row["reward/mean"] == row_dapo["reward/mean"] and row["loss/pg"] == row_dapo["loss/pg"]
    assert wrong > 0, "every response was right: the comparison showed nothing"


def test_no_compare_grader_logs_no_disagreement_keys(tmp_path, tiny_sft_model, tiny_train_data):
    cell = write_cell(tmp_path / "c.yaml", tiny_sft_model, tiny_train_data, rule="token", steps=1, every=1)
    cfg = load_train_config(cell, {"tracking.enabled": False})
    assert cfg.dataset.compare_grader is None
    train(cfg, tmp_path / "run", quiet=True)
    assert not [k for k in metrics_rows(tmp_path / "run")[0] if k.startswith("reward/disagree")]
