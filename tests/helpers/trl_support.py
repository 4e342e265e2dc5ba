"""TRL GRPOTrainer runs on the built-in tiny model, shared by tests/integrations/test_trl.py and its
2-process worker (trl_worker.py)."""

from __future__ import annotations

import zlib

import datasets
import torch
import trl
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from aggbench.integrations import trl as adapter
from aggbench.tiny.task import make_task, task_reward

G = 8  # num_generations


def dataset(n: int = 32):
    train, _ = make_task(0, n, 2)
    # every prompt of the task has the same length: no left padding, so TRL's forward (positions from
    # the cache position) and aggbench's (positions from the attention mask) see the same inputs
    assert len({len(r["prompt"]) for r in train}) == 1
    return datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in train]
    )


def reward(completions, answer, **_):
    return [task_reward(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]


def grpo_args(tmp_path, **over):
    base = dict(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=16,
        num_generations=G,
        max_completion_length=48,
        max_steps=1,
        learning_rate=1e-4,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        seed=0,
        gradient_checkpointing=False,
        bf16=False,  # TRL defaults to bf16 autocast, on CPU too: the comparisons are in float64
        max_grad_norm=0.0,  # no clipping: the captured gradient is the loss's own
        epsilon=0.2,
        epsilon_high=0.28,
    )
    base.update(over)
    return trl.GRPOConfig(**base)


def group_seeded_rollout(prompts, trainer):
    """TRL's ``rollout_func`` hook: each group of G copies of a prompt sampled by the real model with a
    seed of its own (crc32 of the prompt), so a group's completions do not depend on how TRL chunks
    the generation batch (its own sampler draws differ with per_device_train_batch_size)."""
    tok = trainer.processing_class
    out = {"prompt_ids": [], "completion_ids": [], "logprobs": None}
    eos = tok.eos_token_id
    for start in range(0, len(prompts), G):
        group = prompts[start : start + G]
        assert all(p == group[0] for p in group), "TRL no longer sends each prompt's G copies together"
        text = tok.apply_chat_template(group[0], tokenize=False, add_generation_prompt=True)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(zlib.crc32(text.encode()))
            seqs = trainer.model.generate(
                input_ids=torch.tensor([ids] * G),
                attention_mask=torch.ones(G, len(ids), dtype=torch.long),
                do_sample=True,
                temperature=1.0,
                top_k=0,
                max_new_tokens=trainer.args.max_completion_length,
                pad_token_id=tok.pad_token_id,
            )
        for row in seqs[:, len(ids) :].tolist():
            out["prompt_ids"].append(ids)
            out["completion_ids"].append(row[: row.index(eos) + 1] if eos in row else row)
    return out


class Grads(TrainerCallback):
    """The gradient of every optimiser step, just before the step."""

    def __init__(self):
        self.steps = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
        self.steps.append(
            {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        )


def recording_trainer(
    model_dir, tmp_path, *, aggregation="balanced", dtype=torch.float64, plugins=(), rollout=None, **over
):
    """An AggregationGRPOTrainer that records each generation batch (before TRL splits it)."""

    class Recording(adapter.AggregationGRPOTrainer):
        batches: list = []

        def _generate_and_score_completions(self, inputs):
            out = super()._generate_and_score_completions(inputs)
            self.batches.append(
                {
                    **{k: v.clone() for k, v in out.items() if torch.is_tensor(v)},
                    **{f"seen_{k}": v.clone() for k, v in self.last_generation.items()},
                }
            )
            return out

    Recording.batches = []
    grads = Grads()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    trainer = Recording(
        model=model,
        reward_funcs=reward,
        args=grpo_args(tmp_path, **over),
        train_dataset=dataset(),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[grads],
        aggregation=aggregation,
        plugins=plugins,
        rollout_func=rollout,
    )
    return trainer, grads
