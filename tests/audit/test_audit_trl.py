"""``aggbench audit --trl-loss-type X``'s weights are the gradient of TRL's own loss, for every X.

TRL 1.16 has no standalone loss function: the aggregation is inside ``GRPOTrainer._compute_loss``.
This test calls that method itself (unbound) on a stand-in ``self`` that carries the attributes it
reads, with ``_get_per_token_logps_and_entropies`` returning slices of one leaf tensor of
log-probabilities [B, T], once per micro-batch the way the Trainer accumulates (the loss of each
call divided as TRL divides it), and compares d(sum of the losses)/d(logp) with ``-w * A`` where
``w`` are the audit's weights. old_per_token_logps is absent, so TRL uses logp.detach(): ratio 1.
The set of loss types is read from TRL's source, so a new TRL mode fails the coverage test.
"""

from __future__ import annotations

import inspect
import re
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from aggbench.aggregation.explain import make_batch
from aggbench.audit import audit, get_mode, micro_slices, mode_names

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


def _stand_in(loss_type: str, logp: torch.Tensor, micro: list[slice], **settings):
    eps = settings.get("epsilon", 0.2)
    eps_high = settings.get("epsilon_high")
    args = SimpleNamespace(
        delta=None,
        sapo_temperature_pos=1.0,
        sapo_temperature_neg=1.05,
        vespo_k_pos=2.0,
        vespo_lambda_pos=3.0,
        vespo_k_neg=3.0,
        vespo_lambda_neg=2.0,
        use_bias_correction_kl=False,
        steps_per_generation=len(micro),
    )
    current = {}

    def logps(model, input_ids, attention_mask, logits_to_keep, **_):
        s = current["slice"]
        return logp[s], torch.zeros_like(logp[s]), None

    stub = SimpleNamespace(
        args=args,
        loss_type=loss_type,
        importance_sampling_level="sequence" if loss_type == "luspo" else "token",
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        beta=0.0,
        epsilon_low=eps,
        epsilon_high=eps_high if eps_high is not None else eps,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=len(micro),
        accelerator=SimpleNamespace(num_processes=1, gather=lambda t: t, reduce=lambda t, reduction="sum": t),
        max_completion_length=settings.get("max_completion_length", 512),
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        entropy_coef=0.0,
        use_adaptive_entropy=False,
        _metrics=defaultdict(lambda: defaultdict(list)),
        _get_per_token_logps_and_entropies=logps,
        get_gamma_weights=GRPOTrainer.get_gamma_weights,  # a staticmethod: TRL's own
    )
    return stub, current


def trl_gradient(loss_type: str, batch, micro: list[slice], **settings) -> torch.Tensor:
    """d(TRL's accumulated loss)/d(logp) [B, T] over the micro-batches."""
    mask, adv, _ = batch.tensors()
    b, t = mask.shape
    logp = (
        -torch.rand(b, t, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ).requires_grad_()
    stub, current = _stand_in(loss_type, logp, micro, **settings)
    total = torch.zeros((), dtype=torch.float64)
    for s in micro:
        current["slice"] = s
        n = s.stop - s.start
        inputs = {
            "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
            "prompt_mask": torch.ones(n, 1, dtype=torch.long),
            "completion_ids": torch.zeros(n, t, dtype=torch.long),
            "completion_mask": mask[s].to(torch.float64),
            "advantages": adv[s],
            "num_items_in_batch": mask.sum().to(torch.float64),
        }
        total = total + GRPOTrainer._compute_loss(stub, None, inputs)
    total.backward()
    return logp.grad


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
