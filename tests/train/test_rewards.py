"""The training reward (aggbench.train.rewards.RewardFn) on real DAPO-format rows and on hostile responses.

The math reward is the evaluation grader behind a pool of killable workers; these tests call the
reward itself, as the training loop does (tests/grading/ covers the grader in depth)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from aggbench.train.rewards import RewardFn


def _dapo_rows(shared_data: Path, n: int) -> list[tuple[str, str]]:
    path = shared_data / "train" / "dapo17k" / "dapo_repo_eval_aime-2024_dapo_format.jsonl"
    rows, seen = [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        gold = r["reward_model"]["ground_truth"]
        if gold not in seen:  # distinct answers, so another row's answer is really wrong
            seen.add(gold)
            rows.append((r["extra_info"]["index"], gold))
        if len(rows) == n:
            return rows
    raise AssertionError(f"{path} has fewer than {n} distinct answers")


def test_math_reward_on_real_rows_accepts_other_forms_and_rejects_other_answers(shared_data):
    rows = _dapo_rows(shared_data, 12)
    golds = [g for _i, g in rows]
    right = [f"... so we get\nAnswer: {g}" for g in golds]  # DAPO's answer line
    boxed = [f"Thus the answer is $\\boxed{{{int(g):03d}}}$." for g in golds]  # zero-padded AIME form
    wrong = [f"Answer: {golds[(k + 1) % len(golds)]}" for k in range(len(golds))]  # the next row's
    reward = RewardFn("math", workers=2, timeout_s=10.0)
    try:
        assert reward(right, golds) == [1.0] * len(golds)
        assert reward(boxed, golds) == [1.0] * len(golds)
        assert reward(wrong, golds) == [0.0] * len(golds)
    finally:
        reward.close()


def test_math_reward_grades_hostile_responses_wrong_within_a_bounded_time():
    hostile = ["\\boxed{" + "1+" * 50_000 + "1}", "\\boxed{}" * 12_500, "\\boxed{10^{10^{10}}}"]
    assert len(hostile[0]) > 100_000 and len(hostile[1]) == 100_000  # 100k characters of box spam
    reward = RewardFn("math", workers=2, timeout_s=3.0)
    try:
        assert reward(["\\boxed{7}"], ["7"]) == [1.0]  # workers started
        t0 = time.monotonic()
        out = reward([*hostile, "Answer: 7"], ["1"] * len(hostile) + ["7"])
        elapsed = time.monotonic() - t0
        assert out == [0.0, 0.0, 0.0, 1.0]  # the step's other responses are still graded
        assert elapsed < 15, elapsed
    finally:
        reward.close()


def test_tiny_reward_is_exact_match_and_unknown_grader_is_refused():
    assert RewardFn("tiny")(["\\boxed{abc}", "\\boxed{abd}"], ["abc", "abc"]) == [1.0, 0.0]
    try:
        RewardFn("maths")
    except ValueError as exc:
        assert "valid: 'tiny', 'math'" in str(exc)
    else:
        raise AssertionError("an unknown grader was accepted")
