"""The aggregation rule contract: registry, named instances, input checks (helpers: ``ops``).

A rule is a pure function

    rule(mask [B, T], advantages [B], group_ids [B], *, **params) -> effective advantages [B, T]

over the WHOLE optimiser mini-batch. The effective advantage of a token is (its weight) x (its
sequence's advantage); the policy-gradient loss is the plain token SUM of the clipped objective
evaluated with them (see ``aggbench.train.objective``). Because the weights never depend on the model's
outputs they are computed once per optimiser step, before the batch is cut into micro-batches or
spread over data-parallel ranks, so gradient accumulation and data parallelism are exact for every
rule by construction.

Rules are used as named *instances* (``RuleInstance``): a registered rule plus parameters. The
instance name is what configs, cell ids, tables and diagnostics show.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, Protocol

import torch
from torch import Tensor

from aggbench.registry import Registry, RegistryError, did_you_mean

Scope = Literal["group", "batch"]


class AggregationFn(Protocol):
    """Typed signature every registered rule has (extra parameters are keyword-only)."""

    def __call__(self, mask: Tensor, advantages: Tensor, group_ids: Tensor, **params: Any) -> Tensor: ...


class AggregationInputError(ValueError):
    """Bad tensors given to a rule; the message names the field."""


@dataclass(frozen=True)
class RuleSpec:
    """A registered rule: its function, its parameters (with defaults) and what it claims."""

    name: str
    fn: AggregationFn
    params: Mapping[str, inspect.Parameter]
    version: str
    sign_balanced: bool
    """Claims: binary rewards at group scope give both signs the same total weight."""
    summary: str

    def param_defaults(self) -> dict[str, Any]:
        return {k: p.default for k, p in self.params.items()}


RULES: Registry[RuleSpec] = Registry("aggregation rule")


def register_rule(
    name: str, *, version: str = "1", sign_balanced: bool = False
) -> Callable[[AggregationFn], AggregationFn]:
    """Decorator: register ``fn`` as aggregation rule ``name``.

    The function must take ``(mask, advantages, group_ids)`` positionally and every other
    parameter keyword-only with a default (the defaults define the rule's default instance).
    """

    def decorator(fn: AggregationFn) -> AggregationFn:
        sig = inspect.signature(fn)
        ps = list(sig.parameters.values())
        positional = [p.name for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if positional != ["mask", "advantages", "group_ids"]:
            raise RegistryError(
                f"aggregation rule {name!r}: signature must start (mask, advantages, group_ids, *, ...); "
                f"got positional parameters {positional}"
            )
        params = {}
        for p in ps[3:]:
            if p.kind is not p.KEYWORD_ONLY or p.default is p.empty:
                raise RegistryError(
                    f"aggregation rule {name!r}: parameter {p.name!r} must be keyword-only with a default"
                )
            params[p.name] = p
        doc = inspect.getdoc(fn) or ""
        spec = RuleSpec(
            name=name,
            fn=fn,
            params=MappingProxyType(params),
            version=version,
            sign_balanced=sign_balanced,
            summary=doc.splitlines()[0] if doc else "",
        )
        RULES.add(name, spec, same=lambda a, b: _same_function(a.fn, b.fn))
        return fn

    return decorator


def _same_function(a: Any, b: Any) -> bool:
    return getattr(a, "__module__", None) == getattr(b, "__module__", None) and getattr(
        a, "__qualname__", None
    ) == getattr(b, "__qualname__", None)


def get_rule(name: str) -> RuleSpec:
    return RULES.get(name)


def rule_names() -> list[str]:
    return RULES.names()


@dataclass(frozen=True)
class RuleInstance:
    """A named, parameterised rule: what a config's ``aggregations:`` entry becomes."""

    name: str
    rule: str
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        spec = get_rule(self.rule)
        full = spec.param_defaults()
        for key, value in dict(self.params).items():
            if key not in spec.params:
                valid = ", ".join(spec.params) or "(none)"
                raise RegistryError(
                    f"aggregation instance {self.name!r}: rule {self.rule!r} has no parameter {key!r}."
                    f"{did_you_mean(key, spec.params)} Valid parameters: {valid}"
                )
            _check_param_value(self.name, self.rule, spec.params[key], value)
            full[key] = value
        object.__setattr__(self, "params", MappingProxyType(full))

    @property
    def spec(self) -> RuleSpec:
        return get_rule(self.rule)

    def __call__(self, mask: Tensor, advantages: Tensor, group_ids: Tensor) -> Tensor:
        """mask [B, T], advantages [B], group_ids [B] -> effective advantages [B, T]."""
        return self.spec.fn(mask, advantages, group_ids, **self.params)

    def describe(self) -> dict[str, Any]:
        """Flat description for tags, tables and JSON: rule, version and every parameter."""
        return {"instance": self.name, "rule": self.rule, "version": self.spec.version, **self.params}


def _check_param_value(instance: str, rule: str, param: inspect.Parameter, value: Any) -> None:
    ann = param.annotation
    if isinstance(ann, str):  # postponed annotations: resolve Literal[...] by evaluating the string
        try:
            ann = eval(ann, {"Literal": Literal, "Scope": Scope, "typing": typing})  # noqa: S307
        except Exception:
            return
    if typing.get_origin(ann) is Literal:
        allowed = typing.get_args(ann)
        if value not in allowed:
            raise RegistryError(
                f"aggregation instance {instance!r}: {param.name}={value!r} is not allowed for rule "
                f"{rule!r}; allowed values: {', '.join(map(repr, allowed))}"
            )


def builtin_instances() -> dict[str, RuleInstance]:
    """The named instances every run knows: each registered rule at its defaults, plus variants."""
    insts = {name: RuleInstance(name, name) for name in rule_names()}
    # batch scope keeps the default reading, named explicitly: there the variants differ even for
    # binary rewards (|A| differs between groups of one sign), and proportional keeps each
    # response's own advantage inside its sign's token mean (docs/aggregations.md)
    insts["balanced_batch"] = RuleInstance(
        "balanced_batch", "balanced", {"scope": "batch", "variant": "proportional"}
    )
    insts["balanced_mass"] = RuleInstance("balanced_mass", "balanced", {"variant": "mass"})
    # the paper grid's three rules differ in scope too (token and sequence: mini-batch; balanced:
    # group); these change only the scope, for the scope ablation (configs/paper.yaml `ablations`)
    insts["token_group"] = RuleInstance("token_group", "token", {"scope": "group"})
    insts["sequence_group"] = RuleInstance("sequence_group", "sequence", {"scope": "group"})
    return insts


def make_instance(
    name: str, rule: str | None = None, params: Mapping[str, Any] | None = None
) -> RuleInstance:
    """Build an instance from a config entry; ``rule`` defaults to a built-in instance of that name."""
    if rule is None:
        known = builtin_instances()
        if name in known and not params:
            return known[name]
        base = known.get(name)
        if base is None:
            raise RegistryError(
                f"aggregation instance {name!r} names no registered rule or built-in instance and gives no "
                f"`rule:`.{did_you_mean(name, known)} Known: {', '.join(sorted(known))}"
            )
        return RuleInstance(name, base.rule, {**base.params, **(params or {})})
    return RuleInstance(name, rule, dict(params or {}))


def resolve_instance(entry: Any, *, max_new_tokens: int | None = None) -> RuleInstance:
    """THE rule instance of a config's aggregation entry: every caller outside aggregation/ (grid
    validation, the trainer, the report's version check, the TRL adapter) resolves through here,
    so an instance means the same everywhere it is named (its MLflow tags, aggregation.json, the
    rule that trained).

    entry: a mapping or an object with ``name`` and optional ``rule`` and ``params`` (a grid's
    ``aggregations:`` item, ``TrainConfig.aggregation``). ``max_new_tokens``: the cell's response
    budget; ``constant`` (Dr. GRPO) divides by L_max, so an entry that gives no ``max_length`` gets
    this budget as its L_max (without it, a batch's own width would be used: a layout-dependent
    divisor).
    """
    get = entry.get if isinstance(entry, Mapping) else lambda key: getattr(entry, key, None)
    inst = make_instance(get("name"), get("rule"), get("params") or None)
    if inst.rule == "constant" and inst.params.get("max_length") is None and max_new_tokens is not None:
        inst = RuleInstance(inst.name, inst.rule, {**inst.params, "max_length": max_new_tokens})
    return inst


# ----------------------------------------------------------------------------- input checks


def check_inputs(mask: Tensor, advantages: Tensor, group_ids: Tensor) -> Tensor:
    """Validate a rule's inputs and return the mask as a float tensor of the advantages' dtype.

    mask: [B, T] bool or 0/1; advantages: [B] float, finite; group_ids: [B] integer.
    """
    if not isinstance(mask, Tensor) or mask.dim() != 2:
        raise AggregationInputError(
            f"mask must be a 2-D tensor [B, T]; got shape {tuple(getattr(mask, 'shape', ()))}"
        )
    if not isinstance(advantages, Tensor) or advantages.dim() != 1:
        raise AggregationInputError(
            f"advantages must be a 1-D tensor [B]; got shape {tuple(getattr(advantages, 'shape', ()))}"
        )
    if not isinstance(group_ids, Tensor) or group_ids.dim() != 1:
        raise AggregationInputError(
            f"group_ids must be a 1-D tensor [B]; got shape {tuple(getattr(group_ids, 'shape', ()))}"
        )
    b = mask.shape[0]
    if b == 0:
        raise AggregationInputError("empty batch: mask has 0 sequences (B = 0); a rule needs at least one")
    if advantages.shape[0] != b or group_ids.shape[0] != b:
        raise AggregationInputError(
            f"mismatched shapes: mask has B={b} sequences but advantages has {advantages.shape[0]} "
            f"and group_ids has {group_ids.shape[0]}"
        )
    if not advantages.is_floating_point():
        raise AggregationInputError(f"advantages must be floating point; got dtype {advantages.dtype}")
    if not torch.isfinite(advantages).all():
        bad = int((~torch.isfinite(advantages)).nonzero()[0])
        raise AggregationInputError(f"advantages[{bad}] = {advantages[bad].item()} is not finite")
    if group_ids.is_floating_point() or group_ids.dtype == torch.bool:
        raise AggregationInputError(f"group_ids must be an integer tensor; got dtype {group_ids.dtype}")
    if mask.dtype != torch.bool and not ((mask == 0) | (mask == 1)).all():
        raise AggregationInputError("mask must hold only 0 and 1 (or be a bool tensor)")
    return mask.to(advantages.dtype)
