"""Top-k is a sampling setting (issue 28, item 4(c)) in both engines, in training and evaluation.

The HF engine on the untrained tiny model (near-uniform samples): top_k=1 at temperature 1 is the
argmax at every step, so it equals the engine's own greedy decode and all samples agree; top_k=0
(off) and -1 (verl's spelling of off) sample the same way. The vLLM engine's test is in
test_vllm_real.py (the vllm leg)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from aggbench.config import SamplingConfig
from aggbench.evaluation.generate import sampling_for
from aggbench.evaluation.options import GenerateOptions, workflow_args
from aggbench.rollout.hf import HFEngine
from aggbench.rollout.vllm import sampling_kwargs
from helpers.tiny_models import tiny_model_for_tests


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = tiny_model_for_tests(tmp_path_factory.mktemp("topk"))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = [
        tok(f"<|bos|><|user|>{t}<|eos|><|assistant|>", add_special_tokens=False)["input_ids"]
        for t in ("ab", "xyz")
    ]
    return HFEngine(model, tok, batch_size=8), ids


def test_top_k_1_is_the_argmax_and_0_or_minus_1_is_off(engine):
    eng, ids = engine
    kw = {"n": 3, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 12}
    greedy = eng.generate_greedy(ids, max_new_tokens=12).response_ids
    one = eng.generate(ids, seed=3, top_k=1, **kw)
    for g in range(len(ids)):
        samples = [r for r, k in zip(one.response_ids, one.group, strict=True) if k == g]
        assert samples == [greedy[g]] * 3
    off, minus = eng.generate(ids, seed=3, top_k=0, **kw), eng.generate(ids, seed=3, top_k=-1, **kw)
    assert off.response_ids == minus.response_ids  # -1 is "off" as 0 is
    assert len({tuple(r) for r in off.response_ids}) > len(ids)  # sampled, not the argmax


def test_top_k_reaches_vllm_params_and_the_configs():
    assert sampling_kwargs(n=1, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0, top_k=20)["top_k"] == 20
    assert sampling_kwargs(n=1, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0, top_k=-1)["top_k"] == 0
    assert SamplingConfig().top_k == 0 and SamplingConfig(top_k=-1).top_k == -1
    with pytest.raises(ValueError):
        SamplingConfig(top_k=-2)

    class Spec:
        class sampling:  # noqa: N801 - stands in for a benchmark's sampling block
            n, temperature, top_p, top_k, max_tokens = 4, 0.6, 0.95, 0, 64

    assert sampling_for(Spec, GenerateOptions())["top_k"] == 0
    assert sampling_for(Spec, GenerateOptions(top_k=20, temperature=0.7, top_p=0.8)) == {
        "n": 4, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "max_tokens": 64,
    }  # fmt: skip
    # a model's own recommended sampling reaches its generate jobs, after every other option
    model = {"evaluation_sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 20}}
    args = workflow_args({"engine": "hf", "batch_size": 8}, model, 1)
    assert args[-6:] == ["--temperature", "0.7", "--top-p", "0.8", "--top-k", "20"]
    assert "--top-k" not in workflow_args({"engine": "hf", "batch_size": 8}, {}, 1)
