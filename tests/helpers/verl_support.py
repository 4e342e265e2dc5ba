"""verl's own actor-update path on CPU, one process standing in for every data-parallel rank
(tests/integrations/test_verl.py).

What runs is verl's code: its config composition, ``compute_advantage`` (the driver's call of the
registered estimator), ``left_right_2_no_padding`` and the ``to_tensordict`` conversion of
``_update_actor``, the dispatch's chunking (``BatchData.chunk``, as ``dispatch_nd_compute_dataproto``
splits a batch over ranks), each rank's mini-batch iterator (``make_iterator``), the micro-batch
split (``prepare_micro_batches``) and the loss (``ppo_loss``). What this file supplies is what FSDP
and the engine would: the global token count of a mini-batch (their all-reduce), the per-token
log-probs of the model in verl's no-padding layout, and the average of the ranks' gradients.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from aggbench.integrations import verl as adapter
from aggbench.tiny.model import render_prompt
from aggbench.tiny.task import make_task

N = 4  # responses per prompt (rollout.n)
PROMPTS = 4
RESPONSE_LEN = 12
# binary rewards per group: mixed, all-wrong (zero advantages), mostly right, one right
REWARDS = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0], [0, 1, 0, 0]]


def overrides(
    estimator: str, loss_agg_mode: str, *, mini_batches: int = 1, dp: int = 2, extra=()
) -> list[str]:
    actor = "actor_rollout_ref.actor"
    return [
        f"algorithm.adv_estimator={estimator}",
        f"{actor}.loss_agg_mode={loss_agg_mode}",
        f"data.train_batch_size={PROMPTS}",
        f"{actor}.ppo_mini_batch_size={PROMPTS // mini_batches}",
        f"{actor}.ppo_micro_batch_size_per_gpu=2",
        f"{actor}.clip_ratio_low=0.2",
        f"{actor}.clip_ratio_high=0.28",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        f"actor_rollout_ref.rollout.n={N}",
        f"trainer.n_gpus_per_node={dp}",
        "trainer.use_v1=false",
        "trainer.balance_batch=false",
        *extra,
    ]


def make_batch(model_dir, seed: int = 0):
    """A GRPO step batch in verl's padded layout (DataProto) with rewards on the last response token."""
    from verl import DataProto

    tok = AutoTokenizer.from_pretrained(model_dir)
    train, _ = make_task(seed, PROMPTS, 1)
    prompts = [tok(render_prompt(tok, r["prompt"]), add_special_tokens=False)["input_ids"] for r in train]
    p_len = max(map(len, prompts))
    gen = torch.Generator().manual_seed(seed)
    b = PROMPTS * N
    lengths = torch.randint(2, RESPONSE_LEN + 1, (b,), generator=gen)
    responses = torch.randint(5, tok.vocab_size, (b, RESPONSE_LEN), generator=gen)
    response_mask = (torch.arange(RESPONSE_LEN)[None, :] < lengths[:, None]).long()
    responses = responses * response_mask + tok.pad_token_id * (1 - response_mask)
    prompt_ids = torch.full((b, p_len), tok.pad_token_id)
    prompt_mask = torch.zeros(b, p_len, dtype=torch.long)
    for i in range(b):
        ids = prompts[i // N]
        prompt_ids[i, p_len - len(ids) :] = torch.tensor(ids)  # left padding, as verl's rollout
        prompt_mask[i, p_len - len(ids) :] = 1
    attention = torch.cat([prompt_mask, response_mask], dim=1)
    rewards = torch.zeros(b, RESPONSE_LEN, dtype=torch.float64)
    flat = [r for group in REWARDS for r in group]
    rewards[torch.arange(b), lengths - 1] = torch.tensor(flat, dtype=torch.float64)
    uids = np.array([f"uid-{i // N}" for i in range(b)], dtype=object)
    return DataProto.from_dict(
        tensors={
            "prompts": prompt_ids,
            "responses": responses,
            "input_ids": torch.cat([prompt_ids, responses], dim=1),
            "attention_mask": attention,
            "position_ids": (attention.cumsum(1) - 1).clamp_min(0),
            "response_mask": response_mask,
            "token_level_rewards": rewards,
            "row": torch.arange(b),
        },
        non_tensors={"uid": uids},
    )


def load_model(model_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)


def response_logprobs(model, batch) -> torch.Tensor:
    """[B, T] log-probs of the response tokens (no grad), from verl's padded layout."""
    ids, attn = batch.batch["input_ids"], batch.batch["attention_mask"]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=batch.batch["position_ids"]).logits
    lp = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    t = batch.batch["responses"].shape[1]
    return lp[:, -t:] * batch.batch["response_mask"]


def add_old_logprobs(model, batch, seed: int = 1) -> None:
    """Behaviour log-probs = current ones + noise, so ratios differ from 1 and some tokens clip."""
    gen = torch.Generator().manual_seed(seed)
    lp = response_logprobs(model, batch)
    noise = 0.3 * torch.randn(lp.shape, generator=gen, dtype=lp.dtype)
    batch.batch["old_log_probs"] = (lp + noise) * batch.batch["response_mask"]


