"""OpenRLHF's and SkyRL's loss modes in ``aggbench audit`` against their released source.

Neither library installs beside aggbench (OpenRLHF needs DeepSpeed, SkyRL ray and its config
stack), so their loss functions are taken out of the released wheels (.ci/audit-sources.txt,
sha256-checked, downloaded by ``make test-verl`` into AGGBENCH_AUDIT_SOURCES) by their source
text, and run on the batch with torch:
- OpenRLHF 0.11.2: ``openrlhf/models/loss.py aggregate_loss`` with the normalisers of
  ``openrlhf/utils/loss_utils.py _optimizer_step_loss_norm`` (total / gas), each micro-batch's loss
  divided by gas as DeepSpeed does; the gradient of the summed losses is compared with -w * A.
- SkyRL 0.3.0: ``apply_loss_reduction_to_advantages_minibatch`` pre-scales the advantages, and the
  policy loss is a plain masked sum (``reduce_loss``), so the gradient at ratio 1 is -(scaled A):
  compared with -w * A.
"""

from __future__ import annotations

import ast
import os
import typing
import zipfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from aggbench.aggregation.explain import make_batch
from aggbench.audit import audit, get_mode, micro_slices, mode_names

SOURCES = os.environ.get("AGGBENCH_AUDIT_SOURCES")
if not SOURCES:
    pytest.skip(
        "the released wheels are downloaded by `make test-verl` (AGGBENCH_AUDIT_SOURCES)",
        allow_module_level=True,
    )

LENGTHS = [3, 17, 1, 12, 5, 9, 2, 11]
REWARDS = [1, 0, 0, 1, 1, 1, 0, 0]
GROUPS = [0, 0, 0, 0, 1, 1, 1, 1]
WIDTH = 20


def functions(wheel_glob: str, member_suffix: str, names: list[str]) -> dict:
    """The named top-level functions of one file in the wheel, compiled with torch in scope."""
    (wheel,) = sorted(Path(SOURCES).glob(wheel_glob))
    with zipfile.ZipFile(wheel) as zf:
        (member,) = [m for m in zf.namelist() if m.endswith(member_suffix)]
        text = zf.read(member).decode()
    tree = ast.parse(text)
    picked = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in picked} == set(names), f"{member} no longer defines {names}"
    # the names the extracted sources use (typing's old aliases among them)
    scope = {"torch": torch, "dist": dist, **{n: getattr(typing, n) for n in ("Optional", "List", "Tuple")}}
    exec(compile(ast.Module(body=picked, type_ignores=[]), member, "exec"), scope)  # noqa: S102
    return {n: scope[n] for n in names}


def expected_grad(report, adv: torch.Tensor, shape) -> torch.Tensor:
    out = torch.zeros(shape, dtype=torch.float64)
    for i, w in enumerate(report.weights):
        out[i, : len(w)] = -torch.tensor(w, dtype=torch.float64) * adv[i]
    return out


@pytest.mark.parametrize("mode", sorted(mode_names("openrlhf")))
@pytest.mark.parametrize("micro_batch_size", [None, 3])
def test_openrlhf_modes_are_the_gradient_of_its_own_loss(mode, micro_batch_size):
    fns = functions("openrlhf-*.whl", "openrlhf/models/loss.py", ["aggregate_loss"])
    fns |= functions("openrlhf-*.whl", "openrlhf/utils/loss_utils.py", ["_optimizer_step_loss_norm"])
    batch = make_batch(LENGTHS, REWARDS, GROUPS, max_length=WIDTH)
    report = audit(batch, get_mode("openrlhf", mode), micro_batch_size=micro_batch_size)
    mask, adv, _ = batch.tensors()
    maskf = mask.to(torch.float64)
    micro = micro_slices(len(LENGTHS), micro_batch_size)
    gas = len(micro)
    info = fns["_optimizer_step_loss_norm"]([maskf[s] for s in micro], None, 1, gas)
    logp = torch.zeros(mask.shape, dtype=torch.float64, requires_grad=True)
    total = torch.zeros((), dtype=torch.float64)
    for s in micro:
        per_token = -adv[s, None] * torch.exp(logp[s] - logp[s].detach())
        loss = fns["aggregate_loss"](per_token, maskf[s], token_level_loss=mode == "token-mean", **info)
        total = total + loss / gas  # DeepSpeed scales every backward loss by 1 / gas
    total.backward()
    exp = expected_grad(report, adv, mask.shape)
    assert torch.allclose(logp.grad, exp, rtol=1e-6, atol=1e-15), (logp.grad - exp).abs().max()


@pytest.mark.parametrize("mode", sorted(mode_names("skyrl")))
@pytest.mark.parametrize(("micro_batch_size", "lengths"), [(None, LENGTHS), (3, LENGTHS), (2, LENGTHS)])
def test_skyrl_modes_are_the_gradient_of_its_own_loss(mode, micro_batch_size, lengths):
    fn = functions(
        "skyrl-*.whl",
        "skyrl/backends/skyrl_train/utils/ppo_utils.py",
        ["apply_loss_reduction_to_advantages_minibatch"],
    )["apply_loss_reduction_to_advantages_minibatch"]
    batch = make_batch(lengths, REWARDS, GROUPS, max_length=WIDTH)
    report = audit(batch, get_mode("skyrl", mode), micro_batch_size=micro_batch_size)
    mask, adv, gids = batch.tensors()
    maskf = mask.to(torch.float64)
    bounds = [
        (int(i), int(i) + int((gids == g).sum())) for g in gids.unique() for i in [(gids == g).nonzero()[0]]
    ]
    scaled = fn(
        adv[:, None] * maskf,
        maskf,
        mode,
        micro_batch_size or len(lengths),
        WIDTH,
        prompt_boundaries=bounds,
    )
    exp = expected_grad(report, adv, mask.shape)
    assert torch.allclose(-scaled * maskf, exp, rtol=1e-10, atol=1e-15), (-scaled * maskf - exp).abs().max()
