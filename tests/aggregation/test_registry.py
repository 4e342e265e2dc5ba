"""Registry behaviour and bad-input errors: every message names the field and the fix."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from aggbench.aggregation import (
    AggregationInputError,
    RegistryError,
    RuleInstance,
    get_rule,
    load_plugins,
    make_instance,
    mask_from_lengths,
    register_rule,
    rule_names,
)
from aggbench.aggregation.contract import RULES


def test_builtins_registered_with_versions_and_docstrings():
    assert {"token", "sequence", "seq_sum", "constant", "balanced"} <= set(rule_names())
    for name in rule_names():
        spec = get_rule(name)
        assert spec.version and spec.summary, name
        assert "Source" in (spec.fn.__doc__ or ""), f"{name}: docstring must state its source"


def test_unknown_rule_lists_valid_names_and_suggests():
    with pytest.raises(RegistryError) as e:
        get_rule("balanse")
    msg = str(e.value)
    assert "'balanse'" in msg and "Did you mean 'balanced'" in msg and "token" in msg and "sequence" in msg


def test_unknown_and_bad_parameters():
    with pytest.raises(RegistryError, match=r"no parameter 'scoep'.*Did you mean 'scope'.*Valid parameters"):
        RuleInstance("x", "balanced", {"scoep": "batch"})
    with pytest.raises(RegistryError, match=r"scope='global' is not allowed.*'group', 'batch'"):
        RuleInstance("x", "token", {"scope": "global"})
    with pytest.raises(RegistryError, match=r"variant='masss'.*'proportional', 'mass', 'count'"):
        RuleInstance("x", "balanced", {"variant": "masss"})


def test_make_instance_from_config_entries():
    assert make_instance("balanced_batch").params["scope"] == "batch"
    inst = make_instance("my_bal", "balanced", {"variant": "mass"})
    assert inst.describe() == {
        "instance": "my_bal",
        "rule": "balanced",
        "version": "2",
        "scope": "group",
        "variant": "mass",
        "include_zero_groups": True,
    }
    with pytest.raises(RegistryError, match="names no registered rule"):
        make_instance("nonexistent_instance")


def test_duplicate_name_rejected_but_reimport_is_noop():
    @register_rule("tmp_dup_rule")
    def first(mask, advantages, group_ids):
        return mask * advantages[:, None]

    try:
        with pytest.raises(RegistryError, match="already registered"):

            @register_rule("tmp_dup_rule")
            def second(mask, advantages, group_ids):
                return mask * advantages[:, None]

        register_rule("tmp_dup_rule")(first)  # same function again (a plugin imported twice): fine
    finally:
        RULES.remove("tmp_dup_rule")


def test_bad_signature_rejected():
    with pytest.raises(RegistryError, match="must start"):

        @register_rule("tmp_bad_sig")
        def bad(advantages, mask, group_ids):
            return advantages

    with pytest.raises(RegistryError, match="keyword-only with a default"):

        @register_rule("tmp_bad_sig2")
        def bad2(mask, advantages, group_ids, *, alpha):
            return advantages


def test_plugin_by_module_path_and_file(tmp_path, monkeypatch):
    mod = tmp_path / "my_rules_plugin.py"
    mod.write_text(
        textwrap.dedent(
            '''
            from aggbench.aggregation import register_rule
            from aggbench.aggregation.contract import check_inputs

            @register_rule("sqrt_len_test")
            def sqrt_len(mask, advantages, group_ids, *, power: float = 0.5):
                """c_i = 1 / (N * |o_i|^power). Source: a test plugin."""
                m = check_inputs(mask, advantages, group_ids)
                lengths = m.sum(1).clamp_min(1)
                return (advantages / (m.shape[0] * lengths**power))[:, None] * m
            '''
        )
    )
    try:
        load_plugins(["my_rules_plugin"], search_paths=[tmp_path])
        assert "sqrt_len_test" in rule_names()
        load_plugins(["my_rules_plugin"], search_paths=[tmp_path])  # idempotent
        eff = RuleInstance("s", "sqrt_len_test")(
            mask_from_lengths([4, 1]), torch.tensor([1.0, -1.0], dtype=torch.float64), torch.tensor([0, 0])
        )
        assert float(eff[0, 0]) == pytest.approx(1 / (2 * 2))
    finally:
        RULES.remove("sqrt_len_test")
        sys.modules.pop("my_rules_plugin", None)
    with pytest.raises(RegistryError, match=r"plugin module 'no_such_rules_mod' was not found"):
        load_plugins(["no_such_rules_mod"])
    with pytest.raises(RegistryError, match="plugin file"):
        load_plugins([str(tmp_path / "missing.py")])
    # a relative path: the error says where it was read from and the module-name alternative
    with pytest.raises(
        RegistryError, match=r"read from the working directory, .*or name the module \(my_rules\)"
    ):
        load_plugins(["my_rules.py"])


@pytest.mark.parametrize(
    "mask,adv,gids,match",
    [
        (
            torch.ones(2, 3),
            torch.ones(3),
            torch.zeros(2, dtype=torch.long),
            r"mismatched shapes.*B=2.*advantages has 3",
        ),
        (torch.ones(0, 3), torch.ones(0), torch.zeros(0, dtype=torch.long), "empty batch"),
        (torch.ones(3), torch.ones(3), torch.zeros(3, dtype=torch.long), r"mask must be a 2-D tensor"),
        (torch.ones(2, 3), torch.ones(2, 1), torch.zeros(2, dtype=torch.long), r"advantages must be a 1-D"),
        (
            torch.ones(2, 3),
            torch.tensor([1.0, float("nan")]),
            torch.zeros(2, dtype=torch.long),
            r"advantages\[1\]",
        ),
        (torch.ones(2, 3), torch.ones(2), torch.zeros(2), "group_ids must be an integer"),
        (torch.full((2, 3), 0.5), torch.ones(2), torch.zeros(2, dtype=torch.long), "only 0 and 1"),
    ],
)
def test_bad_inputs_name_the_field(mask, adv, gids, match):
    for name in rule_names():
        with pytest.raises(AggregationInputError, match=match):
            RuleInstance("t", name)(mask, adv, gids)


def test_negative_lengths_named():
    with pytest.raises(AggregationInputError, match=r"lengths\[1\] = -3 is negative"):
        mask_from_lengths([2, -3])
    with pytest.raises(AggregationInputError, match="empty batch"):
        mask_from_lengths([])
