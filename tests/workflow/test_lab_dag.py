"""configs/lab.yaml, lab_v2.yaml and lab_v3.yaml, the controlled length-bias labs: their dry runs are
the grids the labs promise (v1: 4 knob settings x 3 rules x 3 seeds; v2: 5 settings, its seeds; v3:
v2's four gap x spread settings, token and sequence, 15 fresh seeds, nothing else changed), each
setting's knobs reaching `aggbench prepare-model`, and a 2-step version of v2 (1 seed, a few prompts)
runs through Snakemake to the tables and to v2's checks and decisions (aggbench.report.lab_v2)."""

from __future__ import annotations

import csv
import json
import re

import pytest
import yaml

from aggbench.grid import load_experiment
from aggbench.layout import eval_metrics_file


def _lab(wf, name="lab"):
    return wf.REPO / "configs" / f"{name}.yaml"


def test_lab_grid_is_four_knob_settings_by_three_rules_by_three_seeds(wf, tmp_path):
    exp = load_experiment(_lab(wf))
    assert {name: m["task"] for name, m in exp["models"].items()} == {
        f"tiny-{g[:3]}-{s}": {"gap": g, "spread": s}
        for g in ("positive", "negative")
        for s in ("low", "high")
    }
    proc = wf.run(["-n", "-p", "--configfile", str(_lab(wf)), "--config", f"results_dir={tmp_path / 'r'}"])
    counts = wf.job_counts(proc.stdout)
    total = exp["training"]["algorithm"]["total_steps"]
    segments = total // exp["training"]["checkpoint"]["every"]
    cells = 4 * 3 * 3
    assert counts["cell_config"] == cells and counts["train"] == cells * segments, counts
    assert counts["prepare_model"] == 4 and counts["prepare_data"] == 1, counts  # one dataset for all four
    # evaluation at the last step only, plus each warm start: the steps go to training
    assert counts["generate"] == cells and counts["generate_base"] == 4, counts
    # the four warm starts share their knob-free first half: it runs once, each model continues from
    # it (the same weights as a warm start alone: tests/tiny/test_skill_phase.py)
    assert counts["prepare_skill_phase"] == 1, counts
    phase = re.findall(
        r"aggbench prepare-model tiny --skill-phase-only --sft-steps 500 --out (\S+)", proc.stdout
    )
    assert len(phase) == 1 and "/warm_starts/skill-0-500-" in phase[0], phase
    commands = re.findall(r"aggbench prepare-model tiny (?!--skill-phase-only)[^>]*", proc.stdout)
    assert len(commands) == 4
    assert all(f"--skill-from {phase[0]} " in c for c in commands), commands
    for gap in ("positive", "negative"):
        for spread in ("low", "high"):
            assert any(
                f"--gap {gap} " in c and f"--spread {spread} " in c and f"tiny-{gap[:3]}-{spread} " in c
                for c in commands
            ), commands
    # the warm starts' weights depend on torch's thread count: a 1-core run trains them on the
    # same 2 threads (Snakemake lowers {threads} to --cores; tests/tiny/test_skill_phase.py)
    one_core = wf.run(
        [
            "-n",
            "-p",
            "--cores",
            "1",
            "--configfile",
            str(_lab(wf)),
            "--config",
            f"results_dir={tmp_path / 'c'}",
        ]
    )
    warm = re.findall(r"export OMP_NUM_THREADS=(\d+); aggbench prepare-model", one_core.stdout)
    assert warm == ["2"] * 5, warm  # the skill phase and the four models
    # a grid whose warm starts share nothing runs each alone, as before (the smoke grid: one model)
    smoke = wf.run(["-n", "-p", "--config", f"results_dir={tmp_path / 's'}"])
    assert "prepare_skill_phase" not in smoke.stdout and "--skill-from" not in smoke.stdout
    assert wf.job_counts(smoke.stdout)["prepare_model"] == 1
    # every setting's rollouts fit its longest warm-start answer (TaskConfig.max_response_tokens)
    from aggbench.grid import cell_train_config
    from aggbench.tiny.task import TaskConfig

    for name, m in exp["models"].items():
        cfg = cell_train_config(exp, f"{name}__tiny__token__s0")
        longest = TaskConfig(**m["task"]).max_response_tokens()
        assert longest < cfg.sampling.max_new_tokens <= exp["evaluation"]["max_tokens"], name


