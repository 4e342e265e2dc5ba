"""The real trainer on 2 ranks (torchrun, gloo, CPU) with FSDP2 equals the one-process trainer.

FSDP2's ``fully_shard`` runs on CPU with gloo in torch 2.13, so the FSDP path itself is tested
(no DDP stand-in). Both sides train the tiny model for 2 steps in float64 with
``rollout.seeding: prompt`` (each prompt group sampled on its own seed, so the rollouts do not
depend on which rank samples which prompt), 2 mini-batches per step and micro-batches of 3 (so the
ranks' micro-batches differ from the one process's). What must hold:

* token, sequence (with a KL term: the reference model is sharded too) and balanced (with
  activation checkpointing): the same parameters after 2 steps, the same metrics, the same rollouts;
* the mean-over-ranks slip (FSDP2's default reduction) is caught by the same comparison;
* a run stopped after step 1 and resumed from its sharded checkpoint (a new torchrun) equals the
  straight run; a different number of processes is refused; a locked run directory is refused;
* the export in step_N/ loads with ``AutoModelForCausalLM.from_pretrained``;
* DDP (the other strategy) equals the one-process run as well;
* dynamic sampling, which leaves ranks with different numbers of groups (so FSDP ranks must pad
  their forward/backward passes to pair up), trains without hanging (no equality claimed: refill
  prompts are drawn per rank), and the ranks call the rollout engine different numbers of times
  (why vLLM must run as independent engines, not in its lockstep data-parallel mode).

All 2-rank runs share one torchrun launch (plus one for the resume), to pay start-up once.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from aggbench.config import load_train_config
from aggbench.config_errors import ConfigError
from aggbench.train.checkpoint import RunLock
from aggbench.train.loop import train
from helpers.trainer_support import metrics_rows, stable

HERE = Path(__file__).parent
RULES = ("token", "sequence", "balanced")
RTOL, ATOL = 1e-9, 1e-12  # float64; measured differences are ~3e-15 (summation order only)


def _cell(path: Path, model: Path, data: Path, rule: str, **over) -> Path:
    cfg = {
        "model": {"name": "tiny", "path": str(model)},
        "dataset": {"name": "tiny", "path": str(data), "grader": "tiny"},
        "aggregation": {"name": rule},
        "seed": 1,  # both steps of seed 1 have groups with reward variance (asserted below)
        "threads": 1,
        "device": "cpu",
        "precision": "fp64",
        "algorithm": {
            "total_steps": 2,
            "prompts_per_step": 4,
            "group_size": 4,
            "mini_batches": 2,
            "micro_batch_size": 3,
            "lr": 3e-4,
            "kl_coef": 0.01 if rule == "sequence" else 0.0,
        },
        "sampling": {"max_new_tokens": 32},
        # and at step 1 where a run stops there; token's step 1 is the reference of 1-step runs
        "checkpoint": {"every": 1 if rule == "token" else 2},
        "rollout": {"save_rollouts": 16, "seeding": "prompt"},
        "tracking": {"enabled": False},
        "distributed": {"strategy": "fsdp", "activation_checkpointing": rule == "balanced"},
    }
    for key, value in over.items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(cfg))
    return path


def _torchrun(plan: list[dict], work: Path, name: str) -> dict[str, str]:
    (work / f"{name}.json").write_text(json.dumps(plan))
    result = work / f"{name}.result.json"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), env_path()]),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(HERE / "fsdp_worker.py"), str(work / f"{name}.json"), str(result)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stderr[-5000:]
    return json.loads(result.read_text())


def env_path() -> str:
    return os.environ.get("PYTHONPATH", "")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_sft_model, tiny_train_data) -> dict:
    work = tmp_path_factory.mktemp("fsdp")
    cells = {r: _cell(work / f"{r}.yaml", tiny_sft_model, tiny_train_data, r) for r in RULES}
    cells["ddp"] = _cell(
        work / "ddp.yaml", tiny_sft_model, tiny_train_data, "token", distributed={"strategy": "ddp"}
    )
    dynamic = {"dynamic_sampling": True, "dynamic_sampling_max_rounds": 1, "overlong": {"filter": True}}
    cells["dynamic"] = _cell(
        work / "dynamic.yaml",
        tiny_sft_model,
        tiny_train_data,
        "balanced",
        precision="fp32",
        algorithm={**dynamic, "micro_batch_size": 2},
    )
    two = {k: work / f"two-{k}" for k in cells}
    slip, resumed, locked = work / "two-token-mean", work / "two-balanced-resumed", work / "locked"
    plan = [
        {
            "config": str(cells[k]),
            "out": str(two[k]),
            "until": 1 if k == "ddp" else None,
            "count_generate": True,
        }
        for k in cells
    ]
    plan.append({"config": str(cells["token"]), "out": str(slip), "until": 1, "slip": True})
    plan.append({"config": str(cells["balanced"]), "out": str(resumed), "until": 1})
    first = _torchrun(plan, work, "first")
    after_one = sorted(p.name for p in (resumed / "checkpoints" / "step_1").iterdir())
    # second launch: a run directory held by another job is refused; then resume to step 2
    with RunLock(locked):
        second = _torchrun(
            [
                {"config": str(cells["balanced"]), "out": str(locked), "expect_error": True},
                {"config": str(cells["balanced"]), "out": str(resumed)},
            ],
            work,
            "second",
        )
    one = {}
    for rule in RULES:  # the reference: the plain one-process trainer, in this process
        one[rule] = work / f"one-{rule}"
        train(load_train_config(cells[rule]), one[rule], quiet=True)
    return {
        "work": work,
        "cells": cells,
        "one": one,
        "two": two,
        "slip": slip,
        "resumed": resumed,
        "locked": locked,
        "results": {**first, **{f"second:{k}": v for k, v in second.items()}},
        "after_one": after_one,
    }


def _weights(run: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step_{step}" / "model.safetensors")


def _assert_same_weights(a: dict, b: dict, what: str) -> None:
    assert sorted(a) == sorted(b), what
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=RTOL, atol=ATOL, msg=lambda m, k=k: f"{what}, {k}: {m}")


def _assert_same_metrics(run_a: Path, run_b: Path, steps: int = 2) -> None:
    rows_a, rows_b = metrics_rows(run_a)[:steps], metrics_rows(run_b)
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == list(range(1, steps + 1))
    for ra, rb in zip(rows_a, rows_b, strict=True):
        sa, sb = stable(ra), stable(rb)
        assert sorted(sa) == sorted(sb)
        for k in sa:
            assert sb[k] == pytest.approx(sa[k], rel=1e-9, abs=1e-12, nan_ok=True), (ra["step"], k)


@pytest.mark.slow
@pytest.mark.parametrize("rule", RULES)
def test_two_ranks_fsdp_equal_one_process(runs, rule):
    one, two = runs["one"][rule], runs["two"][rule]
    assert runs["results"][str(two)] == "ok"
    # the comparison is not vacuous: both steps have groups with reward variance, and the
    # parameters moved far more than the tolerance
    for row in metrics_rows(one):
        assert row["groups/zero_variance"] < row["groups/total"], row["step"]
    start = load_file(Path(load_train_config(runs["cells"][rule]).model.path) / "model.safetensors")
    w1 = _weights(one, 2)
    assert max(float((w1[k] - start[k].double()).abs().max()) for k in start) > 1e-4
    _assert_same_weights(w1, _weights(two, 2), f"{rule}: 2 ranks vs 1 process after 2 steps")
    _assert_same_metrics(one, two)
    for step in (1, 2):  # rank 0 wrote the whole step's rollouts, in group order
        name = f"rollouts/step_{step}.jsonl"
        assert (two / name).read_text() == (one / name).read_text()
    assert (two / "checkpoints" / "step_2" / "sharded" / ".metadata").exists()


@pytest.mark.slow
def test_ddp_equals_one_process(runs):
    """DDP, one step (the second would test nothing FSDP's runs do not)."""
    assert runs["results"][str(runs["two"]["ddp"])] == "ok"
    _assert_same_weights(_weights(runs["one"]["token"], 1), _weights(runs["two"]["ddp"], 1), "ddp vs 1")
    _assert_same_metrics(runs["one"]["token"], runs["two"]["ddp"], steps=1)
    assert not (runs["two"]["ddp"] / "checkpoints" / "step_1" / "sharded").exists()  # whole-model state


@pytest.mark.slow
def test_mean_reduction_slip_is_caught(runs):
    """FSDP2's default reduction (the mean over ranks) halves the gradient: the comparison fails."""
    one, slip = runs["one"]["token"], runs["slip"]
    with pytest.raises(AssertionError):
        _assert_same_weights(_weights(one, 1), _weights(slip, 1), "slip")
    w1, ws = _weights(one, 1), _weights(slip, 1)
    diff = max(float((w1[k] - ws[k]).abs().max()) for k in w1)
    assert diff > 1e3 * ATOL
    # the logged pre-clip gradient norm (mean of the step's 2 mini-batches) shows the factor itself
    assert metrics_rows(slip)[0]["grad_norm"] == pytest.approx(
        metrics_rows(one)[0]["grad_norm"] / 2, rel=1e-3
    )


@pytest.mark.slow
def test_sharded_resume_equals_straight_run(runs):
    resumed, straight = runs["resumed"], runs["two"]["balanced"]
    # after the first launch, step_1 held the export, the trainer state and both ranks' shards
    assert {"model.safetensors", "trainer_state.pt", "sharded", "COMPLETE"} <= set(runs["after_one"])
    assert runs["results"][f"second:{resumed}"] == "ok"
    _assert_same_weights(_weights(straight, 2), _weights(resumed, 2), "resumed vs straight")
    _assert_same_metrics(straight, resumed)
    # the sharded state is kept for the latest checkpoint only
    assert (resumed / "checkpoints" / "step_2" / "sharded" / ".metadata").exists()
    assert not (resumed / "checkpoints" / "step_1" / "sharded").exists()
    assert (resumed / "checkpoints" / "step_1" / "model.safetensors").exists()


@pytest.mark.slow
def test_locked_run_directory_is_refused_on_every_rank(runs):
    msg = runs["results"][f"second:{runs['locked']}"]
    assert msg.startswith("RunLockedError") and "is being trained by" in msg
    assert not (runs["locked"] / "checkpoints").exists()


@pytest.mark.slow
def test_other_world_size_is_refused(runs, tmp_path):
    run = tmp_path / "copy"
    shutil.copytree(runs["two"]["balanced"], run)
    cfg = load_train_config(runs["cells"]["balanced"], {"algorithm.total_steps": 3})
    with pytest.raises(ConfigError) as err:
        train(cfg, run, quiet=True)  # one process, a checkpoint of 2
    msg = str(err.value)
    assert "written by 2 process(es)" in msg and "--nproc_per_node 2" in msg and "new --out" in msg


@pytest.mark.slow
def test_export_loads_with_from_pretrained(runs):
    from transformers import AutoModelForCausalLM

    step = runs["two"]["token"] / "checkpoints" / "step_2"
    assert json.loads((step / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    model = AutoModelForCausalLM.from_pretrained(step, dtype=torch.float64)
    saved = _weights(runs["two"]["token"], 2)
    state = model.state_dict()
    for k, v in saved.items():
        assert torch.equal(state[k], v), k
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # still tied


@pytest.mark.slow
def test_dynamic_sampling_with_unequal_ranks_trains(runs):
    run = runs["two"]["dynamic"]
    assert runs["results"][str(run)] == "ok"
    rows = metrics_rows(run)
    assert [r["step"] for r in rows] == [1, 2]
    # the filter dropped groups and refilled them under FSDP, and groups/total is the sum of what each
    # rank trained on (recorded by the worker). Whether the two ranks end a step with unequal numbers
    # of groups depends on the sampled rewards (and so on the warm-started weights, which differ with
    # the machine's thread count): tests/train/test_dynamic_sampling_calls.py shows unequal ranks
    # deterministically, with a counting engine on the same sampling code
    held = [json.loads((run / f"groups_held.rank{r}.json").read_text()) for r in (0, 1)]
    assert [int(r["groups/total"]) for r in rows] == [held[0][s] + held[1][s] for s in ("1", "2")], held
    assert any(r["groups/filtered"] > 0 for r in rows), [r["groups/filtered"] for r in rows]
    assert all(r["groups/sampled"] == r["groups/total"] + r["groups/filtered"] for r in rows)
    assert (run / "checkpoints" / "step_2" / "sharded" / ".metadata").exists()
    # one rollout-engine call per sampling round (rollout.seeding: prompt seeds each prompt inside
    # the call): 1, or 2 where the rank refilled (max_rounds 1). Which rank refills depends on its own
    # groups, so the counts can differ between ranks in one step: why the vLLM engine must not be
    # vLLM's lockstep data-parallel mode (shown deterministically in test_dynamic_sampling_calls.py)
    calls = [json.loads((run / f"generate_calls.rank{r}.json").read_text()) for r in (0, 1)]
    assert set(calls[0]) == set(calls[1]) == {"1", "2"}, calls
    assert all(c in (1, 2) for rank in calls for c in rank.values()), calls
    # without dynamic sampling each rank makes exactly one call per step
    same = [json.loads((runs["two"]["token"] / f"generate_calls.rank{r}.json").read_text()) for r in (0, 1)]
    assert same[0] == same[1] == {"1": 1, "2": 1}, same


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        ({"distributed.strategy": "none"}, "distributed.strategy is 'none'"),
        (
            {"rollout.engine": "vllm", "rollout.tensor_parallel_size": 2},
            "rollout.tensor_parallel_size=2 under 2 training processes",
        ),
        ({"algorithm.prompts_per_step": 6}, "prompts_per_step=6 must be a multiple of"),
    ],
)
def test_bad_multi_rank_settings_are_refused_before_starting(tmp_path, monkeypatch, over, expected):
    from aggbench.train import parallel

    cell = _cell(tmp_path / "c.yaml", tmp_path / "model", tmp_path / "data.jsonl", "token")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=expected):
        parallel.setup(load_train_config(cell, over))


