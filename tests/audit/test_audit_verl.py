"""``aggbench audit --verl-loss-agg-mode X``'s weights are the gradient of verl's own loss, for every X.

verl 0.9.1's policy loss ``compute_policy_loss_vanilla`` (with an ``ActorConfig`` whose
``global_batch_info`` carries what the v1 trainer puts there: the mini-batch's token count and row
count, dp_size 1, and ``loss_scale_factor``) runs on each micro-batch, the losses are summed as verl's
actor accumulates them, and d(loss)/d(log_prob) is compared with ``-w * A``. The modes are read from
``agg_loss``'s source, so a new verl mode fails the coverage test. Runs in the verl leg
(``make test-verl``), where verl's config stack is importable.
"""

from __future__ import annotations

import inspect
import os
import re

import pytest
import torch

from aggbench.aggregation.explain import make_batch
from aggbench.audit import audit, get_mode, micro_slices, mode_names

if os.environ.get("AGGBENCH_REQUIRE_VERL"):  # the verl leg: never skip there
    import verl.trainer.ppo.core_algos as core_algos
else:
    core_algos = pytest.importorskip(
        "verl.trainer.ppo.core_algos",
        reason="verl's config stack (omegaconf) is installed only in its own environment: `make test-verl`",
    )

LENGTHS = [3, 17, 1, 12, 5, 9, 2, 11]
REWARDS = [1, 0, 0, 1, 1, 1, 0, 0]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]
WIDTH = 20


def test_every_verl_loss_agg_mode_has_a_mode():
    src = inspect.getsource(core_algos.agg_loss)
    found = set(re.findall(r'loss_agg_mode == "([a-z-]+)"', src))
    for group in re.findall(r"loss_agg_mode in \[([^\]]+)\]", src):
        found |= set(re.findall(r'"([a-z-]+)"', group))
    assert found == set(mode_names("verl"))


def verl_gradient(mode: str, batch, micro: list[slice], loss_scale_factor=None) -> torch.Tensor:
    from verl.workers.config import ActorConfig

    mask, adv, _ = batch.tensors()
    b, t = mask.shape
    old = -torch.rand(b, t, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    logp = old.clone().requires_grad_()
    cfg = ActorConfig(
        strategy="fsdp", rollout_n=4, ppo_mini_batch_size=2, ppo_micro_batch_size_per_gpu=2,
        clip_ratio=0.2, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, loss_agg_mode=mode,
    )  # fmt: skip
    cfg.global_batch_info.update(
        dp_size=1, batch_num_tokens=mask.sum(), global_batch_size=b, loss_scale_factor=loss_scale_factor
    )
    total = torch.zeros((), dtype=torch.float64)
    maskf = mask.to(torch.float64)
    for s in micro:
        adv_bt = adv[s, None].expand(s.stop - s.start, t).contiguous()
        loss, _ = core_algos.compute_policy_loss_vanilla(old[s], logp[s], adv_bt, maskf[s], mode, cfg)
        total = total + loss
    total.backward()
    return logp.grad


CASES = [(m, mb, None) for m in sorted(mode_names("verl")) for mb in (None, 3)]
CASES.append(("seq-mean-token-sum-norm", 2, 64))


@pytest.mark.parametrize(("mode", "micro_batch_size", "loss_scale_factor"), CASES)
def test_audit_weights_are_the_gradient_of_verls_own_loss(mode, micro_batch_size, loss_scale_factor):
    batch = make_batch(LENGTHS, REWARDS, GROUPS, max_length=WIDTH)
    settings = {} if loss_scale_factor is None else {"loss_scale_factor": loss_scale_factor}
    report = audit(batch, get_mode("verl", mode), micro_batch_size=micro_batch_size, settings=settings)
    grad = verl_gradient(mode, batch, micro_slices(len(LENGTHS), micro_batch_size), loss_scale_factor)
    mask, adv, _ = batch.tensors()
    expected = torch.zeros_like(grad)
    for i, w in enumerate(report.weights):
        expected[i, : len(w)] = -torch.tensor(w, dtype=torch.float64) * adv[i]
    assert torch.allclose(grad, expected, rtol=1e-7, atol=1e-15), (mode, (grad - expected).abs().max())
    assert bool((grad[~mask] == 0).all())
