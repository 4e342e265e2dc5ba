"""The trainer's side of `rollout.engine: vllm` on a GPU-like platform (sleep mode), against a FAKE
``vllm`` module.

vLLM is NOT exercised here: the real engine trains in the ``vllm`` leg (tests/rollout/
test_vllm_real.py), but on CPU, which has no sleep mode; this fake is what tests the sleep/wake
sequence a GPU run goes through. The fake ``LLM`` keeps its own copy of the weights, loaded from the
checkpoint directory as vLLM does, samples from it with transformers, and applies weight pushes by
Hugging Face name.
What the real trainer must then show over 2 steps:

* the engine is built once, from the run's model directory, with ``max_model_len`` = the longest
  prompt + response the config allows;
* the sequence per step is generate -> sleep (memory to the update) -> wake -> weight push ->
  prefix-cache reset, and the engine is never asked to generate or load while asleep;
* after the last push the engine's weights equal the trainer's final weights (in bf16, what is
  pushed), tensor for tensor: every parameter reached the engine under a name it knows.
"""

from __future__ import annotations

import types

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from aggbench.config import load_train_config
from aggbench.rollout.hf import HFEngine
from aggbench.train.loop import train
from helpers.fake_vllm import install
from helpers.trainer_support import metrics_rows, write_cell


class GeneratingLLM:
    """``vllm.LLM`` stand-in that samples with transformers from its own weight copy."""

    made: list[dict] = []
    instances: list[GeneratingLLM] = []

    def __init__(self, **kwargs):
        GeneratingLLM.made.append(kwargs)
        GeneratingLLM.instances.append(self)
        self.model = AutoModelForCausalLM.from_pretrained(kwargs["model"], dtype=torch.float32)
        self.engine = HFEngine(self.model, AutoTokenizer.from_pretrained(kwargs["tokenizer"]))
        self.events: list[str] = []
        self.asleep = False

    def generate(self, requests, params, use_tqdm=True):
        assert not self.asleep, "generate while asleep"
        self.events.append("generate")
        prompts = [r["prompt_token_ids"] for r in requests]
        assert isinstance(params, list) and len(params) == len(prompts)  # one SamplingParams per prompt
        (first,) = {(p["n"], p["temperature"], p["top_p"]) for p in params}
        roll = self.engine.generate(
            prompts,
            n=first[0],
            temperature=first[1],
            top_p=first[2],
            max_new_tokens=[p["max_tokens"] for p in params],
            seed=[p["seed"] for p in params],
        )
        results = []
        for g in range(len(prompts)):
            rows = [i for i in range(len(roll)) if roll.group[i] == g]
            outputs = [
                types.SimpleNamespace(
                    token_ids=roll.response_ids[i],
                    text=roll.texts[i],
                    finish_reason="stop" if roll.finished[i] else "length",
                    logprobs=[{t: types.SimpleNamespace(logprob=0.0)} for t in roll.response_ids[i]],
                )
                for i in rows
            ]
            results.append(types.SimpleNamespace(outputs=outputs))
        return results

    def sleep(self, level=1):
        assert level == 1
        self.asleep = True
        self.events.append("sleep")

    def wake_up(self):
        self.asleep = False
        self.events.append("wake")

    def collective_rpc(self, method, args=()):
        assert method == "aggbench_load_weights" and not self.asleep
        (weights,) = args
        known = dict(self.model.named_parameters())
        count = 0
        for name, tensor in weights:
            count += 1
            assert name in known, f"pushed {name}, which the engine's model does not have"
            with torch.no_grad():
                known[name].copy_(tensor)
        self.events.append("load")
        return [count]

    def reset_prefix_cache(self):
        self.events.append("reset")


@pytest.fixture
def fake_vllm(monkeypatch):
    install(monkeypatch, GeneratingLLM)
    GeneratingLLM.instances = []
    return GeneratingLLM


def test_trainer_drives_the_vllm_engine(fake_vllm, tmp_path, tiny_sft_model, tiny_train_data):
    cell = write_cell(tmp_path / "cell.yaml", tiny_sft_model, tiny_train_data, steps=2, every=1)
    # the push check scores with prompt_logprobs, which this fake does not model (the real leg runs it)
    over = {"rollout.engine": "vllm", "device": "cpu", "rollout.check_weight_push": False}
    cfg = load_train_config(cell, over)
    train(cfg, tmp_path / "run", quiet=True)

    (kw,) = fake_vllm.made
    assert kw["model"] == str(tiny_sft_model)
    assert kw["max_model_len"] == cfg.sampling.max_prompt_tokens + cfg.sampling.max_new_tokens
    assert kw["gpu_memory_utilization"] == cfg.rollout.gpu_memory_utilization and kw["seed"] == cfg.seed
    (llm,) = fake_vllm.instances
    assert llm.events == ["generate", "sleep", "wake", "load", "reset"] * 2, llm.events

    rows = metrics_rows(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "checkpoints" / "step_2").state_dict()
    start = AutoModelForCausalLM.from_pretrained(tiny_sft_model).state_dict()
    engine = llm.model.state_dict()
    assert trained["model.embed_tokens.weight"].dtype == torch.float32
    for name, want in trained.items():
        assert torch.equal(engine[name], want.to(torch.bfloat16).to(torch.float32)), name
    # the updates moved the weights, and the engine followed
    assert sum(not torch.equal(start[k], trained[k]) for k in trained) > len(trained) // 2
