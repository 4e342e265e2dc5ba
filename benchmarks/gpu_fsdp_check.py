"""GPU check of the multi-GPU training path: the real trainer under FSDP2 on NCCL, in bf16.

    torchrun --standalone --nproc_per_node N benchmarks/gpu_fsdp_check.py [--json OUT.json]

What the `train` rule runs when a cell asks for several GPUs: ``fully_shard`` per decoder layer,
``MixedPrecisionPolicy`` (bf16 compute, fp32 master weights and gradient reduction), activation
checkpointing, generation on gathered parameters, sharded checkpoints (torch.distributed.checkpoint)
and the ``save_pretrained`` export. With N GPUs it shards over them as the rule does. With one GPU
the same FSDP2 code runs on a one-rank NCCL group: the trainer treats one torchrun process as
plain single-process training, so this script starts the group itself and hands the trainer
``FSDPRanks`` (every collective then really goes through NCCL, over one rank).

Checks (PASS/FAIL lines; exit status 1 if any fails):

- train 2 steps, stop, resume from the sharded checkpoint for step 3: metrics rows 1, 2, 3 once
  each, every number finite, ``step_2/sharded/.metadata`` written;
- the step-3 export loads with ``AutoModelForCausalLM.from_pretrained``, finite and changed;
- one process only: the same config trained without FSDP (bf16 autocast over fp32 weights) is
  printed beside it (step-1 reward and loss, largest relative parameter difference after 3 steps).
  Not asserted equal: FSDP computes with bf16 parameters, autocast casts fp32 ones per operation.

Prints tokens/s of generation and of the update, and peak memory per GPU. ``--allow-cpu`` runs the
same code with gloo on CPU (to test the script; its numbers say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import gpu_check  # noqa: E402  (the sibling script: tiny model, data, config, throughput)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--allow-cpu", action="store_true", help="gloo on CPU when no GPU is visible.")
    p.add_argument("--prompts", type=int, default=8, help="Prompts per step (a multiple of N).")
    p.add_argument("--group", type=int, default=8, help="Samples per prompt.")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=16, help="Sequences per forward/backward.")
    p.add_argument("--workdir", type=Path, default=None, help="Where to write (default: a temp dir).")
    p.add_argument("--json", type=Path, default=None, help="Also write the results here (rank 0).")
    return p.parse_args(argv)


def fsdp_config(args: argparse.Namespace, model: Path, data: Path, device: str, longest: int):
    ns = argparse.Namespace(**{**vars(args), "steps": 3, "sft_steps": 0})
    cfg = gpu_check.make_config(ns, model, data, device, longest)
    cfg.distributed.strategy = "fsdp"
    cfg.distributed.activation_checkpointing = True
    cfg.checkpoint.every = 2
    cfg.rollout.seeding = "prompt"  # rollouts independent of which rank samples which prompt
    return cfg


def start_group(device: str, world: int):
    """Start the process group (NCCL on a GPU) before the trainer, which then joins it; with one
    process, also make ``parallel.setup`` hand out FSDP ranks. Returns the function that ends the
    group and puts ``parallel.setup`` back."""
    import socket

    import torch
    import torch.distributed as dist

    from aggbench.train import parallel
    from aggbench.train.parallel.fsdp import FSDPRanks

    if "MASTER_PORT" not in os.environ:  # plain `python`, not torchrun
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1")
    cuda = device == "cuda"
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    real = parallel.setup
    if world == 1:
        parallel.setup = lambda cfg: FSDPRanks(0, 1, dev, owns_group=False)

    def end() -> None:
        parallel.setup = real
        dist.destroy_process_group()

    return end


def shared_inputs(args: argparse.Namespace, tmp: str, rank: int) -> tuple[Path, Path, Path, int]:
    """(work dir, model, data, longest prompt), made by rank 0 and the same on every rank."""
    import torch.distributed as dist

    box: list = [None]
    if rank == 0:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        # warm-started, so that groups have right and wrong answers and the updates move the weights
        model, data, longest = gpu_check.prepare(argparse.Namespace(model=None, sft_steps=40), work)
        box = [(work, model, data, longest)]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# numbers every step must have finite (the per-length and per-rule diagnostics are NaN by design in
# a step without right or without wrong answers)
MUST_BE_FINITE = ("loss/pg", "loss/kl", "grad_norm", "entropy", "reward/mean", "lr")


def finite_rows(run: Path) -> tuple[list[int], list[str]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    bad = [f"step {r['step']} {k}={r.get(k)}" for r in rows for k in MUST_BE_FINITE
           if not isinstance(r.get(k), (int, float)) or not math.isfinite(r[k])]  # fmt: skip
    return [r["step"] for r in rows], bad


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = gpu_check.device_or_exit(args.allow_cpu)
    import torch
    from transformers import AutoModelForCausalLM

    from aggbench.train.loop import train

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    end_group = start_group(device, world)
    checks: list[tuple[str, bool, str]] = []
    with tempfile.TemporaryDirectory(prefix="gpu_fsdp_check-") as tmp:
        work, model, data, longest = shared_inputs(args, tmp, rank)
        cfg = fsdp_config(args, model, data, device, longest)
        run = work / "fsdp"
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        train(cfg, run, until_step=2, quiet=True)
        after_two = (run / "checkpoints" / "step_2" / "sharded" / ".metadata").exists()
        train(cfg, run, quiet=True)  # a new call: resumes from step 2's sharded checkpoint
        peak = torch.cuda.max_memory_allocated() if device == "cuda" else None
        end_group()
        if rank != 0:
            return 0
        steps, bad = finite_rows(run)
        checks.append(("sharded checkpoint at step 2", after_two, str(run / "checkpoints" / "step_2")))
        checks.append(("metrics rows 1, 2, 3 once each (stop at 2, resume)", steps == [1, 2, 3], str(steps)))
        checks.append(("loss, grad norm, entropy, reward, lr finite every step", not bad, "; ".join(bad[:5])))
        export = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step_3")
        start = AutoModelForCausalLM.from_pretrained(model)
        after, before = export.state_dict(), start.state_dict()
        finite = all(torch.isfinite(t).all() for t in after.values())
        moved = max((after[k].float() - before[k].float()).abs().max().item() for k in after)
        checks.append(
            ("step-3 export loads, finite and changed", finite and moved > 0, f"max |change| {moved:.3g}")
        )
        result = {"device": torch.cuda.get_device_name(0) if device == "cuda" else "CPU (--allow-cpu)",
                  "torch": torch.__version__, "world": world, **gpu_check.throughput(run, model),
                  "peak_memory_bytes": peak}  # fmt: skip
        if world == 1:  # the one-process trainer on the same config, for comparison
            plain = cfg.model_copy(deep=True)
            plain.distributed.strategy = "none"
            train(plain, work / "plain", quiet=True)
            ref = AutoModelForCausalLM.from_pretrained(work / "plain" / "checkpoints" / "step_3").state_dict()
            rel = max(((after[k].float() - ref[k].float()).norm() / ref[k].float().norm().clamp_min(1e-12)).item()
                      for k in after)  # fmt: skip
            first = [
                json.loads((d / "metrics.jsonl").read_text().splitlines()[0]) for d in (run, work / "plain")
            ]
            result["vs_one_process"] = {"max_relative_param_difference": rel,
                                        "step1_reward_mean": [f.get("reward/mean") for f in first],
                                        "step1_loss": [f.get("loss/pg") for f in first]}  # fmt: skip
    print(
        f"gpu_fsdp_check {datetime.date.today()}: {result['device']}, torch {result['torch']}, {world} rank(s), "
        f"FSDP2 bf16 + activation checkpointing; {args.prompts} prompts x {args.group} samples"
    )
    for name, ok, detail in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {name}  ({detail})")
    print(
        f"generation: {result['generate_tokens_per_s']:,.0f} tokens/s; update: {result['update_tokens_per_s']:,.0f} tokens/s"
    )
    if peak is not None:
        print(f"peak memory (rank 0): {peak / 2**20:,.1f} MiB")
    if "vs_one_process" in result:
        print(f"vs one process (bf16 autocast): {json.dumps(result['vs_one_process'])}")
    if args.json:
        args.json.write_text(json.dumps({**result, "checks": checks}, indent=2))
    return 0 if all(ok for _, ok, _ in checks) else 1


if __name__ == "__main__":
    raise SystemExit(main())
