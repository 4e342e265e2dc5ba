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

import hashlib
import json
import math
import os
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aggbench.tiny.model import (
    DEFAULT_SFT_BATCH,
    DEFAULT_SFT_LR,
    SftState,
    build_tiny_model,
    sample_responses,
    skill_task,
    thread_count_mismatch,
)
from aggbench.tiny.task import TaskConfig, has_echo, make_task, response_style, task_reward

# name -> the knobs, as configs/lab.yaml's models name them (tiny-<name>)
SETTINGS: dict[str, TaskConfig] = {
    f"{gap[:3]}-{spread}": TaskConfig(gap=gap, spread=spread)
    for gap in ("positive", "negative")
    for spread in ("low", "high")
}
# lab v2 (configs/lab_v2.yaml, docs/lab.md "Lab v2"): one-line gaps, the echo lines before the box,
# and the positive control (half the worked answers echo, no guess does)
SETTINGS_V2: dict[str, TaskConfig] = {
    **{
        f"{gap[:3]}-{name}": TaskConfig(gap=gap, spread=spread)
        for gap in ("positive_line", "negative_line")
        for name, spread in (("low", "low"), ("high", "echo"))
    },
    "control": TaskConfig(spread="echo_worked"),
}


def warm_start_settings(
    root: str | Path,
    settings: dict[str, TaskConfig],
    *,
    steps: int,
    seed: int = 0,
    batch_size: int = DEFAULT_SFT_BATCH,
    lr: float = DEFAULT_SFT_LR,
    skill_steps: int | None = None,
) -> dict[str, Path]:
    """Warm-start one tiny model per setting into ``root/NAME``; returns the directories.

    The first half of the steps (``sft_warm_start``'s skill phase) does not depend on the knobs, so
    it runs once and each setting continues from a copy of its state: every directory holds what
    ``sft_warm_start(steps=steps, seed=seed, task=setting)`` would have written. The settings must
    agree on everything but the knobs (their skill phases would differ otherwise). ``skill_steps``
    moves the split (default: half, as ``sft_warm_start``): a short knob phase after a longer skill
    phase is a cheaper warm start, not the one ``sft_warm_start`` writes (benchmarks/lab_knobs.py
    ``--skill-steps``).
    """
    root = Path(root)
    skills = {skill_task(cfg) for cfg in settings.values()}
    if len(skills) != 1:
        raise ValueError(
            f"settings differ beyond gap/spread, so they share no skill phase: {sorted(map(str, skills))}"
        )
    base = build_tiny_model(root / "_init", seed=seed)
    state = SftState.start(base, steps=steps, batch_size=batch_size, lr=lr, seed=seed)
    skill_steps = math.ceil(0.5 * steps) if skill_steps is None else skill_steps
    if not 0 <= skill_steps <= steps:
        raise ValueError(f"skill_steps must be in [0, steps={steps}], got {skill_steps}")
    state.run(skills.pop(), range(skill_steps))
    out = {}
    for name, cfg in settings.items():
        fork = state.fork()
        fork.run(cfg, range(skill_steps, steps))
        out[name] = build_tiny_model(root / name, seed=seed)  # the tokenizer and generation config
        fork.model.save_pretrained(out[name])
    return out


# --- the skill phase on disk: the lab's warm starts in separate jobs ----------------------------
#
# The workflow prepares each model in its own job (``aggbench prepare-model``), so the shared skill
# phase is written once to a directory (weights, tokenizer, and in SKILL_STATE the optimizer state,
# the example stream's RNG and the losses) and every model continues from it. Each continuation is
# what ``sft_warm_start`` would have written alone (tests/tiny/test_skill_phase.py compares the
# weights bit for bit).

SKILL_STATE = "sft_state.pt"
SKILL_RECORD = "skill_phase.json"


def skill_phase_record(
    *,
    seed: int,
    steps: int,
    task: TaskConfig,
    batch_size: int = DEFAULT_SFT_BATCH,
    lr: float = DEFAULT_SFT_LR,
) -> dict[str, Any]:
    """What identifies a warm start's skill phase: two warm starts with the same record share it."""
    return {
        "seed": seed,
        "sft_steps": steps,
        "skill_steps": math.ceil(0.5 * steps),  # sft_warm_start's worked_only_fraction
        "batch_size": batch_size,
        "lr": lr,
        "task": asdict(skill_task(task)),
    }


def skill_phase_key(record: dict[str, Any]) -> str:
    """A short stable name for a skill phase (a directory name)."""
    digest = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()[:12]
    return f"skill-{record['seed']}-{record['sft_steps']}-{digest}"


