"""Synthetic run files for the ingest/report tests, and the worker of the concurrency test.

The grid: model ``tiny`` x dataset ``tiny`` x rules token, balanced, sequence x seeds 0, 1, on
benchmarks tiny_test and math500 (avg@4), 12 training steps, checkpoints and evaluations every 4.
token and balanced are complete; sequence seed 0 stopped after step 10 (checkpoints 4 and 8, so
steps 9-10 are not committed; evaluated at 4 and 8); sequence seed 1 has no files at all. The base
model has a step-0 evaluation. The evaluation numbers are in EVALS, so tests work them out by hand.

Run as a script (``python report_fixtures.py worker ...``) it is one job of the concurrency test.
"""

from __future__ import annotations

import csv
import json
import math
import shutil
import sys
import time
from pathlib import Path

import yaml

MODEL, DATASET = "tiny", "tiny"
BENCHES = ("tiny_test", "math500")
RULES = ("token", "balanced", "sequence")
DIAG_RULES = ("token", "sequence", "seq_sum", "constant", "balanced", "r6", "r7", "r8", "r9", "r10", "r11")
TOTAL = 12

# (rule, seed) -> benchmark -> {step: avg@4 as a fraction}
EVALS: dict[tuple[str, int], dict[str, dict[int, float]]] = {
    ("token", 0): {"tiny_test": {4: 0.30, 8: 0.50, 12: 0.40}, "math500": {4: 0.10, 8: 0.20, 12: 0.30}},
    ("token", 1): {"tiny_test": {4: 0.20, 8: 0.40, 12: 0.50}, "math500": {4: 0.20, 8: 0.20, 12: 0.20}},
    ("balanced", 0): {"tiny_test": {4: 0.40, 8: 0.60, 12: 0.70}, "math500": {4: 0.30, 8: 0.10, 12: 0.20}},
    ("balanced", 1): {"tiny_test": {4: 0.50, 8: 0.60, 12: 0.50}, "math500": {4: 0.10, 8: 0.30, 12: 0.20}},
    ("sequence", 0): {"tiny_test": {4: 0.10, 8: 0.20}, "math500": {4: 0.05, 8: 0.15}},
}
BASE = {"tiny_test": 0.10, "math500": 0.05}
# (rule, seed) -> (last metrics row, complete checkpoints)
PROGRESS = {key: (TOTAL, [4, 8, 12]) for key in EVALS}
PROGRESS[("sequence", 0)] = (10, [4, 8])

_TEMPLATE: Path | None = None


def cell_id(rule: str, seed: int) -> str:
    return f"{MODEL}__{DATASET}__{rule}__s{seed}"


def metrics_row(seed: int, step: int, rule_index: int = 0) -> dict:
    """~65 metrics of one step (values are arbitrary but distinct; one NaN, as a real run has)."""
    row: dict = {"step": step, "time": 1_700_000_000.0 + 10 * step}
    base = ["reward/mean", "accuracy", "loss/pg", "loss/kl", "entropy", "clip_frac", "grad_norm", "lr"]
    base += ["len/mean", "len/cv", "len/pos_cv", "len/neg_cv"]
    for i, k in enumerate(base):
        row[k] = round(math.sin(step + i + 0.3 * seed + rule_index), 6)
    row["len/pos_mean"] = 30.0 + 2 * step + seed
    row["len/neg_mean"] = 20.0 + step - seed
    row["len/gap"] = row["len/pos_mean"] - row["len/neg_mean"]
    cv_within = round(0.5 + 0.25 * math.cos(step + seed + rule_index), 6)
    row["len/cv_within"] = float("nan") if step == 2 else cv_within  # no group of >= 2 responses
    row["len/gap_within"] = 2.0 - 0.5 * step + seed
    row["response/truncated_frac"] = round(0.05 * ((step + seed + rule_index) % 4), 6)
    for j, r in enumerate(DIAG_RULES):
        wp = 0.5 if r == "balanced" else 0.4 + 0.01 * ((step + j) % 5)
        wn = 0.5 if r == "balanced" else 0.6 - 0.01 * ((step + j) % 3)
        row[f"agg/{r}/weight_pos"] = wp
        row[f"agg/{r}/weight_neg"] = wn
        row[f"agg/{r}/weight_ratio"] = float("nan") if (r == "token" and step == 3) else wp / wn
        row[f"agg/{r}/pg_loss"] = round(0.01 * step * (j + 1), 6)
    return row


def eval_metrics(bench: str, value: float) -> dict:
    """A metrics.json as ``aggbench.evaluation.generate.score_benchmark`` writes it (n = 4)."""
    return {
        "benchmark": bench,
        "grader": "tiny" if bench == "tiny_test" else "math",
        "avg@4": value,
        "avg@4_ci": [max(0.0, value - 0.1), min(1.0, value + 0.1)],
        "pass@1": value,
        "pass@4": min(1.0, value + 0.2),
        "maj@4": value,
        "metrics": ["avg@4", "pass@1", "pass@4", "maj@4"],
        "n_problems": 16,
        "n_samples": 4,
        "n_responses": 64,
        "n_correct": int(64 * value),
        "ci_low": max(0.0, value - 0.1),
        "ci_high": min(1.0, value + 0.1),
        "mean_length": 40.0,
        "truncation_rate": 0.0,
    }


