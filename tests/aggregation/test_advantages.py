"""Group advantage estimators, and the per-batch diagnostics, on hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from aggbench.aggregation import mask_from_lengths
from aggbench.aggregation.advantages import get_advantage
from aggbench.aggregation.diagnostics import diagnostics, length_stats
from aggbench.registry import RegistryError

R = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
G = torch.tensor([0, 0, 0, 0, 5, 5])


def test_grpo_bessel_and_population():
    # group 0: rewards 1,0,0,0: mean 1/4; deviations 3/4, -1/4 x3; sum of squares 3/4
    # bessel std = sqrt(3/4 / 3) = 1/2 -> A = 3/2, -1/2; population std = sqrt(3/16) = sqrt(3)/4
    a = get_advantage("grpo")(R, G, std="bessel", eps=0.0)
    assert a[:4].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    p = get_advantage("grpo")(R, G, std="population", eps=0.0)
    assert p[:4].tolist() == pytest.approx(
        [0.75 / (math.sqrt(3) / 4), -0.25 / (math.sqrt(3) / 4)] + [-1 / math.sqrt(3)] * 2
    )
    # group 5 has equal rewards: zero advantage (not 0/eps)
    assert a[4:].tolist() == [0.0, 0.0] and p[4:].tolist() == [0.0, 0.0]


def test_drgrpo_is_mean_centred_only():
    a = get_advantage("drgrpo")(R, G)
    assert a.tolist() == pytest.approx([0.75, -0.25, -0.25, -0.25, 0.0, 0.0])


def test_unknown_estimator_and_bad_shapes():
    with pytest.raises(RegistryError, match=r"unknown advantage estimator 'grp'.*Did you mean 'grpo'"):
        get_advantage("grp")
    with pytest.raises(ValueError, match="same length"):
        get_advantage("grpo")(R, G[:3])
    with pytest.raises(ValueError, match="std must be"):
        get_advantage("grpo")(R, G, std="sample")


def test_length_stats_and_diagnostics_by_hand():
    mask = mask_from_lengths([10, 2, 4, 6, 3, 3])
    adv = get_advantage("grpo")(R, G, std="population", eps=0.0)
    s = length_stats(mask, adv, G)
    assert s["len/pos_mean"] == 10 and s["len/neg_mean"] == 4 and s["len/gap"] == 6
    assert s["len/neg_cv"] == pytest.approx(math.sqrt(8 / 3) / 4)  # lengths 2,4,6: std sqrt(8/3), mean 4
    assert s["groups/zero_variance"] == 1 and s["groups/total"] == 2
    d = diagnostics(mask, adv, G)
    # |A+| = (3/4) / (sqrt(3)/4) = sqrt(3), |A-| = 1/sqrt(3).
    # balanced (group scope): each sign sqrt(k(G-k))/G = sqrt(3)/4 in the group with signal, averaged
    # over the 2 groups (the zero group counts): sqrt(3)/8
    assert d["agg/balanced/weight_pos"] == pytest.approx(math.sqrt(3) / 8)
    # sequence (batch scope, N = 6 sequences): w+ = |o_0| * |A+| / (6 |o_0|) = sqrt(3)/6
    assert d["agg/sequence/weight_pos"] == pytest.approx(math.sqrt(3) / 6)
    for name in ("sequence", "balanced"):
        assert d[f"agg/{name}/weight_ratio"] == pytest.approx(1.0)
    # token (batch): w+ / w- = (T+ |A+|) / (T- |A-|) = (10 * 3) / (12 * 1) with |A+| = 3 |A-|
    assert d["agg/token/weight_ratio"] == pytest.approx(30 / 12)
    assert "agg/token/pg_loss" not in d  # only with unit_loss
    d2 = diagnostics(mask, adv, G, unit_loss=torch.ones(mask.shape, dtype=torch.float64))
    assert d2["agg/token/pg_loss"] == pytest.approx(d["agg/token/weight_pos"] + d["agg/token/weight_neg"])
