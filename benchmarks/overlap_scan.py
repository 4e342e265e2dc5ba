"""What the near-copy search costs the report (aggbench.data.near): a training set against real test
benchmarks, verbatim and near copies, vs the named baseline of the verbatim count alone (problem
keys of the training set, intersected), measured in the same process, rounds interleaved.

    .venv/bin/python benchmarks/overlap_scan.py [--rounds 3] [--data ../shared/data]

Three training sets, each the common case and a harder one for the search:
- ``random``: 50,000 problems of 20-120 words drawn at random from the math benchmarks' words
  (the size of DAPO-Math-17k to Polaris): almost none is a candidate, the cost is the scan;
- ``math``: 20,000 problems made from the real math problems with 30% of their words replaced:
  many share rare spans with a test problem, so the similarity is computed often;
- ``code``: 5,000 problems made the same way from LiveCodeBench's (270 words on average), against
  LiveCodeBench: long texts, the similarity's worst case.
This script reports; it is not a test (tests/data/test_overlap.py checks what is found).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

MATH = {  # name: (file under --data, its problem field)
    "aime24": ("aime24/test.jsonl", "problem"),
    "math500": ("math500/test.jsonl", "problem"),
    "olympiadbench": ("olympiadbench/test.jsonl", "question"),
    "minerva": ("minerva/test.jsonl", "problem"),
}
CODE = {"livecodebench": ("livecodebench/lcb_v5_2408_2501_public_tests_rllm.jsonl", "problem")}


def _read(data: Path, files: dict[str, tuple[str, str]]) -> dict[str, list[str]]:
    return {
        name: [json.loads(line)[field] for line in (data / path).open()]
        for name, (path, field) in files.items()
    }


def _mutated(texts: list[str], n: int, rng: random.Random) -> list[str]:
    """``n`` problems, each one of ``texts`` with 30% of its words replaced by others of theirs."""
    words = " ".join(texts).split()
    out = []
    for _ in range(n):
        mine = rng.choice(texts).split()
        out.append(" ".join(rng.choice(words) if rng.random() < 0.3 else w for w in mine))
    return out


def _measure(train: list[str], raw: dict[str, list[str]], rounds: int) -> tuple[float, float, dict]:
    from aggbench.data.holdout import problem_key
    from aggbench.data.near import Problems, near_copies

    tests = {
        name: Problems.of((f"{name} #{i}", t) for i, t in enumerate(texts)) for name, texts in raw.items()
    }
    base, ours = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        keys = {problem_key(t) for t in train}
        verbatim = {name: len(keys & p.raw.keys()) for name, p in tests.items()}
        t1 = time.perf_counter()
        near = near_copies(Problems.of((f"line {i}", t) for i, t in enumerate(train)), tests)
        t2 = time.perf_counter()
        base.append(t1 - t0)
        ours.append(t2 - t0)  # the report counts both
    found = {name: (verbatim[name], len(near[name])) for name in tests}
    return statistics.median(base), statistics.median(ours), found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--data", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    args = ap.parse_args()

    rng = random.Random(0)
    math, code = _read(args.data, MATH), _read(args.data, CODE)
    words = " ".join(t for texts in math.values() for t in texts).split()
    all_math = [t for texts in math.values() for t in texts]
    cases = {
        "random": ([" ".join(rng.choices(words, k=rng.randint(20, 120))) for _ in range(50_000)], math),
        "math": (_mutated(all_math, 20_000, rng), math),
        "code": (_mutated(code["livecodebench"], 5_000, rng), code),
    }
    for name, (train, tests) in cases.items():
        base, ours, found = _measure(train, tests, args.rounds)
        print(
            f"{name}: {len(train)} training problems against {', '.join(tests)}: verbatim only (baseline) "
            f"{base:.2f} s, verbatim and near copies {ours:.2f} s, ratio {ours / base:.1f}x "
            f"(median of {args.rounds}); found (verbatim, near) {found}"
        )


if __name__ == "__main__":
    main()