def test_fsdp_needs_decoder_layers():
    from aggbench.train.parallel.fsdp import decoder_layers

    with pytest.raises(ConfigError, match="no decoder layers in Linear"):
        decoder_layers(torch.nn.Linear(2, 2))


def _torchrun_cli(cell: Path, out: Path, fault: str | None = None) -> subprocess.CompletedProcess:
    """`aggbench train` on 2 ranks exactly as the `train` rule launches it (torchrun -m aggbench.cli)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("AGGBENCH_FAULT", None)
    if fault:
        env["AGGBENCH_FAULT"] = fault
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += ["-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(out), "--quiet"]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=480)


@pytest.mark.slow
def test_crash_during_a_sharded_checkpoint_write_then_rerun_completes(runs, tmp_path):
    """Both ranks die while step 2's checkpoint is being written (rank 0 inside the atomic write,
    after the sharded state): the rerun resumes from step 1's checkpoint and ends with the weights,
    metrics and rollouts of the uninterrupted 2-rank run, each step once."""
    cell, out = runs["cells"]["token"], tmp_path / "crashed"
    died = _torchrun_cli(cell, out, fault="checkpoint_write:2")
    assert died.returncode != 0
    assert "AGGBENCH_FAULT: dying at checkpoint_write (step 2)" in died.stderr
    assert not (out / "checkpoints" / "step_2").exists()  # nothing that looks finished
    assert [r["step"] for r in metrics_rows(out)] == [1, 2]  # step 2's line was written before the crash
    rerun = _torchrun_cli(cell, out)
    assert rerun.returncode == 0, rerun.stderr[-5000:]
    assert "steps 1 -> 2" in rerun.stdout  # resumed from step 1, not from scratch
    straight = runs["two"]["token"]
    _assert_same_weights(_weights(straight, 2), _weights(out, 2), "crashed + rerun vs straight")
    _assert_same_metrics(straight, out)  # step 2 once, with the completed run's values
    assert (out / "rollouts" / "step_2.jsonl").read_text() == (
        straight / "rollouts" / "step_2.jsonl"
    ).read_text()
    assert not [p.name for p in (out / "checkpoints").iterdir() if ".tmp-" in p.name]  # partial dir cleaned
