"""`aggbench plan`: what an experiment grid costs, before it is submitted.

For each cell and for the whole grid: GPU-hours (training and evaluation), peak memory per GPU
(weights, gradients, optimizer state, activations, KV cache) and the SLURM jobs, all from the
experiment config. The memory and FLOP formulas are in :mod:`aggbench.plan.costmodel`; this module
reads the grid (through :mod:`aggbench.grid`, the same expansion the Snakefile uses) and the
optional ``plan:`` block of the config, and records where every number came from: a model's
config.json or the built-in table, a configured (measured) throughput or an assumed default.

Time model. Per training step, with P prompts x G samples, mean prompt length p and response
length r (default: their configured maxima, an upper bound):

    generation GPU-seconds = P G r x rounds / generate tokens/s per GPU
    update GPU-seconds     = P G (p + r) x ppo_epochs / update tokens/s per GPU
                             (+ 1/3 of that per extra forward-only pass: old log-probs when there
                             is more than one optimiser step per batch, reference log-probs when
                             kl_coef > 0)

A throughput that is not configured is assumed: MFU x the GPU's peak bf16 FLOP/s / FLOPs per
token (costmodel). A train segment's wall time is its steps' GPU-seconds / the job's GPUs, which
assumes generation and update scale across them (loading the model and writing checkpoints are
not counted). Evaluation: every benchmark's problems x samples
x r tokens per evaluated checkpoint, on the generate job's GPUs. Grading is CPU work and has no
estimate: its cost is shown as requested CPU-hours (jobs x cpus x runtime).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aggbench import layout
from aggbench.grid import (
    GridError,
    cell_train_config,
    cells,
    checkpoint_steps,
    eval_steps,
)
from aggbench.plan import costmodel as cm
from aggbench.plan.jobs import grid_jobs
from aggbench.resources import requests_gpus, resource
from aggbench.rollout.vllm import EVAL_GPU_MEMORY_UTILIZATION

# Defaults of the `plan:` block, each with its source (printed under "assumed" when used).
DEFAULTS: dict[str, Any] = {
    "gpu": {"name": "H100 SXM 80GB", "memory_gib": 80.0, "peak_tflops": 989.0},
    "mfu": {"update": 0.33, "generate": 0.20},
    "activation_checkpointing": None,
    "response_fraction": 1.0,
    "dynamic_sampling_rounds": 1.0,
}
SOURCES: dict[str, str] = {
    "gpu": "NVIDIA H100 SXM datasheet: 80 GB, 989 TFLOP/s dense BF16 (1,979 is with sparsity)",
    "mfu.update": "torchtitan docs/performance.md: FSDP2, Llama 3.1 8B, 8 x H100, 33-39% MFU "
    "without Float8 (the low end; an RL update over padded micro-batches is likely slower)",
    "mfu.generate": "~12,500 output tok/s for Llama 3.1 8B (bf16) on one H100 with vLLM (third-party "
    "benchmarks collected at morphllm.com/vllm-benchmarks) = 12,500 x 2 x 8.03e9 / 989e12 = 0.20; "
    "optimistic for long reasoning responses",
    "activation_checkpointing": "the cell's training.distributed.activation_checkpointing where the "
    "trainer has that setting, else false",
    "response_fraction": "responses at their maximum length (an upper bound)",
    "dynamic_sampling_rounds": "one generation round per step (a lower bound with dynamic sampling, "
    "which may draw up to 1 + dynamic_sampling_max_rounds)",
    "mean_prompt_tokens": "prompts at max_prompt_tokens (an upper bound)",
}
# Problems per benchmark when the offline file is not at hand: line counts of the offline copies
# (../shared/data, see its PROVENANCE.md), which agree with the specs' descriptions.
KNOWN_PROBLEMS = {"math500": 500, "aime24": 30, "aime25": 30, "minerva": 272, "olympiadbench": 675,
                  "livecodebench": 279}  # fmt: skip


def settings(exp: dict) -> tuple[dict[str, Any], list[str]]:
    """The `plan:` block merged over DEFAULTS, and the names of the defaults that were used."""
    given = exp.get("plan") or {}
    out = copy.deepcopy(DEFAULTS)
    assumed = []
    for key, default in DEFAULTS.items():
        if isinstance(default, dict):
            out[key] = {**default, **(given.get(key) or {})}
            missing = [k for k in default if k not in (given.get(key) or {})]
            if key == "gpu" and len(missing) == len(default):
                assumed.append("gpu")
            else:
                assumed += [f"{key}.{k}" for k in missing]
        elif key in given:
            out[key] = given[key]
        else:
            assumed.append(key)
    out["models"] = given.get("models") or {}
    out["benchmarks"] = given.get("benchmarks") or {}
    unknown = sorted(set(out["models"]) - set(exp["models"]))
    if unknown:
        raise GridError(
            f"plan.models: {', '.join(map(repr, unknown))} not in models; allowed: {', '.join(exp['models'])}"
        )
    unknown = sorted(set(out["benchmarks"]) - set(exp["benchmarks"]))
    if unknown:
        raise GridError(
            f"plan.benchmarks: {', '.join(map(repr, unknown))} not in benchmarks; "
            f"allowed: {', '.join(exp['benchmarks'])}"
        )
    return out, assumed


def model_shape(exp: dict, name: str, plan: dict) -> tuple[cm.ModelShape, str]:
    """The model's architecture and where it came from, first found of: plan.models.NAME.config,
    a local model directory (path: true), the prepared model under results_dir, the built-in tiny
    model, the built-in table of published configs."""
    m = exp["models"][name]
    override = (plan["models"].get(name) or {}).get("config")
    if override:
        shape = cm.ModelShape.from_file(
            override, key=f"plan.models.{name}.config", fix="point it at a model's config.json or directory"
        )
        return shape, f"{override} (plan.models.{name}.config)"
    candidates = []
    if m.get("path"):
        candidates.append(Path(m["source"]))
    candidates.append(layout.model_dir(exp.get("results_dir", "results"), name))
    for config in (directory / "config.json" for directory in candidates):
        if config.is_file():
            fix = f"prepare the model again (aggbench prepare-model ... --force) or set plan.models.{name}.config"
            return cm.ModelShape.from_file(config, key=f"models.{name}", fix=fix), str(config)
    if m["source"] == "tiny":
        return cm.tiny_shape(), "built-in tiny model (aggbench.tiny.model.MODEL_SHAPE)"
    if m["source"] in cm.BUILTIN_SHAPES:
        return cm.BUILTIN_SHAPES[m["source"]]
    raise GridError(
        f"models.{name}: no config.json for {m['source']!r} (not prepared under results_dir, and not in "
        f"the built-in table: {', '.join(cm.BUILTIN_SHAPES)}); set plan.models.{name}.config to its "
        "config.json or model directory"
    )


def benchmark_workload(exp: dict, plan: dict) -> list[dict[str, Any]]:
    """Per benchmark: problems (and where that number came from), samples, the greedy protocol's
    decodes per problem (0 or 1), max response tokens."""
    from aggbench.data import load_benchmark_spec
    from aggbench.data.rows import resolve_data_dir

    ev, root, out = exp["evaluation"], resolve_data_dir(None), []
    for b in exp["benchmarks"]:
        spec = load_benchmark_spec(b)
        if b in plan["benchmarks"]:
            problems, source = int(plan["benchmarks"][b]), "plan.benchmarks"
        elif spec.builtin is not None:
            problems, source = spec.builtin.n_test, "built-in task"
        elif spec.holdout_of is not None:  # a training set's held-out problems: its holdout.n
            from aggbench.data import load_training_spec
            from aggbench.data.grid_checks import no_holdout

            owner = load_training_spec(spec.holdout_of)
            held = owner.holdout
            if held is None:
                raise GridError(f"{no_holdout(b, spec.holdout_of, owner)}, or set plan.benchmarks.{b}: N")
            problems, source = held.n, f"holdout.n of dataset {spec.holdout_of}"
        elif root is not None and spec.offline_file and (root / spec.offline_file).is_file():
            path = root / spec.offline_file
            problems = sum(1 for line in path.read_text().splitlines() if line.strip())
            source = f"lines of {path}"
        elif b in KNOWN_PROBLEMS:
            problems, source = KNOWN_PROBLEMS[b], "known size (offline copy's line count)"
        else:
            raise GridError(f"benchmarks: size of {b!r} unknown offline; set plan.benchmarks.{b}: N")
        if ev.get("limit"):
            problems = min(problems, int(ev["limit"]))
        out.append(
            {
                "name": b,
                "problems": problems,
                "problems_source": source,
                "samples": int(ev.get("n") or spec.sampling.n),
                "greedy": 1 if ev.get("greedy") else 0,  # the greedy protocol's one decode per problem
                "max_tokens": int(ev.get("max_tokens") or spec.sampling.max_tokens),
            }
        )
    return out


def _throughput(kind: str, given: dict, plan: dict, flops: float, on_gpu: bool):
    """(tokens/s per GPU or None, source)."""
    if kind in given:
        return float(given[kind]), "configured"
    if not on_gpu:
        return None, "not estimated on CPU: set plan.models.<model>.throughput"
    tps = plan["mfu"][kind] * plan["gpu"]["peak_tflops"] * 1e12 / flops
    return tps, f"assumed: MFU {plan['mfu'][kind]} x {plan['gpu']['peak_tflops']} TFLOP/s"


@dataclass(frozen=True)
class _TrainTime:
    """One training step's tokens and throughputs, and what a cell's training takes."""

    tokens: dict[str, float]
    gen_tps: float | None
    gen_src: str
    upd_tps: float | None
    upd_src: str
    step_gpu_s: float | None
    longest_segment: int
    segment_wall_h: float | None
    train_gpu_h: float | None


@dataclass(frozen=True)
class _EvalTime:
    """What evaluating one checkpoint takes, on the generate job's GPUs."""

    tokens: float
    tps: float | None
    src: str
    gpu_h: float | None
    wall_h: float | None


