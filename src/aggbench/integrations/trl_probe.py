"""TRL's own loss on a probe batch: the behaviour check the TRL adapter runs at start.

``trl_gradient`` calls ``GRPOTrainer._compute_loss`` itself (unbound) on a stand-in ``self`` that
carries the attributes it reads, once per micro-batch as the Trainer accumulates, with
``_get_per_token_logps_and_entropies`` returning slices of one leaf tensor of log-probabilities
[B, T] and no ``old_per_token_logps`` (so TRL uses logp.detach(): importance ratio 1); it returns
d(sum of the micro-batch losses)/d(logp) [B, T]. ``check_dapo_normaliser`` uses it to check that
``loss_type="dapo"`` still divides by the generation batch's token count, the meaning the adapter's
advantage scaling relies on (a method-name check cannot see a changed normaliser).
tests/audit/test_audit_trl.py drives every loss type through it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor


def _stand_in(
    trainer_cls: type, loss_type: str, logp: Tensor, micro: list[slice], settings: Mapping[str, Any]
):
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
    current: dict[str, slice] = {}

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
        get_gamma_weights=trainer_cls.get_gamma_weights,  # a staticmethod: TRL's own
    )
    return stub, current


def trl_gradient(
    trainer_cls: type,
    loss_type: str,
    mask: Tensor,
    advantages: Tensor,
    micro: list[slice],
    settings: Mapping[str, Any] | None = None,
) -> Tensor:
    """d(TRL's accumulated loss)/d(logp) [B, T] at ratio 1; mask [B, T] bool, advantages [B]."""
    b, t = mask.shape
    logp = (
        -torch.rand(b, t, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ).requires_grad_()
    stub, current = _stand_in(trainer_cls, loss_type, logp, micro, dict(settings or {}))
    total = torch.zeros((), dtype=torch.float64)
    for s in micro:
        current["slice"] = s
        n = s.stop - s.start
        inputs = {
            "prompt_ids": torch.zeros(n, 1, dtype=torch.long),
            "prompt_mask": torch.ones(n, 1, dtype=torch.long),
            "completion_ids": torch.zeros(n, t, dtype=torch.long),
            "completion_mask": mask[s].to(torch.float64),
            "advantages": advantages[s].to(torch.float64),
            "num_items_in_batch": mask.sum().to(torch.float64),
        }
        total = total + trainer_cls._compute_loss(stub, None, inputs)
    total.backward()
    return logp.grad


def check_dapo_normaliser(trainer_cls: type) -> None:
    """Refuse a TRL whose ``dapo`` loss no longer divides by the generation batch's token count.

    Probe: lengths 1, 3 | 2, 6 in two micro-batches (12 tokens), advantages 1, -1, 1, -1; TRL 1.16
    gives every token the gradient -A / 12.
    """
    import trl

    lengths = torch.tensor([1, 3, 2, 6])
    mask = torch.arange(6)[None, :] < lengths[:, None]
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64)
    try:
        grad = trl_gradient(trainer_cls, "dapo", mask, adv, [slice(0, 2), slice(2, 4)])
    except Exception as exc:  # the private loss no longer has the shape this probe drives
        raise RuntimeError(
            f"aggbench TRL adapter: trl {trl.__version__}'s GRPOTrainer._compute_loss could not be run on the "
            f"behaviour probe ({type(exc).__name__}: {exc}); this TRL release is not supported"
        ) from exc
    expected = torch.where(mask, -adv[:, None] / 12.0, torch.zeros_like(grad))
    if not torch.allclose(grad, expected, rtol=1e-9, atol=1e-12):
        got = float(-grad[0, 0])
        raise RuntimeError(
            f"aggbench TRL adapter: trl {trl.__version__}'s loss_type='dapo' no longer divides by the generation "
            f"batch's token count (probe: a token of weight 1/12 got {got:.6g}); the adapter's advantage "
            "scaling would be wrong, so it refuses this TRL release"
        )
