"""Aggregation bias in an unmodified TRL run: a one-line swap of the trainer class.

    from trl import GRPOConfig
    from aggbench.integrations.trl_monitor import AggregationMonitorCallback, MonitoredGRPOTrainer

    trainer = MonitoredGRPOTrainer(                       # was: GRPOTrainer(
        model=model, reward_funcs=reward, train_dataset=data,
        args=GRPOConfig(output_dir="out", loss_type="dapo", num_generations=8),
        callbacks=[AggregationMonitorCallback()],         # optional: also to MLflow (aggbench.tracking)
    )
    trainer.train()

The training is TRL's own: the subclass calls TRL's ``_generate_and_score_completions`` and returns
its output untouched. On each generation batch it gathers every process's loss mask (completion
mask x tool mask) and advantages, takes the groups from the global row index // num_generations
(TRL's grouping), and computes ``aggbench.integrations.monitor.monitor_metrics`` under the run's own
``loss_type``: response-length CV and right/wrong length gap (pooled and within group), the per-sign
weight ratio of the run's mode, and what token, sequence and balanced aggregation would have given.
They go into TRL's own metrics, so TRL's ``log`` averages them per logging step and every logger in
``report_to`` (and ``trainer.state.log_history``) gets them as ``aggbench/...``. A plain
``TrainerCallback`` never sees the batch, hence the subclass; it uses the same private surface as
the adapter (``aggbench.integrations.trl``) with the same version checks.

Layout-dependent modes (TRL's ``bnpo``, and ``grpo``/``dr_grpo``/``luspo`` only with unequal
micro-batches) are read with consecutive micro-batches of ``per_device_train_batch_size`` rows;
TRL shuffles the rows before it splits them, so for ``bnpo`` the run's own values are those of
one of the layouts it may use.
"""

from __future__ import annotations

from typing import Any

from aggbench.integrations.monitor import PREFIX, monitor_metrics
from aggbench.integrations.trl import check_trl_version, gather_generation_batch

_SETTINGS = ("max_completion_length", "epsilon", "epsilon_high")


def _make_trainer_class():
    from trl import GRPOTrainer

    check_trl_version(GRPOTrainer)

    class MonitoredGRPOTrainer(GRPOTrainer):
        """``GRPOTrainer`` that logs aggbench's aggregation-bias metrics per step (module docstring).

        ``self.aggbench_monitor``: the last generation batch's metrics. Everything else is TRL's.
        """

        aggbench_monitor: dict[str, float] | None = None

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            out = super()._generate_and_score_completions(inputs)
            for key in ("advantages", "completion_mask"):
                if key not in out:
                    import trl

                    raise RuntimeError(
                        f"aggbench TRL monitor: trl {trl.__version__}'s generation batch lacks {key!r}; this TRL "
                        "release is not supported"
                    )
            mask = out["completion_mask"]
            if out.get("tool_mask") is not None:
                mask = mask * out["tool_mask"]
            acc = self.accelerator
            training = self.model.training
            full_mask, full_adv, groups = gather_generation_batch(
                mask,
                out["advantages"],
                num_generations=self.num_generations if training else self.num_generations_eval,
                gather=acc.gather,
                pad=lambda t: acc.pad_across_processes(t, dim=1, pad_index=0),
            )
            settings = {k: getattr(self.args, k, None) for k in _SETTINGS}
            settings["epsilon_high"] = getattr(self, "epsilon_high", settings["epsilon_high"])
            # one micro-batch per accumulation step and process: the rows one backward pass sees
            metrics = monitor_metrics(
                full_mask.cpu(),
                full_adv.cpu(),
                groups.cpu(),
                library="trl",
                mode=self.loss_type,
                micro_batch_size=self.args.per_device_train_batch_size,
                settings=settings,
            )
            self.aggbench_monitor = metrics
            bucket = self._metrics["train" if training else "eval"]
            for key, value in metrics.items():
                bucket[key].append(value)
            return out

    MonitoredGRPOTrainer.__module__ = __name__
    return MonitoredGRPOTrainer


def _make_callback_class():
    from transformers import TrainerCallback

    class AggregationMonitorCallback(TrainerCallback):
        """Sends the monitor's ``aggbench/*`` values of each TRL log to MLflow through aggbench.tracking.

        TRL's own loggers already get them (``report_to``); this adds an MLflow run found by its
        ``aggbench.cell_id`` tag (``run_name``) in ``tracking_uri`` (default: ``sqlite:///mlflow.db``,
        a SQLite store in the current directory), on the main process only, at TRL's global step.
        """

        def __init__(
            self,
            tracking_uri: str = "sqlite:///mlflow.db",
            experiment: str = "aggbench-monitor",
            run_name: str = "trl-run",
        ):
            self.tracking_uri = tracking_uri
            self.experiment = experiment
            self.run_name = run_name
            self.run = None

        def on_log(self, args, state, control, logs=None, **kwargs):
            if not state.is_world_process_zero or not logs:
                return
            values = {k: float(v) for k, v in logs.items() if k.startswith(PREFIX)}
            if not values:
                return
            from aggbench.tracking import MlflowRun, finite

            if self.run is None:
                self.run = MlflowRun(self.tracking_uri, self.experiment, self.run_name, None)
            self.run.log_step_metrics(int(state.global_step), {k: finite(v) for k, v in values.items()})

    AggregationMonitorCallback.__module__ = __name__
    return AggregationMonitorCallback


_FACTORIES = {"MonitoredGRPOTrainer": _make_trainer_class, "AggregationMonitorCallback": _make_callback_class}


def __getattr__(name: str) -> Any:
    # TRL and transformers are imported on first use, so importing this module needs neither
    if name in _FACTORIES:
        cls = _FACTORIES[name]()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
