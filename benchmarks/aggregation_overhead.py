"""How much does each aggregation rule cost on top of the policy-gradient loss? Prints ratios to `token`.

For every built-in rule instance, times three stages on one mini-batch [B x T] (default 256 x 4096,
16 groups of 16, random lengths, binary rewards, grpo advantages):

  weights   effective advantages only: inst(mask, advantages, group_ids)
  fwd       weights + aggbench.train.objective.pg_loss with random log-probs (no autograd)
  fwd+bwd   weights + pg_loss + backward w.r.t. the log-probs

Rules are timed interleaved in the same run: each round times every instance once, in a shuffled
order, so machine noise (other processes, frequency scaling) hits all rules alike; the reported
ratio is the median over rounds of (time of rule / time of token in the same round). This script
reports; it is not a test. The target for `balanced` is within 1.10x of `token`.

    .venv/bin/python benchmarks/aggregation_overhead.py [--rounds 15] [--device cpu|cuda] [--threads 1]

On a shared or small machine, ``--threads 1`` gives far steadier numbers (two threads contend with
other processes); the interquartile range printed beside each ratio shows how noisy a run was.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from aggbench.aggregation import builtin_instances
from aggbench.aggregation.advantages import grpo
from aggbench.train.objective import pg_loss

STAGES = ("weights", "fwd", "fwd+bwd")


def make_batch(b: int, t: int, n_groups: int, device: str, seed: int):
    """-> mask [B, T] bool, advantages [B] float32, group ids [B] long, old_logp [B, T], logp [B, T]."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    rewards = torch.randint(0, 2, (b,), generator=gen).float()
    gids = torch.arange(n_groups).repeat_interleave(b // n_groups)
    adv = grpo(rewards, gids)
    mask = torch.arange(t)[None, :] < lengths[:, None]
    old = -torch.rand(b, t, generator=gen) * 3
    logp = old + 0.1 * torch.randn(b, t, generator=gen)
    return (x.to(device) for x in (mask, adv.float(), gids, old, logp))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: str, inner: int) -> float:
    """Fastest of ``inner`` calls, in seconds (the minimum rejects calls another process preempted)."""
    best = float("inf")
    for _ in range(inner):
        sync(device)
        t0 = time.perf_counter()
        fn()
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--width", type=int, default=4096)
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--inner", type=int, default=3, help="calls per timing (their minimum is one sample)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.batch % args.groups:
        ap.error(f"--batch {args.batch} must be a multiple of --groups {args.groups}")

    mask, adv, gids, old, logp = make_batch(args.batch, args.width, args.groups, args.device, args.seed)
    logp_leaf = logp.clone().requires_grad_()
    insts = builtin_instances()

    def stage_fns(inst):
        def weights():
            return inst(mask, adv, gids)

        def fwd():
            with torch.no_grad():
                return pg_loss(logp, old, inst(mask, adv, gids), mask)

        def fwd_bwd():
            logp_leaf.grad = None
            pg_loss(logp_leaf, old, inst(mask, adv, gids), mask).backward()

        return {"weights": weights, "fwd": fwd, "fwd+bwd": fwd_bwd}

    fns = {name: stage_fns(inst) for name, inst in insts.items()}
    for f in fns.values():  # warm-up: first calls allocate and (on GPU) load kernels
        for g in f.values():
            g()
            g()

    times = {n: {s: [] for s in STAGES} for n in insts}
    rng = random.Random(args.seed)
    for _ in range(args.rounds):
        order = list(insts)
        rng.shuffle(order)
        for name in order:
            for stage in STAGES:
                times[name][stage].append(timed(fns[name][stage], args.device, args.inner))

    print(
        f"aggregation overhead: batch {args.batch} x {args.width} ({args.groups} groups of "
        f"{args.batch // args.groups}), {int(mask.sum())} tokens, device {args.device}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} rounds x {args.inner} calls"
    )
    print(
        "ratio = median over rounds of (rule time / token time in the same round) [interquartile range];"
        " ms = median\n"
    )
    head = f"{'instance':<24}" + "".join(f"{s + ' ratio':>26}{s + ' ms':>12}" for s in STAGES)
    print(head)
    print("-" * len(head))
    for name in insts:
        row = f"{name:<24}"
        for stage in STAGES:
            ratios = [a / b for a, b in zip(times[name][stage], times["token"][stage], strict=True)]
            q1, _, q3 = statistics.quantiles(ratios, n=4)
            cell = f"{statistics.median(ratios):.3f} [{q1:.2f}-{q3:.2f}]"
            row += f"{cell:>26}{1e3 * statistics.median(times[name][stage]):>12.2f}"
        print(row)
    ratio = statistics.median(
        a / b for a, b in zip(times["balanced"]["fwd+bwd"], times["token"]["fwd+bwd"], strict=True)
    )
    verdict = "within" if ratio <= 1.10 else "ABOVE"
    print(f"\nbalanced fwd+bwd / token fwd+bwd = {ratio:.3f}: {verdict} the 1.10x target")


if __name__ == "__main__":
    main()
