"""Aggregation bias in an unmodified verl GRPO run: one override, ``algorithm.adv_estimator=aggbench_monitor_grpo``.

verl imports ``aggbench.integrations.verl`` through its ``verl.plugins`` entry point, which registers
this estimator: it returns verl's own GRPO advantages unchanged (``compute_grpo_outcome_advantage``,
with the run's ``norm_adv_by_std_in_grpo``), so the training is verl's ``grpo``, and on the whole
step batch it computes ``aggbench.integrations.monitor.monitor_metrics`` under the run's own
``actor.loss_agg_mode``: response-length CV and right/wrong length gap (pooled and within group),
the per-sign weight ratio of the run's mode, and what token, sequence and balanced aggregation
would have given. They reach every logger in ``trainer.logger`` (console, wandb, mlflow,
tensorboard ...) as ``aggbench/...`` through a hook on verl's ``Tracking.log`` (installed with the
estimator): the next log call of the driver, the step's, carries them. The estimator and the
logger both run in verl's driver process, in the legacy and the v1 trainer alike.

All of verl 0.9's loss_agg_modes use mini-batch-global normalisers, so the run's own per-sign
ratio is read on the step batch as one mini-batch (with k > 1 mini-batches each has the same
weighting up to a per-mini-batch factor).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from aggbench.integrations.monitor import monitor_metrics

NAME = "aggbench_monitor_grpo"
_PENDING: dict[str, float] = {}
_HOOKED: list[bool] = []


def step_metrics(
    token_level_rewards: Tensor, advantages: Tensor, response_mask: Tensor, index: Any, root: Any
):
    """``monitor_metrics`` of one step batch under the run's loss_agg_mode; advantages [B, T]."""
    from aggbench.integrations.verl import _get, group_ids_of  # lazily: verl.py imports this module

    m = response_mask.to(torch.float64)
    per_seq = (advantages.to(torch.float64) * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)
    mode = str(_get(root, "actor_rollout_ref.actor.loss_agg_mode", "token-mean"))
    settings = {}
    factor = _get(root, "actor_rollout_ref.actor.loss_scale_factor")
    if factor is not None:
        settings["loss_scale_factor"] = factor
    return monitor_metrics(
        response_mask.bool().cpu(),
        per_seq.cpu(),
        group_ids_of(index),
        library="verl",
        mode=mode,
        settings=settings,
    )


def estimator(
    token_level_rewards: Tensor, response_mask: Tensor, index: Any = None, config: Any = None, **_: Any
) -> tuple[Tensor, Tensor]:
    """verl's GRPO advantages, unchanged, plus the monitor's metrics for the next log call.

    token_level_rewards, response_mask: [B, T]; index: [B] uids -> (advantages, returns) [B, T].
    """
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from aggbench.integrations.verl import _root

    advantages, returns = compute_grpo_outcome_advantage(
        token_level_rewards,
        response_mask,
        index,
        norm_adv_by_std_in_grpo=bool(config.get("norm_adv_by_std_in_grpo", True)),
    )
    _PENDING.update(step_metrics(token_level_rewards, advantages, response_mask, index, _root(config)))
    return advantages, returns


def install_log_hook() -> None:
    """Make ``verl.utils.tracking.Tracking.log`` carry the pending ``aggbench/*`` metrics (once)."""
    if _HOOKED:
        return
    from verl.utils.tracking import Tracking

    original = Tracking.log

    def log(self, data, step, backend=None):
        if _PENDING:
            data = {**data, **_PENDING}
            _PENDING.clear()
        return original(self, data, step, backend)

    log.aggbench_original = original  # type: ignore[attr-defined]
    Tracking.log = log
    _HOOKED.append(True)


def register() -> str:
    """Register ``aggbench_monitor_grpo`` with verl and install the log hook; -> the name."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    if ADV_ESTIMATOR_REGISTRY.get(NAME) is not estimator:
        ADV_ESTIMATOR_REGISTRY.pop(NAME, None)
        register_adv_est(NAME)(estimator)
    install_log_hook()
    return NAME
