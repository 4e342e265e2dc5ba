"""configs/smoke_vllm.yaml end to end on REAL vLLM (the CPU build): snakemake trains one rule for 4
steps with vLLM rollouts (weights pushed after every update), evaluates the base model (step 0) and
step 4 with `aggbench generate --engine vllm`, and writes the tables.

The prepared tiny model is put in place first (its warm start is not what this checks).
"""

from __future__ import annotations

import csv
import json

import pytest
import yaml

from aggbench import layout
from helpers.real_vllm import require_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500)]
require_vllm()


def test_smoke_vllm_dag_trains_evaluates_and_reports(wf, tiny_model, tmp_path, monkeypatch):
    base = wf.REPO / "configs" / "smoke_vllm.yaml"
    results = tmp_path / "results"
    over = {"results_dir": str(results), "models": {"tiny": {"sft_steps": wf.TEST_SFT_STEPS}}}
    config = wf.write_config(tmp_path / "smoke_vllm.yaml", over, base=base)
    wf.populate_model(results, tiny_model)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)  # each job decides for itself
    wf.run(["--cores", "2", "--configfile", str(config)], timeout=1200, env={"VLLM_CPU_KVCACHE_SPACE": "1"})

    cfg = yaml.safe_load(config.read_text())
    assert cfg["training"]["rollout"]["engine"] == cfg["evaluation"]["engine"] == "vllm"
    run = layout.run_dir(results, "tiny__tiny__balanced__s0")
    rows = [json.loads(line) for line in layout.metrics_file(run).read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["rollout/push_diff_after"] < 1e-3 and "rollout/logprob_gap_mean" in r for r in rows)
    gen = json.loads((layout.samples_dir(run, 4) / "generation.json").read_text())
    assert gen["engine"] == "vllm" and gen["benchmarks"]["tiny_test"]["n_problems"] == 64

    last = [
        r for r in csv.DictReader((layout.tables_dir(results) / "last.csv").open()) if r["table"] == "last"
    ]
    cells = {(r["row"], r["column"]): r for r in last}
    labels = {row for row, _ in cells}
    assert "balanced" in labels and len(labels) == 2, labels  # the rule and the base model (step 0)
    for label in labels:
        value = float(cells[(label, "tiny_test")]["mean"])
        assert 0.0 <= value <= 100.0 and cells[(label, "tiny_test")]["flagged"] == "0"
    assert int(cells[("balanced", "tiny_test")]["step"]) == 4
