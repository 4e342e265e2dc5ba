"""`aggbench generate --engine vllm` against a FAKE ``vllm`` module on a fake GPU platform.

vLLM is NOT exercised here: the real engine generates in the ``vllm`` leg (tests/evaluation/
test_generate_vllm_real.py), on CPU. What this adds is the GPU-side argument the CPU build cannot
show: the tensor-parallel size from the command line (which the generate rule takes from its
job's GPUs), and how completions become sample rows with fixed, known texts.
"""

from __future__ import annotations

import json
import types

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from helpers.fake_vllm import install
from helpers.jsonl import read_jsonl


class FakeLLM:
    """Stands in for ``vllm.LLM``: records its arguments and requests; completion k of every
    prompt is the text ``"<k>"`` (its tokens from the real tokenizer), finished by a stop token."""

    made: list[dict] = []
    calls: list[tuple[list[dict], dict]] = []

    def __init__(self, **kwargs):
        from transformers import AutoTokenizer

        FakeLLM.made.append(kwargs)
        self.tok = AutoTokenizer.from_pretrained(kwargs["tokenizer"])

    def generate(self, requests, params, use_tqdm=True):
        FakeLLM.calls.append((requests, params))
        results = []
        assert isinstance(params, list) and len(params) == len(requests)  # one SamplingParams per prompt
        for _, prm in zip(requests, params, strict=True):
            outputs = []
            for k in range(prm["n"]):
                ids = self.tok(str(k), add_special_tokens=False)["input_ids"]
                lps = [{t: types.SimpleNamespace(logprob=-0.5)} for t in ids]
                outputs.append(
                    types.SimpleNamespace(token_ids=ids, text=str(k), finish_reason="stop", logprobs=lps)
                )
            results.append(types.SimpleNamespace(outputs=outputs))
        return results


@pytest.fixture
def fake_vllm(monkeypatch):
    install(monkeypatch, FakeLLM)
    FakeLLM.calls = []
    return FakeLLM


def test_vllm_generate_spans_the_given_gpus_and_writes_the_completions(
    fake_vllm, tiny_model, shared_data, tmp_path, monkeypatch
):
    from transformers import AutoTokenizer

    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(shared_data))

    out = tmp_path / "samples"
    args = ["generate", "--checkpoint", str(tiny_model), "--benchmarks", "tiny_test", "--limit", "3"]
    args += ["--n", "2", "--max-tokens", "8", "--engine", "vllm", "--tensor-parallel-size", "2"]
    result = CliRunner().invoke(main, [*args, "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output

    (kw,) = fake_vllm.made  # one engine for the whole command
    assert kw["tensor_parallel_size"] == 2 and "distributed_executor_backend" not in kw
    assert kw["model"] == kw["tokenizer"] == str(tiny_model)
    assert kw["enable_sleep_mode"] is False  # nothing shares the GPU with the evaluator
    assert kw["dtype"] == "bfloat16"

    (requests, params), *more = fake_vllm.calls
    assert more == []  # all prompts of a benchmark in one call: vLLM schedules them itself
    rows = read_jsonl(out / "tiny_test.jsonl")
    tok = AutoTokenizer.from_pretrained(tiny_model)
    prompts = [r["prompt"] for r in rows if r["sample"] == 0]
    assert requests == [{"prompt_token_ids": tok(p, add_special_tokens=False)["input_ids"]} for p in prompts]
    assert {(p["n"], p["max_tokens"], p["logprobs"]) for p in params} == {(2, 8, 0)}
    assert len({p["seed"] for p in params}) == len(params)  # each prompt its own noise
    info = json.loads((out / "generation.json").read_text())
    assert info["options"]["tensor_parallel_size"] == 2
    assert {p["temperature"] for p in params} == {info["benchmarks"]["tiny_test"]["sampling"]["temperature"]}

    assert [(r["sample"], r["response"], r["finish_reason"]) for r in rows] == [
        (j, str(j), "stop") for _ in prompts for j in (0, 1)
    ]
    assert all(r["length"] == len(tok(r["response"], add_special_tokens=False)["input_ids"]) for r in rows)


def test_tensor_parallel_with_the_hf_engine_is_refused(model_cli):
    result = model_cli("generate", "tiny_test", "--tensor-parallel-size", "2")
    assert result.exit_code == 1
    assert "--tensor-parallel-size 2 applies to --engine vllm only" in result.output
