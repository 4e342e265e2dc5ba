"""`aggbench probe --engine vllm` against REAL vLLM (the CPU build, the `make test-vllm` leg): the
first 100 MATH-500 problems from ../shared/data with the untrained tiny model (issue 28, item 7).

* the split is the model's tokens (prefix + target == each problem's text) and every problem gets
  a row, in order; the prefixes that leave no room in the tiny model's 512 positions are counted as
  not probed (no verdict, not in the rate), and the targets longer than the room left are scored on
  their first 512 - prefix tokens and counted as capped: nothing is refused by vLLM or dropped;
* the summary's rates are recomputed from the rows, and the table is printed;
* the same probe on the hf engine (batch size 1) gives the same rows on the first 20 problems: the
  same split and budgets, and greedy continuations that agree on at least 18 of 20 (float32 on
  both; the smallest gap between the top two logits on these decodes was measured at 8e-4, so a
  disagreement would be a near tie, not a different prompt).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from helpers.jsonl import read_jsonl
from helpers.real_vllm import require_vllm, subprocess_env

pytestmark = pytest.mark.vllm
require_vllm()

CONTEXT = 512  # the tiny model's max_position_embeddings
CROSS = 20  # problems probed by both engines
N = 100  # problems probed on vLLM (a bounded leg; the CPU test covers the protocol)


def _probe_vllm(checkpoint, out, data_dir, *args):
    cmd = [sys.executable, "-m", "aggbench.cli", "probe", "--checkpoint", str(checkpoint)]
    cmd += ["--engine", "vllm", "--benchmarks", "math500", "--out", str(out), "--quiet", *args]
    env = subprocess_env()
    env["AGGBENCH_DATA_DIR"] = str(data_dir)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, json.loads((out / "probe.json").read_text())


def test_vllm_probes_math500_with_the_tiny_model(tiny_model, shared_data, tmp_path):
    from transformers import AutoTokenizer

    from aggbench.data.benchmarks import load_benchmark
    from aggbench.evaluation.probe import summarise

    proc, info = _probe_vllm(tiny_model, tmp_path / "vllm", shared_data, "--label", "tiny", "--limit", str(N))
    assert info["engine"] == "vllm" and info["device"] == "vllm (cpu)" and info["max_context"] == CONTEXT
    records = load_benchmark("math500", data_dir=shared_data, limit=N)
    rows = read_jsonl(tmp_path / "vllm" / "math500.jsonl")
    assert [r["id"] for r in rows] == [rec["id"] for rec in records] and len(rows) == N
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    over = 0
    for row, rec in zip(rows, records, strict=True):
        n = len(tokenizer(rec["prompt"], add_special_tokens=False)["input_ids"])
        assert row["prefix"] + row["target"] == rec["prompt"]  # MATH-500 is ASCII: the tokenizer round-trips
        assert row["prefix_tokens"] == int(0.6 * n) and row["target_tokens"] == n - int(0.6 * n)
        if row["prefix_tokens"] >= CONTEXT:
            over += 1
            assert row["finish_reason"] == "prompt_too_long" and row["exact"] is None
            continue
        assert row["budget"] == min(row["target_tokens"], CONTEXT - row["prefix_tokens"])
        assert row["capped"] == (row["budget"] < row["target_tokens"])
        assert 0 <= row["continuation_tokens"] <= row["budget"]
        assert row["finish_reason"] in ("stop", "length") and isinstance(row["exact"], bool)
    bench = info["benchmarks"]["math500"]
    assert {k: bench[k] for k in summarise(rows)} == summarise(rows)
    assert bench["n_problems"] == N and bench["n"] == N - over
    assert bench["not_probed"] == ({"prompt_too_long": over} if over else {})
    assert bench["capped"] > 0  # long problems whose targets do not fit beside their prefixes
    assert bench["n_exact"] == sum(bool(r["exact"]) for r in rows)
    assert f"| tiny | math500 | 0.6 | {N - over} |" in proc.stdout
    assert (tmp_path / "vllm" / "probe.md").read_text() in proc.stdout

    hf_out = tmp_path / "hf"
    args = ["probe", "--checkpoint", str(tiny_model), "--benchmarks", "math500", "--out", str(hf_out)]
    args += ["--limit", str(CROSS), "--batch-size", "1", "--data-dir", str(shared_data), "--quiet"]
    hf = CliRunner().invoke(main, args)
    assert hf.exit_code == 0, hf.output
    hf_rows = read_jsonl(hf_out / "math500.jsonl")
    keys = ("id", "prefix", "target", "prefix_tokens", "target_tokens", "budget", "capped")
    assert [{k: r[k] for k in keys} for r in hf_rows] == [{k: r[k] for k in keys} for r in rows[:CROSS]]
    same = sum(h["continuation"] == v["continuation"] for h, v in zip(hf_rows, rows, strict=False))
    assert same >= CROSS - 2, f"hf and vLLM greedy continuations agree on {same} of {CROSS}"