def model_plan(exp: dict, name: str, plan: dict, workload: list[dict]) -> dict[str, Any]:
    """Everything per model (cells of one model differ only in dataset, rule and seed)."""
    shape, shape_source = model_shape(exp, name, plan)
    cfg = cell_train_config(exp, next(c.id for c in cells(exp) if c.model == name))
    a, s = cfg.algorithm, cfg.sampling
    mp = plan["models"].get(name) or {}
    frac = float(mp.get("response_fraction", plan["response_fraction"]))
    prompt = float(mp.get("mean_prompt_tokens", s.max_prompt_tokens))
    resp = frac * s.max_new_tokens
    rounds = float(plan["dynamic_sampling_rounds"]) if a.dynamic_sampling else 1.0
    precision = "fp32" if cfg.precision == "fp64" else cfg.precision  # fp64: tests only
    gpus = int(resource(exp, "train", name, "gpus") or 0)
    gen_gpus = int(resource(exp, "generate", name, "gpus") or 0)
    given = mp.get("throughput") or {}
    train = _train_time(exp, name, plan, shape, a, given, prompt, resp, rounds, gpus)
    ev = _eval_time(exp, name, plan, shape, given, workload, frac, prompt, gen_gpus)
    memory = memory_plan(exp, name, shape, cfg, plan, gpus, precision, gen_gpus)
    runtime_h = float(resource(exp, "train", name, "runtime")) / 60
    warnings = list(memory.pop("warnings"))
    if train.segment_wall_h is not None and train.segment_wall_h > runtime_h:
        warnings.append(
            f"a train segment ({train.longest_segment} steps) needs ~{train.segment_wall_h:.1f} h but "
            f"resources.train.runtime is {runtime_h:.1f} h: raise it or lower training.checkpoint.every"
        )
    gen_runtime_h = float(resource(exp, "generate", name, "runtime")) / 60
    if ev.wall_h is not None and ev.wall_h > gen_runtime_h:
        warnings.append(
            f"a generate job needs ~{ev.wall_h:.1f} h but resources.generate.runtime is {gen_runtime_h:.1f} h"
        )
    return {
        "shape": shape.as_dict(),
        "shape_source": shape_source,
        "params": shape.n_params(),
        "params_non_embedding": shape.n_non_embedding(),
        "train_gpus": gpus,
        "generate_gpus": gen_gpus,
        "precision": cfg.precision,
        "lengths": {
            "mean_prompt": prompt,
            "mean_response": resp,
            "max_prompt": s.max_prompt_tokens,
            "max_response": s.max_new_tokens,
        },
        "tokens_per_step": train.tokens,
        "throughput": {
            "generate": train.gen_tps,
            "generate_source": train.gen_src,
            "update": train.upd_tps,
            "update_source": train.upd_src,
            "eval_generate": ev.tps,
            "eval_generate_source": ev.src,
        },
        "step_gpu_seconds": train.step_gpu_s,
        "segment_steps": train.longest_segment,
        "segment_wall_hours": train.segment_wall_h,
        "segment_runtime_limit_hours": runtime_h,
        "train_gpu_hours_per_cell": train.train_gpu_h,
        "eval_tokens_per_checkpoint": ev.tokens,
        "eval_gpu_hours_per_checkpoint": ev.gpu_h,
        "generate_job_wall_hours": ev.wall_h,
        "memory": memory,
        "warnings": warnings,
    }


