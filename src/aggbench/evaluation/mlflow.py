"""Evaluation metrics -> the cell's MLflow run, at the training step of the checkpoint.

``eval/{benchmark}/{metric}`` keys (``@`` spelled ``_at_``; which values, and the notes tag:
``metric_names.eval_to_mlflow``), logged idempotently by ``MlflowRun.log_step_metrics``: a key that
already has a value at the step is skipped. ``aggbench evaluate`` logs live through this module;
``aggbench ingest`` replays the metrics.json files through the same two functions. A base model's
run (``results/base/{model}``, step 0) has nothing else to come and is FINISHED once its metrics are
in (``finish``); a cell's run keeps the status its trainer gives it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aggbench.metric_names import eval_to_mlflow


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

    A key that already has a value at ``step`` is skipped, so re-running never stores a second
    value; ``finish``: then mark the run FINISHED (a base model's evaluation run). Returns
    ``{"logged": [keys], "skipped": [keys], "run_id": str}``.
    """
    from aggbench.tracking import MlflowRun, resolve_tracking_uri

    run = MlflowRun(resolve_tracking_uri(tracking_uri, Path(run_dir)), experiment, cell_id, Path(run_dir))
    logged, skipped = run.log_step_metrics(step, *eval_to_mlflow(metrics_by_benchmark))
    if finish and run.status() != "FINISHED":
        run.set_status("FINISHED")
    return {"logged": logged, "skipped": skipped, "run_id": run.run_id}
