"""The random-reward negative control (issue 28, item 7): ``controls.random_reward`` adds, per
aggregation, a cell ``<name>-random`` trained on a seeded Bernoulli(p) reward; it trains on the tiny
model (2 steps), its rewards are the seeded draws (the same after a resume), its logged disagreement
with the dataset's real reward is counted, and it is a row of its own in the tables."""

from __future__ import annotations

import json

import pytest

from aggbench.config import load_train_config
from aggbench.grid import cell_train_config, cells, load_experiment, validate_experiment
from aggbench.seeds import random_reward
from aggbench.train.loop import train
from aggbench.train.rewards import RandomReward
from helpers import report_fixtures as rf
from helpers.trainer_support import metrics_rows

from ..report.test_report_versions import _report

SMOKE = "configs/smoke.yaml"


def test_random_reward_is_a_seeded_bernoulli_per_group():
    reward = RandomReward(0.3)
    seeds = [random_reward(0, 1, 0, ("p", j)) for j in range(500) for _ in range(8)]
    draws = reward(["x"] * len(seeds), ["a"] * len(seeds), draw_seeds=seeds)
    assert set(draws) == {0.0, 1.0}
    assert 0.27 < sum(draws) / len(draws) < 0.33  # 4,000 seeded draws of Bernoulli(0.3): 0.30 +- 0.02
    again = reward(["y"] * 16, ["b"] * 16, draw_seeds=seeds[:16])
    assert again == draws[:16]  # a function of the seeds only, not of the responses
    assert reward(["x"] * 8, ["a"] * 8, draw_seeds=seeds[8:16]) == draws[8:16]  # a group alone: the same
    with pytest.raises(ValueError, match="p must be in"):
        RandomReward(1.0)


def test_the_control_cells_and_their_config(tmp_path):
    exp = load_experiment(SMOKE)
    assert not [c for c in cells(exp) if c.aggregation.endswith("-random")]  # off by default
    exp["controls"] = {"random_reward": {"enabled": True, "p": 0.3, "aggregations": ["balanced"]}}
    validate_experiment(exp)
    ids = [c.id for c in cells(exp)]
    assert ids[-1] == "tiny__tiny__balanced-random__s0" and len(ids) == 4
    cfg = cell_train_config(exp, ids[-1])
    assert (cfg.dataset.grader, cfg.dataset.random_p, cfg.dataset.compare_grader) == ("random", 0.3, "tiny")
    assert (cfg.aggregation.rule, cfg.aggregation.params["scope"]) == ("balanced", "group")
    main = cell_train_config(exp, "tiny__tiny__balanced__s0")
    assert (main.dataset.grader, main.dataset.compare_grader) == ("tiny", None)  # unchanged
    exp["controls"]["random_reward"]["p"] = 1.5
    with pytest.raises(Exception, match="random_reward"):
        validate_experiment(exp)
    # random as a dataset's own reward would put coin flips in a main row: refused, the fix named
    exp["controls"]["random_reward"]["p"] = 0.5
    exp["datasets"]["tiny"]["reward"] = "random"
    with pytest.raises(
        Exception, match="datasets.tiny.reward: random is the negative control.*controls.random_reward"
    ):
        validate_experiment(exp)


@pytest.mark.slow
def test_the_control_trains_on_its_draws_and_resumes_them(tmp_path, tiny_sft_model, tiny_train_data):
    from helpers.trainer_support import write_cell

    cell = write_cell(tmp_path / "c.yaml", tiny_sft_model, tiny_train_data, rule="balanced", steps=2, every=1)
    over = {
        "tracking.enabled": False,
        "rollout.save_rollouts": 16,
        "dataset.grader": "random",
        "dataset.random_p": 0.5,
        "dataset.compare_grader": "tiny",
    }
    cfg = load_train_config(cell, over)
    train(cfg, tmp_path / "a", quiet=True)
    train(cfg, tmp_path / "b", until_step=1, quiet=True)
    train(cfg, tmp_path / "b", quiet=True)  # resumed at step 1
    rows = metrics_rows(tmp_path / "a")
    for step in (1, 2):
        saved = [
            json.loads(x)
            for x in (tmp_path / "a" / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
        ]
        resumed = [
            json.loads(x)
            for x in (tmp_path / "b" / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
        ]
        assert [r["reward"] for r in saved] == [r["reward"] for r in resumed]
        # the rewards are the group's seeded draws (the group id is its place in the step)
        for g in sorted({r["group"] for r in saved}):
            got = [r["reward"] for r in saved if r["group"] == g]
            seed = random_reward(cfg.seed, step, 0, ("p", g))
            assert got == RandomReward(0.5)([""] * len(got), [""] * len(got), draw_seeds=[seed] * len(got))
    # the real reward disagrees with the random one: the control is not trained on correctness
    assert sum(r["reward/disagree"] for r in rows) > 0
    assert all(0.0 <= r["reward/compare_accuracy"] <= 1.0 for r in rows)


def test_the_control_is_a_row_of_the_tables(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    evals = dict(rf.EVALS)
    evals[("balanced-random", 0)] = {
        "tiny_test": {4: 0.15, 8: 0.15, 12: 0.20},
        "math500": {4: 0.05, 8: 0.10, 12: 0.05},
    }
    evals = {k: v for k, v in evals.items() if k[0] != "sequence"}  # complete cells only
    controls = {"random_reward": {"enabled": True, "aggregations": ["balanced"]}}
    config = rf.make_grid(tmp_path, evals=evals, controls=controls)
    rows, md = _report(tmp_path, config)
    assert float(rows[("last", "balanced-random", "tiny_test")]["mean"]) == pytest.approx(20.0)
    assert rows[("last", "balanced-random", "tiny_test")]["n_seeds"] == "1"
    # its own row (flagged: seed 1 has no run), never marked best (no bold), beside the rules'
    assert (
        "| balanced-random † | 12 | 20.0 [10.0, 30.0] (n=1) | 5.0 [0.0, 15.0] (n=1) | 12.5 (n=1) | 0.0 (n=1) |"
        in md
    )
    assert rows[("last", "balanced-random", "tiny_test")]["kind"] == "control"
