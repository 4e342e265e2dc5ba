"""The experimental axis: aggregation rules as exact weightings over the whole mini-batch.

Public API::

    from aggbench.aggregation import register_rule, get_rule, rule_names, RuleInstance, make_instance
    from aggbench.aggregation import resolve_instance   # a config's entry -> its instance (one place)
    from aggbench.aggregation import check_inputs, broadcast, safe_reciprocal   # helpers for a rule

Plugins import from here only; the modules behind it (contract, ops, rules, diagnostics, explain) may move.
    eff = RuleInstance("balanced", "balanced")(mask, advantages, group_ids)   # [B, T]
"""

# The built-in rules register themselves on import; every import of an aggregation module runs this
# package first, so the registry is never seen without them.
from aggbench.aggregation import rules  # noqa: E402,F401,I001
from aggbench.aggregation.contract import (
    AggregationFn,
    AggregationInputError,
    RuleInstance,
    RuleSpec,
    Scope,
    builtin_instances,
    check_inputs,
    get_rule,
    make_instance,
    register_rule,
    resolve_instance,
    rule_names,
)
from aggbench.aggregation.ops import broadcast, groups_of, mask_from_lengths, safe_reciprocal
from aggbench.registry import RegistryError, env_plugins, load_plugins

__all__ = [
    "AggregationFn",
    "AggregationInputError",
    "RegistryError",
    "RuleInstance",
    "RuleSpec",
    "Scope",
    "broadcast",
    "builtin_instances",
    "check_inputs",
    "env_plugins",
    "get_rule",
    "groups_of",
    "load_plugins",
    "make_instance",
    "mask_from_lengths",
    "register_rule",
    "resolve_instance",
    "rule_names",
    "safe_reciprocal",
]
