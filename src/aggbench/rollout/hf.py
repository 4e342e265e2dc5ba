"""Rollouts with transformers ``generate``: CPU and GPU, sharing the training model's weights."""

from __future__ import annotations

from typing import Any

import torch

from aggbench.rollout.base import Rollouts
from aggbench.rollout.kv_cache import cache_kwargs


class HFEngine:
    """Samples from the policy model itself (no weight copy, so ``sync_weights`` is a no-op)."""

    def __init__(
        self, model: Any, tokenizer: Any, *, batch_size: int = 64, stop_token_ids: list[int] | None = None
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eos_ids = sorted(set(eos_token_ids(model, tokenizer)) | set(stop_token_ids or []))
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = pad if pad is not None else self.eos_ids[0]

    def sync_weights(self, model: Any) -> None:
        self.model = model

    @torch.no_grad()
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
        """``n`` samples per prompt. seed: one int seeds the call (rows draw one after another from
        one generator, so they are independent); a list seeds each prompt, one generate call per
        prompt; None leaves torch's generator as it is. max_new_tokens: one budget, or one per
        prompt (generated to the largest, each response cut at its own: the same distribution).
        top_k: 0 or -1 is off (transformers' top_k=0)."""
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": max(top_k, 0)}
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        if len(budgets) != len(prompts):
            raise ValueError(f"max_new_tokens: {len(budgets)} values for {len(prompts)} prompts")
        if not isinstance(seed, list):
            if seed is not None:
                torch.manual_seed(seed)  # sampling is a pure function of (weights, prompts, seed)
            flat = [(g, p) for g, p in enumerate(prompts) for _ in range(n)]
            return self._decode(flat, budgets, sampling)
        if len(seed) != len(prompts):
            raise ValueError(f"seed: {len(seed)} values for {len(prompts)} prompts")
        parts = []
        for g, (prompt, s, b) in enumerate(zip(prompts, seed, budgets, strict=True)):
            torch.manual_seed(s)
            part = self._decode([(0, prompt)] * n, [b], sampling)
            part.group = [g] * len(part)
            parts.append(part)
        return Rollouts.concat(parts)

    @torch.no_grad()
    def generate_greedy(self, prompts: list[list[int]], *, max_new_tokens: int | list[int]) -> Rollouts:
        """Greedy decoding (argmax at every step), the temperature -> 0 limit of sampling: one
        response per prompt, group = prompt index. Padding changes floating-point reduction order,
        so ``batch_size=1`` is the exactly reproducible setting (the lm-eval cross-check uses it)."""
        sampling = {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
        budgets = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        return self._decode(list(enumerate(prompts)), budgets, sampling)

    def _decode(
        self, flat: list[tuple[int, list[int]]], budgets: list[int], sampling: dict[str, Any]
    ) -> Rollouts:
        """One response per (group, prompt ids) pair, ``batch_size`` at a time: left-padded
        input_ids [b, T] and attention_mask [b, T]; a response is cut after its first EOS, or at
        its group's budget ``budgets[group]``."""
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        out = Rollouts([], [], [], [], [])
        try:
            for start in range(0, len(flat), self.batch_size):
                chunk = flat[start : start + self.batch_size]
                width = max(len(p) for _, p in chunk)
                ids = torch.full((len(chunk), width), self.pad_id, dtype=torch.long)
                attn = torch.zeros((len(chunk), width), dtype=torch.long)
                for i, (_, p) in enumerate(chunk):  # left padding
                    ids[i, width - len(p) :] = torch.tensor(p)
                    attn[i, width - len(p) :] = 1
                gen = self.model.generate(
                    input_ids=ids.to(device),
                    attention_mask=attn.to(device),
                    **sampling,
                    max_new_tokens=max(budgets[g] for g, _ in chunk),
                    pad_token_id=self.pad_id,
                    eos_token_id=self.eos_ids,
                    **cache_kwargs(self.model, device),  # a doubling KV cache where exact (CPU)
                )[:, width:].cpu()
                for i, (g, p) in enumerate(chunk):
                    resp = gen[i].tolist()[: budgets[g]]
                    cut = next((j + 1 for j, t in enumerate(resp) if t in self.eos_ids), None)
                    finished = cut is not None
                    resp = resp[:cut] if finished else resp
                    out.prompt_ids.append(list(p))
                    out.response_ids.append(resp)
                    out.finished.append(finished)
                    out.group.append(g)
                    out.texts.append(self.tokenizer.decode(resp, skip_special_tokens=True))
        finally:
            self.model.train(was_training)
        return out


def eos_token_ids(model: Any, tokenizer: Any) -> list[int]:
    """Every id that ends a response: the generation config's eos ids and the tokenizer's."""
    ids: list[int] = []
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    for v in (gen_eos, tokenizer.eos_token_id):
        if v is None:
            continue
        ids.extend(v if isinstance(v, list) else [v])
    if not ids:
        raise ValueError(
            "the tokenizer and generation config define no eos_token_id; generation could not stop"
        )
    return sorted(set(ids))