def write_run(
    run_dir: Path, seed: int, last: int, ckpts: list[int], evals: dict, rule_index: int = 0
) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = [metrics_row(seed, s, rule_index) for s in range(1, last + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for s in ckpts:
        d = run_dir / "checkpoints" / f"step_{s}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "COMPLETE").write_text(f"{s}\n")
    for bench, by_step in evals.items():
        for s, v in by_step.items():
            d = run_dir / "eval" / f"step_{s}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"{bench}.metrics.json").write_text(json.dumps(eval_metrics(bench, v)))


def make_grid(
    root: Path,
    *,
    reported: dict | None = None,
    store: bool = True,
    evals: dict | None = None,
    controls: dict | None = None,
) -> Path:
    """Write the grid's config and run files under ``root``; returns the config path.

    store: start from a copy of an empty, already migrated MLflow database (saves MLflow's 5-7 s
    of migrations per test; the concurrency test starts from nothing instead). evals: another
    {(rule, seed): {benchmark: {step: value}}} than EVALS, every cell of it trained to the end (12
    steps, checkpoints 4, 8, 12). controls: the config's ``controls`` (its cells then need ``evals``).
    """
    results = root / "results"
    for (rule, seed), by_bench in (evals or EVALS).items():
        last, ckpts = PROGRESS[(rule, seed)] if evals is None else (TOTAL, [4, 8, 12])
        index = RULES.index(rule) if rule in RULES else len(RULES)  # a control: <rule>-random
        write_run(results / "runs" / cell_id(rule, seed), seed, last, ckpts, by_bench, index)
    base = results / "base" / MODEL / "eval" / "step_0"
    base.mkdir(parents=True)
    for bench, v in BASE.items():
        (base / f"{bench}.metrics.json").write_text(json.dumps(eval_metrics(bench, v)))
    if store:
        shutil.copy(empty_store(), results / "mlflow.db")
    exp = {
        "experiment": "synth",
        "results_dir": str(results),
        "tracking_uri": None,
        "models": {MODEL: {"source": "tiny"}},
        "datasets": {DATASET: {"spec": "tiny"}},
        "aggregations": [{"name": r} for r in RULES],
        "seeds": [0, 1],
        "benchmarks": list(BENCHES),
        "training": {"algorithm": {"total_steps": TOTAL}, "checkpoint": {"every": 4}},
        "evaluation": {"every": 4, "n": 4},
    }
    if reported is not None:
        exp["reported"] = reported
    if controls is not None:
        exp["controls"] = controls
    path = root / "exp.yaml"
    path.write_text(yaml.safe_dump(exp, sort_keys=False))
    return path


def empty_store() -> Path:
    """An empty, migrated MLflow SQLite database, made once per test session."""
    global _TEMPLATE
    if _TEMPLATE is None:
        import atexit
        import tempfile

        from mlflow.tracking import MlflowClient

        tmp = tempfile.mkdtemp(prefix="aggbench-mlflow-template-")
        atexit.register(shutil.rmtree, tmp, True)
        path = Path(tmp) / "mlflow.db"
        MlflowClient(tracking_uri=f"sqlite:///{path}").search_experiments()
        _TEMPLATE = path
    return _TEMPLATE


def raw_counts(client, run_id: str, keys) -> dict[str, list[int]]:
    """Every logged step of every key, duplicates included (no metric_history de-duplication)."""
    return {k: sorted(int(m.step) for m in client.get_metric_history(run_id, k)) for k in keys}


def _worker(uri: str, experiment: str, cid: str, run_dir: str, sync_dir: str, rounds: str = "1") -> None:
    """One job: import everything, say ready, then for each round wait for its start signal
    (``go-{round}``) and sync one cell's files (``MlflowRun.sync``, one transaction per step, then
    ``MlflowRun.log_step_metrics``) as a trainer would, printing what it logged as one JSON line."""
    import mlflow  # noqa: F401 - imported before the start signal, so the jobs really overlap

    import aggbench.evaluation.generate  # noqa: F401
    from aggbench.report.ingest import Source, ingest_source
    from aggbench.tracking import init_store

    src = Source(cid, Path(run_dir), "cell", {"aggbench.cell_id": cid}, 20)
    sync = Path(sync_dir)
    (sync / f"ready-{cid}").touch()
    for r in range(1, int(rounds) + 1):
        while not (sync / f"go-{r}").exists():
            time.sleep(0.01)
        init_store(uri)
        print(json.dumps(ingest_source(src, uri, experiment)), flush=True)
        (sync / f"done-{r}-{cid}").touch()


def read_csv(path: Path) -> dict[tuple[str, str, str], dict[str, str]]:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {(r["table"], r["row"], r["column"]): r for r in rows}


def md_rows(md: str, title_part: str) -> dict[str, list[str]]:
    """{row label: cells} of the Markdown table under the heading containing ``title_part``."""
    section = md.split(title_part, 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| rule"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0]] = cells[1:]
    return out


def ingest_and_report(config: Path, out: Path, *report_args: str) -> str:
    """`aggbench ingest` then `aggbench report --out out` on the grid, as the report rule runs
    them (both must succeed); returns the report's output."""
    from click.testing import CliRunner

    from aggbench.cli.report import ingest_command, report_command

    runner = CliRunner()
    res = runner.invoke(ingest_command, ["--config", str(config), "--quiet"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    args = ["--config", str(config), "--out", str(out), *report_args]
    res = runner.invoke(report_command, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        _worker(*sys.argv[2:])
