"""Helpers for the whole-workflow tests: run the real `snakemake` on the real Snakefile.

Every test drives Snakemake through a subprocess, as a user would. Tests that write results point
`results_dir` at a temporary directory (and most also run with `--directory` in one, so
Snakemake's own state under .snakemake/ stays out of the repository).
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SNAKEFILE = REPO / "Snakefile"
SMOKE = REPO / "configs" / "smoke.yaml"
PAPER = REPO / "configs" / "paper.yaml"
# Warm-start steps of the tiny model the DAG tests share (few: these tests check the workflow,
# not learning; the smoke test builds its own model with the smoke config's 150 steps).
TEST_SFT_STEPS = 30


def _exe(name: str) -> str:
    """The tool installed beside this Python (the project's venv), else the one on PATH."""
    here = Path(sys.executable).with_name(name)
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"`{name}` not found beside {sys.executable} or on PATH; install the project first")
    return found


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = (
            deep_merge(out[k], v)
            if isinstance(v, dict) and isinstance(out.get(k), dict)
            else copy.deepcopy(v)
        )
    return out


def write_config(
    path: Path, over: dict | None = None, *, base: Path = SMOKE, drop: tuple[str, ...] = ()
) -> Path:
    """A copy of `base` (the smoke config) with `over` merged in and top-level keys `drop`ped."""
    cfg = deep_merge(yaml.safe_load(base.read_text()), over or {})
    for key in drop:
        cfg.pop(key, None)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def small_config(path: Path, results: Path, over: dict | None = None) -> Path:
    """A minimal grid on the tiny model: one rule, few steps, 4 test problems x 2 samples."""
    base = {
        "results_dir": str(results),
        "models": {"tiny": {"source": "tiny", "sft_steps": TEST_SFT_STEPS}},
        "aggregations": [{"name": "balanced"}],
        "training": {
            "algorithm": {"total_steps": 2, "prompts_per_step": 4, "group_size": 4, "micro_batch_size": 16},
            "checkpoint": {"every": 2},
        },
        "evaluation": {"every": 2, "n": 2, "limit": 4, "base_model": False},
    }
    cfg = yaml.safe_load(SMOKE.read_text())
    cfg["aggregations"] = []  # replaced, not merged
    cfg = deep_merge(deep_merge(cfg, base), over or {})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def small_grid(
    tmp_path: Path, name: str, model_dir: Path, *, total_steps: int, checkpoint_every: int, eval_every: int
) -> tuple[Path, Path]:
    """A :func:`small_config` grid with these steps, results under ``tmp_path/results`` and the
    prepared tiny model already in place there; returns (config path, results dir)."""
    results = tmp_path / "results"
    over = {
        "training": {"algorithm": {"total_steps": total_steps}, "checkpoint": {"every": checkpoint_every}},
        "evaluation": {"every": eval_every},
    }
    config = small_config(tmp_path / f"{name}.yaml", results, over)
    populate_model(results, model_dir)
    return config, results


def expected_jobs(
    *,
    cells: int,
    segments: int,
    evaluations: int,
    benchmarks: int = 1,
    base_model: bool = False,
    prepare: bool = True,
    fetch: bool = True,
) -> dict[str, int]:
    """Snakemake's job counts for a one-model, one-dataset grid of this shape: per cell a config,
    ``segments`` train jobs, ``evaluations`` generate jobs and one grade job per benchmark each;
    the base model's generate and grade jobs; prepare_model/prepare_data unless already done, and
    fetch_benchmarks unless its lock is already there."""
    counts = {"prepare_model": 1, "prepare_data": 1} if prepare else {}
    counts |= {"fetch_benchmarks": 1} if fetch else {}
    counts |= {
        "experiment_config": 1,
        "cell_config": cells,
        "train": cells * segments,
        "generate": cells * evaluations,
        "grade": cells * evaluations * benchmarks,
    }
    if base_model:
        counts |= {"generate_base": 1, "grade_base": benchmarks}
    return counts | {"report": 1, "all": 1}


