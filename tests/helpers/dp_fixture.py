"""A deterministic float64 tiny model and fixed rollouts, shared by the test and its workers."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from aggbench.aggregation.advantages import grpo
from aggbench.rollout.base import Rollouts

N_GROUPS, G = 4, 4


def tiny_model(vocab_size: int = 30) -> LlamaForCausalLM:
    """A 2-layer float64 Llama, the same weights for the same vocab size (seed 0)."""
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(cfg).double()


def fixed_batch() -> tuple[Rollouts, torch.Tensor, torch.Tensor]:
    """Rollouts of 4 groups x 4, their advantages [16] and behaviour log-probs [16, T] (ratios != 1)."""
    gen = torch.Generator().manual_seed(3)
    prompts, responses, groups, rewards = [], [], [], []
    for g in range(N_GROUPS):
        p = torch.randint(1, 30, (int(torch.randint(2, 6, (1,), generator=gen)),), generator=gen).tolist()
        for j in range(G):
            n = int(torch.randint(1, 10, (1,), generator=gen))
            prompts.append(p)
            responses.append(torch.randint(1, 30, (n,), generator=gen).tolist())
            groups.append(g)
            rewards.append(float((j + g) % 3 == 0))
    roll = Rollouts(prompts, responses, [True] * len(responses), [""] * len(responses), groups)
    adv = grpo(torch.tensor(rewards, dtype=torch.float64), torch.tensor(groups))
    t = max(len(r) for r in responses)
    old = -1.5 + 0.3 * torch.randn((len(responses), t), generator=gen, dtype=torch.float64)
    return roll, adv, old
