"""vLLM rollouts on a GPU, colocated with training (the `gpu` extra: ``pip install aggbench[gpu]``).

Kept thin on purpose and on public vLLM APIs only: ``LLM.generate`` with token-id prompts,
``SamplingParams``, ``LLM.sleep`` / ``LLM.wake_up`` to free GPU memory during the update, and
``LLM.collective_rpc`` to push the trainer's weights into every worker through a small worker
extension (``WeightSyncExtension``, named by ``worker_extension_cls``). The parts that do not need
vLLM (request building, weight export) are plain functions tested on CPU; the engine itself is
tested only where vLLM is installed (tests marked ``gpu``).
"""

from __future__ import annotations

from typing import Any

from aggbench.rollout.base import Rollouts

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

    ``logprobs=0`` returns the sampled token's log-prob; ``top_k=-1`` is vLLM's "no top-k".
    Greedy decoding is ``temperature=0``.
    """
    return {
        "n": n,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": -1,
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


def export_weights(model: Any, dtype: Any = None) -> list[tuple[str, Any]]:
    """(name, tensor) pairs to push into vLLM: the HF state dict, tied duplicates dropped.

    vLLM's ``load_weights`` takes Hugging Face parameter names; a tied ``lm_head.weight`` is the
    embedding itself and is skipped (vLLM ties it on its side). Tensors are detached, made
    contiguous and cast to ``dtype`` (the engine's, e.g. bfloat16) when given.
    """
    seen: dict[int, str] = {}
    out = []
    for name, tensor in model.state_dict(keep_vars=False).items():
        key = tensor.data_ptr()
        if key in seen and tensor.numel() > 0:
            continue  # tied: the same storage was exported under its first name
        seen[key] = name
        t = tensor.detach()
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out.append((name, t.contiguous()))
    return out


class WeightSyncExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``); called through ``collective_rpc``."""

    def aggbench_load_weights(self, weights: list[tuple[str, Any]]) -> int:
        model = self.model_runner.model  # type: ignore[attr-defined]  (set by vLLM's worker)
        model.load_weights(weights=weights)
        return len(weights)


class VLLMEngine:
    """Rollouts from a colocated vLLM engine; ``sync_weights`` pushes the policy after each update."""

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
        llm = vllm.LLM(
            model=str(path),
            tokenizer=str(options.get("tokenizer_path", path)),
            tensor_parallel_size=options.get("tensor_parallel_size", 1),
            gpu_memory_utilization=options.get("gpu_memory_utilization", 0.5),
            dtype=options.get("dtype", "bfloat16"),
            enable_sleep_mode=options.get("enable_sleep_mode", True),
            worker_extension_cls="aggbench.rollout.vllm.WeightSyncExtension",
            seed=options.get("seed", 0),
        )
        return cls(llm, tokenizer, sleep_between=options.get("enable_sleep_mode", True))

    def sync_weights(self, model: Any) -> None:
        import torch

        self.wake()
        self.llm.collective_rpc("aggbench_load_weights", args=(export_weights(model, torch.bfloat16),))

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
