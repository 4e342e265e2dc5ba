"""The vLLM engine's parts that need no vLLM (weight export, requests, sampling arguments, seeds),
on the real tiny model; and, marked ``gpu``, the engine on a CUDA GPU.

The engine itself runs against real vLLM on CPU in the ``vllm`` leg (tests/rollout/test_vllm_real.py).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers import AutoModelForCausalLM

from aggbench.rollout import make_engine
from aggbench.rollout.vllm import (
    GPU_EXTRA_HINT,
    build_requests,
    export_weights,
    prompt_seeds,
    sampling_kwargs,
)
from helpers.tiny_models import tiny_model_for_tests

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_model_for_tests(tmp_path_factory.mktemp("m"))
    return path, AutoModelForCausalLM.from_pretrained(path)


def test_export_weights_names_shapes_dtypes(tiny):
    _, model = tiny
    exported = export_weights(model, torch.bfloat16)
    names = [n for n, _ in exported]
    sd = model.state_dict()
    # the tied lm_head is the embedding: exported once, under the embedding's name
    assert model.config.tie_word_embeddings
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    assert set(names) == set(sd) - {"lm_head.weight"}
    for name, t in exported:
        assert t.shape == sd[name].shape and t.dtype == torch.bfloat16 and t.is_contiguous()
        torch.testing.assert_close(t.float(), sd[name].float(), rtol=1e-2, atol=1e-2)
    assert len(names) == len(set(names))


def test_requests_and_sampling_params():
    assert build_requests([[1, 2], [3]]) == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    with pytest.raises(ValueError, match="prompt 1"):
        build_requests([[1], []])
    kw = sampling_kwargs(n=8, temperature=1.0, top_p=0.9, max_new_tokens=64, seed=3)
    assert kw == {
        "n": 8,
        "temperature": 1.0,
        "top_p": 0.9,
        "top_k": 0,
        "max_tokens": 64,
        "seed": 3,
        "logprobs": 0,
        "skip_special_tokens": True,
    }
    assert "seed" not in sampling_kwargs(n=1, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=None)


def test_per_prompt_seeds_are_hashed_apart():
    """vLLM seeds child j of a request with seed + j: per-prompt seeds must not be neighbours."""
    got = prompt_seeds(41, 64)
    assert got == prompt_seeds(41, 64) and len(set(got)) == 64
    assert min(abs(a - b) for i, a in enumerate(got) for b in got[i + 1 :]) > 10**6
    assert prompt_seeds([5, 6], 2) == [5, 6] and prompt_seeds(None, 3) == [None] * 3
    with pytest.raises(ValueError, match="seed: 1 values for 2 prompts"):
        prompt_seeds([5], 2)


@pytest.mark.skipif(HAS_VLLM, reason="vLLM is installed here: the missing-extra message cannot be shown")
def test_missing_extra_names_it(tiny):
    _, model = tiny
    with pytest.raises(ImportError) as e:
        make_engine("vllm", model, None, model_path="x")
    assert "aggbench[gpu]" in str(e.value) and e.value.args[0] == GPU_EXTRA_HINT


@pytest.mark.gpu
@pytest.mark.skipif(not (HAS_VLLM and torch.cuda.is_available()), reason="needs vLLM and a CUDA GPU")
def test_vllm_engine_generates(tiny):  # pragma: no cover - GPU only
    path, model = tiny
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    eng = make_engine("vllm", model, tok, model_path=str(path), gpu_memory_utilization=0.2, in_process=True)
    ids = tok("<|bos|><|user|>Start<|eos|><|assistant|>", add_special_tokens=False)["input_ids"]
    out = eng.generate([ids], n=4, temperature=1.0, top_p=1.0, max_new_tokens=16, seed=0)
    assert len(out) == 4 and all(
        len(lp) == len(r) for lp, r in zip(out.logprobs, out.response_ids, strict=True)
    )
    eng.sync_weights(model)
