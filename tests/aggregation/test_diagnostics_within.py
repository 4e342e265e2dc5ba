"""``len/cv_within`` and ``len/gap_within``: length statistics inside each group, worked by hand.

Difficulty mixed into the pooled sign split: a hard-to-fail prompt with long answers (group 0,
lengths 40+ 40+ 44-) and a hard prompt with short ones (group 1, lengths 10+ 10- 10-):

    pooled:  positive lengths 40, 40, 10 -> 30;  negative 44, 10, 10 -> 64/3;  gap 30 - 64/3 = 26/3 > 0
    within:  group 0: 40 - 44 = -4;  group 1: 10 - 10 = 0;  gap_within = (-4 + 0) / 2 = -2
    CV:      group 0 mean 124/3, deviations -4/3, -4/3, 8/3, population variance 32/9,
             CV = (sqrt(32)/3) / (124/3) = sqrt(32)/124; group 1 CV 0; cv_within = sqrt(32)/248

Inside every prompt a right answer is no longer than a wrong one, yet the pooled gap says right
answers are 8.7 tokens longer: the pooled split reflects which prompts are easy, not how length
relates to correctness, which is why both are logged.
"""

from __future__ import annotations

import math

import pytest
import torch

from aggbench.aggregation import mask_from_lengths
from aggbench.aggregation.diagnostics import diagnostics, length_stats

OLD_KEYS = {"len/mean", "len/cv", "len/pos_mean", "len/pos_cv", "len/neg_mean", "len/neg_cv", "len/gap"}
OLD_KEYS |= {"groups/zero_variance", "groups/total"}


def _stats(lengths, advantages, gids):
    adv = torch.tensor(advantages, dtype=torch.float64)
    return length_stats(mask_from_lengths(lengths), adv, torch.tensor(gids))


def test_pooled_gap_positive_while_every_within_group_gap_is_not():
    out = _stats([40, 40, 44, 10, 10, 10], [0.7, 0.7, -1.4, 1.4, -0.7, -0.7], [0, 0, 0, 1, 1, 1])
    assert out["len/gap"] == pytest.approx(26 / 3)
    assert out["len/gap_within"] == pytest.approx(-2.0)
    assert out["len/cv_within"] == pytest.approx(math.sqrt(32) / 248)
    # pooled CV: lengths 40, 40, 44, 10, 10, 10, mean 77/3; sum of squares 5436 / 6 = 906
    assert out["len/cv"] == pytest.approx(math.sqrt(906 - (77 / 3) ** 2) / (77 / 3))
    assert set(out) == OLD_KEYS | {"len/cv_within", "len/gap_within"}


def test_which_groups_qualify_whatever_the_row_order_and_group_ids():
    """Group 7: lengths 6, 8, all advantages 0: its CV counts (1/7), it has no gap. Group 2: one
    response: neither. Group 5: 3+ 9-: CV 3/6 = 1/2, gap -6. cv_within = (1/7 + 1/2) / 2 = 9/28."""
    out = _stats([9, 6, 5, 3, 8], [-1.0, 0.0, 1.0, 1.0, 0.0], [5, 7, 2, 5, 7])
    assert out["len/cv_within"] == pytest.approx(9 / 28)
    assert out["len/gap_within"] == pytest.approx(-6.0)
    # pooled: positive 5, 3 -> 4; negative 9 -> gap -5
    assert out["len/gap"] == pytest.approx(-5.0)


def test_nan_when_no_group_qualifies():
    # one response per group: no CV inside a group, no group with both signs
    out = _stats([4, 6], [1.0, -1.0], [0, 1])
    assert math.isnan(out["len/cv_within"]) and math.isnan(out["len/gap_within"])
    assert out["len/gap"] == -2.0  # the pooled gap still exists
    # a group of one sign only has a CV but no gap; an all-empty group has no CV (mean length 0)
    out = _stats([2, 6, 0, 0], [1.0, 1.0, -1.0, -1.0], [0, 0, 1, 1])
    assert out["len/cv_within"] == pytest.approx(0.5)
    assert math.isnan(out["len/gap_within"])


def test_logged_with_every_step_diagnostics():
    mask = mask_from_lengths([40, 40, 44, 10, 10, 10])
    adv = torch.tensor([0.7, 0.7, -1.4, 1.4, -0.7, -0.7], dtype=torch.float32)
    d = diagnostics(mask, adv, torch.tensor([0, 0, 0, 1, 1, 1]))
    assert d["len/gap_within"] == pytest.approx(-2.0)
    assert d["len/cv_within"] == pytest.approx(math.sqrt(32) / 248)
