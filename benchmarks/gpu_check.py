"""GPU check: the tiny model's GRPO training steps in bf16 on one GPU, with generation on the GPU.

Runs the real trainer (``aggbench.train.loop.train``: transformers ``generate`` rollouts, bf16 autocast
over fp32 master weights, AdamW) for a few steps on one GPU and reports

- tokens/s of generation (response tokens sampled per second) and of the update (prompt +
  response tokens through forward, backward and the optimiser step per second), from the
  trainer's own per-step timings (metrics.jsonl) and its saved rollouts; the first step
  (CUDA start-up) is left out when there are more;
- the measured peak memory (``torch.cuda.max_memory_allocated``) next to ``aggbench plan``'s
  estimate for the same settings (``aggbench.plan.estimate.train_job_memory``: the larger of the update
  and the rollout phase; prompt width = the longest prompt of the data).

- where vLLM is installed (the `gpu` extra): the weight push into a colocated vLLM engine, proven as
  the ``vllm`` leg proves it on CPU (``aggbench.train.engine_checks.push_roundtrip``: zeroed,
  perturbed and restored weights; bf16 on the GPU, so "equal" is within 5e-2), and the push time.

Run it whenever a GPU is available and record the printed README line (date, GPU, numbers)::

    .venv/bin/python benchmarks/gpu_check.py [--steps 4] [--prompts 8] [--group 8] [--json out.json]

Without a GPU it refuses (exit 2); ``--allow-cpu`` runs the same code on CPU (to test the script;
its numbers say nothing about a GPU, and peak memory is not measured there).
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allow-cpu", action="store_true", help="Run on CPU when no GPU is visible.")
    p.add_argument("--steps", type=int, default=4, help="Training steps (the first is warm-up).")
    p.add_argument("--prompts", type=int, default=8, help="Prompts per step.")
    p.add_argument("--group", type=int, default=8, help="Samples per prompt.")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=32, help="Sequences per forward/backward.")
    p.add_argument("--sft-steps", type=int, default=0, help="Warm-start steps of the tiny model.")
    p.add_argument("--model", type=Path, default=None, help="A model directory instead of the tiny model.")
    p.add_argument("--workdir", type=Path, default=None, help="Where to write (default: a temp dir).")
    p.add_argument("--json", type=Path, default=None, help="Also write the results here.")
    return p.parse_args(argv)


def device_or_exit(allow_cpu: bool) -> str:
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if allow_cpu:
        return "cpu"
    sys.stderr.write(
        f"gpu_check: no CUDA GPU is visible (torch {torch.__version__}: torch.cuda.is_available() is "
        "False). This check measures bf16 training and generation on a GPU: run it on a GPU machine "
        "with a CUDA build of torch, or pass --allow-cpu to run the same code on CPU (to test the "
        "script; the numbers then say nothing about a GPU).\n"
    )
    raise SystemExit(2)


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path, int]:
    """The model directory, the training data (the tiny task) and its longest prompt in tokens."""
    from transformers import AutoTokenizer

    from aggbench.prompts import encode_prompts
    from aggbench.tiny.model import build_tiny_model, sft_warm_start
    from aggbench.tiny.task import make_task

    model = args.model
    if model is None:
        model = build_tiny_model(work / "tiny")
        if args.sft_steps:
            sft_warm_start(model, steps=args.sft_steps, batch_size=16, progress=False)
    train, _ = make_task(0, 256, 16)
    data = work / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in train))
    tokenizer = AutoTokenizer.from_pretrained(model)
    longest = max(len(ids) for ids in encode_prompts(tokenizer, [r["prompt"] for r in train]))
    return Path(model), data, longest


def make_config(args: argparse.Namespace, model: Path, data: Path, device: str, max_prompt: int):
    from aggbench.config import TrainConfig

    n = args.prompts * args.group
    return TrainConfig.model_validate(
        {
            "device": device,
            "precision": "bf16",
            "model": {"name": "tiny", "path": str(model)},
            "dataset": {"name": "tiny", "path": str(data), "grader": "tiny"},
            "aggregation": {"name": "balanced"},
            "algorithm": {
                "total_steps": args.steps,
                "prompts_per_step": args.prompts,
                "group_size": args.group,
                "micro_batch_size": args.micro_batch,
                "lr": 1e-5,
            },
            "sampling": {"max_new_tokens": args.max_new_tokens, "max_prompt_tokens": max_prompt},
            "rollout": {"engine": "hf", "batch_size": n, "save_rollouts": n},
            "checkpoint": {"every": 10_000},
            "tracking": {"enabled": False},
        }
    )


def measure(cfg, model: Path, out: Path) -> dict:
    """Train, then read the per-step timings and token counts the trainer wrote."""
    import torch

    from aggbench.train.loop import train

    cuda = cfg.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    train(cfg, out, quiet=True)
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if cuda else None
    return {**throughput(out, model), "peak_memory_bytes": peak, "wall_s": wall}


def throughput(out: Path, model: Path) -> dict:
    """Per-step timings and token counts of the run in ``out`` (its metrics.jsonl and saved
    rollouts), and the tokens/s they give, the first step left out when there are more."""
    from transformers import AutoTokenizer

    from aggbench.prompts import encode_prompts

    tokenizer = AutoTokenizer.from_pretrained(model)
    steps = []
    for line in (out / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        rolls = [
            json.loads(x) for x in (out / "rollouts" / f"step_{row['step']}.jsonl").read_text().splitlines()
        ]
        prompts = list(dict.fromkeys(r["prompt"] for r in rolls))
        prompt_len = dict(zip(prompts, (len(x) for x in encode_prompts(tokenizer, prompts)), strict=True))
        generated = sum(r["length"] for r in rolls)
        steps.append(
            {
                "step": row["step"],
                "generate_s": row["time/generate_s"],
                "update_s": row["time/update_s"],
                "generated_tokens": generated,
                "update_tokens": generated + sum(prompt_len[r["prompt"]] for r in rolls),
                "sequences": len(rolls),
            }
        )
    timed = steps[1:] if len(steps) > 1 else steps
    gen = sum(s["generated_tokens"] for s in timed) / sum(s["generate_s"] for s in timed)
    upd = sum(s["update_tokens"] for s in timed) / sum(s["update_s"] for s in timed)
    return {"steps": steps, "generate_tokens_per_s": gen, "update_tokens_per_s": upd,
            "median_step_s": statistics.median(s["generate_s"] + s["update_s"] for s in timed)}  # fmt: skip


def plan_estimate(cfg, model: Path) -> dict:
    """aggbench plan's memory estimate for this config on one GPU."""
    from aggbench.plan.costmodel import ModelShape
    from aggbench.plan.estimate import train_job_memory

    shape = ModelShape.from_file(model)
    job = train_job_memory(shape, cfg, gpus=1, gpu_memory_gib=0, precision=cfg.precision)
    update, rollout = job["update"][False]["peak"], job["rollout"]["peak"]
    return {
        "params": shape.n_params(),
        "update_peak": update,
        "rollout_peak": rollout,
        "peak": max(update, rollout),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = device_or_exit(args.allow_cpu)
    import torch

    with tempfile.TemporaryDirectory(prefix="gpu_check-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        model, data, longest = prepare(args, work)
        cfg = make_config(args, model, data, device, longest)
        result = measure(cfg, model, work / "run")
        est = plan_estimate(cfg, model)
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "CPU (--allow-cpu)"
    mib = 2**20
    print(
        f"gpu_check {datetime.date.today()}: {gpu}, torch {torch.__version__}; model {est['params'] / 1e6:.2f}M "
        f"params, bf16 autocast; {args.prompts} prompts x {args.group} samples, max_new_tokens "
        f"{args.max_new_tokens}, micro-batch {args.micro_batch}, {args.steps} steps ({result['wall_s']:.1f} s)"
    )
    print(f"{'step':>4} {'generate s':>11} {'update s':>9} {'generated':>10} {'updated':>8}")
    for s in result["steps"]:
        print(
            f"{s['step']:>4} {s['generate_s']:>11.3f} {s['update_s']:>9.3f} {s['generated_tokens']:>10} "
            f"{s['update_tokens']:>8}"
        )
    print(
        f"generation: {result['generate_tokens_per_s']:,.0f} tokens/s (response tokens sampled, HF generate)"
    )
    print(
        f"update:     {result['update_tokens_per_s']:,.0f} tokens/s (prompt + response, forward + backward + AdamW)"
    )
    peak = result["peak_memory_bytes"]
    measured = f"{peak / mib:,.1f} MiB" if peak is not None else "n/a on CPU"
    ratio = f"; measured / estimate = {peak / est['peak']:.2f}" if peak is not None else ""
    print(
        f"peak memory: measured (torch.cuda.max_memory_allocated) {measured}; aggbench plan estimate "
        f"{est['peak'] / mib:,.1f} MiB (update phase {est['update_peak'] / mib:,.1f}, rollout phase "
        f"{est['rollout_peak'] / mib:,.1f}){ratio}"
    )
    print(
        f"README: | {datetime.date.today()} | {gpu} | {result['generate_tokens_per_s']:,.0f} | "
        f"{result['update_tokens_per_s']:,.0f} | {measured} (plan {est['peak'] / mib:,.1f} MiB) |"
    )
    push = vllm_push_check(model) if device == "cuda" else None
    if args.json:
        args.json.write_text(json.dumps({"device": gpu, "torch": torch.__version__, "args": {
            k: str(v) for k, v in vars(args).items()}, **result, "plan_estimate": est,
            "vllm_push": push}, indent=2))  # fmt: skip
    if push is not None and push.get("ok") is False:
        return 1
    return 0


def vllm_push_check(model_dir: Path) -> dict | None:
    """The push roundtrip on a bf16 vLLM engine on this GPU (None, with a line, without vLLM)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        print("vllm push check: skipped (vLLM is not installed: pip install 'aggbench[gpu]')")
        return None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aggbench.rollout import make_engine
    from aggbench.train.engine_checks import push_roundtrip

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    engine = make_engine(
        "vllm", None, tok, model_path=str(model_dir), dtype="bfloat16", in_process=True,
        gpu_memory_utilization=0.3, max_model_len=512,
    )  # fmt: skip
    prompt = tok("<|bos|><|user|>6 + 2<|eos|><|assistant|>", add_special_tokens=False)["input_ids"]
    response = tok("8<|eos|>", add_special_tokens=False)["input_ids"]
    t0 = time.perf_counter()
    engine.sync_weights(model)
    push_s = time.perf_counter() - t0
    check = push_roundtrip(engine, model, prompt, response)
    ok = check["zeroed_vs_uniform"] < 1e-3 and check["perturbed"] < 5e-2 and check["restored"] < 5e-2
    ok = ok and check["zeroed_vs_own"] > 0.1 and check["perturbed_vs_own"] > 5e-2
    print(f"vllm push check ({'ok' if ok else 'FAILED'}): push {push_s:.3f} s; " + ", ".join(
        f"{k} {v:.2e}" for k, v in check.items()))  # fmt: skip
    engine.close()
    return {**check, "push_s": push_s, "ok": ok}


if __name__ == "__main__":
    raise SystemExit(main())
