"""`aggbench grid check` and `aggbench plan` find a plugin beside the config, as Snakemake does.

The user's rule module sits in the config's folder, the command runs from another folder with
nothing on PYTHONPATH: both commands must import it (the Snakefile adds the config's folder), and
a plugin that exists nowhere is named with the folders searched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
AGGBENCH = str(Path(sys.executable).parent / "aggbench")

PLUGIN = '''
from aggbench.aggregation import check_inputs, register_rule


@register_rule("gridtest_sqrt_length")
def gridtest_sqrt_length(mask, advantages, group_ids):
    """c_i = 1 / (N * sqrt(|o_i|)). mask [B, T], advantages [B], group_ids [B] -> [B, T]."""
    m = check_inputs(mask, advantages, group_ids)
    return (advantages / (m.shape[0] * m.sum(1).clamp_min(1) ** 0.5))[:, None] * m
'''


def _user_config(tmp_path: Path, plugin: str) -> Path:
    userdir = tmp_path / "userdir"
    userdir.mkdir()
    (userdir / "gridtest_rules.py").write_text(PLUGIN)
    cfg = yaml.safe_load((REPO / "configs" / "smoke.yaml").read_text())
    cfg["plugins"] = [plugin]
    cfg["aggregations"] = [{"name": "token"}, {"name": "sqrtlen", "rule": "gridtest_sqrt_length"}]
    path = userdir / "experiment.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([AGGBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_plugin_beside_the_config_is_found_from_another_folder(tmp_path):
    config = _user_config(tmp_path, "gridtest_rules")
    work = tmp_path / "work"
    work.mkdir()

    check = _run(["grid", "check", "--config", str(config), "--format", "json"], cwd=work)
    assert check.returncode == 0, check.stderr
    assert json.loads(check.stdout)["jobs"]["cells"] == 2, check.stdout

    plan = _run(["plan", str(config), "--format", "json"], cwd=work)
    assert plan.returncode == 0, plan.stderr
    assert "sqrtlen" in plan.stdout


def test_missing_plugin_is_named(tmp_path):
    config = _user_config(tmp_path, "gridtest_no_such_module")
    work = tmp_path / "work"
    work.mkdir()
    check = _run(["grid", "check", "--config", str(config)], cwd=work)
    assert check.returncode != 0
    assert "gridtest_no_such_module" in check.stderr and "Traceback" not in check.stderr, check.stderr
