"""Wall time of the smoke DAG (`snakemake --cores 2` on configs/smoke.yaml), against a named baseline.

The DAG is run end to end in a temporary results directory, as `make smoke` runs it. With
``--baseline REV`` the same DAG also runs from a detached worktree of REV (for example the commit
before a change), the two interleaved round by round (baseline, then this tree), so machine noise
hits both alike; the ratio printed is the median over rounds of (this tree / baseline). It then
compares what the two runs wrote: the tables (``tables/*.csv``) and every cell's ``metrics.jsonl``
must be identical except fields that are times (``aggbench.golden.TIME_FIELDS``), which proves a refactoring
changed no result on this machine. The smoke budget is 15 minutes on 2 cores (target 10); a run
over it is reported, not failed: this script reports, it is not a test.

    .venv/bin/python benchmarks/smoke_dag.py [--baseline REV] [--rounds 1]

Another grid: ``--configfile configs/lab.yaml --set 'seeds=[0]'`` times the lab (one seed: 12
cells, the four warm starts) and prints cells per hour; ``--set KEY.SUB=VALUE`` (VALUE read as
YAML) edits that config for both trees. Every model's weights are compared byte for byte as well.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aggbench.golden import differences  # the golden test's comparison, TIME_FIELDS left out

REPO = Path(__file__).resolve().parents[1]
BUDGET_S = 15 * 60


def grid_config(configfile: str | None, sets: list[str], out: Path) -> Path | None:
    """``configfile`` (default: configs/smoke.yaml) with each ``KEY.SUB=VALUE`` (VALUE read as YAML)
    set, written to ``out``; None when nothing is to change (the Snakefile's default config)."""
    if configfile is None and not sets:
        return None
    import yaml

    cfg = yaml.safe_load((REPO / (configfile or "configs/smoke.yaml")).read_text())
    for item in sets:
        key, _, value = item.partition("=")
        *parents, leaf = key.split(".")
        node = cfg
        for k in parents:
            node = node.setdefault(k, {})
        node[leaf] = yaml.safe_load(value)
    out.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def run_dag(tree: Path, results: Path, config: Path | None = None) -> float:
    """One DAG from ``tree`` (its Snakefile and its src/), results under ``results``; -> seconds."""
    snakemake = Path(sys.executable).with_name("snakemake")
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    configfile = ["--configfile", str(config)] if config else []
    t0 = time.monotonic()
    proc = subprocess.run(
        [str(snakemake), "--cores", "2", *configfile, "--config", f"results_dir={results}"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"smoke DAG failed in {tree}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall


def model_differences(a: Path, b: Path) -> list[str]:
    """The prepared models whose weights differ (or that only one side has)."""
    names = {d.name for r in (a, b) for d in (r / "models").iterdir() if d.is_dir()}
    out = []
    for name in sorted(names):
        wa, wb = (r / "models" / name / "model.safetensors" for r in (a, b))
        if not (wa.is_file() and wb.is_file()) or wa.read_bytes() != wb.read_bytes():
            out.append(f"models/{name}/model.safetensors differs")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", help="a git revision to time (and compare) beside this tree")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--configfile", help="the grid to run (default: the Snakefile's, configs/smoke.yaml)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        trees = {"this tree": REPO}
        if args.baseline:
            base = work / "baseline"
            subprocess.run(
                ["git", "worktree", "add", "--detach", str(base), args.baseline], cwd=REPO, check=True
            )
            trees = {f"baseline {args.baseline}": base, **trees}
        walls: dict[str, list[float]] = {name: [] for name in trees}
        config = grid_config(args.configfile, args.sets, work / "grid.yaml")
        try:
            for r in range(args.rounds):
                for name, tree in trees.items():
                    results = work / f"{name.split()[0]}-{r}" / "results"
                    walls[name].append(run_dag(tree, results, config))
                    cells = len([d for d in (results / "runs").iterdir() if d.is_dir()])
                    per_hour = cells * 3600 / walls[name][-1]
                    print(
                        f"round {r + 1}: {name}: {walls[name][-1]:.0f} s, {cells} cells, {per_hour:.1f} cells/hour",
                        flush=True,
                    )
            for name, w in walls.items():
                verdict = "within" if statistics.median(w) <= BUDGET_S else "OVER"
                print(f"{name}: median {statistics.median(w):.0f} s ({verdict} the {BUDGET_S} s budget)")
            if args.baseline:
                ratios = [h / b for b, h in zip(*walls.values(), strict=True)]
                print(
                    f"this tree / baseline: {statistics.median(ratios):.2f}x (median of {len(ratios)} rounds)"
                )
                diff = differences(work / "baseline-0" / "results", work / "this-0" / "results")
                diff += model_differences(work / "baseline-0" / "results", work / "this-0" / "results")
                print(
                    "outputs identical except time fields"
                    if not diff
                    else "OUTPUTS DIFFER:\n  " + "\n  ".join(diff)
                )
        finally:
            if args.baseline:
                subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=REPO, check=False)
                shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
