"""What the reworded-copy search costs the report (aggbench.data.overlap): one training set of N
problems against the real math test benchmarks, verbatim and reworded, vs the named baseline of the
verbatim count alone (problem keys of the training set, intersected), measured in the same process,
rounds interleaved.

    .venv/bin/python benchmarks/overlap_scan.py [--problems 50000] [--rounds 3] [--data ../shared/data]

The training problems are 20-120 words drawn at random from the benchmarks' own words (the size of
DAPO-Math-17k to Polaris; the words a math training set uses), so almost none is a candidate: the
cost measured is the scan, the common case. This script reports; it is not a test
(tests/data/test_overlap.py checks what is found).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

BENCHMARKS = {  # name: (file under --data, its problem field)
    "aime24": ("aime24/test.jsonl", "problem"),
    "math500": ("math500/test.jsonl", "problem"),
    "olympiadbench": ("olympiadbench/test.jsonl", "question"),
    "minerva": ("minerva/test.jsonl", "problem"),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    args = ap.parse_args()

    from aggbench.data.holdout import problem_key
    from aggbench.data.overlap import _Problems, _reworded

    raw = {
        name: [json.loads(line)[field] for line in (args.data / path).open()]
        for name, (path, field) in BENCHMARKS.items()
    }
    words = " ".join(t for texts in raw.values() for t in texts).split()
    rng = random.Random(0)
    train = [" ".join(rng.choices(words, k=rng.randint(20, 120))) for _ in range(args.problems)]
    tests = {name: _Problems.of(texts, benchmark=True) for name, texts in raw.items()}
    test_keys = {name: {problem_key(t) for t in texts} for name, texts in raw.items()}

    base, ours = [], []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        keys = {problem_key(t) for t in train}
        verbatim = {name: len(keys & k) for name, k in test_keys.items()}
        t1 = time.perf_counter()
        side = _Problems.of(train, benchmark=False)
        reworded = _reworded(side, tests)
        t2 = time.perf_counter()
        base.append(t1 - t0)
        ours.append(t2 - t1 + (t1 - t0))  # the report counts both
    print(f"{args.problems} training problems against {', '.join(raw)}")
    print(f"verbatim only (baseline): median {statistics.median(base):.2f} s of {args.rounds} rounds")
    print(f"verbatim and reworded:    median {statistics.median(ours):.2f} s")
    print(
        f"ratio: {statistics.median(ours) / statistics.median(base):.1f}x; found {verbatim} verbatim, {reworded} reworded"
    )


if __name__ == "__main__":
    main()
