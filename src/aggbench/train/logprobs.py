"""Log-probabilities and entropies of response tokens under a causal LM.

Layout (as in verl): prompts LEFT-padded to width P, responses RIGHT-padded to width T, concatenated
into ``input_ids`` [B, P + T]. With left padding, position ids must come from the attention mask
(``cumsum(mask) - 1``), otherwise recomputed log-probs disagree with generation's (measured here: they
then agree to ~1e-5).
"""

from __future__ import annotations

import torch
from torch import Tensor


def position_ids_from_mask(attention_mask: Tensor) -> Tensor:
    """attention_mask [B, L] (1 = real token) -> position ids [B, L], 0 on left padding."""
    return (attention_mask.long().cumsum(dim=-1) - 1).clamp_min(0)


def response_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    response_width: int,
    *,
    with_entropy: bool = False,
    temperature: float = 1.0,
) -> tuple[Tensor, Tensor | None]:
    """Log-probs [B, T] of the last ``response_width`` tokens, and optionally their entropies [B, T].

    input_ids, attention_mask: [B, P + T]. Logits are divided by ``temperature`` (the sampling
    temperature, so the ratio is taken against the distribution that was sampled). Padding positions
    get arbitrary finite values; callers multiply by the response mask.
    """
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    logits = out.logits[:, -response_width - 1 : -1, :]
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    if temperature != 1.0:
        logits = logits / temperature
    logsm = torch.log_softmax(logits, dim=-1)
    targets = input_ids[:, -response_width:]
    logp = logsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        entropy = -(logsm.exp() * logsm).sum(dim=-1)
    return logp, entropy
