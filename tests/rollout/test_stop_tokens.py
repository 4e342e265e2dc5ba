"""Stop tokens (issue 13, item 8): a chat model's end-of-turn token ends a response in every engine.

Qwen2.5-Math-7B is a base model whose generation config ends on ``<|endoftext|>`` only, while its
chat template closes a turn with ``<|im_end|>``; Qwen2.5-Math's own evaluation (math_eval.py) stops
on both (stop words ``</s>``, ``<|im_end|>``, ``<|endoftext|>``; stop_token_ids 151645, 151643).
Without them a model that closes its turn keeps writing into an invented next turn. Here the tiny
model's ``<|user|>`` (a turn marker the untrained model samples about once per hundred tokens)
plays that role: with it as a stop token, each response is exactly the response without it, cut
after its first ``<|user|>``. The real-vLLM half is in tests/rollout/test_vllm_real.py.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

from aggbench.cli import main
from aggbench.prompts import stop_token_ids
from aggbench.rollout import make_engine
from helpers.tiny_models import tiny_model_for_tests

STOP = "<|user|>"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tiny_model_for_tests(tmp_path_factory.mktemp("stop-tiny"))
    return path, AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def test_stop_tokens_map_to_single_vocabulary_ids_or_are_refused(tiny):
    _, _, tok = tiny
    assert stop_token_ids(tok, [STOP, "<|system|>"]) == [5, 4]
    assert stop_token_ids(tok, []) == []
    with pytest.raises(ValueError, match=r"\['<\|im_end\|>'\] are not single tokens.*model.stop_tokens"):
        stop_token_ids(tok, [STOP, "<|im_end|>"])


def test_hf_engine_cuts_each_response_at_its_first_stop_token(tiny):
    path, model, tok = tiny
    stop_id = stop_token_ids(tok, [STOP])[0]
    prompts = [tok("<|bos|><|user|>3 + 4<|eos|><|assistant|>", add_special_tokens=False)["input_ids"]] * 2
    kw = {"n": 16, "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 64, "seed": 7}
    plain = make_engine("hf", model, tok, batch_size=64).generate(prompts, **kw)
    stopped = make_engine("hf", model, tok, batch_size=64, stop_token_ids=[stop_id]).generate(prompts, **kw)
    cut = 0
    for free, resp, fin in zip(plain.response_ids, stopped.response_ids, stopped.finished, strict=True):
        if stop_id in free:
            k = free.index(stop_id) + 1
            assert resp == free[:k] and fin  # the same draws, ended at (and keeping) the stop token
            cut += k < len(free)
        else:
            assert resp == free
    assert cut >= 3  # the property was exercised: responses that went on past the token were cut


def test_generate_stops_on_stop_tokens_and_records_them(tiny, tmp_path):
    path, _, _ = tiny
    common = ["generate", "--checkpoint", str(path), "--benchmarks", "tiny_test", "--n", "4"]
    common += ["--max-tokens", "64", "--seed", "5", "--quiet"]
    lengths = {}
    for name, extra in (("plain", []), ("stop", ["--stop-token", STOP])):
        res = CliRunner().invoke(main, [*common, *extra, "--out", str(tmp_path / name)])
        assert res.exit_code == 0, res.output
        rows = (tmp_path / name / "tiny_test.jsonl").read_text().splitlines()
        lengths[name] = [json.loads(r)["length"] for r in rows]
    info = json.loads((tmp_path / "stop" / "generation.json").read_text())
    assert info["options"]["stop_tokens"] == [STOP]
    assert all(s <= p for s, p in zip(lengths["stop"], lengths["plain"], strict=True))
    assert sum(s < p for s, p in zip(lengths["stop"], lengths["plain"], strict=True)) >= 3
    bad = CliRunner().invoke(main, [*common, "--stop-token", "<|im_end|>", "--out", str(tmp_path / "bad")])
    assert bad.exit_code != 0 and "<|im_end|>" in bad.output and "stop_tokens" in bad.output
