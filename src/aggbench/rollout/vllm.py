"""vLLM rollouts on a GPU, colocated with training (the `gpu` extra: ``pip install aggbench[gpu]``).

Kept thin on purpose and on public vLLM APIs only: ``LLM.generate`` with token-id prompts,
``SamplingParams``, ``LLM.sleep`` / ``LLM.wake_up`` to free GPU memory during the update, and
``LLM.collective_rpc`` to push the trainer's weights into every worker through a small worker
extension (``WeightSyncExtension``, named by ``worker_extension_cls``).

Under torchrun (``WORLD_SIZE`` > 1, multi-GPU training) every training rank builds its own engine
in vLLM's torchrun mode, ``distributed_executor_backend="external_launcher"``: one vLLM worker
inside each training process, no processes spawned, and the same ``seed`` on every rank.
``data_parallel_size`` is deliberately left at 1. vLLM lays the torchrun world out as
``ExternalDP x DP x PP x TP`` (``vllm.distributed.parallel_state.initialize_model_parallel``): the
ranks of its own DP dimension step in lockstep (an all-reduce of "unfinished requests" on every
engine step, ``LLMEngine.has_unfinished_requests_dp``) and deadlock unless every rank calls
``generate`` together, the same number of times. The trainer's ranks do not: under dynamic sampling
each rank refills its own zero-variance groups, and with ``rollout.seed_per_prompt`` each group is
one call, so the counts differ from rank to rank (measured in ``tests/train/test_fsdp.py``).
With ``data_parallel_size`` 1 the ranks form vLLM's "external DP" dimension, which its code
describes as "every dp rank can generate independently (in verl integration)": verl's layout.
The data is split outside vLLM: each rank generates its own prompt groups (``parallel.my_groups``).
The trainer's FSDP2 parameters are sharded DTensors; ``export_weights``
gathers each one whole (``DTensor.full_tensor``, a collective every rank runs in the same order)
so that each rank's engine receives the full weights.

The parts that do not need vLLM (request building, the engine's arguments, weight export, sharded
export included) are plain functions tested on CPU; the engine itself is tested only where vLLM is
installed (tests marked ``gpu``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from aggbench.rollout.base import Rollouts

# The evaluator's engine has its GPUs to itself (no trainer beside it); `aggbench plan` budgets with it.
EVAL_GPU_MEMORY_UTILIZATION = 0.85

GPU_EXTRA_HINT = (
    "the vLLM rollout engine needs the `gpu` extra (vLLM 0.33 and its CUDA wheels): "
    "pip install 'aggbench[gpu]' on a GPU machine, or set rollout.engine: hf"
)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(GPU_EXTRA_HINT) from exc
    return vllm


def sampling_kwargs(
    *, n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int
) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` matching the HF engine's sampling.

    ``logprobs=0`` returns the sampled token's log-prob; ``top_k=0`` is vLLM's "no top-k" (0.33
    still accepts -1 but prefers 0). Greedy decoding is ``temperature=0``.
    """
    return {
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": 0,
        "max_tokens": max_new_tokens,
        "seed": seed,
        "logprobs": 0,
        "skip_special_tokens": True,
    }


def build_requests(prompts: list[list[int]]) -> list[dict[str, list[int]]]:
    """Token-id prompts in vLLM's ``TokensPrompt`` form (a TypedDict: plain dicts are accepted)."""
    for i, p in enumerate(prompts):
        if not p or not all(isinstance(t, int) and t >= 0 for t in p):
            raise ValueError(f"prompt {i} must be a non-empty list of non-negative token ids")
    return [{"prompt_token_ids": list(p)} for p in prompts]