def _train_time(exp, name, plan, shape: cm.ModelShape, a, given, prompt, resp, rounds, gpus) -> _TrainTime:
    """One step's tokens (``a``: the cell's algorithm config; mean ``prompt`` and ``resp`` lengths,
    ``rounds`` of generation), the throughputs (``given``: configured ones), GPU-seconds per step,
    the longest train segment's wall hours on ``gpus`` GPUs and a cell's training GPU-hours."""
    gen_ctx, upd_ctx = cm.mean_context(prompt, resp)
    gen_tps, gen_src = _throughput("generate", given, plan, shape.forward_flops_per_token(gen_ctx), gpus > 0)
    upd_tps, upd_src = _throughput("update", given, plan, shape.train_flops_per_token(upd_ctx), gpus > 0)
    seqs = a.prompts_per_step * a.group_size
    tokens = {
        "generate": seqs * resp * rounds,
        "update": seqs * (prompt + resp) * a.ppo_epochs,
        "forward_only": seqs * (prompt + resp) * ((a.ppo_epochs * a.mini_batches > 1) + (a.kl_coef > 0)),
    }
    step_gpu_s = None
    if gen_tps and upd_tps:
        step_gpu_s = (
            tokens["generate"] / gen_tps + tokens["update"] / upd_tps + tokens["forward_only"] / (3 * upd_tps)
        )
    segments = checkpoint_steps(exp, name)
    longest = max(b - a_ for a_, b in zip([0, *segments], segments, strict=False))
    # device-seconds: GPU-seconds, or a CPU job's seconds when a throughput is configured for it
    train_gpu_h = None if step_gpu_s is None else (step_gpu_s * a.total_steps / 3600 if gpus else 0.0)
    wall_h = step_gpu_s * longest / max(gpus, 1) / 3600 if step_gpu_s is not None else None
    return _TrainTime(tokens, gen_tps, gen_src, upd_tps, upd_src, step_gpu_s, longest, wall_h, train_gpu_h)


