"""Metrics against hand-computed values (the arithmetic is written next to each number)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from aggbench.evaluation.metrics import avg_at_k, bootstrap_ci, maj_at_k, pass_at_k, pass_at_k_mean, summarize


def test_avg_at_k_small_matrix() -> None:
    correct = [[1, 0, 1, 1], [0, 0, 0, 1], [1, 1, 1, 1]]
    # (3 + 1 + 4) correct of 12 samples = 8/12
    assert avg_at_k(correct) == pytest.approx(8 / 12)
    assert avg_at_k(np.array(correct, dtype=bool)) == pytest.approx(8 / 12)
    with pytest.raises(ValueError, match="0/1"):
        avg_at_k([[0.5, 1.0]])
    with pytest.raises(ValueError, match=r"\[P, k\]"):
        avg_at_k([1, 0, 1])


def test_pass_at_k_hand_values() -> None:
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)  # 1 - C(3,1)/C(5,1) = 1 - 3/5
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(10, 3, 5) == pytest.approx(11 / 12)  # 1 - C(7,5)/C(10,5) = 1 - 21/252
    assert pass_at_k(5, 0, 3) == 0.0  # no correct sample
    assert pass_at_k(5, 4, 2) == 1.0  # n - c = 1 < k = 2: every 2-subset holds a correct one
    assert pass_at_k(5, 5, 5) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)
    with pytest.raises(ValueError):
        pass_at_k(5, 2, 6)


def test_pass_at_k_stable_for_large_n() -> None:
    # exact rational value from integer binomials, independent of the product form
    exact = 1 - Fraction(math.comb(1000 - 7, 100), math.comb(1000, 100))
    assert pass_at_k(1000, 7, 100) == pytest.approx(float(exact), rel=1e-12)
    assert pass_at_k(1000, 1, 1) == pytest.approx(0.001)  # 1 - 999/1000


def test_pass_at_k_mean() -> None:
    # problem 1: c=2 of n=5 -> pass@1 = 0.4; problem 2: c=0 -> 0; mean 0.2
    assert pass_at_k_mean([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], 1) == pytest.approx(0.2)


def test_maj_at_k_votes_and_ties() -> None:
    answers = [
        ["a", "b", "a", None],  # a has 2 votes -> a
        ["x", "y", None, None],  # x, y tie 1-1 -> x (appears first)
        [None, None, None, None],  # nothing extracted -> scores 0
        ["b", "a", "b", "a"],  # b, a tie 2-2 -> b (appears first)
        ["z", None, None, None],  # None never wins, even with 3 "votes" -> z
    ]
    truth = [{"a": True, "b": False}, {"x": False, "y": True}, {}, {"b": True, "a": False}, {"z": True}]
    # correct winners: problems 0, 3, 4 -> 3/5
    assert maj_at_k(answers, truth) == pytest.approx(3 / 5)
    # an empty or blank answer (\boxed{}) is no answer either: "7" wins against two of them
    assert maj_at_k([["", " ", "7"], ["", "", ""]], [{"7": True, "": False, " ": False}, {"": True}]) == 0.5
    assert maj_at_k(answers, lambda p, a: truth[p][a]) == pytest.approx(3 / 5)
    # first 1 sample only: winners a (T), x (F), none (0), b (T), z (T) -> 3/5
    assert maj_at_k(answers, truth, k=1) == pytest.approx(3 / 5)
    # first 2: a/b tie -> a (T); x/y tie -> x (F); none; b/a tie -> b (T); z (T) -> 3/5
    assert maj_at_k(answers, truth, k=2) == pytest.approx(3 / 5)
    # with problem 0's truth flipped, a still wins on 4 samples but is now wrong -> 2/5
    flipped = [{"a": False, "b": True}, *truth[1:]]
    assert maj_at_k(answers, flipped) == pytest.approx(2 / 5)
    # ... while on its first 2 samples the a/b tie still goes to a (first seen) -> 2/5 as well,
    # and reversing the sample order makes b the first seen -> b wins -> 3/5
    assert maj_at_k(answers, flipped, k=2) == pytest.approx(2 / 5)
    assert maj_at_k([["b", "a"], *answers[1:]], flipped) == pytest.approx(3 / 5)


def test_bootstrap_ci_known_cases() -> None:
    assert bootstrap_ci(np.ones(50)) == (1.0, 1.0)
    assert bootstrap_ci(np.full(30, 0.25)) == (0.25, 0.25)
    rng = np.random.default_rng(123)
    scores = rng.permutation(np.r_[np.ones(200), np.zeros(200)])  # a 50/50 sample of 400 problems
    lo, hi = bootstrap_ci(scores, n_boot=2000, seed=0)
    assert lo < 0.5 < hi
    # normal approximation: 2 * 1.96 * sqrt(0.25 / 400) = 0.098
    assert hi - lo == pytest.approx(2 * 1.96 * math.sqrt(0.25 / 400), abs=0.012)
    assert bootstrap_ci(scores, n_boot=2000, seed=0) == (lo, hi)  # deterministic per seed
    lo90, hi90 = bootstrap_ci(scores, n_boot=2000, alpha=0.10, seed=0)
    assert lo <= lo90 and hi90 <= hi  # a 90% interval sits inside the 95% one
    with pytest.raises(ValueError):
        bootstrap_ci([])


def _graded() -> list[dict]:
    p1 = zip([1, 0, 1, 1], ["5", "4", "5", "5"], strict=True)
    p2 = zip([0, 0, 0, 1], ["3", "2", "3", "7"], strict=True)
    return [{"id": "p1", "correct": bool(c), "extracted": a} for c, a in p1] + [
        {"id": "p2", "correct": bool(c), "extracted": a} for c, a in p2
    ]


def test_summarize_hand_values() -> None:
    out = summarize(_graded())
    assert (out["n_problems"], out["n_samples"]) == (2, 4)
    assert set(out) == {"n_problems", "n_samples"} | {
        f"{m}{s}" for m in ("avg@4", "pass@1", "pass@2", "pass@4", "maj@4") for s in ("", "_ci")
    }
    assert out["avg@4"] == pytest.approx(0.5)  # (3 + 1) / 8
    assert out["pass@1"] == pytest.approx(0.5)  # (3/4 + 1/4) / 2
    # p1: n-c = 1 < 2 -> 1; p2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; mean 0.75
    assert out["pass@2"] == pytest.approx(0.75)
    assert out["pass@4"] == pytest.approx(1.0)  # both problems have a correct sample
    assert out["maj@4"] == pytest.approx(0.5)  # p1 votes "5" (right), p2 votes "3" (wrong)
    for metric in ("avg@4", "pass@2", "maj@4"):
        lo, hi = out[f"{metric}_ci"]
        assert lo <= out[metric] <= hi
    # with 2 problems the bootstrap means lie in {p1, mid, p2}: maj@4 per problem is 1 and 0
    assert out["maj@4_ci"] == [0.0, 1.0]


def test_summarize_spec_metrics_and_errors() -> None:
    out = summarize(_graded(), metrics=["avg@2", "pass@1"])
    assert out["avg@2"] == pytest.approx(0.25)  # first 2 samples: p1 [1, 0], p2 [0, 0] -> 1/4
    assert "maj@4" not in out
    no_answers = [{k: v for k, v in r.items() if k != "extracted"} for r in _graded()]
    assert "maj@4" not in summarize(no_answers)
    with pytest.raises(ValueError, match="same number of samples"):
        summarize(_graded()[:-1])
    bad = _graded()
    bad[1] = {**bad[1], "extracted": "5"}  # "5" now graded both correct and wrong in p1
    with pytest.raises(ValueError, match="graded both correct and wrong"):
        summarize(bad, metrics=["maj@4"])
    with pytest.raises(ValueError, match="k <= the 4 samples"):
        summarize(_graded(), metrics=["pass@8"])
