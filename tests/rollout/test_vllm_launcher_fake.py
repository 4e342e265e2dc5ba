"""vLLM's GPU-side arguments and the FSDP weight export, against a FAKE ``vllm`` module.

The engine itself is NOT exercised here (it is, on CPU, in the ``vllm`` leg: tests/rollout/
test_vllm_real.py). What is tested:

* ``VLLMEngine.from_model`` against a fake ``vllm`` module (put in ``sys.modules``) whose ``LLM``
  records its keyword arguments, on a fake GPU platform: under torchrun (``WORLD_SIZE`` > 1) it asks
  for vLLM's ``external_launcher`` with the run's seed and without vLLM's lockstep
  ``data_parallel_size`` (ranks call ``generate`` different numbers of times: see
  ``aggbench.rollout.vllm``); one process gets exactly its arguments; a TP size that does not
  divide the world is an error naming the field; on a platform without sleep mode it is turned
  off; ``sync_weights`` pushes every exported tensor once in one call, then resets the prefix cache.
* The weight export of an FSDP2-sharded model (2 gloo ranks under torchrun, the trainer's own
  ``FSDPRanks.prepare_model``): every rank gets the same names, shapes, dtypes and values as
  ``export_weights`` of the unsharded model (tied ``lm_head`` dropped, bf16 cast).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aggbench.config_errors import ConfigError
from aggbench.rollout import make_engine
from aggbench.rollout.vllm import export_weights, launcher_kwargs
from helpers.dp_fixture import tiny_model
from helpers.fake_vllm import install
from helpers.trainer_support import write_cell

HERE = Path(__file__).parent


class FakeLLM:
    """Stands in for ``vllm.LLM``: records its arguments and the weight pushes."""

    made: list[dict] = []

    def __init__(self, **kwargs):
        FakeLLM.made.append(kwargs)
        self.rpcs: list[tuple[str, tuple]] = []
        self.events: list[str] = []

    def collective_rpc(self, method, args=()):
        (weights,) = args
        pairs = list(weights)  # in process: the generator itself arrives
        self.rpcs.append((method, pairs))
        self.events.append(method)
        return [len(pairs)]

    def reset_prefix_cache(self):
        self.events.append("reset_prefix_cache")


@pytest.fixture
def fake_vllm(monkeypatch):
    install(monkeypatch, FakeLLM)
    return FakeLLM


def _build(monkeypatch, world: int | None, **options):
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", str(world))
    return make_engine("vllm", None, None, model_path="/ckpt", seed=7, **options)


def test_one_process_keeps_its_arguments(fake_vllm, monkeypatch):
    _build(monkeypatch, None, tensor_parallel_size=2, gpu_memory_utilization=0.6)
    assert fake_vllm.made == [
        {
            "model": "/ckpt",
            "tokenizer": "/ckpt",
            "tensor_parallel_size": 2,
            "gpu_memory_utilization": 0.6,
            "dtype": "bfloat16",
            "enable_sleep_mode": True,
            "worker_extension_cls": "aggbench.rollout.vllm.WeightSyncExtension",
            "seed": 7,
            "logprobs_mode": "processed_logprobs",
        }
    ]
    _build(monkeypatch, 1)  # torchrun --nproc_per_node 1 is one process too
    assert "distributed_executor_backend" not in fake_vllm.made[-1]


@pytest.mark.parametrize(("world", "tp"), [(2, 1), (8, 1), (4, 2)])
def test_torchrun_uses_external_launcher_without_lockstep_dp(fake_vllm, monkeypatch, world, tp):
    _build(monkeypatch, world, tensor_parallel_size=tp)
    (kw,) = fake_vllm.made
    assert kw["distributed_executor_backend"] == "external_launcher"
    assert kw["tensor_parallel_size"] == tp
    # vLLM's own DP ranks must call generate together; the trainer's ranks do not (dynamic
    # sampling), so the world / tp engines stay vLLM's independent "external DP" ranks
    assert "data_parallel_size" not in kw
    assert kw["seed"] == 7  # the same explicit seed on every rank
    assert kw["worker_extension_cls"] == "aggbench.rollout.vllm.WeightSyncExtension"


def test_tp_not_dividing_the_world_is_refused(fake_vllm, monkeypatch):
    with pytest.raises(ValueError, match=r"rollout.tensor_parallel_size=2 must divide the 3 torchrun"):
        _build(monkeypatch, 3, tensor_parallel_size=2)
    assert fake_vllm.made == []
    with pytest.raises(ValueError, match="at least 1"):
        launcher_kwargs(0, 2)


def test_trainer_refuses_vllm_tensor_parallel_under_torchrun(tmp_path, monkeypatch):
    from aggbench.config import load_train_config
    from aggbench.train import parallel

    cell = write_cell(tmp_path / "c.yaml", tmp_path / "model", tmp_path / "data.jsonl")
    over = {"rollout.engine": "vllm", "rollout.tensor_parallel_size": 2, "distributed.strategy": "fsdp"}
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel_size=2 under 2 training processes"):
        parallel.setup(load_train_config(cell, over))


def test_sync_weights_pushes_every_tensor_once(fake_vllm, monkeypatch):
    model = tiny_model().float()
    engine = _build(monkeypatch, None, in_process=True)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    engine.sync_weights(model)
    rpcs = engine.llm.rpcs
    assert [m for m, _ in rpcs] == ["aggbench_load_weights"]
    # then the prefix cache (KV blocks computed with the old weights) is dropped, once
    assert engine.llm.events == ["aggbench_load_weights", "reset_prefix_cache"]
    ((_, pushed),) = rpcs
    expected = export_weights(model, torch.bfloat16)
    assert [n for n, _ in pushed] == [n for n, _ in expected]
    for (_, got), (_, want) in zip(pushed, expected, strict=True):
        assert got.dtype == torch.bfloat16 and torch.equal(got, want)


def test_float32_push_and_no_push_out_of_process(fake_vllm, monkeypatch):
    model = tiny_model().float()
    engine = _build(monkeypatch, None, in_process=True, dtype="float32")
    assert fake_vllm.made[-1]["dtype"] == "float32"
    engine.sync_weights(model)
    ((_, pushed),) = engine.llm.rpcs
    assert {t.dtype for _, t in pushed} == {torch.float32}
    separate = _build(monkeypatch, None)  # aggbench generate's engine: its own process
    with pytest.raises(RuntimeError, match="in_process=True"):
        separate.sync_weights(model)


def test_sleep_mode_is_dropped_where_the_platform_has_none(monkeypatch, caplog):
    install(monkeypatch, FakeLLM, cpu=True, sleep_mode=False)
    with caplog.at_level("WARNING", logger="aggbench.rollout.vllm"):
        engine = _build(monkeypatch, None, enable_sleep_mode=True, max_model_len=300)
    kw = FakeLLM.made[-1]
    assert kw["enable_sleep_mode"] is False and engine.sleep_between is False
    assert "rollout.enable_sleep_mode is off" in caplog.text
    # CPU: no chunked prefill (seeded requests crash vLLM-CPU when a prompt is split), eager mode
    assert kw["enable_chunked_prefill"] is False and kw["enforce_eager"] is True
    assert kw["max_num_batched_tokens"] >= 300


@pytest.mark.slow
def test_fsdp_sharded_export_equals_unsharded(tmp_path):
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    cmd += [str(HERE / "vllm_export_worker.py"), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-5000:]

    whole = tiny_model()
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=False)
        # the trainer's FSDP path really sharded the weights (each rank holds half the rows)
        assert got["sharded"] and all(got["sharded"].values()), got["sharded"]
        emb = "model.embed_tokens.weight"
        assert got["local_rows"][emb] == whole.get_parameter(emb).shape[0] // 2
        for key, dtype in (("bf16", torch.bfloat16), ("raw", None)):
            want = export_weights(whole, dtype)
            assert [n for n, _ in got[key]] == [n for n, _ in want]
            assert "lm_head.weight" not in {n for n, _ in got[key]}
            for (name, g), (_, w) in zip(got[key], want, strict=True):
                assert not hasattr(g, "to_local"), f"{name} is still a DTensor"
                assert (g.shape, g.dtype) == (w.shape, w.dtype), name
                assert g.is_contiguous() and torch.equal(g, w), name
