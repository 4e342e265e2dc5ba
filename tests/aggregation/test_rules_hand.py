"""One hand-computed example per rule; the arithmetic is in the comments.

Batch A (one group, G = 3): lengths |o| = [2, 4, 3] (9 tokens), advantages A = [2, -1, -1].
Batch B (two groups {0,1}, {2,3}): lengths [2, 4, 1, 3] (10 tokens), A = [1, -1, 1, -1].
Batch C (non-binary, one group): lengths [2, 4, 3], A = [3, -1, -2].
"""

from __future__ import annotations

import pytest
import torch

from aggbench.aggregation import RuleInstance, mask_from_lengths


def run(rule, lengths, adv, groups, **params):
    mask = mask_from_lengths(lengths)
    eff = RuleInstance("t", rule, params)(mask, torch.tensor(adv, dtype=torch.float64), torch.tensor(groups))
    # every token of a sequence carries the same effective advantage: return one value per sequence
    per_seq = [float(eff[i, 0]) if lengths[i] else 0.0 for i in range(len(lengths))]
    for i, n in enumerate(lengths):
        assert torch.all(eff[i, :n] == eff[i, 0]) and torch.all(eff[i, n:] == 0)
    return per_seq


A = ([2, 4, 3], [2.0, -1.0, -1.0], [0, 0, 0])
B = ([2, 4, 1, 3], [1.0, -1.0, 1.0, -1.0], [0, 0, 1, 1])
C = ([2, 4, 3], [3.0, -1.0, -2.0], [0, 0, 0])


def approx(xs):
    return pytest.approx(xs, rel=1e-12, abs=1e-15)


def test_token():
    # c = 1/9 for every token: eff = A/9
    assert run("token", *A) == approx([2 / 9, -1 / 9, -1 / 9])
    # batch B, batch scope: c = 1/10
    assert run("token", *B) == approx([1 / 10, -1 / 10, 1 / 10, -1 / 10])
    # group scope: group 0 has 6 tokens, group 1 has 4; averaged over 2 groups: 1/12 and 1/8
    assert run("token", *B, scope="group") == approx([1 / 12, -1 / 12, 1 / 8, -1 / 8])


def test_sequence():
    # c_i = 1/(N |o_i|) = 1/6, 1/12, 1/9: eff = [2/6, -1/12, -1/9]
    assert run("sequence", *A) == approx([1 / 3, -1 / 12, -1 / 9])
    # group scope on B: 1/(2 groups * 2 per group * |o_i|)
    assert run("sequence", *B, scope="group") == approx([1 / 8, -1 / 16, 1 / 4, -1 / 12])


def test_seq_sum():
    # c = 1/N = 1/3
    assert run("seq_sum", *A) == approx([2 / 3, -1 / 3, -1 / 3])


def test_constant():
    # c = 1/(N * L_max) = 1/(3 * 5) = 1/15
    assert run("constant", *A, max_length=5) == approx([2 / 15, -1 / 15, -1 / 15])
    # max_length=None uses the padded width T = 4: 1/12
    assert run("constant", *A) == approx([2 / 12, -1 / 12, -1 / 12])


def test_balanced_binary_group_scope():
    # S+ = {0}: k/G = 1/3, token mean over T+ = 2, A+ = 2 -> mass reading: M+/(G T+) = 2/(3*2) = 1/3
    # S- = {1, 2}: M- = 2, T- = 7 -> -2/(3*7) = -2/21. Each sign's total weight: 2/3 (= sequence's)
    for variant in ("mass", "proportional", "count"):
        assert run("balanced", *A, variant=variant) == approx([1 / 3, -2 / 21, -2 / 21]), variant


def test_balanced_batch_scope_vs_group_scope():
    # batch scope on B: N = 4; S+ = {0, 2}: M+ = 2, T+ = 3 -> 2/(4*3) = 1/6; S- = {1, 3}: M- = 2, T- = 7 -> -1/14
    assert run("balanced", *B, scope="batch") == approx([1 / 6, -1 / 14, 1 / 6, -1 / 14])
    # group scope: group 0: +1/(2*2), -1/(2*4); group 1: +1/(2*1), -1/(2*3); each halved (2 groups)
    assert run("balanced", *B, scope="group") == approx([1 / 8, -1 / 16, 1 / 4, -1 / 12])


def test_balanced_non_binary_variants():
    # C: S+ = {0}: M+ = 3, T+ = 2; S- = {1, 2}: M- = 3, T- = 7, sum |A_j||o_j| over S- = 1*4 + 2*3 = 10
    # mass: +3/(3*2) = 1/2; every S- token -3/(3*7) = -1/7 (negative total 7 * 1/7 = 1 = M-/G)
    assert run("balanced", *C, variant="mass") == approx([1 / 2, -1 / 7, -1 / 7])
    # proportional: A_i * M_S / (G * 10): -1*3/30 = -1/10, -2*3/30 = -1/5 (total 4/10 + 3/5 = 1)
    assert run("balanced", *C, variant="proportional") == approx([1 / 2, -1 / 10, -1 / 5])
    # count: A_i * |S| / (G * T_S): -1*2/21, -2*2/21; positive 3*1/(3*2) = 1/2
    assert run("balanced", *C, variant="count") == approx([1 / 2, -2 / 21, -4 / 21])


def test_zero_groups_in_denominators():
    # B plus a zero group {4, 5} of lengths 5, 5 (A = 0): 20 tokens, 6 sequences, 3 groups
    lengths, adv, groups = [2, 4, 1, 3, 5, 5], [1.0, -1.0, 1.0, -1.0, 0.0, 0.0], [0, 0, 1, 1, 2, 2]
    assert run("token", lengths, adv, groups)[:4] == approx([1 / 20, -1 / 20, 1 / 20, -1 / 20])
    assert run("token", lengths, adv, groups, include_zero_groups=False)[:4] == approx([0.1, -0.1, 0.1, -0.1])
    # sequence: N = 6 vs 4
    assert run("sequence", lengths, adv, groups)[:2] == approx([1 / 12, -1 / 24])
    assert run("sequence", lengths, adv, groups, include_zero_groups=False)[:2] == approx([1 / 8, -1 / 16])
    # balanced group scope: 3 groups vs 2 in the average
    assert run("balanced", lengths, adv, groups)[:2] == approx([1 / 12, -1 / 24])
    assert run("balanced", lengths, adv, groups, include_zero_groups=False)[:2] == approx([1 / 8, -1 / 16])
