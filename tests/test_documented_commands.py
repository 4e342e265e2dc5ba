"""Commands the docs give, run as written (issue 24, item 5): a doc edit that breaks one fails here.

- README's contract-test command for a plugin rule (`PYTHONPATH=. pytest -p my_rules ...`), from a
  directory holding README's `my_rules.py`; without `PYTHONPATH=.` pytest cannot import the plugin
  (the control), which is why the command carries it.
- docs/workflow.md's `mlflow.load_table` block against a store written by the real report code;
  without `set_experiment` it does not find the summary run's table (the control).
- Installs from a clone: aggbench is on no package index, so the docs never say
  `pip install aggbench...` or `pip install "aggbench[...]"`, and name `pip install -e ".[trl]"`.
"""

from __future__ import annotations

import csv
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from aggbench import golden

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
GOLDEN_LAST = golden.sets(REPO / "tests" / "golden" / "smoke")[0] / "tables" / "last.csv"  # any set will do


def _readme_block(first_line: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if b.splitlines()[0].strip() == first_line]
    return block


def _contract_command() -> str:
    (cmd,) = re.findall(r"`(PYTHONPATH=\. \S*pytest -p my_rules [^`]*)`", README.read_text())
    return cmd


def _run_documented(cmd: str, cwd: Path, *, keep_pythonpath: bool) -> subprocess.CompletedProcess:
    words = shlex.split(cmd)
    assert words[0] == "PYTHONPATH=." and words[1].endswith("pytest"), cmd
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if keep_pythonpath:
        env["PYTHONPATH"] = "."
    # The venv's `pytest` script, as documented: `python -m pytest` would put the working directory
    # on sys.path itself and hide a missing PYTHONPATH.
    script = Path(sys.executable).with_name("pytest")
    assert script.exists(), script
    argv = [str(script), "-p", "no:cacheprovider", *words[2:]]
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_readme_contract_test_command_checks_a_plugin_rule(tmp_path):
    # A user's checkout: README's my_rules.py beside the repository's tests and pytest config.
    (tmp_path / "my_rules.py").write_text(_readme_block("# my_rules.py"))
    for name in ("tests", "pyproject.toml"):
        (tmp_path / name).symlink_to(REPO / name)
    cmd = _contract_command()
    proc = _run_documented(cmd, tmp_path, keep_pythonpath=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 5, proc.stdout[-2000:]
    control = _run_documented(cmd, tmp_path, keep_pythonpath=False)
    assert control.returncode != 0
    assert "my_rules" in control.stdout + control.stderr


def _docs_load_table_block() -> str:
    text = (REPO / "docs" / "workflow.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "load_table" in b]
    return block


def test_docs_load_table_block_reads_the_summary_table(tmp_path):
    from aggbench.report.summary import log_summary

    results = tmp_path / "results"
    results.mkdir()
    log_summary(f"sqlite:///{results / 'mlflow.db'}", "smoke", [GOLDEN_LAST], [])
    block = _docs_load_table_block()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    script = (
        block + "\nprint('ROWS', len(last), 'ROW0', last['row'].iloc[0], 'MEAN0', last['mean'].iloc[0])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(GOLDEN_LAST.open()))
    assert f"ROWS {len(rows)}" in proc.stdout
    assert f"ROW0 {rows[0]['row']} MEAN0 {float(rows[0]['mean'])}" in proc.stdout, proc.stdout[-500:]
    # The control: the same block without set_experiment finds no summary run in the default one.
    control = re.sub(
        r"exp = mlflow\.set_experiment\([^)]*\).*\n", "exp = mlflow.get_experiment('0')\n", block
    )
    assert control != block
    proc = subprocess.run(
        [sys.executable, "-c", control], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0


DOCS = [README, *sorted((REPO / "docs").glob("*.md"))]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_docs_install_aggbench_from_a_clone(path):
    text = path.read_text()
    bad = re.findall(r"pip install\s+\"?aggbench\b[^`\n]*", text)
    assert not bad, (
        f'{path.name}: aggbench is on no index; write `pip install -e ".[extra]"` (from a clone): {bad}'
    )


def test_readme_names_the_trl_install_from_a_clone():
    assert re.search(r'pip install\s+-e "\.\[trl\]"', README.read_text())


def test_readme_and_docs_trl_snippets_import_every_name_they_use():
    """README's and docs/integrations.md's TRL/monitor snippets are copy-paste code: each name they call
    at module level (GRPOConfig, the trainer classes) is imported in the snippet (the `...` and
    user-supplied names such as model, reward, data stand for the user's own)."""
    import ast

    users = {"model", "reward", "data", "my_reward", "my_dataset"}
    texts = README.read_text() + (REPO / "docs" / "integrations.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", texts, re.S) if "integrations.trl" in b]
    assert len(blocks) >= 3
    for block in blocks:
        tree = ast.parse(block)
        imported = {
            a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names
        }
        called = {
            n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
        }
        assert called - imported - users == set(), block