def compute_advantage(batch, config):
    """verl's driver-side call: the estimator named by ``config.algorithm.adv_estimator``."""
    from verl.trainer.ppo.ray_trainer import compute_advantage as verl_compute_advantage

    return verl_compute_advantage(
        batch,
        adv_estimator=config.algorithm.adv_estimator,
        num_repeat=config.actor_rollout_ref.rollout.n,
        norm_adv_by_std_in_grpo=config.algorithm.norm_adv_by_std_in_grpo,
        config=config.algorithm,
    )


def _flat_logprobs(model, micro) -> torch.Tensor:
    """What the engine's forward gives ppo_loss: per token of the unpadded sequences, the log-prob
    of the NEXT token (verl's left-shifted no-padding layout), [total_nnz]."""
    out = []
    for ids, pos in zip(micro["input_ids"].unbind(), micro["position_ids"].unbind(), strict=True):
        logits = model(input_ids=ids[None], position_ids=pos[None]).logits[0]
        lp = torch.log_softmax(logits[:-1].double(), -1).gather(-1, ids[1:, None])[:, 0]
        out.append(torch.cat([lp, lp.new_zeros(1)]))
    return torch.cat(out)


def verl_update_gradients(model, batch, config) -> list[tuple[list[int], dict[str, torch.Tensor]]]:
    """Each mini-batch's gradient as verl's actor update computes it over ``dp`` ranks.

    Returns [(rows of the global mini-batch, {parameter: gradient})] in update order.
    """
    from verl.protocol import BatchData
    from verl.utils import tensordict_utils as tu
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.engine.utils import prepare_micro_batches
    from verl.workers.utils.losses import ppo_loss
    from verl.workers.utils.padding import left_right_2_no_padding

    actor_cfg = omega_conf_to_dataclass(config.actor_rollout_ref.actor)
    dp = int(config.trainer.n_gpus_per_node) * int(config.trainer.nnodes)
    mini = int(config.actor_rollout_ref.actor.ppo_mini_batch_size) * int(config.actor_rollout_ref.rollout.n)
    td = left_right_2_no_padding(batch.to_tensordict())
    shards = BatchData(td).chunk(chunks=dp)
    iters = [
        list(
            tu.make_iterator(
                s, mini_batch_size=mini // dp, epochs=1, seed=42 + r, dataloader_kwargs={"shuffle": False}
            )
        )
        for r, s in enumerate(shards)
    ]
    result = []
    for k in range(len(iters[0])):
        model.zero_grad(set_to_none=True)
        parts = [it[k] for it in iters]
        tokens = sum(int(p["loss_mask"].sum()) for p in parts)  # the engine's all-reduce over dp ranks
        rows: list[int] = []
        for part in parts:
            rows += part["row"].tolist()
            tu.assign_non_tensor(
                part,
                dp_size=dp,
                batch_num_tokens=tokens,
                global_batch_size=mini,
                use_dynamic_bsz=False,
                micro_batch_size_per_gpu=int(config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu),
            )
            micro_batches, _ = prepare_micro_batches(part)
            for micro in micro_batches:
                loss, _ = ppo_loss(actor_cfg, {"log_probs": _flat_logprobs(model, micro)}, micro)
                loss.backward()
        # FSDP averages the ranks' gradients
        grads = {n: p.grad.clone() / dp for n, p in model.named_parameters() if p.grad is not None}
        result.append((rows, grads))
    return result


def aggbench_gradient(model, batch, rows: list[int], instance) -> dict[str, torch.Tensor]:
    """aggbench's own update (train/update.py) on the mini-batch ``rows``, the rule computed on it,
    with verl's GRPO advantages."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    from aggbench.train.batching import PackedBatch
    from aggbench.train.scoring import ScoredBatch
    from aggbench.train.update import LossSettings, MiniBatch, accumulate_gradients

    t = batch.batch
    mask = t["response_mask"].bool()
    grpo, _ = compute_grpo_outcome_advantage(
        t["token_level_rewards"], t["response_mask"], batch.non_tensor_batch["uid"]
    )
    adv = (grpo * mask).sum(1) / mask.sum(1)
    packed = PackedBatch(
        input_ids=t["input_ids"],
        attention_mask=t["attention_mask"],
        response_mask=mask,
        prompt_lens=t["attention_mask"][:, : t["prompts"].shape[1]].sum(1),
        response_lens=mask.sum(1),
    )
    mb = torch.tensor(sorted(rows))
    gids = adapter.group_ids_of(batch.non_tensor_batch["uid"])
    eff = instance(mask[mb], adv[mb], gids[mb])
    settings = LossSettings(clip_low=0.2, clip_high=0.28, dual_clip=3.0, micro_batch_size=4)
    model.zero_grad(set_to_none=True)
    scored = ScoredBatch(packed, mask, adv, gids)
    accumulate_gradients(
        model, scored, MiniBatch.whole(mb, eff, torch.zeros_like(eff)), settings, old=t["old_log_probs"]
    )
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def relative_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    scale = max(float(v.abs().max()) for v in b.values())
    return max(float((a[k] - b[k]).abs().max()) for k in a) / scale
