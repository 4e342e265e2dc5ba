"""The experimental axis: aggregation rules as exact weightings over the whole mini-batch.

Public API::

    from aggbench.aggregation import register_rule, get_rule, rule_names, RuleInstance, make_instance
    eff = RuleInstance("balanced", "balanced")(mask, advantages, group_ids)   # [B, T]
"""

from aggbench.aggregation.core import (
    AggregationFn,
    AggregationInputError,
    RuleInstance,
    RuleSpec,
    Scope,
    builtin_instances,
    check_inputs,
    get_rule,
    make_instance,
    mask_from_lengths,
    register_rule,
    rule_names,
)
from aggbench.registry import RegistryError, load_plugins

__all__ = [
    "AggregationFn",
    "AggregationInputError",
    "RegistryError",
    "RuleInstance",
    "RuleSpec",
    "Scope",
    "builtin_instances",
    "check_inputs",
    "get_rule",
    "load_plugins",
    "make_instance",
    "mask_from_lengths",
    "register_rule",
    "rule_names",
]