def _eval_time(exp, name, plan, shape: cm.ModelShape, given, workload, frac, prompt, gen_gpus) -> _EvalTime:
    """Evaluating one checkpoint on every benchmark of ``workload`` (responses at ``frac`` of their
    maximum, prompts of ``prompt`` tokens) on the generate job's ``gen_gpus`` GPUs."""
    decodes = {w["name"]: w["problems"] * (w["samples"] + w.get("greedy", 0)) for w in workload}
    tokens = sum(decodes[w["name"]] * _eval_response(w, frac, prompt, exp, name) for w in workload)
    ctx = prompt + (tokens / max(sum(decodes.values()), 1)) / 2
    tps, src = _throughput("generate", given, plan, shape.forward_flops_per_token(ctx), gen_gpus > 0)
    hours = tokens / tps / 3600 if tps else None
    gpu_h = None if hours is None else (hours if gen_gpus else 0.0)
    wall_h = None if hours is None else hours / max(gen_gpus, 1)
    return _EvalTime(tokens, tps, src, gpu_h, wall_h)


def _eval_response(w: dict, frac: float, prompt: float, exp: dict, name: str) -> float:
    """Mean response tokens of a benchmark: its max_tokens x fraction, capped by the context."""
    cap = exp["models"][name].get("max_context")
    longest = min(w["max_tokens"], cap - prompt) if cap else w["max_tokens"]
    return frac * max(longest, 1)


