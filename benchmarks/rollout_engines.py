"""Tokens/s of the vLLM rollout engine vs transformers `generate` (the hf engine): same model,
prompts and sampling, in one process, rounds interleaved (hf, vLLM seeded, vLLM unseeded, hf, ...)
so machine noise hits all three.

Seeded = aggbench's default (`rollout.seeding: call` or `prompt`): one SamplingParams per prompt
with its own seed; vLLM samples seeded requests one by one (the known GPU throughput cost).
Unseeded = `rollout.seeding: engine`: the engine's own generator, not bit-reproducible.

Needs vLLM (on CPU: `make install-vllm`, then run with .venv-vllm/bin/python):

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/rollout_engines.py [--rounds 5]

Prints the median tokens/s of each and the ratios against the named baseline, the hf engine
measured in the same run. The model is the built-in tiny one, briefly warm-started so responses
have realistic lengths (EOS is reachable); float32 on both sides.
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
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--sft-steps", type=int, default=100)
    args = ap.parse_args()

    import vllm

    from aggbench.rollout import make_engine

    with tempfile.TemporaryDirectory() as tmp:
        path, tok, model, prompts = warm_tiny_policy(tmp, sft_steps=args.sft_steps, n_prompts=args.prompts)
        t0 = time.perf_counter()
        engines = {
            "hf": make_engine("hf", model, tok, batch_size=args.prompts * args.samples),
            "vllm": make_engine("vllm", None, tok, model_path=str(path), dtype="float32", in_process=True),
        }
        print(f"vLLM {vllm.__version__} engine started in {time.perf_counter() - t0:.1f} s", flush=True)
        kinds = {"hf": ("hf", 0), "vllm seeded": ("vllm", 0), "vllm unseeded": ("vllm", None)}
        rates: dict[str, list[float]] = {k: [] for k in kinds}
        for r in range(args.rounds + 1):  # round 0 warms every path up and is dropped
            for name, (engine, seed) in kinds.items():
                t = time.perf_counter()
                out = engines[engine].generate(
                    prompts,
                    n=args.samples,
                    temperature=1.0,
                    top_p=1.0,
                    max_new_tokens=args.max_new_tokens,
                    seed=None if seed is None else seed + r,
                )
                dt = time.perf_counter() - t
                tokens = sum(len(x) for x in out.response_ids)
                if r:
                    rates[name].append(tokens / dt)
                print(
                    f"round {r} {name:14s} {tokens:6d} tokens in {dt:6.2f} s = {tokens / dt:8.0f} tok/s",
                    flush=True,
                )
        med = {k: statistics.median(v) for k, v in rates.items()}
        shape = f"{args.prompts} prompts x {args.samples} samples, {args.max_new_tokens} new tokens"
        print(f"\nmedian tokens/s over {args.rounds} rounds ({shape}):")
        for k, v in med.items():
            print(f"  {k:14s} {v:8.0f}   ratio / hf = {v / med['hf']:.2f}")
        print(
            f"baseline: the hf engine (transformers {__import__('transformers').__version__} generate), same run"
        )
        print(f"vllm unseeded / vllm seeded = {med['vllm unseeded'] / med['vllm seeded']:.2f}")


if __name__ == "__main__":  # vLLM spawns workers: a script that starts it needs this guard
    main()
