"""Any aggbench aggregation rule inside TRL's ``GRPOTrainer``, exact under accumulation and DP.

    from trl import GRPOConfig
    from aggbench.integrations.trl import AggregationGRPOTrainer

    trainer = AggregationGRPOTrainer(
        model=model, reward_funcs=reward, train_dataset=data,
        args=GRPOConfig(output_dir="out", loss_type="dapo", num_generations=8),
        aggregation="balanced",            # any registered rule or instance; plugins=["my_rules"]
    )
    trainer.train()

Design (docs/integrations.md):

- TRL has no public loss hook (``compute_loss`` calls the private ``_compute_loss``), but its loss
  accepts per-token advantages [B, T] from subclasses. So the adapter overrides
  ``_generate_and_score_completions``: it calls TRL's, gathers the loss mask (the mask the loss
  uses: completion mask x tool mask, after truncation masking) and TRL's advantages from every
  process, takes group ids from the global index // ``num_generations`` (TRL's own grouping), runs
  the rule on the WHOLE generation batch and returns this process's rows as [B, T] advantages.
- With ``loss_type="dapo"`` TRL divides each micro-batch's token sum by (tokens of the global
  generation batch / processes) x (accumulation steps / steps_per_generation), and data parallelism
  averages over processes; with ``steps_per_generation == gradient_accumulation_steps`` that is a
  division by N, the generation batch's token count. The advantages are multiplied by N, so the
  optimiser step's gradient is the rule's plain token sum on the whole batch: exactly what
  aggbench's trainer computes, for any micro-batch size, accumulation or process count.
- Settings that break this are refused before training (``check_args``), each with one line that
  names the setting and the fix.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from aggbench.aggregation import RuleInstance, load_plugins, resolve_instance
from aggbench.integrations import AdapterConfigError

# The TRL releases this adapter is tested against (the `trl` extra pins the same range). Outside it
# the adapter refuses to start unless ALLOW_UNTESTED_TRL is set in the environment; either way the
# private pieces it relies on are checked (signatures and the dapo normaliser's behaviour at
# start, the generation batch's keys on every batch).
TESTED_TRL = (1, 16)
ALLOW_UNTESTED_TRL = "AGGBENCH_ALLOW_UNTESTED_TRL"
_REQUIRED_OUTPUT = ("advantages", "completion_mask", "num_items_in_batch")


def check_args(args: Any) -> None:
    """Refuse, with one line naming the setting and the fix, a GRPOConfig the adapter is not exact under."""
    if args.loss_type != "dapo":
        raise AdapterConfigError(
            f"GRPOConfig.loss_type={args.loss_type!r}: the adapter's advantages are scaled for 'dapo' (a token "
            "sum over the global generation batch); set loss_type='dapo' (the aggregation rule now sets the weighting)"
        )
    if args.steps_per_generation != args.gradient_accumulation_steps:
        raise AdapterConfigError(
            f"GRPOConfig.steps_per_generation={args.steps_per_generation} with gradient_accumulation_steps="
            f"{args.gradient_accumulation_steps}: one optimiser step must consume exactly one generation batch; "
            "set steps_per_generation equal to gradient_accumulation_steps (or leave both it and "
            "generation_batch_size unset)"
        )
    if args.importance_sampling_level != "token":
        raise AdapterConfigError(
            f"GRPOConfig.importance_sampling_level={args.importance_sampling_level!r}: a sequence-level ratio "
            "replaces the per-token terms the rule weights; set importance_sampling_level='token'"
        )
    if args.top_entropy_quantile < 1.0:
        raise AdapterConfigError(
            f"GRPOConfig.top_entropy_quantile={args.top_entropy_quantile}: TRL picks the high-entropy tokens per "
            "micro-batch, so the kept tokens change with micro-batching; set top_entropy_quantile=1.0"
        )
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        raise AdapterConfigError(
            f"GRPOConfig.entropy_coef={args.entropy_coef} (use_adaptive_entropy={args.use_adaptive_entropy}): "
            "TRL's entropy bonus is a per-micro-batch token mean, not exact under accumulation; set "
            "entropy_coef=0.0 and use_adaptive_entropy=False"
        )


def resolve_rule(aggregation: str | RuleInstance, plugins: Iterable[str] = ()) -> RuleInstance:
    """A rule instance from a name (a registered rule or built-in instance) after importing ``plugins``."""
    load_plugins(list(plugins))
    if isinstance(aggregation, RuleInstance):
        return aggregation
    return resolve_instance({"name": aggregation})


def effective_advantages(
    rule: RuleInstance,
    mask: Tensor,
    advantages: Tensor,
    *,
    num_generations: int,
    rank: int = 0,
    gather: Callable[[Tensor], Tensor] = lambda t: t,
    pad: Callable[[Tensor], Tensor] = lambda t: t,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """This process's rows of the rule's effective advantages, computed on the whole batch.

    mask: [B, T] this process's loss mask; advantages: [B] TRL's advantages of its rows; ``pad``
    pads a tensor's dim 1 to the widest process, ``gather`` concatenates every process's rows in
    process order (accelerate's ``pad_across_processes`` / ``gather``). Group of global row i:
    i // num_generations. Returns [B, T] in ``dtype`` (0 outside the mask).
    """
    b, t = mask.shape
    full_mask, full_adv, group_ids = gather_generation_batch(
        mask, advantages, num_generations=num_generations, gather=gather, pad=pad
    )
    eff = rule(full_mask, full_adv, group_ids)
    return eff[rank * b : (rank + 1) * b, :t].to(dtype)


def gather_generation_batch(
    mask: Tensor,
    advantages: Tensor,
    *,
    num_generations: int,
    gather: Callable[[Tensor], Tensor] = lambda t: t,
    pad: Callable[[Tensor], Tensor] = lambda t: t,
) -> tuple[Tensor, Tensor, Tensor]:
    """The whole generation batch from every process's rows (the adapter's and the monitor's view).

    mask: [B, T] this process's loss mask; advantages: [B]; ``pad``/``gather`` as in
    ``effective_advantages``. Returns (mask [N, T'] float64, advantages [N] float64, group ids [N]
    = global row // num_generations, TRL's grouping), N rows over all processes in process order.
    """
    full_mask = gather(pad(mask.to(torch.float64).contiguous()))
    full_adv = gather(advantages.detach().to(torch.float64).contiguous())
    if full_mask.shape[0] != full_adv.shape[0] or full_mask.shape[0] % num_generations:
        raise RuntimeError(
            f"aggbench TRL adapter: gathered {full_mask.shape[0]} masks and {full_adv.shape[0]} advantages for "
            f"groups of {num_generations}; TRL's generation batch no longer has the layout this adapter expects"
        )
    group_ids = torch.div(
        torch.arange(full_adv.shape[0], device=full_adv.device), num_generations, rounding_mode="floor"
    )
    return full_mask, full_adv, group_ids


def check_trl_version(trainer_cls: type) -> None:
    """Refuse a TRL outside the tested minor version (unless ``ALLOW_UNTESTED_TRL`` is set in the
    environment), and any TRL whose private pieces changed shape or whose ``dapo`` normaliser changed
    meaning (``trl_probe.check_dapo_normaliser`` runs TRL's own loss on a probe batch)."""
    import os

    import trl

    from aggbench.integrations.trl_probe import check_dapo_normaliser

    version = tuple(int(p) for p in trl.__version__.split(".")[:2] if p.isdigit())
    tested = ".".join(map(str, TESTED_TRL))
    if version != TESTED_TRL:
        if not os.environ.get(ALLOW_UNTESTED_TRL):
            raise RuntimeError(
                f"aggbench TRL adapter: tested with trl {tested}.x, found {trl.__version__}; install "
                f"'trl>={tested},<{TESTED_TRL[0]}.{TESTED_TRL[1] + 1}' (the `trl` extra), or set "
                f"{ALLOW_UNTESTED_TRL}=1 to run anyway after the start-up checks (then rerun "
                "tests/integrations/test_trl.py and tests/audit/test_audit_trl.py with this TRL)"
            )
        warnings.warn(
            f"aggbench TRL adapter: trl {trl.__version__} is untested ({ALLOW_UNTESTED_TRL} is set); the "
            "private methods and the dapo normaliser were checked at start",
            stacklevel=3,
        )
    for name, params in (
        ("_generate_and_score_completions", ["self", "inputs"]),
        ("_compute_loss", ["self", "model", "inputs"]),
    ):
        method = getattr(trainer_cls, name, None)
        got = list(inspect.signature(method).parameters) if method is not None else None
        if got != params:
            raise RuntimeError(
                f"aggbench TRL adapter: trl {trl.__version__} GRPOTrainer.{name} has parameters {got}, expected "
                f"{params}; this TRL release is not supported (tested: {tested}.x)"
            )
    check_dapo_normaliser(trainer_cls)


def _make_trainer_class():
    from trl import GRPOTrainer

    check_trl_version(GRPOTrainer)

    class AggregationGRPOTrainer(GRPOTrainer):
        """``GRPOTrainer`` whose loss weighting is an aggbench aggregation rule (module docstring).

        Extra keyword arguments: ``aggregation`` (a registered rule name, built-in instance name or a
        ``RuleInstance``; default ``"balanced"``) and ``plugins`` (modules or ``.py`` files that
        register rules, imported first). Everything else is GRPOTrainer's.
        """

        def __init__(
            self,
            *args: Any,
            aggregation: str | RuleInstance = "balanced",
            plugins: Iterable[str] = (),
            **kwargs: Any,
        ):
            self.aggregation = resolve_rule(aggregation, plugins)
            config = kwargs.get("args", args[2] if len(args) > 2 else None)
            if config is not None:
                check_args(config)  # before TRL loads anything
            super().__init__(*args, **kwargs)
            check_args(self.args)  # TRL's defaults, when no config was given
            # constant (Dr. GRPO) divides by L_max: without its own max_length, TRL's budget (as
            # loss_type="dr_grpo"), not the batch's padded width (TRL pads each batch to its longest
            # completion, so that divisor would change from batch to batch)
            self.aggregation = resolve_instance(
                self.aggregation, max_new_tokens=self.args.max_completion_length
            )

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            out = super()._generate_and_score_completions(inputs)
            missing = [k for k in _REQUIRED_OUTPUT if k not in out]
            if missing:
                import trl

                raise RuntimeError(
                    f"aggbench TRL adapter: trl {trl.__version__}'s generation batch lacks {missing}; this TRL "
                    "release is not supported"
                )
            mask = out["completion_mask"]
            if out.get("tool_mask") is not None:
                mask = mask * out["tool_mask"]
            acc = self.accelerator
            wide = torch.float64 if next(self.model.parameters()).dtype == torch.float64 else torch.float32
            eff = effective_advantages(
                self.aggregation,
                mask,
                out["advantages"],
                num_generations=self.num_generations if self.model.training else self.num_generations_eval,
                rank=acc.process_index,
                gather=acc.gather,
                pad=lambda t: acc.pad_across_processes(t, dim=1, pad_index=0),
                dtype=wide,
            )
            # TRL's dapo loss divides by the generation batch's token count: multiplying by it leaves
            # the rule's plain token sum (module docstring)
            tokens = out["num_items_in_batch"].to(wide)
            # what the rule saw and gave, this process's rows (for diagnostics and tests)
            self.last_generation = {
                "advantages": out["advantages"],
                "loss_mask": mask,
                "effective": eff,
                "tokens": tokens,
            }
            out["advantages"] = eff * tokens
            return out

    AggregationGRPOTrainer.__module__ = __name__
    return AggregationGRPOTrainer


def __getattr__(name: str) -> Any:
    # TRL is imported on first use of the trainer class, so `import aggbench.integrations.trl` (and
    # the helpers above) work without the `trl` extra
    if name == "AggregationGRPOTrainer":
        cls = _make_trainer_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
