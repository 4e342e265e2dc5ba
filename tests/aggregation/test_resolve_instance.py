"""A config's aggregation entry becomes its rule instance in one function,
``aggregation.resolve_instance``: the grid's validation, the trainer, the report's version check and
the TRL adapter all call it, so a run's MLflow tags, its aggregation.json and the rule that trained
agree (a ``constant`` run's tags once lacked the ``max_length`` its aggregation.json recorded)."""

from __future__ import annotations

import ast
from pathlib import Path
from types import SimpleNamespace

from aggbench.aggregation import resolve_instance
from aggbench.config import TrainConfig
from aggbench.provenance import run_tags

SRC = Path(__file__).resolve().parents[2] / "src" / "aggbench"
HOME = SRC / "aggregation" / "contract.py"
BUILDERS = {"make_instance", "RuleInstance"}


def _calls(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every call of one of ``names`` (a bare name or an attribute) in ``tree``."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name in names:
                out.append((node.lineno, name))
    return out


def builders_outside_the_contract(src: Path) -> list[str]:
    return [
        f"{p.relative_to(src)}:{line} {name}"
        for p in sorted(src.rglob("*.py"))
        if p.relative_to(src) != HOME.relative_to(SRC)
        for line, name in _calls(ast.parse(p.read_text()), BUILDERS)
    ]


def test_no_module_but_the_contract_builds_an_instance():
    assert builders_outside_the_contract(SRC) == []
    # and inside the contract, a config's entry is resolved by resolve_instance alone
    users = {
        fn.name
        for fn in ast.walk(ast.parse(HOME.read_text()))
        if isinstance(fn, ast.FunctionDef) and _calls(fn, {"make_instance"})
    }
    assert users == {"resolve_instance"}


def test_the_checker_finds_a_planted_builder(tmp_path):
    (tmp_path / "report").mkdir()
    planted = "from aggbench.aggregation import make_instance\nrule = make_instance('token')\n"
    (tmp_path / "report" / "tables.py").write_text(planted)
    assert builders_outside_the_contract(tmp_path) == ["report/tables.py:2 make_instance"]


def test_constant_gets_the_response_budget_as_its_max_length():
    inst = resolve_instance({"name": "constant"}, max_new_tokens=48)
    assert inst.params["max_length"] == 48
    given = resolve_instance(
        {"name": "c", "rule": "constant", "params": {"max_length": 7}}, max_new_tokens=48
    )
    assert given.params["max_length"] == 7  # an entry's own value wins
    assert resolve_instance({"name": "constant"}).params["max_length"] is None
    assert "max_length" not in resolve_instance({"name": "token"}, max_new_tokens=48).params


def test_an_attribute_entry_and_a_mapping_entry_resolve_alike():
    entry = {"name": "b", "rule": "balanced", "params": {"variant": "mass"}}
    assert resolve_instance(entry) == resolve_instance(SimpleNamespace(**entry))


def test_a_constant_runs_tags_carry_what_its_aggregation_json_records():
    cfg = TrainConfig(
        model={"name": "tiny", "path": "unused"},
        dataset={"name": "toy", "path": "unused.jsonl"},
        aggregation={"name": "constant"},
    )
    rule = resolve_instance(cfg.aggregation, max_new_tokens=cfg.sampling.max_new_tokens)
    tags = run_tags(cfg, rule, [])
    described = rule.describe()  # what the trainer writes to aggregation.json
    assert tags["aggregation.max_length"] == described["max_length"] == cfg.sampling.max_new_tokens
    for key in ("rule", "version"):
        assert tags[f"aggregation.{key}"] == described[key]