def train_job_memory(
    shape: cm.ModelShape, cfg: Any, *, gpus: int, gpu_memory_gib: float, precision: str
) -> dict[str, Any]:
    """Bytes per GPU of a train job (a TrainConfig ``cfg`` on ``gpus`` GPUs, 0 = one CPU process):
    the update phase without and with activation checkpointing, and the rollout phase. Sequences at
    the configured maxima (max_prompt_tokens + max_new_tokens)."""
    a, s, ro = cfg.algorithm, cfg.sampling, cfg.rollout
    seq, resp = s.max_prompt_tokens + s.max_new_tokens, s.max_new_tokens
    mb = min(a.micro_batch_size, a.prompts_per_step * a.group_size)
    kw = dict(shards=max(gpus, 1), seq_len=seq, response_len=resp, precision=precision)
    update = {ck: cm.train_memory(shape, micro_batch=mb, checkpointing=ck, **kw) for ck in (False, True)}
    n = shape.n_params()
    if ro.engine == "vllm":
        resident = 12 * n // max(gpus, 1)  # params + AdamW state; gradients are freed after the step
        reserved = ro.gpu_memory_utilization * gpu_memory_gib * cm.GIB
        kv_budget = reserved - 2 * n / ro.tensor_parallel_size
        rollout = {
            "trainer_resident": resident,
            "vllm_reserved": int(reserved),
            "peak": int(resident + reserved),
        }
        rollout["kv_budget"] = int(kv_budget)
        rollout["max_length_sequences_in_kv"] = max(int(kv_budget // (shape.kv_bytes_per_token() * seq)), 0)
    else:  # transformers generate on the trainer's own weights
        batch = min(ro.batch_size, a.prompts_per_step * a.group_size)
        rollout = cm.hf_rollout_memory(
            shape, shards=max(gpus, 1), batch=batch, seq_len=seq, precision=precision
        )
    return {"micro_batch_size": mb, "settings": kw, "update": update, "rollout": rollout}


def memory_plan(
    exp, name, shape: cm.ModelShape, cfg, plan, gpus: int, precision: str, gen_gpus: int = 1
) -> dict:
    """Bytes per GPU (host bytes for a CPU job) of a train job's update and rollout phases and of a
    generate job (vLLM tensor-parallel over its ``gen_gpus``), with a fit check against the GPU (or
    the job's mem_mb)."""
    job = train_job_memory(
        shape, cfg, gpus=gpus, gpu_memory_gib=plan["gpu"]["memory_gib"], precision=precision
    )
    mb, kw, update, rollout = job["micro_batch_size"], job["settings"], job["update"], job["rollout"]
    n, seq = shape.n_params(), kw["seq_len"]
    seq_kv = shape.kv_bytes_per_token() * seq
    ckpt = plan["activation_checkpointing"]
    if ckpt is None:  # the trainer's own setting where it has one
        ckpt = getattr(getattr(cfg, "distributed", None), "activation_checkpointing", False)
    ckpt = bool(ckpt)
    peak = max(update[ckpt]["peak"], rollout["peak"])
    if gpus:
        capacity, where = plan["gpu"]["memory_gib"] * cm.GIB, f"GPU memory ({plan['gpu']['name']})"
    else:
        capacity, where = float(resource(exp, "train", name, "mem_mb")) * 2**20, "resources.train.mem_mb"
    fits = {
        str(ck).lower(): cm.max_micro_batch(shape, capacity, checkpointing=ck, **kw) for ck in (False, True)
    }
    warnings = []
    if peak > capacity:
        warnings.append(
            f"peak memory {peak / cm.GIB:.1f} GiB per {'GPU' if gpus else 'job'} exceeds {where} "
            f"{capacity / cm.GIB:.1f} GiB (update phase with micro_batch_size={mb}"
            f"{', activation checkpointing' if ckpt else ''}: {update[ckpt]['peak'] / cm.GIB:.1f} GiB); "
            f"largest micro_batch_size that fits: {fits['false']} without, {fits['true']} with "
            "activation checkpointing"
        )
    engine = exp["evaluation"].get("engine", "hf")
    gen = {"engine": engine, "weights": 2 * n, "kv_per_max_length_sequence": seq_kv}
    if engine == "vllm":
        # `aggbench generate --tensor-parallel-size gpus`: weights split over the GPUs, and the KV
        # heads too (replicated once there are more GPUs than KV heads)
        tp = max(gen_gpus, 1)
        gen["tensor_parallel_size"] = tp
        gen["weights_per_gpu"] = 2 * n // tp
        kv_per_gpu = seq_kv / min(tp, shape.kv_heads)
        gen_budget = EVAL_GPU_MEMORY_UTILIZATION * plan["gpu"]["memory_gib"] * cm.GIB - 2 * n / tp
        gen["max_length_sequences_in_kv"] = max(int(gen_budget // kv_per_gpu), 0)
    return {
        "micro_batch_size": mb,
        "update": {"no_checkpointing": update[False], "checkpointing": update[True]},
        "rollout": rollout,
        "activation_checkpointing": ckpt,
        "peak": peak,
        "capacity": int(capacity),
        "capacity_of": where,
        "max_micro_batch": fits,
        "generate_job": gen,
        "warnings": warnings,
    }


def build_plan(exp: dict, config: str | os.PathLike | None = None) -> dict[str, Any]:
    """The whole plan of a validated experiment (``grid.load_experiment``), JSON-serialisable."""
    plan, assumed = settings(exp)
    on_gpu = requests_gpus(exp, ("train", "generate"))
    if any("mean_prompt_tokens" not in (plan["models"].get(m) or {}) for m in exp["models"]):
        assumed.append("mean_prompt_tokens")
    workload = benchmark_workload(exp, plan)
    models = {m: model_plan(exp, m, plan, workload) for m in exp["models"]}
    rows, totals = [], {"train_gpu_hours": 0.0, "eval_gpu_hours": 0.0, "requested_gpu_hours": 0.0}
    unknown = False
    for c in cells(exp):
        mp = models[c.model]
        n_eval = len(eval_steps(exp, c.model))
        train_h = mp["train_gpu_hours_per_cell"]
        per_ckpt = mp["eval_gpu_hours_per_checkpoint"]
        # each extra evaluation seed samples the checkpoint again (without the greedy decode, which
        # this counts too: an upper bound when evaluation.greedy is on)
        again = 1 + len(exp["evaluation"].get("extra_seeds") or [])
        eval_h = None if per_ckpt is None else per_ckpt * n_eval * again
        unknown |= (train_h is None and mp["train_gpus"] > 0) or (eval_h is None and mp["generate_gpus"] > 0)
        totals["train_gpu_hours"] += train_h or 0.0
        totals["eval_gpu_hours"] += eval_h or 0.0
        rows.append(
            {
                "cell": c.id,
                "model": c.model,
                "train_gpus": mp["train_gpus"],
                "segments": len(checkpoint_steps(exp, c.model)),
                "segment_wall_hours": mp["segment_wall_hours"],
                "segment_runtime_limit_hours": mp["segment_runtime_limit_hours"],
                "evaluated_checkpoints": n_eval,
                "train_gpu_hours": train_h,
                "eval_gpu_hours": eval_h,
                "gpu_hours": (train_h or 0.0) + (eval_h or 0.0),
                "peak_memory_bytes": mp["memory"]["peak"],
            }
        )
    jobs = grid_jobs(exp)
    base = {}
    if exp["evaluation"].get("base_model", True):
        for m, mp in models.items():
            base[m] = mp["eval_gpu_hours_per_checkpoint"]
            totals["eval_gpu_hours"] += base[m] or 0.0
    for m in exp["models"]:
        n_cells = sum(1 for c in cells(exp) if c.model == m)
        n_eval = sum(len(eval_steps(exp, c.model)) for c in cells(exp) if c.model == m) + (m in base)
        for section, count in (("train", n_cells * len(checkpoint_steps(exp, m))), ("generate", n_eval)):
            hours = float(resource(exp, section, m, "runtime")) / 60
            totals["requested_gpu_hours"] += count * int(resource(exp, section, m, "gpus") or 0) * hours
    grade_jobs = jobs["rules"].get("grade", 0) + jobs["rules"].get("grade_base", 0)
    totals["requested_grade_cpu_hours"] = (
        grade_jobs
        * int(resource(exp, "grade", None, "cpus"))
        * float(resource(exp, "grade", None, "runtime"))
        / 60
    )
    totals["gpu_hours"] = totals["train_gpu_hours"] + totals["eval_gpu_hours"]
    totals["complete"] = not unknown
    return {
        "config": str(config) if config else None,
        "experiment": exp["experiment"],
        "gpu": plan["gpu"],
        "mfu": plan["mfu"],
        "assumed": {
            k: SOURCES["gpu" if k.startswith("gpu") else k]
            for k in assumed
            if on_gpu or not k.startswith(("gpu", "mfu"))
        },
        "benchmarks": workload,
        "models": models,
        "base_eval_gpu_hours": base,
        "cells": rows,
        "jobs": jobs,
        "totals": totals,
    }
