"""The ``agg/*`` diagnostics are the weights each mini-batch's update applied, not the whole batch's.

A batch-scoped rule (``token``: c = 1 / tokens of the mini-batch) weights a mini-batch on its own,
so with several mini-batches its applied weights are not its rows of the whole batch's weights.
Hand-worked: two groups, each one right (+1) and one wrong (-1) answer (population std, eps 0),
lengths 2, 4 (group 0) and 6, 8 (group 1), one group per mini-batch.

    token, mini-batch 0: c = 1/6,  w+ = 2/6,  w- = 4/6
    token, mini-batch 1: c = 1/14, w+ = 6/14, w- = 8/14
    applied (mean over the two updates): w+ = (1/3 + 3/7) / 2 = 8/21, w- = (2/3 + 4/7) / 2 = 13/21
    whole batch (what was logged before): c = 1/20, w+ = 8/20, w- = 12/20

``balanced_batch`` (batch scope, k/G weights per sign over the mini-batch, token mean inside a
sign): each mini-batch holds 1 positive and 1 negative sequence, so each sign gets 1/2 in each
update, whatever the lengths: w+ = w- = 1/2 applied, and on the whole batch also 2/4 = 1/2 per sign
(so it pins down that the per-update values are averaged, not summed: the sum would be 1).
"""

from __future__ import annotations

import math

import pytest
import torch

from aggbench.aggregation import mask_from_lengths
from aggbench.aggregation.advantages import get_advantage
from aggbench.aggregation.diagnostics import diagnostics

LENGTHS = [2, 4, 6, 8]
REWARDS = torch.tensor([1.0, 0.0, 1.0, 0.0], dtype=torch.float64)
GIDS = torch.tensor([0, 0, 1, 1])
MINIBATCHES = [torch.tensor([0, 1]), torch.tensor([2, 3])]


def _batch():
    adv = get_advantage("grpo")(REWARDS, GIDS, std="population", eps=0.0)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0])
    return mask_from_lengths(LENGTHS), adv


def test_batch_scoped_rule_logs_the_weights_each_minibatch_applied():
    mask, adv = _batch()
    d = diagnostics(mask, adv, GIDS, minibatches=MINIBATCHES)
    assert d["agg/token/weight_pos"] == pytest.approx(8 / 21)
    assert d["agg/token/weight_neg"] == pytest.approx(13 / 21)
    assert d["agg/token/weight_ratio"] == pytest.approx(8 / 13)
    assert d["agg/balanced_batch/weight_pos"] == pytest.approx(0.5)
    assert d["agg/balanced_batch/weight_neg"] == pytest.approx(0.5)
    whole = diagnostics(mask, adv, GIDS)  # one mini-batch: the whole batch's weights, as before
    assert whole["agg/token/weight_pos"] == pytest.approx(8 / 20)
    assert whole["agg/token/weight_neg"] == pytest.approx(12 / 20)
    # pg_loss at unit loss 1 per token is the applied |weight| mass per update: (1 + 1) / 2
    d = diagnostics(
        mask, adv, GIDS, minibatches=MINIBATCHES, unit_loss=torch.ones(mask.shape, dtype=torch.float64)
    )
    assert d["agg/token/pg_loss"] == pytest.approx(1.0)
    # length statistics stay those of the whole batch
    assert d["len/mean"] == 5.0 and d["groups/total"] == 2 and not math.isnan(d["len/gap"])


def test_step_metrics_use_the_minibatches_of_the_update():
    """The trainer's metrics row takes the mini-batches the update ran (``UpdateTotals``)."""
    from aggbench.aggregation import make_instance
    from aggbench.train.global_batch import GlobalView
    from aggbench.train.sampling import SamplingStats
    from aggbench.train.step_log import RankPart, StepTiming, record
    from aggbench.train.update import UpdateTotals

    mask, adv = _batch()
    view = GlobalView(mask=mask, advantages=adv, group_ids=GIDS, offset=0, count=4)
    zeros = torch.zeros(mask.shape, dtype=torch.float64)
    upd = UpdateTotals(0.0, 0.0, 0.0, 0.0, 20.0, 0.0, 2, zeros, view, zeros.float(), minibatches=MINIBATCHES)
    part = RankPart(
        REWARDS.tolist(), [True] * 4, [int(n) for n in mask.sum(1)], zeros, [], SamplingStats(1, 2, 0, 2, 4)
    )

    rule = make_instance("token", "token", None)
    row = record(step=1, parts=[part], rule=rule, totals=upd, timing=StepTiming(0.0, 0.0), lr=1e-3)
    assert row["agg/token/weight_pos"] == pytest.approx(8 / 21)
    assert row["agg/token/weight_neg"] == pytest.approx(13 / 21)