def launcher_kwargs(tensor_parallel_size: int, world_size: int) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments that place the engine: one process, or one rank of a torchrun job.

    One process: vLLM's own executor over ``tensor_parallel_size`` GPUs. Under torchrun
    (``world_size`` > 1): ``external_launcher`` with vLLM's ``data_parallel_size`` left at 1, so the
    world / tp engines are vLLM's independent "external DP" ranks and never wait for each other
    (the module docstring says why lockstep DP would deadlock the trainer). vLLM reshapes the
    world into (-1, tp), so ``tensor_parallel_size`` must divide it.
    """
    tp = int(tensor_parallel_size)
    if tp < 1:
        raise ValueError(f"rollout.tensor_parallel_size={tp} must be at least 1")
    if world_size <= 1:
        return {"tensor_parallel_size": tp}
    if world_size % tp:
        raise ValueError(
            f"rollout.tensor_parallel_size={tp} must divide the {world_size} torchrun processes "
            "(vLLM groups them into processes / tensor_parallel_size independent engines); "
            "change rollout.tensor_parallel_size or the GPU count"
        )
    return {"distributed_executor_backend": "external_launcher", "tensor_parallel_size": tp}


def iter_weights(model: Any, dtype: Any = None) -> Iterator[tuple[str, Any]]:
    """(name, tensor) pairs to push into vLLM, one at a time: the HF state dict, ties dropped.

    vLLM's ``load_weights`` takes Hugging Face parameter names; a tied ``lm_head.weight`` is the
    embedding itself (the same parameter object) and is skipped (vLLM ties it on its side).
    Tensors are detached, cast to ``dtype`` (the engine's, e.g. bfloat16) when given, and made
    contiguous. A sharded FSDP2 parameter (a DTensor) is gathered whole with ``full_tensor()``
    after the cast (half the traffic in bf16; the same values): a collective, so every rank must
    iterate to the end, in the same order (the state dict's order is the same on every rank).
    """
    from torch.distributed.tensor import DTensor

    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen:
            continue  # tied: the same parameter was exported under its first name
        seen.add(id(tensor))
        t = tensor.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        if isinstance(t, DTensor):
            t = t.full_tensor()
        yield name, t.contiguous()


def export_weights(model: Any, dtype: Any = None) -> list[tuple[str, Any]]:
    """All of ``iter_weights``: [(HF name, whole tensor)], tied duplicates dropped, cast to ``dtype``.

    Works on a whole model and on an FSDP2-sharded one alike (then a collective: every rank calls it).
    """
    return list(iter_weights(model, dtype))


def weight_buckets(pairs: Iterable[tuple[str, Any]], max_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Consecutive runs of ``pairs`` of at most ``max_bytes`` (a larger tensor goes alone), so a
    weight push never holds more than one bucket beyond the model."""
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, t in pairs:
        n = t.numel() * t.element_size()
        if bucket and size + n > max_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


class WeightSyncExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``); called through ``collective_rpc``."""

    def aggbench_load_weights(self, weights: list[tuple[str, Any]]) -> int:
        # get_model() unwraps vLLM's CUDA-graph wrapper (both of 0.33's GPU model runners have it)
        model = self.model_runner.get_model()  # type: ignore[attr-defined]  (set by vLLM's worker)
        model.load_weights(weights=weights)
        return len(weights)


class VLLMEngine:
    """Rollouts from a colocated vLLM engine; ``sync_weights`` pushes the policy after each update."""

    bucket_bytes = 1 << 30  # weights pushed per collective_rpc call

    def __init__(self, llm: Any, tokenizer: Any, *, sleep_between: bool = True) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.sleep_between = sleep_between
        self.asleep = False

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, **options: Any) -> VLLMEngine:
        vllm = _import_vllm()
        path = options.get("model_path") or getattr(model, "name_or_path", None)
        if not path:
            raise ValueError("vLLM engine: pass model_path= (the checkpoint directory vLLM loads)")
        world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun sets it; vLLM joins that job
        llm = vllm.LLM(
            model=str(path),
            tokenizer=str(options.get("tokenizer_path", path)),
            gpu_memory_utilization=options.get("gpu_memory_utilization", 0.5),
            dtype=options.get("dtype", "bfloat16"),
            enable_sleep_mode=options.get("enable_sleep_mode", True),
            worker_extension_cls="aggbench.rollout.vllm.WeightSyncExtension",
            seed=options.get("seed", 0),  # the same on every rank, as external_launcher needs
            **launcher_kwargs(options.get("tensor_parallel_size", 1), world),
            # the longest prompt + response the caller will ask for; vLLM's default is the model's
            # whole context (40,960 for Qwen3), whose KV-cache profiling a colocated trainer can't spare
            **({"max_model_len": options["max_model_len"]} if options.get("max_model_len") else {}),
        )
        return cls(llm, tokenizer, sleep_between=options.get("enable_sleep_mode", True))

    def sync_weights(self, model: Any) -> None:
        """Push ``model``'s weights (bf16, HF names) into this rank's engine, in buckets.

        Under FSDP every rank must call this (each parameter is all-gathered): every engine gets
        the full weights.
        """
        import torch

        self.wake()
        for bucket in weight_buckets(iter_weights(model, torch.bfloat16), self.bucket_bytes):
            self.llm.collective_rpc("aggbench_load_weights", args=(bucket,))
        # KV blocks cached for a prompt prefix were computed with the old weights; vLLM's prefix
        # cache would reuse them for the same prompt (sleep level 1 clears it, but sleep mode can
        # be off), so the next rollouts would be partly off-policy
        self.llm.reset_prefix_cache()

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sleep(self) -> None:
        """Free the KV cache and weights' GPU memory for the update (level 1 keeps weights on CPU)."""
        if self.sleep_between and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def generate(
        self,
        prompts: list[list[int]],
        *,
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int,
    ) -> Rollouts:
        vllm = _import_vllm()
        self.wake()
        params = vllm.SamplingParams(
            **sampling_kwargs(
                n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed
            )
        )
        results = self.llm.generate(build_requests(prompts), params, use_tqdm=False)
        out = Rollouts([], [], [], [], [], logprobs=[])
        for g, (prompt, res) in enumerate(zip(prompts, results, strict=True)):
            for comp in res.outputs:
                out.prompt_ids.append(list(prompt))
                out.response_ids.append(list(comp.token_ids))
                out.finished.append(comp.finish_reason == "stop")
                out.texts.append(comp.text)
                out.group.append(g)
                lps = [next(iter(d.values())).logprob for d in (comp.logprobs or [])]
                out.logprobs.append(lps)  # type: ignore[union-attr]
        self.sleep()
        return out
