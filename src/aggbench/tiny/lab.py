"""The controlled length-bias lab's knob settings, and what they do to the warm-started model.

Four settings, ``gap`` (positive, negative) x ``spread`` (low, high) of
:class:`aggbench.tiny.task.TaskConfig`, each one tiny model (the warm start differs by knob; the
problems do not, so one training set and one benchmark serve all four). :func:`warm_start_settings`
warm-starts all of them from one shared first phase (the skill phase, which has no knobs), which
gives the same weights as four separate ``sft_warm_start`` runs at a little more than half the
cost. :func:`measure` samples the warm-started model on training prompts at temperature 1 and
reports the quantities the knobs are meant to set: the length gap (mean length of correct minus
incorrect responses) and the length coefficient of variation, pooled and within prompt groups.
``benchmarks/lab_knobs.py`` prints them; ``tests/tiny/test_lab_knobs.py`` checks their directions.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from aggbench.tiny.model import (
    DEFAULT_SFT_BATCH,
    DEFAULT_SFT_LR,
    SftState,
    build_tiny_model,
    sample_responses,
    skill_task,
)
from aggbench.tiny.task import TaskConfig, make_task, response_style, task_reward

# name -> the knobs, as configs/lab.yaml's models name them (tiny-<name>)
SETTINGS: dict[str, TaskConfig] = {
    f"{gap[:3]}-{spread}": TaskConfig(gap=gap, spread=spread)
    for gap in ("positive", "negative")
    for spread in ("low", "high")
}


def warm_start_settings(
    root: str | Path,
    settings: dict[str, TaskConfig],
    *,
    steps: int,
    seed: int = 0,
    batch_size: int = DEFAULT_SFT_BATCH,
    lr: float = DEFAULT_SFT_LR,
) -> dict[str, Path]:
    """Warm-start one tiny model per setting into ``root/NAME``; returns the directories.

    The first half of the steps (``sft_warm_start``'s skill phase) does not depend on the knobs, so
    it runs once and each setting continues from a copy of its state: every directory holds what
    ``sft_warm_start(steps=steps, seed=seed, task=setting)`` would have written. The settings must
    agree on everything but the knobs (their skill phases would differ otherwise).
    """
    root = Path(root)
    skills = {skill_task(cfg) for cfg in settings.values()}
    if len(skills) != 1:
        raise ValueError(
            f"settings differ beyond gap/spread, so they share no skill phase: {sorted(map(str, skills))}"
        )
    base = build_tiny_model(root / "_init", seed=seed)
    state = SftState.start(base, steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    skill_steps = math.ceil(0.5 * steps)
    state.run(skills.pop(), range(skill_steps))
    out = {}
    for name, cfg in settings.items():
        fork = state.fork()
        fork.run(cfg, range(skill_steps, steps))
        out[name] = build_tiny_model(root / name, seed=seed)  # the tokenizer and generation config
        fork.model.save_pretrained(out[name])
    return out


def _cv(values: list[float]) -> float:
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    return math.sqrt(var) / mean


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def measure(
    model_dir: str | Path,
    task: TaskConfig,
    *,
    n_prompts: int = 16,
    n_samples: int = 8,
    seed: int = 0,
) -> dict[str, Any]:
    """Sample ``n_samples`` responses to each of ``n_prompts`` training prompts (the train split of
    ``make_task(seed)``, as the lab trains on) at temperature 1, with room for the longest
    warm-start answer plus 8 tokens; lengths in tokens with eos.

    Returns accuracy, gap (mean length correct - incorrect; None without both), gap_within (the
    same inside each prompt group, averaged over the groups that have both), cv (pooled), cv_within
    (mean over groups of the group's CV), mean_len, worked_share (responses with a hop line),
    accuracy_worked / accuracy_guess, truncated (share without eos) and n_responses.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    train, _ = make_task(seed, n_prompts, 0, cfg=task)
    budget = task.max_response_tokens() + 8
    texts, lengths = sample_responses(
        model, tokenizer, [r["prompt"] for r in train], n_samples=n_samples, max_new_tokens=budget, seed=seed
    )
    answers = [r["answer"] for r in train for _ in range(n_samples)]
    rewards = [task_reward(t, a) for t, a in zip(texts, answers, strict=True)]
    styles = [response_style(t) for t in texts]
    groups = [range(i, i + n_samples) for i in range(0, len(texts), n_samples)]

    def gap(idx) -> float | None:
        right = [lengths[i] for i in idx if rewards[i] > 0]
        wrong = [lengths[i] for i in idx if rewards[i] == 0]
        return _mean(right) - _mean(wrong) if right and wrong else None

    within = [g for g in (gap(idx) for idx in groups) if g is not None]
    by_style = {s: [r for r, st in zip(rewards, styles, strict=True) if st == s] for s in ("worked", "guess")}
    return {
        "accuracy": sum(rewards) / len(rewards),
        "gap": gap(range(len(texts))),
        "gap_within": _mean(within),
        "cv": _cv(lengths),
        "cv_within": _mean([_cv([lengths[i] for i in idx]) for idx in groups]),
        "mean_len": sum(lengths) / len(lengths),
        "worked_share": len(by_style["worked"]) / len(texts),
        "accuracy_worked": _mean(by_style["worked"]),
        "accuracy_guess": _mean(by_style["guess"]),
        "truncated": sum(n >= budget for n in lengths) / len(lengths),
        "n_responses": len(texts),
    }
