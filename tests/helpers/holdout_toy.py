"""A toy training set with a holdout and its holdout benchmark, offline (the holdout tests:
tests/data/test_holdout.py, tests/data/test_holdout_split_check.py; the ``toy`` fixture is in
tests/data/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

BOXED = "{prompt}\nPlease reason step by step, and put your final answer within \\boxed{}."


def write_specs(root: Path, *, n: int = 3, seed: int = 0, rows: list[dict] | None = None) -> Path:
    """A training spec `toy` (offline file, holdout n/seed) and a benchmark `toy_val` holding it out,
    under root/datasets and root/benchmarks; the data under root/data."""
    (root / "datasets").mkdir(exist_ok=True)
    (root / "benchmarks").mkdir(exist_ok=True)
    (root / "data").mkdir(exist_ok=True)
    spec = {
        "name": "toy",
        "version": 1,
        "offline_file": "toy.jsonl",
        "fields": {"id": "uid", "prompt": "problem", "answer": "answer"},
        "grader": {"name": "math"},
        "holdout": {"n": n, "seed": seed},
    }
    (root / "datasets" / "toy.yaml").write_text(yaml.safe_dump(spec))
    bench = {
        "name": "toy_val",
        "version": 1,
        "holdout_of": "toy",
        "prompt_template": BOXED,
        "grader": {"name": "math"},
        "sampling": {"n": 4, "temperature": 0.6, "top_p": 0.95, "max_tokens": 512},
        "metrics": ["avg@4"],
    }
    (root / "benchmarks" / "toy_val.yaml").write_text(yaml.safe_dump(bench))
    if rows is not None:
        (root / "data" / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def toy_rows() -> list[dict]:
    """20 problems; problem 5 appears three times (as Polaris, published without de-duplication)."""
    rows = [{"uid": f"u{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(20)]
    rows += [{"uid": f"u5-again-{k}", "problem": "What is 5 + 5?", "answer": "10"} for k in range(2)]
    return rows


def toy_grid(toy: Path, tmp_path: Path) -> dict:
    """The smoke grid trained on the toy set (``toy``: the fixture's spec root), results under tmp_path."""
    from aggbench import grid

    exp = grid.load_experiment(grid.REPO_ROOT / "configs" / "smoke.yaml")
    exp["results_dir"] = str(tmp_path / "results")
    exp["datasets"] = {"toy": {"spec": "toy"}}
    return exp
