"""Balanced Aggregation's default reading (version 2: ``variant: proportional``) under shaped,
non-binary rewards, and the near-zero advantages the estimator now rounds to 0.

The group is the one paper.yaml's DAPO overlong shaping produces (max 3,072 new tokens, buffer
512, factor 1.0): lengths [500, 3000, 400, 600, 3000, 300], shaped rewards [1, 0.141, 0, 0,
-0.859, 0], GRPO advantages with Bessel's std. docs/aggregations.md argues the reading.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from aggbench.aggregation import RuleInstance, make_instance, mask_from_lengths
from aggbench.aggregation.advantages import drgrpo, grpo

LENGTHS = [500, 3000, 400, 600, 3000, 300]
SHAPED = [1.0, 0.141, 0.0, 0.0, -0.859, 0.0]


def _weights(inst, lengths, adv, groups):
    """Per-token effective advantage of each sequence [B] and its total push [B]."""
    mask = mask_from_lengths(lengths)
    eff = inst(mask, adv, torch.tensor(groups))
    per_token = torch.stack(
        [eff[i, 0] if n else torch.tensor(0.0, dtype=eff.dtype) for i, n in enumerate(lengths)]
    )
    return per_token, eff.sum(1)


def test_default_is_proportional_version_2_and_mass_is_named():
    default = make_instance("balanced")
    assert default.params["variant"] == "proportional" and default.spec.version == "2"
    assert make_instance("balanced_mass").params == {**default.params, "variant": "mass"}
    assert make_instance("balanced_batch").params["variant"] == "proportional"


def test_overlong_group_by_hand():
    r = torch.tensor(SHAPED, dtype=torch.float64)
    adv = grpo(r, torch.zeros(6, dtype=torch.long), std="bessel", eps=1e-6)
    # by hand: mean = 0.282 / 6 = 0.047; centred = r - 0.047; Bessel std = sqrt(sum c^2 / 5)
    c = [x - 0.047 for x in SHAPED]
    std = math.sqrt(sum(x * x for x in c) / 5)
    a = [x / (std + 1e-6) for x in c]
    assert adv.tolist() == pytest.approx(a, rel=1e-12)
    # proportional, one group (n_u = 6): token of i in S gets A_i M_S / (6 sum_{j in S} |A_j| |o_j|)
    pos, neg = [0, 1], [2, 3, 4, 5]
    m_pos, m_neg = sum(a[i] for i in pos), -sum(a[i] for i in neg)
    d_pos = sum(a[i] * LENGTHS[i] for i in pos)
    d_neg = -sum(a[i] * LENGTHS[i] for i in neg)
    hand = [a[i] * (m_pos / d_pos if i in pos else m_neg / d_neg) / 6 for i in range(6)]
    per_token, total = _weights(make_instance("balanced"), LENGTHS, adv, [0] * 6)
    assert per_token.tolist() == pytest.approx(hand, rel=1e-12)
    # the clean correct answer is pushed harder than the long, penalised one
    assert total[0].item() == pytest.approx(0.186, abs=5e-4) and total[1].item() == pytest.approx(
        0.110, abs=5e-4
    )
    assert total[:2].sum().item() == pytest.approx(m_pos / 6, rel=1e-12)  # the sign's total M+/n_u
    # version 1's reading, kept as balanced_mass: every S+ token weighs M+/(6 T+), the reverse order
    _, mass_total = _weights(make_instance("balanced_mass"), LENGTHS, adv, [0] * 6)
    assert mass_total[0].item() == pytest.approx(0.042, abs=5e-4)
    assert mass_total[1].item() == pytest.approx(0.253, abs=5e-4)


groups_st = st.lists(
    st.tuples(
        st.lists(st.integers(1, 40), min_size=2, max_size=6),  # lengths of one group
        st.integers(0, 2**31 - 1),  # seed of its non-binary rewards
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=60, deadline=None)
@given(groups_st, st.sampled_from(["group", "batch"]))
def test_each_sign_totals_its_mass_on_random_non_binary_groups(groups, scope):
    lengths, rewards, ids = [], [], []
    for g, (ls, seed) in enumerate(groups):
        gen = torch.Generator().manual_seed(seed)
        lengths += ls
        rewards += torch.rand(len(ls), generator=gen, dtype=torch.float64).tolist()
        ids += [g] * len(ls)
    adv = grpo(torch.tensor(rewards, dtype=torch.float64), torch.tensor(ids))
    inst = RuleInstance("b", "balanced", {"scope": scope})
    _, total = _weights(inst, lengths, adv, ids)
    gid = torch.tensor(ids)
    n_g = len(groups)
    units = [gid == g for g in range(n_g)] if scope == "group" else [torch.ones_like(gid, dtype=torch.bool)]
    for unit in units:
        n_u = int(unit.sum())
        for sign in (adv > 0, adv < 0):
            s = unit & sign
            want = adv[s].abs().sum() / n_u / (n_g if scope == "group" else 1)
            assert total[s].abs().sum().item() == pytest.approx(want.item(), rel=1e-9, abs=1e-15)
            assert torch.all(torch.sign(total[s]) == torch.sign(adv[s]))


@pytest.mark.parametrize("side", [1.0, -1.0])
def test_a_response_weight_goes_to_zero_with_its_advantage(side):
    lengths = [10, 30, 20, 5]
    base = [1.5, -0.7, -0.4, 0.9]
    pushes = []
    for eps in (1e-1, 1e-3, 1e-6):
        adv = torch.tensor([*base[:3], side * eps], dtype=torch.float64)
        _, total = _weights(make_instance("balanced"), lengths, adv, [0] * 4)
        pushes.append(abs(total[3].item()))
    assert pushes[0] > pushes[1] > pushes[2] and pushes[2] < 1e-6
    # version 1's reading: the smallest advantage still gets a whole token share of its sign
    adv = torch.tensor([*base[:3], side * 1e-6], dtype=torch.float64)
    _, mass_total = _weights(make_instance("balanced_mass"), lengths, adv, [0] * 4)
    assert abs(mass_total[3].item()) > 1e-3


@pytest.mark.parametrize(("std", "scale"), [("population", 1.0), ("bessel", None)])
@pytest.mark.parametrize(("g", "k"), [(4, 1), (6, 3), (8, 5), (16, 2)])
def test_binary_groups_give_each_sign_sqrt_k_g_minus_k_over_g(std, scale, g, k):
    lengths = [(7 * i) % 23 + 1 for i in range(g)]
    r = torch.tensor([1.0] * k + [0.0] * (g - k), dtype=torch.float64)
    adv = grpo(r, torch.zeros(g, dtype=torch.long), std=std, eps=0.0)
    _, total = _weights(make_instance("balanced"), lengths, adv, [0] * g)
    want = math.sqrt(k * (g - k)) / g * (scale if scale is not None else math.sqrt((g - 1) / g))
    assert total[:k].sum().item() == pytest.approx(want, rel=1e-12)
    assert -total[k:].sum().item() == pytest.approx(want, rel=1e-12)


def test_rounding_residue_is_zero_advantage():
    one = torch.zeros(6, dtype=torch.long)
    # [0.1] * 6: centred values of 1.4e-17 with a positive std used to give every response a sign
    flat = torch.tensor([0.1] * 6, dtype=torch.float64)
    assert (flat - flat.mean()).abs().max() > 0  # the residue this guards against
    assert torch.equal(grpo(flat, one), torch.zeros(6, dtype=torch.float64))
    assert torch.equal(drgrpo(flat, one), torch.zeros(6, dtype=torch.float64))
    # a reward equal to its group's mean: exactly 0, so no rule gives it the negative sign's weight
    v = [0.844, 0.758, 0.421, 0.259, 0.511]
    r = torch.tensor([*v, sum(v) / 5], dtype=torch.float64)  # the last is the group's mean, 0.5586
    assert (r - r.mean())[5].item() != 0.0  # 1.1e-16 of rounding
    adv = grpo(r, one)
    assert adv[5].item() == 0.0
    _, total = _weights(make_instance("balanced_mass"), [5] * 6, adv, [0] * 6)
    assert total[5].item() == 0.0
    # real differences stay: float32 rewards 1e-4 apart are signal, not residue
    small = torch.tensor([0.5, 0.5001, 0.5, 0.5], dtype=torch.float32)
    assert torch.count_nonzero(grpo(small, one[:4])) == 4