def test_lab_v2_grid_is_five_settings_by_three_rules_by_its_seeds(wf, tmp_path):
    exp = load_experiment(_lab(wf, "lab_v2"))
    assert {name: m["task"] for name, m in exp["models"].items()} == {
        "tiny-pos-low": {"gap": "positive_line", "spread": "low"},
        "tiny-pos-high": {"gap": "positive_line", "spread": "echo"},
        "tiny-neg-low": {"gap": "negative_line", "spread": "low"},
        "tiny-neg-high": {"gap": "negative_line", "spread": "echo"},
        "tiny-control": {"spread": "echo_worked"},
    }
    proc = wf.run(
        ["-n", "-p", "--configfile", str(_lab(wf, "lab_v2")), "--config", f"results_dir={tmp_path / 'r'}"]
    )
    counts = wf.job_counts(proc.stdout)
    cells = 5 * 3 * len(exp["seeds"])
    assert counts["train"] == cells and counts["generate"] == cells and counts["prepare_model"] == 5, counts
    assert counts["prepare_skill_phase"] == 1, counts  # all five share the knob-free first half
    commands = re.findall(r"aggbench prepare-model tiny (?!--skill-phase-only)[^>]*", proc.stdout)
    assert any("--spread echo_worked " in c and "tiny-control " in c for c in commands), commands
    assert any("--gap negative_line " in c and "--spread echo " in c for c in commands), commands
    from aggbench.grid import cell_train_config
    from aggbench.tiny.task import TaskConfig

    for name, m in exp["models"].items():
        cfg = cell_train_config(exp, f"{name}__tiny__token__s0")
        longest = TaskConfig(**m["task"]).max_response_tokens()
        assert longest < cfg.sampling.max_new_tokens <= exp["evaluation"]["max_tokens"], name


