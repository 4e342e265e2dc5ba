"""Helpers shared by test modules (importable as `helpers.support`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
import typing
from pathlib import Path

import torch

from aggbench.aggregation import RuleInstance, builtin_instances, get_rule, rule_names

REPO_ROOT = Path(__file__).resolve().parents[2]


# The MLflow key names (after eval/{benchmark}/) of one benchmark's metrics.json with n = 4: every
# avg@/pass@/maj@ value plus the confidence interval, the length statistics and the problem count.
EVAL_KEYS_N4 = [
    "avg_at_4",
    "pass_at_1",
    "pass_at_4",
    "maj_at_4",
    "ci_low",
    "ci_high",
    "mean_length",
    "truncation_rate",
    "n_problems",
]


def shared_data_dir() -> Path:
    """../shared/data beside the repository (AGGBENCH_SHARED_DATA overrides); never copied in."""
    env = os.environ.get("AGGBENCH_SHARED_DATA")
    return Path(env) if env else REPO_ROOT.parent / "shared" / "data"


def random_batch(
    seed: int,
    *,
    n_groups: int = 4,
    group_size: int = 4,
    max_len: int = 12,
    binary: bool = True,
    dtype: torch.dtype = torch.float64,
    zero_group: bool = False,
):
    """A random mini-batch: (mask [B, T] bool, rewards [B], group_ids [B]).

    Lengths are drawn in 1..max_len so the two signs' mean lengths differ in general; with
    ``zero_group`` the first group's rewards are all equal (no learning signal).
    """
    gen = torch.Generator().manual_seed(seed)
    b = n_groups * group_size
    lengths = torch.randint(1, max_len + 1, (b,), generator=gen)
    if binary:
        rewards = torch.randint(0, 2, (b,), generator=gen).to(dtype)
        for g in range(n_groups):  # guarantee variance in every group unless asked otherwise
            sl = slice(g * group_size, (g + 1) * group_size)
            if rewards[sl].min() == rewards[sl].max():
                rewards[g * group_size] = 1 - rewards[g * group_size]
    else:
        rewards = torch.rand(b, generator=gen, dtype=dtype)
    if zero_group:
        rewards[:group_size] = 1.0
    group_ids = torch.arange(n_groups).repeat_interleave(group_size) * 7 + 3  # arbitrary ids
    mask = torch.arange(max_len)[None, :] < lengths[:, None]
    return mask, rewards, group_ids


# ----------------------------------------------------------------------------- rule instances
# Instances the contract tests run over: every registered rule at every allowed value of its
# Literal parameters (scope, variant) plus the built-in named instances. A newly registered rule
# is picked up with no new test code.


def _literal_choices(annotation) -> tuple | None:
    if isinstance(annotation, str):
        from aggbench.aggregation.contract import Scope

        try:
            annotation = eval(annotation, {"Literal": typing.Literal, "Scope": Scope})  # noqa: S307
        except Exception:
            return None
    if typing.get_origin(annotation) is typing.Literal:
        return typing.get_args(annotation)
    return None


def contract_instances() -> list[RuleInstance]:
    out: dict[str, RuleInstance] = dict(builtin_instances())
    for rule in rule_names():
        spec = get_rule(rule)
        axes = {k: _literal_choices(p.annotation) for k, p in spec.params.items()}
        axes = {k: v for k, v in axes.items() if v}
        keys = sorted(axes)
        for values in itertools.product(*(axes[k] for k in keys)):
            params = dict(zip(keys, values, strict=True))
            name = "__".join([rule] + [f"{k}-{v}" for k, v in params.items()])
            out[name] = RuleInstance(name, rule, params)
    return list(out.values())


def instance_ids(insts: list[RuleInstance]) -> list[str]:
    return [i.name for i in insts]


def import_without(tmp_path: Path, blocked: str, modules: list[str]) -> subprocess.CompletedProcess:
    """Import ``modules`` in a fresh interpreter where ``import <blocked>`` fails (a stub package
    that raises ImportError shadows the real one); the process prints how many it imported."""
    stub = tmp_path / blocked
    stub.mkdir()
    (stub / "__init__.py").write_text(f'raise ImportError("{blocked} is blocked in this check")\n')
    code = textwrap.dedent(
        f"""
        import importlib, sys
        sys.path.insert(0, {str(tmp_path)!r})
        for name in {modules!r}:
            importlib.import_module(name)
        assert sys.modules.get({blocked!r}) is None, "{blocked} was imported"
        print(len({modules!r}))
        """
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
