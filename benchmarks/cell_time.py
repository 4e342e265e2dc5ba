"""Where a DAG's wall time goes, job kind by job kind (issue 27, item 5: measure, then cut).

    python benchmarks/cell_time.py results            # after `snakemake --cores 2` (the smoke DAG)
    python benchmarks/cell_time.py results/lab --imports

Reads what the run left: each job's wall time (Snakemake's ``benchmark:`` file beside its log,
``logs/<rule>/....times.tsv``), the trainer's per-step generate and update seconds
(``metrics.jsonl``) and the generate job's model load and sampling seconds (``generation.json``).
Prints, per job kind, the summed wall time and how it splits: inside training steps (generate,
update) vs outside them (process start, imports, model load, MLflow, checkpoints); a generate job's
model load and sampling vs the rest. ``--imports`` also times a fresh Python importing what a train
and a generate job import (no model loaded), the part of "outside" every job pays.

Times are the machine's of that run (a busy machine inflates them all): compare shares, or two runs
made interleaved on one machine, never absolute seconds across machines.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

KINDS = ("prepare_model", "train", "generate", "generate_base", "grade", "grade_base", "report")


def job_walls(results: Path) -> dict[str, list[tuple[Path, float]]]:
    """{rule: [(benchmark file, wall seconds)]} from the ``benchmark:`` files under logs/."""
    out: dict[str, list[tuple[Path, float]]] = defaultdict(list)
    for kind in KINDS:
        root = results / "logs" / kind
        files = sorted(root.rglob("*.times.tsv")) if root.is_dir() else []
        if kind == "report" and (results / "logs" / "report.times.tsv").is_file():
            files = [results / "logs" / "report.times.tsv"]
        for f in files:
            rows = list(csv.DictReader(f.open(), delimiter="\t"))
            if rows:
                out[kind].append((f, float(rows[-1]["s"])))
    return out


def train_split(results: Path, walls: list[tuple[Path, float]]) -> tuple[float, float, float]:
    """(generate s, update s, outside-step s) summed over the train jobs: a job for step N covers the
    steps after the previous segment's end up to N."""
    gen = upd = 0.0
    ends: dict[str, list[int]] = defaultdict(list)
    for f, _ in walls:
        ends[f.parent.name].append(int(f.name.split(".")[0].split("_")[1]))
    for cell, steps in ends.items():
        rows = [
            json.loads(x) for x in (results / "runs" / cell / "metrics.jsonl").read_text().splitlines() if x
        ]
        last = max(steps)
        for r in rows:
            if r["step"] <= last:
                gen += r.get("time/generate_s", 0.0)
                upd += r.get("time/update_s", 0.0)
    total = sum(w for _, w in walls)
    return gen, upd, total - gen - upd


def generate_split(results: Path, under: str) -> tuple[float, float]:
    """(model load s, sampling s) summed over the generation.json files of ``runs`` or ``base``."""
    load = sample = 0.0
    for g in results.glob(f"{under}/*/samples/step_*/generation.json"):
        info = json.loads(g.read_text())
        load += info.get("model_load_s", 0.0)
        sample += info.get("total_s", 0.0) - info.get("model_load_s", 0.0)
    return load, sample


def import_seconds(module: str, repeats: int = 3) -> float:
    """Median wall time of a fresh Python that imports ``module`` (what a job pays before its work)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {module}"], check=True)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument(
        "--imports", action="store_true", help="also time the imports of a train and a generate job"
    )
    args = ap.parse_args(argv)
    walls = job_walls(args.results)
    if not walls:
        sys.exit(
            f"{args.results}: no logs/<rule>/*.times.tsv (run the DAG with this workflow's benchmark: files)"
        )
    total = sum(w for jobs in walls.values() for _, w in jobs)
    print(f"{args.results}: {sum(map(len, walls.values()))} jobs, {total:.0f} s of job wall time (summed)")
    print(f"{'job kind':<15}{'jobs':>5}{'wall s':>9}{'share':>7}  split")
    for kind in KINDS:
        jobs = walls.get(kind, [])
        if not jobs:
            continue
        wall = sum(w for _, w in jobs)
        split = ""
        if kind == "train":
            gen, upd, other = train_split(args.results, jobs)
            split = f"steps: generate {gen:.0f} s + update {upd:.0f} s; outside steps {other:.0f} s ({other / wall:.0%})"
        if kind in ("generate", "generate_base"):
            load, sample = generate_split(args.results, "runs" if kind == "generate" else "base")
            rest = wall - load - sample
            split = f"model load {load:.0f} s, sampling {sample:.0f} s; start-up and writing {rest:.0f} s ({rest / wall:.0%})"
        print(f"{kind:<15}{len(jobs):>5}{wall:>9.0f}{wall / total:>7.0%}  {split}")
    if args.imports:
        for module in ("aggbench.train.loop", "aggbench.evaluation.generate", "aggbench.evaluation.score"):
            print(f"fresh python importing {module}: {import_seconds(module):.1f} s")


if __name__ == "__main__":
    main()