def test_lab_v3_is_lab_v2s_h2_part_on_fresh_seeds(wf, tmp_path):
    """Lab v3 (docs/lab.md, pre-registered): nothing retuned. Its config is v2's without the control
    and the balanced rule, on 15 seeds v2 did not use; its dry run is that grid."""
    v2, v3 = (yaml.safe_load(_lab(wf, n).read_text()) for n in ("lab_v2", "lab_v3"))
    assert v3["models"] == {k: m for k, m in v2["models"].items() if k != "tiny-control"}
    assert v3["aggregations"] == [{"name": "token"}, {"name": "sequence"}]
    assert v3["seeds"] == list(range(6, 21)) and not set(v3["seeds"]) & set(v2["seeds"])
    same = set(v2) - {"experiment", "results_dir", "models", "aggregations", "seeds"}
    assert {k: v3[k] for k in same} == {k: v2[k] for k in same} and set(v3) == set(v2)
    exp = load_experiment(_lab(wf, "lab_v3"))
    proc = wf.run(
        ["-n", "-p", "--configfile", str(_lab(wf, "lab_v3")), "--config", f"results_dir={tmp_path / 'r'}"]
    )
    counts = wf.job_counts(proc.stdout)
    cells = 4 * 2 * 15
    assert len(exp["seeds"]) == 15 and counts["train"] == cells and counts["generate"] == cells, counts
    assert counts["prepare_model"] == 4 and counts["prepare_skill_phase"] == 1, counts


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_two_step_lab_v2_runs_to_the_tables_and_its_checks(wf, tmp_path, tiny_model):
    """Lab v2's config itself, shrunk: 2 steps, 1 seed, 4 prompts x 4 samples, 2 test problems. Two of
    the five models (a gap arm with the echo lines, and the control), each the DAG tests' shared tiny
    model (preparing each setting's warm start is `aggbench prepare-model`'s job, tested with the
    knobs in tests/tiny; here the grid is). v2's checks then run on the real run files: every cell
    trained its named rule (its logged loss and weights), the control's echo share is read from
    its graded samples, and the probability metric is there."""
    from aggbench.report.lab_v2 import apply_gate, load_cells, render

    results = tmp_path / "results"
    over = {
        "results_dir": str(results),
        "seeds": [0],
        "training": {
            "algorithm": {"total_steps": 2, "prompts_per_step": 4, "group_size": 4, "micro_batch_size": 16},
            "checkpoint": {"every": 2},
        },
        # with the held-out selection split: the report adds the selected-checkpoint table
        "benchmarks": ["tiny_test", "tiny_val"],
        "evaluation": {
            "every": 2,
            "n": 1,
            "limit": 2,
            "base_model": False,
            "selection": {"tiny_test": "tiny_val"},
            # and an extra evaluation seed: its generate and grade jobs run, the report writes variance.md
            "extra_seeds": [1],
        },
    }
    config = wf.write_config(tmp_path / "lab2.yaml", over, base=_lab(wf, "lab_v2"))
    cfg = yaml.safe_load(config.read_text())
    cfg["models"] = {m: cfg["models"][m] for m in ("tiny-pos-high", "tiny-control")}
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    models = list(cfg["models"])
    for name in models:
        wf.populate_model(results, tiny_model, name=name)
    wf.run(["--cores", "2", "--configfile", str(config), "--directory", str(tmp_path)], timeout=1500)

    rows = list(csv.DictReader((results / "tables" / "last.csv").open()))
    last = [r for r in rows if r["table"] == "last" and r["column"] == "tiny_test"]
    filled = {(r["model"], r["row"]) for r in last if r["mean"] != "" and r["step"] == "2"}
    assert filled == {(m, rule) for m in models for rule in ("token", "sequence", "balanced")}, last
    assert {r["column"] for r in rows} == {"tiny_test", "average", "drop"}  # tiny_val selects, no column
    selected = list(csv.DictReader((results / "tables" / "selected.csv").open()))
    chosen = {(r["model"], r["row"]) for r in selected if r["column"] == "tiny_test" and r["step"] == "2"}
    assert chosen == filled, selected  # one evaluated step: it is the one chosen
    for name in models:
        for rule in ("token", "sequence", "balanced"):
            again = results / "runs" / f"{name}__tiny__{rule}__s0" / "eval" / "step_2" / "eval_seed_1"
            assert {p.name for p in again.iterdir()} >= {"tiny_test.jsonl", "tiny_val.metrics.json"}
    variance = (results / "tables" / "variance.md").read_text()
    assert "needs >= 2 training seeds" in variance  # one seed here: tests/report/test_variance.py decomposes

    cells = load_cells(results, step=2, benchmark="tiny_test", metric="avg@1")
    apply_gate(cells)
    assert len(cells) == 6
    assert [c.rule_problem for c in cells] == [None] * 6  # each trained its named rule, told apart
    control = [c for c in cells if c.arm == "control"]
    assert control and all(c.echo_share is None or 0 <= c.echo_share <= 100 for c in control)
    assert all(0 <= c.sampled <= 100 for c in cells)
    assert all(c.prob is None or 0 <= c.prob <= 100 for c in cells)  # None: the metric not usable there
    for c in cells:  # the probability metric was computed for every cell (a secondary outcome)
        ev = json.loads(eval_metrics_file(results / "runs" / c.cell, 2, "tiny_test").read_text())
        assert 0 <= ev["prob_correct"] <= 1 and "prob_usable" in ev, ev
    text = render(cells)
    assert "Cells analysed:" in text and "not decidable" in text  # one seed: nothing to decide
