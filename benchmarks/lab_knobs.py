"""Do the lab knobs move the warm-started model's length gap and CV? Prints one row per setting.

For the settings of ``aggbench.tiny.lab.SETTINGS`` (v1: gap positive/negative x spread low/high)
or ``SETTINGS_V2`` (``--lab v2``: one-line gaps, the echo block, the echo control) it warm-starts the tiny model (one shared skill phase, then each setting's mix phase:
``warm_start_settings``), samples ``--prompts`` training prompts x ``--samples`` responses at
temperature 1 and prints accuracy, the length gap (mean length correct - incorrect, pooled and
averaged within prompt groups), the length CV (pooled and within groups), the mean length, the
share of worked answers and of truncated ones. This script reports; it is not a test
(``tests/tiny/test_lab_knobs.py`` checks the directions at a smaller budget).

    .venv/bin/python benchmarks/lab_knobs.py [--lab v1|v2] [--sft-steps 500] [--skill-steps N] [--lr 1e-3]
        [--batch-size 16] [--prompts 16]
        [--samples 8] [--threads 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from aggbench.tiny.lab import SETTINGS, SETTINGS_V2, measure, warm_start_settings
from aggbench.tiny.model import DEFAULT_SFT_BATCH, DEFAULT_SFT_LR, DEFAULT_SFT_STEPS

COLUMNS = (
    "accuracy",
    "accuracy_worked",
    "accuracy_guess",
    "gap",
    "gap_within",
    "cv",
    "cv_within",
    "mean_len",
)
COLUMNS += ("worked_share", "echo_share", "truncated")


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lab", choices=("v1", "v2"), default="v1", help="Which lab's settings.")
    parser.add_argument("--sft-steps", type=int, default=DEFAULT_SFT_STEPS)
    parser.add_argument(
        "--skill-steps",
        type=int,
        default=None,
        help="Steps of the shared skill phase (default: half, as the lab).",
    )
    parser.add_argument("--lr", type=float, default=DEFAULT_SFT_LR, help="Peak warm-start learning rate.")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_SFT_BATCH, help="Warm-start batch size.")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--out", default=None, help="Keep the warm-started models here (default: a temporary directory)."
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or tmp
        t0 = time.monotonic()
        settings = SETTINGS_V2 if args.lab == "v2" else SETTINGS
        dirs = warm_start_settings(
            root,
            settings,
            steps=args.sft_steps,
            seed=args.seed,
            skill_steps=args.skill_steps,
            lr=args.lr,
            batch_size=args.batch_size,
        )
        print(f"warm starts: {args.sft_steps} steps, {time.monotonic() - t0:.0f} s for all {len(dirs)}")
        print("setting    " + " ".join(f"{c[:12]:>12}" for c in COLUMNS))
        for name, cfg in settings.items():
            row = measure(dirs[name], cfg, n_prompts=args.prompts, n_samples=args.samples, seed=args.seed)
            print(f"{name:<10} " + " ".join(f"{_fmt(row[c]):>12}" for c in COLUMNS))


if __name__ == "__main__":
    main()
