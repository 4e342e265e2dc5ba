"""Golden smoke outputs: compare a smoke run's results with the committed ones (tests/golden/smoke/).

A results directory's tables (``tables/*.csv``) and each cell's ``metrics.jsonl`` must equal the
golden copies field by field, except fields that measure time (``TIME_FIELDS``, shared with
benchmarks/smoke_dag.py). Every difference names the file, the row, the field, golden and got.
``machine.json`` says what the golden was made on (CPU model, torch's CPU capability, torch, the
lock's sha256): on another CPU the numbers may differ legitimately (the warm start's kernels), so a
comparison there cannot be made (``machine_differences``). Regenerate with ``make golden``:

    python -m aggbench.golden --regenerate tests/golden/smoke   # runs the smoke DAG in a temp dir
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# metrics.jsonl fields that measure time (wall clock, durations, throughput); all others must match.
TIME_FIELDS = ("time", "time/", "tokens_per_s")
# What the golden's numbers depend on beyond the code; the CPU ones decide whether to compare.
MACHINE_KEYS = ("cpu_model", "cpu_capability")
LOCK = Path(".ci") / "lock.txt"


def is_time(key: str) -> bool:
    return any(key == f or (f.endswith("/") and key.startswith(f)) for f in TIME_FIELDS)


def same(x: object, y: object) -> bool:
    return x == y or (isinstance(x, float) and isinstance(y, float) and x != x and y != y)  # NaN == NaN


def _rows_diff(name: str, golden: list[dict], got: list[dict], key: str) -> list[str]:
    if len(golden) != len(got):
        return [f"{name}: {len(golden)} rows in the golden, {len(got)} got"]
    out = []
    for i, (g, r) in enumerate(zip(golden, got, strict=True)):
        where = f"{name} row {i + 1} ({key} {g.get(key)})"
        for field in sorted(k for k in g.keys() | r.keys() if not is_time(k)):
            if not same(g.get(field), r.get(field)):
                out.append(f"{where} field {field}: golden {g.get(field)!r}, got {r.get(field)!r}")
    return out


def _table_rows(path: Path) -> list[dict]:
    return list(csv.DictReader(path.open())) if path.exists() else []


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def differences(golden: Path, got: Path) -> list[str]:
    """Every difference of ``got`` (a results directory) from ``golden`` (same layout: tables/,
    runs/<cell>/metrics.jsonl), time fields left out; a file missing on either side is one."""
    golden, got = Path(golden), Path(got)
    out = []
    names = {p.name for d in (golden, got) for p in (d / "tables").glob("*.csv")}
    for name in sorted(names):
        g, r = _table_rows(golden / "tables" / name), _table_rows(got / "tables" / name)
        out += _rows_diff(f"tables/{name}", g, r, "row")
    cells = {p.relative_to(d) for d in (golden, got) for p in (d / "runs").glob("*/metrics.jsonl")}
    for rel in sorted(cells):
        out += _rows_diff(str(rel), _jsonl(golden / rel), _jsonl(got / rel), "step")
    return out


def machine(repo: Path) -> dict:
    """This machine as the golden records it (``environment.describe``'s CPU fields, torch, lock)."""
    from aggbench import environment

    env = environment.describe()
    lock = Path(repo) / LOCK
    return {
        "cpu_model": env["cpu_model"],
        "cpu_capability": env["cpu_capability"],
        "torch": env["packages"].get("torch"),
        "lock_sha256": hashlib.sha256(lock.read_bytes()).hexdigest() if lock.exists() else None,
        "environment_sha256": env["environment_sha256"],
    }


def machine_differences(golden: dict, here: dict) -> list[str]:
    """The CPU fields in which ``here`` differs from the golden's machine: non-empty = cannot compare."""
    return [
        f"{k}: golden {golden.get(k)!r}, here {here.get(k)!r}"
        for k in MACHINE_KEYS
        if golden.get(k) != here.get(k)
    ]


def copy_results(results: Path, dest: Path) -> None:
    """The compared files of ``results`` (tables/*.csv, runs/*/metrics.jsonl) into ``dest``, replaced."""
    shutil.rmtree(dest / "tables", ignore_errors=True)
    shutil.rmtree(dest / "runs", ignore_errors=True)
    for src in [*results.glob("tables/*.csv"), *results.glob("runs/*/metrics.jsonl")]:
        target = dest / src.relative_to(results)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)


def regenerate(dest: Path, repo: Path, results: Path | None = None) -> None:
    """Run the smoke DAG (``snakemake --cores 2``) in a temp dir (or take ``results``), copy its
    compared files and this machine's description into ``dest``."""
    with tempfile.TemporaryDirectory() as tmp:
        if results is None:
            results = Path(tmp) / "results"
            snakemake = Path(sys.executable).with_name("snakemake")
            cmd = [str(snakemake), "--cores", "2", "--config", f"results_dir={results}"]
            subprocess.run(cmd, cwd=repo, env=dict(os.environ), check=True)
        dest.mkdir(parents=True, exist_ok=True)
        copy_results(Path(results), dest)
    (dest / "machine.json").write_text(json.dumps(machine(repo), indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regenerate", type=Path, required=True, help="the golden directory to rewrite")
    ap.add_argument("--from-results", type=Path, help="copy this finished smoke results dir, no new run")
    ap.add_argument("--repo", type=Path, default=Path.cwd())
    args = ap.parse_args(argv)
    regenerate(args.regenerate, args.repo, args.from_results)
    print(f"golden smoke outputs written to {args.regenerate}")


if __name__ == "__main__":
    main()
