"""Evaluation metrics -> the cell's MLflow run, at the training step of the checkpoint.

``eval/{benchmark}/{metric}`` keys (``@`` spelled ``_at_``), logged idempotently: a key that already
has a value at the step is skipped. ``aggbench evaluate`` logs live; ``aggbench ingest`` replays the
metrics.json files through the same function. A base model's run (``results/base/{model}``, step 0)
has nothing else to come and is FINISHED once its metrics are in (``finish``); a cell's run keeps
the status its trainer gives it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aggbench.metric_names import CONTEXT_COUNTS, mlflow_key


def eval_metric_values(benchmark: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """The MLflow metrics of one benchmark: every avg@/pass@/maj@ value, the CI of avg@n, lengths."""
    out = {mlflow_key(benchmark, m): float(metrics[m]) for m in metrics.get("metrics", []) if m in metrics}
    for name in ("ci_low", "ci_high", "mean_length", "truncation_rate", *CONTEXT_COUNTS):
        if metrics.get(name) is not None:
            out[mlflow_key(benchmark, name)] = float(metrics[name])
    return out


def log_eval_metrics(
    run_dir: str | Path,
    cell_id: str,
    step: int,
    metrics_by_benchmark: Mapping[str, Mapping[str, Any]],
    tracking_uri: str | None = None,
    experiment: str = "aggbench",
    *,
    finish: bool = False,
) -> dict[str, Any]:
    """Log evaluation metrics to the cell's MLflow run at training ``step``, idempotently.

    A key that already has a value at ``step`` (read through ``metric_history``) is skipped, so
    re-running never stores a second value; the rest go in one ``log_batch`` call; ``finish``: then
    mark the run FINISHED (a base model's evaluation run). Returns
    ``{"logged": [keys], "skipped": [keys], "run_id": str}``.
    """
    from mlflow.entities import Metric

    from aggbench.tracking import MlflowRun, _retry, metric_history, resolve_tracking_uri

    run = MlflowRun(resolve_tracking_uri(tracking_uri, Path(run_dir)), experiment, cell_id, Path(run_dir))
    values: dict[str, float] = {}
    tags: dict[str, str] = {}
    for bench, metrics in metrics_by_benchmark.items():
        values.update(eval_metric_values(bench, metrics))
        if metrics.get("public_tests_only"):
            tags[f"eval/{bench}/notes"] = "public tests only"
    logged, skipped = [], []
    now = int(time.time() * 1000)
    batch = []
    for key, value in values.items():
        if step in metric_history(run.client, run.run_id, key):
            skipped.append(key)
        else:
            batch.append(Metric(key, value, now, int(step)))
            logged.append(key)
    for i in range(0, len(batch), 1000):
        _retry(run.client.log_batch, run.run_id, metrics=batch[i : i + 1000])
    if tags:
        run.set_tags(tags)
    if finish and run.status() != "FINISHED":
        run.set_status("FINISHED")
    return {"logged": logged, "skipped": skipped, "run_id": run.run_id}
