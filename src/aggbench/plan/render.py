"""The plan as the text `aggbench plan` prints: memory per GPU term by term, time per cell,
GPU-hours and jobs of the grid, and what was assumed."""

from __future__ import annotations

from typing import Any

GIB = 1024**3


def _h(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _gib(b: float | None) -> str:
    return "-" if b is None else f"{b / GIB:,.2f}"


def _bytes(b: float) -> str:
    return f"{b / GIB:,.2f} GiB" if b >= GIB / 10 else f"{b / 2**20:,.1f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e9:.3f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def _count(x: float) -> str:
    return f"{x / 1e6:,.1f}M" if x >= 1e6 else f"{x:,.0f}"


def render(plan: dict[str, Any]) -> str:
    """The plan as plain text: models (memory, throughput), cells, grid totals, assumptions."""
    out = _header(plan)
    for name, m in plan["models"].items():
        out += _model(name, m)
    out += _cells(plan["cells"])
    out += _grid(plan)
    if plan["assumed"]:
        out += ["", "Assumed (set these in the config's plan: block; see docs/workflow.md):"]
        out += [f"  {k}: {v}" for k, v in plan["assumed"].items()]
    return "\n".join(out)


def _header(plan: dict[str, Any]) -> list[str]:
    g = plan["gpu"]
    return [
        f"aggbench plan: {plan['config'] or '(config)'} (experiment {plan['experiment']})",
        f"GPU: {g['name']}, {g['memory_gib']:g} GiB, {g['peak_tflops']:g} TFLOP/s bf16"
        + ("  [assumed]" if "gpu" in plan["assumed"] else ""),
        "",
        "Models",
    ]


def _model(name: str, m: dict[str, Any]) -> list[str]:
    """One model's block: architecture, lengths and throughput, memory table, KV cache, time per cell."""
    s, mem, t = m["shape"], m["memory"], m["throughput"]
    where = f"{m['train_gpus']} GPUs" if m["train_gpus"] else "CPU"
    out = [
        f"  {name}: {_params(m['params'])} parameters ({_params(m['params_non_embedding'])} "
        f"non-embedding); {s['layers']} layers, hidden {s['hidden']}, {s['heads']}/{s['kv_heads']} "
        f"heads x {s['head_dim']}, MLP {s['intermediate']}, vocab {s['vocab']}",
        f"    architecture from: {m['shape_source']}",
        f"    train job: {where}, {m['precision']}, micro_batch_size {mem['micro_batch_size']}, "
        f"prompt <= {m['lengths']['max_prompt']} + response <= {m['lengths']['max_response']} tokens "
        f"(planned means {m['lengths']['mean_prompt']:,.0f} + {m['lengths']['mean_response']:,.0f})",
        f"    tokens per step: {_count(m['tokens_per_step']['generate'])} generated, "
        f"{_count(m['tokens_per_step']['update'])} updated, "
        f"{_count(m['tokens_per_step']['forward_only'])} forward-only",
        f"    tokens/s{' per GPU' if m['train_gpus'] else ''}: generate {_h(t['generate'], 0)} [{t['generate_source']}], "
        f"update {_h(t['update'], 0)} [{t['update_source']}]",
    ]
    out += _memory_table(m)
    gj = mem["generate_job"]
    line = f"    KV cache: {_bytes(gj['kv_per_max_length_sequence'])} per max-length sequence"
    if "max_length_sequences_in_kv" in gj:
        line += (
            f"; generate job ({m['generate_gpus']} GPU, vLLM tensor-parallel {gj['tensor_parallel_size']}): "
            f"weights {_bytes(gj['weights_per_gpu'])} per GPU, "
            f"KV room for {gj['max_length_sequences_in_kv']} max-length sequences"
        )
    out.append(line)
    seg = m["segment_wall_hours"]
    ev = m["eval_gpu_hours_per_checkpoint"]
    out.append(
        f"    per cell: train segment of {m['segment_steps']} steps "
        + (f"~{_h(seg)} h" if seg is not None else "(time not estimated)")
        + f", runtime limit {_h(m['segment_runtime_limit_hours'])} h; evaluation "
        + (f"~{_h(ev, 2)} GPU-h per checkpoint" if ev is not None else "time not estimated")
    )
    out += [f"    WARNING: {w}" for w in m["warnings"]]
    return out


def _memory_table(m: dict[str, Any]) -> list[str]:
    """Memory per GPU (or per CPU job), term by term, without and with activation checkpointing."""
    mem = m["memory"]
    no, ck = mem["update"]["no_checkpointing"], mem["update"]["checkpointing"]
    unit = "GPU" if m["train_gpus"] else "job (host memory)"
    out = [f"    {'memory per ' + unit + ', GiB':<34}{'no checkpointing':>18}{'checkpointing':>16}"]
    for key, label in (
        ("params", "params (fp32)"),
        ("grads", "gradients (fp32)"),
        ("optimizer", "AdamW state (fp32)"),
        ("weights16", "bf16 weight copies"),
        ("activations", "activations, 1 micro-batch"),
        ("logits", "logits (transient)"),
        ("recompute", "recomputed layer"),
        ("peak", "update phase"),
    ):
        out.append(f"      {label:<32}{_gib(no.get(key)):>18}{_gib(ck.get(key)):>16}")
    r = mem["rollout"]
    if "vllm_reserved" in r:
        out.append(
            f"      {'rollout phase (vLLM + trainer)':<32}{_gib(r['peak']):>18}{_gib(r['peak']):>16}"
            f"   vLLM reserves {_gib(r['vllm_reserved'])}, KV room for {r['max_length_sequences_in_kv']} "
            "max-length sequences"
        )
    else:
        out.append(
            f"      {'rollout phase (HF generate)':<32}{_gib(r['peak']):>18}{_gib(r['peak']):>16}"
            f"   KV cache {_gib(r['kv_cache'])}"
        )
    fits = mem["max_micro_batch"]
    out.append(
        f"      {'fits ' + mem['capacity_of'] + '?':<32}"
        f"{'yes' if max(no['peak'], r['peak']) <= mem['capacity'] else 'NO':>18}"
        f"{'yes' if max(ck['peak'], r['peak']) <= mem['capacity'] else 'NO':>16}"
        f"   of {_gib(mem['capacity'])}; largest micro_batch_size that fits: {fits['false']} / {fits['true']}"
    )
    return out


def _cells(cells: list[dict[str, Any]]) -> list[str]:
    out = [
        "",
        "Cells",
        f"  {'cell':<44}{'GPUs':>5}{'segments':>9}{'h/segment':>10}{'limit h':>8}{'evals':>6}"
        f"{'train GPU-h':>12}{'eval GPU-h':>11}{'GPU-h':>9}{'peak GiB':>9}",
    ]
    for c in cells:
        out.append(
            f"  {c['cell']:<44}{c['train_gpus']:>5}{c['segments']:>9}{_h(c['segment_wall_hours']):>10}"
            f"{_h(c['segment_runtime_limit_hours']):>8}{c['evaluated_checkpoints']:>6}"
            f"{_h(c['train_gpu_hours']):>12}{_h(c['eval_gpu_hours']):>11}{_h(c['gpu_hours']):>9}"
            f"{_gib(c['peak_memory_bytes']):>9}"
        )
    return out


def _grid(plan: dict[str, Any]) -> list[str]:
    """The grid's GPU-hours (estimated and requested), grading CPU-hours and jobs per rule."""
    tot, jobs = plan["totals"], plan["jobs"]
    base = sum(v or 0 for v in plan["base_eval_gpu_hours"].values())
    rules = jobs["rules"]
    return [
        "",
        "Grid",
        f"  GPU-hours: {_h(tot['gpu_hours'])} estimated (training {_h(tot['train_gpu_hours'])}, evaluation "
        f"{_h(tot['eval_gpu_hours'])} incl. base models {_h(base)}); {_h(tot['requested_gpu_hours'])} "
        "requested (GPUs x runtime limits)"
        + ("" if tot["complete"] else "  [incomplete: some GPU jobs have no throughput]"),
        f"  grading: {rules.get('grade', 0) + rules.get('grade_base', 0) + rules.get('grade_eval_seed', 0)} CPU jobs, "
        f"{_h(tot['requested_grade_cpu_hours'])} CPU-hours requested",
        f"  SLURM jobs: {jobs['slurm']} ("
        + ", ".join(
            f"{r} {rules[r]}"
            for r in (
                "train",
                "generate",
                "grade",
                "generate_base",
                "grade_base",
                "generate_eval_seed",
                "grade_eval_seed",
                "report",
            )  # fmt: skip
            if r in rules
        )
        + f"); local rules: {jobs['local']}; snakemake -n lists {jobs['total']}",
    ]
