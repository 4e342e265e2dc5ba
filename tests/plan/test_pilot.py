"""configs/pilot.yaml: one paper cell, a few steps, a reduced evaluation; its bill is in README.

The pilot is what a new user submits before the paper's 1,077 SLURM jobs, so it must be the paper's
cell (same model, data, rule and training settings) and differ only where its comments say.
README's cluster section states the GPU-hours of both configs as `aggbench plan` prints them: a
change of evaluation or training settings that moves the bill fails here until README says so.
"""

from __future__ import annotations

import copy

import yaml

from aggbench.grid import cells, load_experiment

from .test_plan import PAPER, REPO, plan_json

PILOT = REPO / "configs" / "pilot.yaml"
# What the pilot changes on purpose (its header and inline comments say so).
PILOT_CHANGES = {
    ("training", "algorithm", "total_steps"): (200, 10),
    ("training", "checkpoint", "every"): (25, 5),  # two segments: the second resumes a checkpoint
    ("evaluation", "every"): (25, 5),
}


def test_pilot_is_the_one_paper_cell_qwen3_dapo_balanced():
    assert [c.id for c in cells(load_experiment(str(PILOT)))] == ["qwen3-1.7b__dapo17k__balanced__s0"]
    paper_ids = {c.id for c in cells(load_experiment(str(PAPER)))}
    assert "qwen3-1.7b__dapo17k__balanced__s0" in paper_ids


def test_pilot_differs_from_the_paper_only_where_it_says():
    paper, pilot = (yaml.safe_load(p.read_text()) for p in (PAPER, PILOT))
    assert pilot["models"]["qwen3-1.7b"] == paper["models"]["qwen3-1.7b"]
    assert pilot["datasets"]["dapo17k"] == paper["datasets"]["dapo17k"]
    expected = copy.deepcopy(paper["training"])
    got = copy.deepcopy(pilot["training"])
    for path, (was, now) in PILOT_CHANGES.items():
        if path[0] != "training":
            continue
        *parents, key = path[1:]
        want, have = expected, got
        for p in parents:
            want, have = want[p], have[p]
        assert (want[key], have[key]) == (was, now), path
        want[key] = have[key]
    assert got == expected
    ev = pilot["evaluation"]
    assert (paper["evaluation"]["every"], ev["every"]) == PILOT_CHANGES[("evaluation", "every")]
    assert ev["n"] == 1 and ev["max_tokens"] < 8192  # the reduced evaluation
    assert set(pilot["benchmarks"]) < set(paper["benchmarks"])


def test_readme_states_the_gpu_hours_aggbench_plan_gives():
    readme = (REPO / "README.md").read_text()
    plans = {p: plan_json(p) for p in (PAPER, PILOT)}
    for path, plan in plans.items():  # the table's row: config, cells, SLURM jobs
        n_cells = len(cells(load_experiment(str(path))))
        row = f"| `configs/{path.name}` | {n_cells} | {plan['jobs']['slurm']:,} |"
        assert row in readme, row
    paper, pilot = (plans[p]["totals"] for p in (PAPER, PILOT))
    assert paper["complete"] and pilot["complete"]
    for name, totals in (("paper", paper), ("pilot", pilot)):
        estimated = (
            f"{totals['gpu_hours']:,.0f}" if totals["gpu_hours"] >= 100 else f"{totals['gpu_hours']:.1f}"
        )
        requested = f"{totals['requested_gpu_hours']:,.0f}"
        assert f"{estimated} GPU-hours estimated" in readme, (name, estimated)
        assert f"{requested} requested" in readme, (name, requested)
    assert pilot["gpu_hours"] < 0.01 * paper["gpu_hours"]
