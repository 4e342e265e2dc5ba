"""Other trainers' loss modes as per-token weights: what each does to a batch at importance ratio 1.

Every mode is written from its library's released source (file and version in ``source``) as a
function of the loss mask and the micro-batch layout: ``weights(mask, micro, settings) -> [B, T]``,
the weight w[i, t] such that the policy-gradient loss's gradient w.r.t. log pi(token t of i) is
``-w[i, t] * A_i`` at importance ratio 1 (no clipping is active there; TRL's SAPO soft gate has
slope 1 there, VESPO's gamma weight is 1 there, CISPO's detached coefficient is
``min(1, epsilon_high)``). KL, entropy and off-policy masks are left out (they are not the
aggregation). ``micro`` lists the micro-batches (row slices) one optimiser step accumulates, over
accumulation steps and data-parallel ranks together; a mode that normalises per micro-batch reads
it, one that uses global totals does not. tests/audit/ runs each library's own loss function on a
batch and compares the gradient with these weights.

Adding a mode: ``@register_mode("library", "name", source=..., normaliser=...)`` on a function
with that signature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from aggbench.registry import Registry, RegistryError

WeightFn = Callable[[Tensor, list[slice], Mapping[str, Any]], Tensor]

# The releases these modes are read from (and tested against where installed).
VERSIONS = {"trl": "1.16.0", "verl": "0.9.1", "openrlhf": "0.11.2", "skyrl": "0.3.0"}
# How each library names the setting (for messages and the CLI).
SETTING = {
    "trl": "GRPOConfig.loss_type",
    "verl": "actor_rollout_ref.actor.loss_agg_mode",
    "openrlhf": "--actor.loss_agg_mode",
    "skyrl": "trainer.algorithm.loss_reduction",
}


@dataclass(frozen=True)
class Mode:
    """One library's loss mode: ``weights`` [B, T] from the mask [B, T], the layout and settings."""

    library: str
    name: str
    weights: WeightFn
    source: str
    normaliser: str
    defaults: Mapping[str, Any] = field(default_factory=dict)  # settings it reads, library defaults

    @property
    def label(self) -> str:
        return f"{self.library} {SETTING[self.library].rsplit('.', 1)[-1]}={self.name}"


_REGISTRIES: dict[str, Registry[Mode]] = {lib: Registry(f"{SETTING[lib]} value") for lib in VERSIONS}


def register_mode(
    library: str, name: str, *, source: str, normaliser: str, defaults: Mapping[str, Any] | None = None
) -> Callable[[WeightFn], WeightFn]:
    """Decorator: register ``fn(mask [B, T], micro, settings) -> weights [B, T]`` as a library's mode."""
    if library not in _REGISTRIES:
        raise RegistryError(f"unknown library {library!r}; valid: {', '.join(_REGISTRIES)}")

    def deco(fn: WeightFn) -> WeightFn:
        _REGISTRIES[library].add(name, Mode(library, name, fn, source, normaliser, dict(defaults or {})))
        return fn

    return deco


def get_mode(library: str, name: str) -> Mode:
    """The registered mode; an unknown name lists the valid ones (with a did-you-mean)."""
    if library not in _REGISTRIES:
        raise RegistryError(f"unknown library {library!r}; valid: {', '.join(_REGISTRIES)}")
    return _REGISTRIES[library].get(name)


def mode_names(library: str) -> list[str]:
    return _REGISTRIES[library].names()


def libraries() -> list[str]:
    return list(_REGISTRIES)


# ----------------------------------------------------------------------------- shared pieces


def _tokens(mask: Tensor) -> Tensor:
    """[B, T] -> [B, 1] response lengths, at least 1 (the libraries' clamp(min=1))."""
    return mask.sum(dim=1, keepdim=True).clamp(min=1.0)


def _per_micro(mask: Tensor, micro: list[slice], fn: Callable[[Tensor], Tensor]) -> Tensor:
    """Apply ``fn(mask of one micro-batch [b, T]) -> [b, T]`` to each micro-batch."""
    out = torch.zeros_like(mask)
    for s in micro:
        out[s] = fn(mask[s])
    return out


