"""Tokens/s of the hf engine with aggbench's doubling key/value cache vs transformers' default cache
(the named baseline: ``DynamicLayer``, one ``torch.cat`` per layer and decoding step), measured in
the same process, rounds interleaved (default, doubling, default, ...), and whether the two sampled
the same tokens (they must: aggbench.rollout.kv_cache returns the same tensors).

    .venv/bin/python benchmarks/kv_cache.py [--rounds 5] [--max-new-tokens 84,160] [--threads 1]

Two lengths by default: the lab's training rollouts (8 prompts x 8 samples, 84 new tokens) and its
evaluation sampling (64 sequences per call, 160 new tokens). The model is the built-in tiny one,
briefly warm-started so responses end at realistic lengths. This script reports; it is not a test
(tests/rollout/test_kv_cache.py checks the equality).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from _tiny_policy import warm_tiny_policy  # benchmarks/: run as a script, this directory is on sys.path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", default="84,160", help="Comma-separated lengths, one run each.")
    ap.add_argument("--sft-steps", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the lab's jobs use 1).")
    args = ap.parse_args()

    import torch

    from aggbench.rollout import hf

    torch.set_num_threads(args.threads)
    doubling = hf.cache_kwargs
    with tempfile.TemporaryDirectory() as tmp:
        _, tok, model, prompts = warm_tiny_policy(tmp, sft_steps=args.sft_steps, n_prompts=args.prompts)
        engine = hf.HFEngine(model, tok, batch_size=args.prompts * args.samples)
        kinds = {"default": lambda *a: {}, "doubling": doubling}
        for length in (int(x) for x in args.max_new_tokens.split(",")):
            rates: dict[str, list[float]] = {k: [] for k in kinds}
            same = True
            for r in range(args.rounds + 1):  # round 0 warms both paths up and is dropped
                outs = {}
                for name, kwargs in kinds.items():
                    hf.cache_kwargs = kwargs
                    t0 = time.perf_counter()
                    out = engine.generate(
                        prompts, n=args.samples, temperature=1.0, top_p=1.0, max_new_tokens=length, seed=r
                    )
                    seconds = time.perf_counter() - t0
                    outs[name] = out.response_ids
                    if r:
                        rates[name].append(sum(map(len, out.response_ids)) / seconds)
                same = same and outs["default"] == outs["doubling"]
            hf.cache_kwargs = doubling
            med = {k: statistics.median(v) for k, v in rates.items()}
            print(
                f"max_new_tokens {length}: default {med['default']:.0f} tokens/s, doubling "
                f"{med['doubling']:.0f} tokens/s: {med['doubling'] / med['default']:.2f}x the default cache "
                f"(median of {args.rounds} rounds; per round "
                + "/".join(f"{d / b:.2f}" for b, d in zip(rates["default"], rates["doubling"], strict=True))
                + f"); same tokens: {same}"
            )


if __name__ == "__main__":
    main()
