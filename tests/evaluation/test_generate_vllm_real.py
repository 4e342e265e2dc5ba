"""`aggbench generate --engine vllm` against REAL vLLM (the CPU build), no fake module: in vLLM's
multiprocess layout (a GPU's default) and in process (the evaluator's choice on CPU).

* tiny_test, 64 problems x 16 samples = 1,024 samples per engine from one warm-started checkpoint,
  fixed seeds: a two-proportion z-test at alpha 0.01 does not separate vLLM's accuracy from the hf
  engine's (the same model, prompts and sampling must give the same accuracy up to noise);
* MATH-500 from ../shared/data, all 500 problems: the tiny model has 512 positions and 40 prompts
  are longer, so the context policy (aggbench.evaluation.context) applies and is counted: those
  get empty `prompt_too_long` rows, the prompts with less room than --max-tokens get capped
  budgets, and nothing is silently truncated or refused by vLLM.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from helpers.real_vllm import require_vllm, subprocess_env

pytestmark = pytest.mark.vllm
require_vllm()

N_SAMPLES = 16  # x 64 tiny_test problems = 1,024 samples per engine


def _generate_vllm(checkpoint, out, *args, data_dir=None, multiprocess=False):
    cmd = [sys.executable, "-m", "aggbench.cli", "generate", "--checkpoint", str(checkpoint)]
    cmd += ["--engine", "vllm", "--out", str(out), "--quiet", *args]
    env = subprocess_env()
    if data_dir is not None:
        env["AGGBENCH_DATA_DIR"] = str(data_dir)
    if multiprocess:  # vLLM's own layout (a GPU's default; on CPU the evaluator runs in process)
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "generation.json").read_text())


def _score(benchmark, samples, out) -> dict:
    graded = out / f"{benchmark}.graded.jsonl"
    args = ["score", "--benchmark", benchmark, "--samples", str(samples), "--out", str(graded), "--quiet"]
    result = CliRunner().invoke(main, [*args, "--workers", "1"])
    assert result.exit_code == 0, result.output
    return json.loads((out / f"{benchmark}.graded.metrics.json").read_text())


def two_proportion_z(k1: int, n1: int, k2: int, n2: int) -> float:
    """The pooled two-proportion z statistic (a textbook formula; no stats library is a dependency)."""
    p = (k1 + k2) / (n1 + n2)
    se = math.sqrt(p * (1 - p) * (1 / n1 + 1 / n2))
    return (k1 / n1 - k2 / n2) / se


def test_vllm_and_hf_accuracy_agree_on_tiny_test(tiny_sft_model, tmp_path):
    common = ["--benchmarks", "tiny_test", "--n", str(N_SAMPLES), "--seed", "11"]
    info = _generate_vllm(tiny_sft_model, tmp_path / "vllm", *common, multiprocess=True)
    assert info["engine"] == "vllm" and info["device"] == "vllm (cpu)" and info["dtype"] == "float32"
    hf = CliRunner().invoke(
        main,
        ["generate", "--checkpoint", str(tiny_sft_model), *common, "--out", str(tmp_path / "hf"), "--quiet"],
    )
    assert hf.exit_code == 0, hf.output
    m_vllm = _score("tiny_test", tmp_path / "vllm" / "tiny_test.jsonl", tmp_path / "vllm")
    m_hf = _score("tiny_test", tmp_path / "hf" / "tiny_test.jsonl", tmp_path / "hf")
    n1, n2 = m_vllm["n_responses"], m_hf["n_responses"]
    assert n1 == n2 == 64 * N_SAMPLES
    k1, k2 = m_vllm["n_correct"], m_hf["n_correct"]
    assert 0 < k1 < n1 and 0 < k2 < n2, (k1, k2)  # a test of agreement needs a non-trivial rate
    z = two_proportion_z(k1, n1, k2, n2)
    assert abs(z) < 2.5758, f"vLLM {k1}/{n1} vs hf {k2}/{n2}: z = {z:.2f} (alpha 0.01 rejects)"
    rows = [json.loads(line) for line in (tmp_path / "vllm" / "tiny_test.jsonl").read_text().splitlines()]
    # every problem's samples are its own draws: not one shared response pattern across problems
    by_sample = {}
    for r in rows:
        by_sample.setdefault(r["sample"], []).append(r["response"])
    assert all(len(set(v)) > 1 for v in by_sample.values())


def test_vllm_generates_math500_with_the_context_policy_counted(tiny_model, shared_data, tmp_path):
    info = _generate_vllm(
        tiny_model,
        tmp_path,
        "--benchmarks",
        "math500",
        "--n",
        "1",
        "--max-tokens",
        "64",
        data_dir=shared_data,
    )
    bench = info["benchmarks"]["math500"]
    assert bench["n_problems"] == 500
    ctx = bench["context"]
    assert ctx["max_context"] == 512  # the tiny model's max_position_embeddings
    rows = [json.loads(line) for line in (tmp_path / "math500.jsonl").read_text().splitlines()]
    assert len(rows) == 500
    over = [r for r in rows if r["finish_reason"] == "prompt_too_long"]
    assert len(over) == ctx["prompts_over_context"] == bench["not_generated"] == 40
    assert all(r["response"] == "" and r["length"] == 0 for r in over)
    assert ctx["responses_capped"] > 0
    assert all(r["length"] <= 64 for r in rows)
    metrics = _score("math500", tmp_path / "math500.jsonl", tmp_path)
    assert metrics["n_responses"] == 500 and metrics["not_generated"] == 40
    assert metrics["context_capped"] == ctx["responses_capped"] == sum(r["context_capped"] for r in rows)


def test_vllm_serves_an_overridden_model_with_its_raised_positions(shared_data, tmp_path):
    """models.<m>.config_overrides (issue 13, item 4) reaches vLLM and the evaluator: a tiny model
    prepared with max_position_embeddings raised from 512 to 1024 (as verl's DAPO 7B recipe raises
    Qwen2.5-Math-7B's 4096 to 32768) is served with 1,024 positions, so MATH-500 prompts longer than
    512 tokens (40 of them, see the test above) are generated, past the original positions, and
    neither refused by vLLM nor dropped."""
    model = tmp_path / "model"
    prep = CliRunner().invoke(
        main,
        [
            "prepare-model",
            "tiny",
            "--out",
            str(model),
            "--sft-steps",
            "0",
            "--probe-prompts",
            "0",
            "--config-override",
            "max_position_embeddings=1024",
            "--quiet",
        ],
    )
    assert prep.exit_code == 0, prep.output
    args = ["--benchmarks", "math500", "--n", "1", "--max-tokens", "64"]
    info = _generate_vllm(model, tmp_path / "out", *args, data_dir=shared_data)
    ctx = info["benchmarks"]["math500"]["context"]
    assert ctx["max_context"] == 1024
    assert ctx["prompts_over_context"] < 40  # at 512 positions 40 prompts do not fit
    rows = [json.loads(line) for line in (tmp_path / "out" / "math500.jsonl").read_text().splitlines()]
    generated = [r for r in rows if r["finish_reason"] != "prompt_too_long"]
    assert len(generated) == 500 - ctx["prompts_over_context"] > 460
    assert all(r["length"] >= 1 for r in generated)
