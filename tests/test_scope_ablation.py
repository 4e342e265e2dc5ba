"""The paper grid's scope ablation: token and sequence default to mini-batch scope and balanced to
group scope, so the main grid changes the rule and the scope at once. Named instances change only
the scope, and configs/paper.yaml lists them as an ablation that is off by default."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from aggbench.aggregation import make_instance
from aggbench.grid import GridError, cells, load_experiment, validate_experiment

PAPER = Path(__file__).resolve().parents[1] / "configs" / "paper.yaml"


def test_default_scopes_differ_and_the_scope_instances_change_only_the_scope():
    assert make_instance("token").params["scope"] == "batch"
    assert make_instance("sequence").params["scope"] == "batch"
    assert make_instance("balanced").params["scope"] == "group"
    for name, rule, scope in (
        ("token_group", "token", "group"),
        ("sequence_group", "sequence", "group"),
        ("balanced_batch", "balanced", "batch"),
    ):
        inst = make_instance(name)
        assert inst.rule == rule and inst.params == {**make_instance(rule).params, "scope": scope}, name


def test_paper_ablation_is_listed_off_by_default_and_adds_cells_only_when_enabled():
    exp = load_experiment(PAPER)
    raw = yaml.safe_load(PAPER.read_text())
    assert raw["ablations"]["enabled"] is False
    assert [a["name"] for a in raw["ablations"]["aggregations"]] == [
        "token_group",
        "sequence_group",
        "balanced_batch",
    ]
    main = [c.id for c in cells(exp)]
    assert len(main) == 2 * 2 * 3 and not any("_group" in c or "_batch" in c for c in main)
    on = copy.deepcopy(raw)
    on["ablations"]["enabled"] = True
    validate_experiment(on)
    both = [c.id for c in cells(on)]
    assert [c for c in both if c in main] == main  # the main cells are unchanged, in order
    extra = sorted({c.split("__")[2] for c in both if c not in main})
    assert extra == ["balanced_batch", "sequence_group", "token_group"] and len(both) == 2 * len(main)


def test_ablation_entries_are_validated_like_aggregations():
    raw = yaml.safe_load(PAPER.read_text())
    bad = copy.deepcopy(raw)
    bad["ablations"] = {"enabled": True, "aggregations": [{"name": "token"}]}  # already a main cell
    with pytest.raises(GridError, match=r"duplicate instance name\(s\) \['token'\]"):
        validate_experiment(bad)
    bad["ablations"] = {"enabled": True, "aggregations": [{"name": "nope_group"}]}
    with pytest.raises(GridError, match="nope_group"):
        validate_experiment(bad)
    bad["ablations"] = {"enabled": True, "extra": 1}
    with pytest.raises(GridError, match="unknown key"):
        validate_experiment(bad)
