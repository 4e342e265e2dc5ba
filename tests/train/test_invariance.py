"""TRL-style invariance on replayed, fixed rollouts in float64.

micro-batch 1 x accumulation 8 == micro-batch 8 x accumulation 1 (and 3 x uneven): the same loss
and the same raw gradients before clipping, for every built-in rule and with KL and entropy on.
"""

from __future__ import annotations

import pytest
import torch

from aggbench.aggregation import builtin_instances
from aggbench.train.batching import pack
from aggbench.train.scoring import ScoredBatch
from aggbench.train.update import LossSettings, MiniBatch, accumulate_gradients, minibatch_weights
from helpers.dp_fixture import fixed_batch, tiny_model


def _run(micro: int, rule) -> tuple[float, list[torch.Tensor]]:
    model = tiny_model()
    roll, adv, old = fixed_batch()
    roll = roll.select(list(range(8)))  # 2 groups x 4 = 8 sequences
    adv, old = adv[:8], old[:8]
    batch = pack(roll, pad_id=0)
    gids = torch.tensor(roll.group)
    ref = old + 0.05
    settings = LossSettings(kl_coef=0.1, entropy_coef=0.01, dual_clip=3.0, micro_batch_size=micro)
    eff, aux_w = minibatch_weights(rule, batch.response_mask, adv, gids, "token-mean")
    rows = torch.arange(8)
    scored = ScoredBatch(batch, batch.response_mask, adv, gids)
    stats = accumulate_gradients(model, scored, MiniBatch.whole(rows, eff, aux_w), settings, old=old, ref=ref)
    total = stats["pg_loss"] + 0.1 * stats["kl"] - 0.01 * stats["entropy"]
    return total, [p.grad.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("name", list(builtin_instances()))
def test_microbatch_1x8_equals_8x1(name):
    rule = builtin_instances()[name]
    loss8, g8 = _run(8, rule)
    for micro in (1, 3):
        loss, g = _run(micro, rule)
        assert loss == pytest.approx(loss8, rel=1e-12, abs=1e-14)
        for a, b in zip(g, g8, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-13)
