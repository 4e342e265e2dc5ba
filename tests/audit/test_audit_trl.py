"""``aggbench audit --trl-loss-type X``'s weights are the gradient of TRL's own loss, for every X.

TRL 1.16 has no standalone loss function: the aggregation is inside ``GRPOTrainer._compute_loss``.
This test calls that method itself (unbound) on a stand-in ``self`` (``aggbench.integrations.trl_probe``,
the adapter's start-up check), once per micro-batch the way the Trainer accumulates, and compares
d(sum of the losses)/d(logp) with ``-w * A`` where ``w`` are the audit's weights, at ratio 1.
The set of loss types is read from TRL's source, so a new TRL mode fails the coverage test.
"""

from __future__ import annotations

import inspect
import re

import pytest
import torch

from aggbench.aggregation.explain import make_batch
from aggbench.audit import audit, get_mode, micro_slices, mode_names
from aggbench.integrations import trl_probe as probe

trl_trainer = pytest.importorskip("trl.trainer.grpo_trainer")
GRPOTrainer = trl_trainer.GRPOTrainer

LENGTHS = [3, 17, 1, 12, 5, 9, 2, 11]
REWARDS = [1, 0, 0, 1, 1, 1, 0, 0]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]
WIDTH = 20


def trl_loss_types() -> set[str]:
    """Every loss_type string literal ``_compute_loss`` compares with (TRL's own list of modes)."""
    src = inspect.getsource(GRPOTrainer._compute_loss)
    found = set(re.findall(r'loss_type == "([a-z_]+)"', src))
    for group in re.findall(r"loss_type in \[([^\]]+)\]", src):
        found |= set(re.findall(r'"([a-z_]+)"', group))
    return found


def test_every_trl_loss_type_has_a_mode():
    assert trl_loss_types() == set(mode_names("trl"))


def trl_gradient(loss_type: str, batch, micro: list[slice], **settings) -> torch.Tensor:
    """d(TRL's accumulated loss)/d(logp) [B, T] over the micro-batches (TRL's own _compute_loss)."""
    mask, adv, _ = batch.tensors()
    return probe.trl_gradient(GRPOTrainer, loss_type, mask, adv, micro, settings)


CASES = [
    (lt, mb, settings)
    for lt in sorted(mode_names("trl"))
    for mb in (None, 2)
    for settings in ([{}, {"epsilon_high": 5.0}] if lt == "cispo" else [{}])
] + [("dr_grpo", 4, {"max_completion_length": 64})]


@pytest.mark.parametrize(("loss_type", "micro_batch_size", "settings"), CASES)
def test_audit_weights_are_the_gradient_of_trls_own_loss(loss_type, micro_batch_size, settings):
    batch = make_batch(LENGTHS, REWARDS, GROUPS, max_length=WIDTH)
    report = audit(batch, get_mode("trl", loss_type), micro_batch_size=micro_batch_size, settings=settings)
    micro = micro_slices(len(LENGTHS), micro_batch_size)
    grad = trl_gradient(loss_type, batch, micro, **settings)
    mask, adv, _ = batch.tensors()
    expected = torch.zeros_like(grad)
    for i, w in enumerate(report.weights):
        expected[i, : len(w)] = -torch.tensor(w, dtype=torch.float64) * adv[i]
    assert torch.allclose(grad, expected, rtol=1e-10, atol=1e-15), (loss_type, (grad - expected).abs().max())
    assert bool((grad[~mask] == 0).all())  # padding gets nothing from TRL either