def shared_skill_phases(models: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    """{skill phase key: the models that share it}, for the keys two or more of ``models`` (an
    experiment config's ``models``: tiny ones with ``sft_steps`` and ``task``) share."""
    from aggbench.tiny.model import DEFAULT_SFT_STEPS

    groups: dict[str, list[str]] = {}
    for name, m in models.items():
        steps = DEFAULT_SFT_STEPS if m.get("sft_steps") is None else m["sft_steps"]
        if m.get("source") != "tiny" or not steps:
            continue
        record = skill_phase_record(seed=0, steps=steps, task=TaskConfig(**(m.get("task") or {})))
        groups.setdefault(skill_phase_key(record), []).append(name)
    return {key: names for key, names in groups.items() if len(names) > 1}


def prepare_skill_phase(
    out_dir: str | Path, *, seed: int, steps: int, task: TaskConfig, progress: bool = False
) -> dict[str, Any] | None:
    """Run the skill phase into ``out_dir`` (written as ``out_dir.tmp-<pid>``, then renamed);
    returns its record, or None when ``out_dir`` already holds this skill phase."""
    import torch

    out = Path(out_dir)
    record = skill_phase_record(seed=seed, steps=steps, task=task)
    if out.exists():
        check_skill_phase(out, record)
        return None
    tmp = out.parent / f"{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        build_tiny_model(tmp, seed=seed)
        state = SftState.start(tmp, steps=steps, batch_size=record["batch_size"], lr=record["lr"], seed=seed)
        state.run(skill_task(task), range(record["skill_steps"]), progress=progress)
        state.model.save_pretrained(tmp)
        saved = {
            "optimizer": state.optimizer.state_dict(),
            "rng": state.rng.getstate(),
            "losses": state.losses,
        }
        torch.save(saved, tmp / SKILL_STATE)
        # the thread count is not part of the record (the key names the phase before any job runs)
        # but its weights depend on it: check_skill_phase refuses a continuation on another count
        on_disk = {**record, "threads": torch.get_num_threads()}
        (tmp / SKILL_RECORD).write_text(json.dumps(on_disk, indent=2) + "\n")
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return record


def check_skill_phase(skill_dir: Path, record: dict[str, Any]) -> None:
    """Raise ValueError unless ``skill_dir`` is a finished skill phase of ``record`` run on this
    process's torch thread count (a continuation on another count matches no plain warm start)."""
    path = skill_dir / SKILL_RECORD
    if not (path.is_file() and (skill_dir / SKILL_STATE).is_file()):
        raise ValueError(
            f"{skill_dir} is not a finished skill phase (no {SKILL_RECORD} or {SKILL_STATE}); delete it and "
            "rerun `aggbench prepare-model tiny --skill-phase-only --out DIR`"
        )
    have = json.loads(path.read_text())
    threads = have.pop("threads", None)  # None: written before the count was recorded
    if have != record:
        diff = ", ".join(
            f"{k}: {have.get(k)!r} -> {record.get(k)!r}"
            for k in sorted({*have, *record})
            if have.get(k) != record.get(k)
        )
        raise ValueError(
            f"{skill_dir} holds another warm start's skill phase ({diff}); prepare the matching one with "
            "`aggbench prepare-model tiny --skill-phase-only` (same --seed, --sft-steps and task options)"
        )
    mismatch = thread_count_mismatch(threads)
    if mismatch:
        raise ValueError(
            f"{skill_dir} {mismatch}: a continuation here would match no plain warm start; set "
            f"OMP_NUM_THREADS={threads} (the workflow's WARM_START_THREADS), or delete it and "
            "prepare the skill phase again on this count"
        )


def continue_from_skill_phase(
    skill_dir: str | Path,
    out_dir: str | Path,
    *,
    seed: int,
    steps: int,
    task: TaskConfig,
    progress: bool = False,
) -> list[float]:
    """Finish the warm start of ``task`` from a saved skill phase into ``out_dir`` (built there with
    its tokenizer); returns the per-step losses of the whole warm start, as ``sft_warm_start``."""
    import torch

    skill_dir = Path(skill_dir)
    record = skill_phase_record(seed=seed, steps=steps, task=task)
    check_skill_phase(skill_dir, record)
    state = SftState.start(
        skill_dir, steps=steps, batch_size=record["batch_size"], lr=record["lr"], seed=seed
    )
    saved = torch.load(skill_dir / SKILL_STATE)
    state.optimizer.load_state_dict(saved["optimizer"])
    version, internal, gauss = saved["rng"]
    state.rng.setstate((version, tuple(internal), gauss))
    state.losses = list(saved["losses"])
    state.run(task, range(record["skill_steps"], steps), progress=progress)
    build_tiny_model(out_dir, seed=seed)  # the tokenizer and generation config
    state.model.save_pretrained(out_dir)
    return state.losses


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
    accuracy_worked / accuracy_guess, echo_share (the share of the worked answers that echo their
    letter before the box, ``spread="echo"``'s block; None without worked answers), truncated (share
    without eos) and n_responses.
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
    echo = [has_echo(t) for t, s in zip(texts, styles, strict=True) if s == "worked"]
    return {
        "accuracy": sum(rewards) / len(rewards),
        "gap": gap(range(len(texts))),
        "gap_within": _mean(within),
        "cv": _cv(lengths),
        "cv_within": _mean([_cv([lengths[i] for i in idx]) for idx in groups]),
        "mean_len": sum(lengths) / len(lengths),
        "worked_share": len(by_style["worked"]) / len(texts),
        "echo_share": _mean(echo),  # of the worked answers
        "accuracy_worked": _mean(by_style["worked"]),
        "accuracy_guess": _mean(by_style["guess"]),
        "truncated": sum(n >= budget for n in lengths) / len(lengths),
        "n_responses": len(texts),
    }