def run(
    args: list[str],
    *,
    cwd: Path = REPO,
    timeout: float = 600,
    env: dict[str, str] | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess:
    """`snakemake ARGS` in `cwd`; on failure (with check) the assertion shows the output's tail.

    Snakemake runs in its own process group, killed whole on a timeout or when the test is
    interrupted, so no job it started outlives the test.
    """
    cmd = [_exe("snakemake"), *args]
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"snakemake {' '.join(args)} timed out after {timeout} s\n{(out + err)[-6000:]}")
    finally:
        _kill_group(proc)
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check and done.returncode != 0:
        pytest.fail(
            f"snakemake {' '.join(args)} exited {done.returncode}\n"
            f"--- stdout (tail)\n{out[-4000:]}\n--- stderr (tail)\n{err[-8000:]}"
        )
    return done


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of `proc` (Snakemake and the jobs it started), if any is left."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def job_counts(text: str) -> dict[str, int]:
    """The 'Job stats' table Snakemake prints (first one), as {rule: count}, without 'total'."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == "Job stats:")
    except StopIteration:
        return {}
    counts: dict[str, int] = {}
    for line in lines[start + 3 :]:
        m = re.fullmatch(r"\s*([A-Za-z_][\w]*)\s+(\d+)\s*", line)
        if not m:
            break
        if m.group(1) != "total":
            counts[m.group(1)] = int(m.group(2))
    return counts


def jobs(text: str) -> list[dict[str, Any]]:
    """Every job block of Snakemake's (dry-)run output: {rule, local, wildcards, resources}."""
    out: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    for line in text.splitlines():
        m = re.match(r"^(local)?rule (\w+):\s*$", line)
        if m:
            current = {"rule": m.group(2), "local": bool(m.group(1)), "wildcards": {}, "resources": {}}
            out.append(current)
            continue
        if current is None:
            continue
        m = re.match(r"^\s+(wildcards|resources): (.*)$", line)
        if m:
            pairs = dict(p.split("=", 1) for p in m.group(2).split(", ") if "=" in p)
            current[m.group(1)] = pairs
    return out


def populate_model(results: Path, model_dir: Path, name: str = "tiny") -> Path:
    """Put an already prepared model where prepare_model would write it (saves its minutes)."""
    dest = results / "models" / name
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(model_dir, dest)
    return dest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """The tiny model as `aggbench prepare-model` (the rule's command) builds it, with few steps."""
    out = tmp_path_factory.mktemp("wf-model") / "tiny"
    proc = subprocess.run(
        [
            _exe("aggbench"),
            "prepare-model",
            "tiny",
            "--sft-steps",
            str(TEST_SFT_STEPS),
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"aggbench prepare-model failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return out


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The smoke DAG run once, exactly as `snakemake --cores 2` runs it, results in a temp dir:
    (results, wall seconds, the finished process). Tests that change files work on a copy."""
    import time

    from helpers.smoke_dag import SMOKE_TIMEOUT_S

    results = tmp_path_factory.mktemp("smoke") / "results"
    t0 = time.monotonic()
    proc = run(["--cores", "2", "--config", f"results_dir={results}"], timeout=SMOKE_TIMEOUT_S)
    wall = time.monotonic() - t0
    print(f"\nsmoke DAG: {wall:.0f} s wall on this machine")
    (results / "smoke_wall_seconds.txt").write_text(f"{wall:.1f}\n")
    return results, wall, proc


@pytest.fixture(scope="session")
def wf():
    """The helpers above, for the test modules (a conftest cannot be imported by name)."""
    import types

    return types.SimpleNamespace(
        REPO=REPO,
        SNAKEFILE=SNAKEFILE,
        SMOKE=SMOKE,
        PAPER=PAPER,
        TEST_SFT_STEPS=TEST_SFT_STEPS,
        deep_merge=deep_merge,
        write_config=write_config,
        small_config=small_config,
        small_grid=small_grid,
        expected_jobs=expected_jobs,
        run=run,
        job_counts=job_counts,
        jobs=jobs,
        populate_model=populate_model,
        exe=_exe,
    )