def _setting(settings: Mapping[str, Any], key: str, default: Any) -> Any:
    value = settings.get(key)
    return default if value is None else value


# ----------------------------------------------------------------------------- TRL 1.16

_TRL = "trl/trainer/grpo_trainer.py GRPOTrainer._compute_loss @ trl 1.16.0"


def _trl_seq_mean(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    # ((loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean() / current_gradient_accumulation_steps
    return _per_micro(mask, micro, lambda m: m / _tokens(m) / m.shape[0] / len(micro))


register_mode(
    "trl",
    "grpo",
    source=_TRL,
    normaliser="per micro-batch: token mean per response, mean over its responses; / accumulation steps",
)(_trl_seq_mean)
register_mode(
    "trl",
    "sapo",
    source=_TRL + " (soft gate 4/tau*sigmoid(tau*(r-1)): slope 1 at r=1)",
    normaliser="as grpo: per micro-batch token mean per response, mean over responses; / accumulation steps",
)(_trl_seq_mean)


@register_mode(
    "trl",
    "bnpo",
    source=_TRL,
    normaliser="per micro-batch: its own token count; / accumulation steps",
)
def _trl_bnpo(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    return _per_micro(mask, micro, lambda m: m / m.sum().clamp(min=1.0) / len(micro))


@register_mode(
    "trl",
    "dr_grpo",
    source=_TRL,
    normaliser="per micro-batch: its responses x max_completion_length; / accumulation steps",
    defaults={"max_completion_length": 512},
)
def _trl_dr_grpo(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    l_max = float(_setting(settings, "max_completion_length", 512))
    return _per_micro(mask, micro, lambda m: m / (m.shape[0] * l_max) / len(micro))


def _trl_global_tokens(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    # sum / (num_items_in_batch / processes * accumulation / steps_per_generation), DDP mean over
    # processes; with steps_per_generation == accumulation steps: / the generation batch's tokens
    return mask / mask.sum().clamp(min=1.0)


register_mode(
    "trl",
    "dapo",
    source=_TRL,
    normaliser="the generation batch's token count (num_items_in_batch, global over processes)",
)(_trl_global_tokens)
register_mode(
    "trl",
    "vespo",
    source=_TRL + " GRPOTrainer.get_gamma_weights (phi(1) = 1)",
    normaliser="as dapo: the generation batch's token count",
)(_trl_global_tokens)


@register_mode(
    "trl",
    "cispo",
    source=_TRL + " (coefficient clamp(r, max=epsilon_high).detach())",
    normaliser="as dapo, times min(1, epsilon_high) (epsilon_high defaults to epsilon, 0.2)",
    defaults={"epsilon": 0.2, "epsilon_high": None},
)
def _trl_cispo(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    eps_high = float(_setting(settings, "epsilon_high", _setting(settings, "epsilon", 0.2)))
    return _trl_global_tokens(mask, micro, settings) * min(1.0, eps_high)


@register_mode(
    "trl",
    "luspo",
    source=_TRL,
    normaliser="per micro-batch: its response count (token sum per response); / accumulation steps",
)
def _trl_luspo(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    # (loss * mask).sum(-1).mean(): at sequence-level importance sampling each token's gradient is
    # |o_i| * (1/|o_i|) = 1 per token of the response; the same at token level
    return _per_micro(mask, micro, lambda m: m / m.shape[0] / len(micro))


# ----------------------------------------------------------------------------- verl 0.9.1

_VERL = "verl/trainer/ppo/core_algos.py agg_loss with the v1 trainer's global_batch_info @ verl 0.9.1"


@register_mode("verl", "token-mean", source=_VERL, normaliser="the mini-batch's token count (global)")
def _verl_token_mean(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    return mask / mask.sum().clamp(min=1.0)


@register_mode("verl", "token-sum", source=_VERL, normaliser="none (a plain token sum; x dp_size)")
def _verl_token_sum(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    return mask.clone()


@register_mode(
    "verl", "seq-mean-token-sum", source=_VERL, normaliser="the mini-batch's row count (global_batch_size)"
)
def _verl_seq_sum(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    return mask / mask.shape[0]


@register_mode(
    "verl",
    "seq-mean-token-sum-norm",
    source=_VERL,
    normaliser="row count x loss_scale_factor (default: the padded response width)",
    defaults={"loss_scale_factor": None},
)
def _verl_seq_sum_norm(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    horizon = float(_setting(settings, "loss_scale_factor", mask.shape[1]))
    return mask / (mask.shape[0] * horizon)


@register_mode(
    "verl",
    "seq-mean-token-mean",
    source=_VERL,
    normaliser="the mini-batch's row count; token mean inside each response",
)
def _verl_seq_mean(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    return mask / _tokens(mask) / mask.shape[0]


# ----------------------------------------------------------------------------- OpenRLHF 0.11.2

_ORL = (
    "openrlhf/models/loss.py aggregate_loss with utils/loss_utils.py iter_grad_accum_global_norm "
    "@ openrlhf 0.11.2"
)


@register_mode("openrlhf", "token-mean", source=_ORL, normaliser="the optimiser step's token count (global)")
def _orl_token_mean(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    return mask / mask.sum().clamp(min=1.0)


@register_mode(
    "openrlhf",
    "seq-mean-token-mean",
    source=_ORL,
    normaliser="the optimiser step's non-empty response count; token mean inside each response",
)
def _orl_seq_mean(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    nonempty = (mask.sum(dim=1) > 0).sum().clamp(min=1)
    return mask / (mask.sum(dim=1, keepdim=True) + 1e-8) / nonempty


# ----------------------------------------------------------------------------- SkyRL 0.3.0

_SKY = (
    "skyrl/backends/skyrl_train/utils/ppo_utils.py apply_loss_reduction_to_advantages_minibatch "
    "(advantages pre-scaled, then a plain masked sum) @ skyrl 0.3.0"
)


@register_mode("skyrl", "token_mean", source=_SKY, normaliser="the mini-batch's token count")
def _sky_token_mean(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    return mask / mask.sum().clamp(min=1.0)


@register_mode(
    "skyrl",
    "token_mean_legacy",
    source=_SKY,
    normaliser="per micro-batch: its own token count; / micro-batch count (rows past the last full one: 0)",
)
def _sky_token_mean_legacy(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    # num_micro_batches = batch_size // micro_batch_size: a shorter last micro-batch is left at 0
    size = micro[0].stop - micro[0].start
    full = [s for s in micro if s.stop - s.start == size]
    return _per_micro(mask, full, lambda m: m / m.sum().clamp(min=1.0) / len(full))


@register_mode(
    "skyrl",
    "sequence_mean",
    source=_SKY,
    normaliser="the mini-batch's row count; token mean inside each response",
)
def _sky_sequence_mean(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    return mask / _tokens(mask) / mask.shape[0]


@register_mode(
    "skyrl",
    "seq_mean_token_sum_norm",
    source=_SKY,
    normaliser="row count x max_seq_len (default: the padded response width)",
    defaults={"max_seq_len": None},
)
def _sky_sum_norm(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    l_max = float(_setting(settings, "max_seq_len", mask.shape[1]))
    return mask / (mask.shape[0] * l_max)


@register_mode(
    "skyrl",
    "prompt_mean",
    source=_SKY,
    normaliser="per prompt group: its token count; / number of groups",
)
def _sky_prompt_mean(mask: Tensor, micro: list[slice], settings: Mapping[str, Any]) -> Tensor:
    gids = settings["group_ids"]
    n = int(gids.max()) + 1
    tokens = mask.new_zeros(n).index_add_(0, gids, mask.sum(dim=1)).clamp(min=1.0)
    return mask / (n * tokens[gids])[:, None]
