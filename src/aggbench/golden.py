"""Golden smoke outputs: compare a smoke run's results with the committed ones (tests/golden/smoke/).

A results directory's tables (``tables/*.csv``) and each cell's ``metrics.jsonl`` must equal the
golden copies field by field, except fields that measure time (``TIME_FIELDS``, shared with
benchmarks/smoke_dag.py). Every difference names the file, the row, the field, golden and got.

The numbers depend on the CPU's kernel path (the warm start's float reductions: an AMD EPYC on
torch's AVX2 path and an Intel Xeon on its AVX512 path train other weights), so the golden root
holds one set per machine class, ``<root>/<machine slug>/`` with its ``machine.json`` (CPU model,
torch's CPU capability, torch, the lock's sha256), and a run is compared with the set of its class
(``set_for``); on a class with no set the comparison cannot be made. Regenerate with ``make golden``
(after a change meant to move the outputs: this machine's set, the other classes' sets removed,
since they are stale by then) or ``make golden-machine`` (add this machine's set beside the others,
at a commit whose outputs pass on them):

    python -m aggbench.golden --regenerate tests/golden/smoke [--keep-other-machines]
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import re
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


def slug(machine: dict) -> str:
    """The directory name of ``machine``'s golden set: its CPU model and capability, e.g.
    ``amd-epyc-avx2``, ``intel-xeon-processor-avx512``."""
    text = re.sub(
        r"\((r|tm)\)", " ", f"{machine.get('cpu_model')} {machine.get('cpu_capability')}", flags=re.I
    )
    return "-".join(re.findall(r"[a-z0-9]+", text.lower()))


def sets(root: Path) -> list[Path]:
    """The golden sets under ``root`` (each a directory with its ``machine.json``), by name."""
    return sorted(p.parent for p in Path(root).glob("*/machine.json"))


def set_for(root: Path, here: dict) -> Path | None:
    """The golden set made on ``here``'s machine class (no ``machine_differences``), or None."""
    for d in sets(root):
        if not machine_differences(json.loads((d / "machine.json").read_text()), here):
            return d
    return None


def copy_results(results: Path, dest: Path) -> None:
    """The compared files of ``results`` (tables/*.csv, runs/*/metrics.jsonl) into ``dest``, replaced."""
    shutil.rmtree(dest / "tables", ignore_errors=True)
    shutil.rmtree(dest / "runs", ignore_errors=True)
    for src in [*results.glob("tables/*.csv"), *results.glob("runs/*/metrics.jsonl")]:
        target = dest / src.relative_to(results)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)


def regenerate(root: Path, repo: Path, results: Path | None = None, *, keep_others: bool = False) -> Path:
    """Run the smoke DAG (``snakemake --cores 2``) in a temp dir (or take ``results``), copy its
    compared files and this machine's description into ``root/<slug>``; unless ``keep_others``,
    remove the other machines' sets (a regeneration means the outputs moved, so theirs are stale).
    Returns the set written."""
    here = machine(repo)
    dest = Path(root) / slug(here)
    with tempfile.TemporaryDirectory() as tmp:
        if results is None:
            results = Path(tmp) / "results"
            snakemake = Path(sys.executable).with_name("snakemake")
            cmd = [str(snakemake), "--cores", "2", "--config", f"results_dir={results}"]
            subprocess.run(cmd, cwd=repo, env=dict(os.environ), check=True)
        dest.mkdir(parents=True, exist_ok=True)
        copy_results(Path(results), dest)
    (dest / "machine.json").write_text(json.dumps(here, indent=2, sort_keys=True) + "\n")
    for other in sets(root):
        if other != dest and not keep_others:
            shutil.rmtree(other)
            print(
                f"removed {other}: made on another machine, stale once the outputs move (regenerate it there)"
            )
    return dest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--regenerate", type=Path, required=True, help="the golden root (one set per machine)")
    ap.add_argument("--from-results", type=Path, help="copy this finished smoke results dir, no new run")
    ap.add_argument(
        "--keep-other-machines",
        action="store_true",
        help="add or refresh this machine's set only (the outputs did not move: they pass on the others)",
    )
    ap.add_argument("--repo", type=Path, default=Path.cwd())
    args = ap.parse_args(argv)
    dest = regenerate(args.regenerate, args.repo, args.from_results, keep_others=args.keep_other_machines)
    print(f"golden smoke outputs written to {dest}")


if __name__ == "__main__":
    main()
