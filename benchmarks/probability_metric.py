"""What the built-in task's probability metric costs against the avg@4 it stands beside.

For each model directory given (tiny models, e.g. the lab's results/lab/models/tiny-*), runs
``aggbench generate`` on tiny_test (64 problems, n = 4, the model's --tiny-task knobs read from its
aggbench_model.json) once, in this process's environment, and prints from generation.json the
seconds of sampling avg@4 and of computing the probability metric, their ratio (metric / sampling:
the issue asks for < 1), and the metric's uncovered mass. Both run in the same job on the same
loaded model, so the ratio is measured in one run (these machines are noisy).

    .venv/bin/python benchmarks/probability_metric.py MODEL_DIR [MODEL_DIR ...] [--max-tokens 120]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--max-tokens", type=int, default=120, help="the lab's evaluation.max_tokens")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    aggbench = Path(sys.executable).with_name("aggbench")
    print("model | sampling avg@4 s | probability s | ratio | prob_correct | uncovered")
    for model in args.models:
        task = json.loads((model / "aggbench_model.json").read_text()).get("task", {})
        knobs = {k: v for k, v in task.items() if k in ("gap", "spread", "verbosity", "worked_fraction")}
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [str(aggbench), "generate", "--checkpoint", str(model), "--benchmarks", "tiny_test",
                   "--out", tmp, "--n", "4", "--max-tokens", str(args.max_tokens),
                   "--tiny-task", json.dumps(knobs), "--quiet"]  # fmt: skip
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            subprocess.run(cmd, check=True, env=env, capture_output=True)
            bench = json.loads((Path(tmp) / "generation.json").read_text())["benchmarks"]["tiny_test"]
        prob = bench["probability"]
        ratio = prob["seconds"] / bench["seconds"]
        print(
            f"{model.name} | {bench['seconds']:.1f} | {prob['seconds']:.1f} | {ratio:.2f} | "
            f"{prob['prob_correct']:.3f} | {prob['prob_uncovered']:.3f}"
        )


if __name__ == "__main__":
    main()
