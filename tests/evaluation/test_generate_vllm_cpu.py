"""`aggbench generate --engine vllm` on CPU, against a fake ``vllm`` module (vLLM is NOT exercised).

vLLM needs a GPU, so what is tested here is aggbench's side of the evaluator's vLLM path: the
engine's arguments (the tensor-parallel size from the command line, which the generate rule takes
from its job's GPUs), the requests and sampling parameters it sends, and how the returned
completions become sample rows. The fake ``LLM`` answers every request with fixed completions.
"""

from __future__ import annotations

import json
import types

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from helpers.fake_vllm import install


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
        for _ in requests:
            outputs = []
            for k in range(params["n"]):
                ids = self.tok(str(k), add_special_tokens=False)["input_ids"]
                lps = [{t: types.SimpleNamespace(logprob=-0.5)} for t in ids]
                outputs.append(
                    types.SimpleNamespace(token_ids=ids, text=str(k), finish_reason="stop", logprobs=lps)
                )
            results.append(types.SimpleNamespace(outputs=outputs))
        return results


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


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
    assert (params["n"], params["max_tokens"], params["logprobs"]) == (2, 8, 0)
    info = json.loads((out / "generation.json").read_text())
    assert info["options"]["tensor_parallel_size"] == 2
    assert params["temperature"] == info["benchmarks"]["tiny_test"]["sampling"]["temperature"]

    assert [(r["sample"], r["response"], r["finish_reason"]) for r in rows] == [
        (j, str(j), "stop") for _ in prompts for j in (0, 1)
    ]
    assert all(r["length"] == len(tok(r["response"], add_special_tokens=False)["input_ids"]) for r in rows)


def test_tensor_parallel_with_the_hf_engine_is_refused(model_cli):
    result = model_cli("generate", "tiny_test", "--tensor-parallel-size", "2")
    assert result.exit_code == 1
    assert "--tensor-parallel-size 2 applies to --engine vllm only" in result.output
