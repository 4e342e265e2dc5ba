"""Exactness of the design invariant on a real (tiny) transformer, in float64.

For every rule instance, the gradient accumulated over a random split of the mini-batch into
micro-batches, and over a simulated 2-rank data-parallel split (gradients SUMMED across ranks),
equals the full-batch gradient, compared as raw gradients before any clipping or optimiser step
(an optimiser step would hide a wrong global scale). A negative control shows the comparison can
fail: re-normalising per micro-batch (TRL bnpo / verl's old per-micro-batch token-mean) breaks it.
"""

from __future__ import annotations

import pytest
import torch

from aggbench.aggregation import RuleInstance
from aggbench.aggregation.advantages import grpo
from aggbench.train.logprobs import response_logprobs
from aggbench.train.objective import aux_token_weights, kl_k3, pg_loss
from helpers.dp_fixture import tiny_model
from helpers.support import contract_instances, instance_ids

INSTANCES = contract_instances()
CLIP = {"clip_low": 0.2, "clip_high": 0.28, "dual_clip": 3.0}


@pytest.fixture(scope="module")
def setup():
    model = tiny_model(vocab_size=40).eval()
    gen = torch.Generator().manual_seed(1)
    n_groups, g, p_width, t_width = 4, 4, 5, 9
    b = n_groups * g
    # fixed rollouts: left-padded prompts (shared within a group), right-padded responses
    prompt_len = torch.randint(2, p_width + 1, (n_groups,), generator=gen).repeat_interleave(g)
    resp_len = torch.randint(1, t_width + 1, (b,), generator=gen)
    prompt_mask = torch.arange(p_width)[None, :] >= (p_width - prompt_len)[:, None]
    resp_mask = torch.arange(t_width)[None, :] < resp_len[:, None]
    ids = torch.randint(3, 40, (b, p_width + t_width), generator=gen)
    attn = torch.cat([prompt_mask, resp_mask], dim=1).long()
    ids = ids * attn  # pad id 0
    rewards = torch.randint(0, 2, (b,), generator=gen).double()
    rewards[::g] = 1 - rewards[1::g]  # variance in every group
    gids = torch.arange(n_groups).repeat_interleave(g)
    adv = grpo(rewards, gids)
    with torch.no_grad():
        logp0, _ = response_logprobs(model, ids, attn, t_width)
    # behaviour and reference policies differ from the current one, so clipping and KL are active
    old = logp0 + 0.2 * torch.randn(logp0.shape, generator=gen, dtype=torch.float64)
    ref = logp0 + 0.1 * torch.randn(logp0.shape, generator=gen, dtype=torch.float64)
    return model, ids, attn, resp_mask, adv, gids, old, ref, t_width


def _loss(model, ids, attn, mask, eff, old, ref, kl_w, t_width, rows):
    logp, ent = response_logprobs(model, ids[rows], attn[rows], t_width, with_entropy=True)
    m = mask[rows]
    pg = pg_loss(logp, old[rows], eff[rows], m, **CLIP)
    kl = (kl_w[rows] * kl_k3(logp, ref[rows])).sum()
    ent_term = (kl_w[rows] * ent).sum()
    return pg + 0.05 * kl - 0.01 * ent_term


def _grads(model, loss_fn, splits):
    model.zero_grad(set_to_none=True)
    for rows in splits:
        loss_fn(rows).backward()  # accumulates: the plain sum of micro-batch losses
    return [p.grad.detach().clone() for p in model.parameters()]


def _assert_same(ga, gb):
    for a, b in zip(ga, gb, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("inst", INSTANCES, ids=instance_ids(INSTANCES))
def test_microbatch_and_data_parallel_gradients_equal_full_batch(setup, inst):
    model, ids, attn, mask, adv, gids, old, ref, t_width = setup
    b = ids.shape[0]
    # computed ONCE on the whole mini-batch, before any split
    eff = inst(mask, adv, gids)
    kl_w = aux_token_weights(mask, "token-mean")

    def loss_fn(rows):
        return _loss(model, ids, attn, mask, eff, old, ref, kl_w, t_width, rows)

    full = _grads(model, loss_fn, [torch.arange(b)])
    perm = torch.randperm(b, generator=torch.Generator().manual_seed(hash(inst.name) % 1000))
    micro = [perm[:3], perm[3:4], perm[4:11], perm[11:]]  # uneven micro-batches
    _assert_same(_grads(model, loss_fn, micro), full)
    # simulated 2-rank data parallel: each rank accumulates its shard, then all-reduce SUM
    rank_grads = [
        _grads(model, loss_fn, list(torch.tensor_split(shard, 2))) for shard in torch.tensor_split(perm, 2)
    ]
    _assert_same([a + c for a, c in zip(*rank_grads, strict=True)], full)
    # batch 1 x accumulation B == batch B x accumulation 1
    _assert_same(_grads(model, loss_fn, [torch.tensor([i]) for i in range(b)]), full)


def test_per_microbatch_renormalisation_is_not_exact(setup):
    """Negative control: recomputing token-mean inside each micro-batch (TRL bnpo-style) is wrong."""
    model, ids, attn, mask, adv, gids, old, ref, t_width = setup
    b = ids.shape[0]
    rule = RuleInstance("token", "token")
    kl_w = aux_token_weights(mask, "token-mean")
    eff = rule(mask, adv, gids)
    full = _grads(
        model, lambda r: _loss(model, ids, attn, mask, eff, old, ref, kl_w, t_width, r), [torch.arange(b)]
    )
    micro = [torch.arange(0, 5), torch.arange(5, b)]

    def renorm_loss(rows):
        local_eff = torch.zeros_like(eff)
        local_eff[rows] = rule(mask[rows], adv[rows], gids[rows]) / len(micro)
        return _loss(model, ids, attn, mask, local_eff, old, ref, kl_w, t_width, rows)

    wrong = _grads(model, renorm_loss, micro)
    with pytest.raises(AssertionError):
        _assert_same(wrong, full)
