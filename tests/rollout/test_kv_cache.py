"""The hf engine's doubling key/value cache (aggbench.rollout.kv_cache) gives what transformers'
default cache gives, bit for bit: the sampled tokens, the logits at every step, and the cached tensors
after the cache methods generate may call; and it stays out where it is not known to be exact."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers.cache_utils", reason="needs transformers' cache module")

from aggbench.rollout.hf import HFEngine  # noqa: E402
from aggbench.rollout.kv_cache import MIN_CAPACITY, cache_kwargs, growing_cache  # noqa: E402


def _layer():
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=50
    )
    cache = growing_cache(_Model(config), torch.device("cpu"))
    assert cache is not None and type(cache.layers[0]).__name__ == "GrowingLayer"
    return cache.layers[0]


class _Model:
    def __init__(self, config):
        self.config = config


def test_updates_hold_what_concatenation_holds_across_growth_crop_and_selection():
    from transformers.cache_utils import DynamicLayer

    ours, theirs = _layer(), DynamicLayer()
    gen = torch.Generator().manual_seed(0)
    steps = [5] + [1] * (2 * MIN_CAPACITY)  # a prefill, then decoding past two doublings
    for q in steps:
        k, v = torch.randn(3, 2, q, 4, generator=gen), torch.randn(3, 2, q, 4, generator=gen)
        a, b = ours.update(k, v), theirs.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert ours._buffers[0].shape[-2] > 2 * MIN_CAPACITY  # it did grow
    for layer in (ours, theirs):  # what generate may call between steps
        layer.crop(-7)
        layer.batch_select_indices(torch.tensor([2, 0]))
    for q in (1, 1, 3):
        k, v = torch.randn(2, 2, q, 4, generator=gen), torch.randn(2, 2, q, 4, generator=gen)
        a, b = ours.update(k, v), theirs.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert ours.get_seq_length() == theirs.get_seq_length() == 5 + 2 * MIN_CAPACITY - 7 + 5


def test_generation_is_bit_identical_to_the_default_cache(tiny_sft_model, monkeypatch):
    """Sampled tokens (two chunk sizes, responses past the first doubling) and every step's logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_sft_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_sft_model, dtype=torch.float32)
    prompts = [tokenizer(f"go {i} " * (1 + i % 5)).input_ids for i in range(6)]

    def run(batch_size):
        engine = HFEngine(model, tokenizer, batch_size=batch_size)
        engine.eos_ids = [tokenizer.bos_token_id]  # never sampled here: every response runs 100 tokens
        out = engine.generate(prompts, n=3, temperature=1.0, top_p=1.0, max_new_tokens=100, seed=7)
        return out.response_ids, out.finished

    ids = torch.tensor([prompts[0]])
    scores = {}
    for name in ("growing", "default"):
        if name == "default":
            monkeypatch.setattr("aggbench.rollout.hf.cache_kwargs", lambda *a: {})
        results = {bs: run(bs) for bs in (4, 18)}
        kwargs = cache_kwargs(model, torch.device("cpu")) if name == "growing" else {}
        torch.manual_seed(3)
        scores[name] = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=True,
            max_new_tokens=MIN_CAPACITY + 20,
            min_new_tokens=MIN_CAPACITY + 20,  # past the first doubling
            output_scores=True,
            return_dict_in_generate=True,
            **kwargs,
        ).scores
        scores[f"{name}-results"] = results
    assert scores["growing-results"] == scores["default-results"]
    assert all(len(r) == 100 for r in scores["growing-results"][4][0])  # past the first doubling
    assert len(scores["growing"]) == len(scores["default"]) == MIN_CAPACITY + 20
    assert all(torch.equal(a, b) for a, b in zip(scores["growing"], scores["default"], strict=True))


def test_stays_out_where_not_known_exact():
    from transformers import LlamaConfig, MistralConfig

    small = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, vocab_size=50
    )
    assert growing_cache(_Model(LlamaConfig(**small)), torch.device("meta")) is None  # not CPU
    assert growing_cache(_Model(LlamaConfig(**small)), "cuda:0") is None
    sliding = _Model(MistralConfig(**small, sliding_window=8))  # sliding-window layers
    assert growing_cache(sliding, torch.device("cpu")) is None
