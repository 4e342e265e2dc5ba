"""What is not wrong with a valid grid but will not work, or will cost a download, as it stands
(``aggbench grid check``'s warnings)."""

from __future__ import annotations

import os

from aggbench import layout
from aggbench.data.fetch import unfetched
from aggbench.grid import results_dir


def readiness_warnings(exp: dict, *, cluster: bool, config: str = "CONFIG") -> list[str]:
    """What is not wrong with a valid grid but will not work, or will cost a download, as it stands:
    a null ``tracking_uri`` on a cluster (``cluster``: a cluster profile, or GPUs requested),
    benchmarks without fetched data, models without a prepared directory. Each names the fix."""
    out, root = [], results_dir(exp)
    if cluster and exp.get("tracking_uri") is None and not os.environ.get("MLFLOW_TRACKING_URI"):
        out.append(
            f"tracking_uri is null, so every job would write one SQLite file, {layout.mlflow_db(root)}, on a "
            "shared filesystem, whose locks are unsafe across nodes: start an MLflow server on the login "
            "node (with --allowed-hosts naming LOGIN-NODE:5000: MLflow answers 403 to any other host "
            "name than localhost's and private IPs') and set tracking_uri: http://LOGIN-NODE:5000 (or "
            "export MLFLOW_TRACKING_URI); docs/workflow.md, 'Running the paper grid on a SLURM cluster'"
        )
    data = layout.benchmark_data_dir(root)
    missing = unfetched(exp["benchmarks"], data)
    if missing:
        out.append(
            f"benchmarks {', '.join(missing)}: no fetched data under {data}; the DAG's local rule "
            f"fetch_benchmarks fetches them on the login node, or now: aggbench data fetch --config {config}"
        )
    unprepared = [m for m in exp["models"] if not layout.model_dir(root, m).is_dir()]
    if unprepared:
        out.append(
            f"models {', '.join(unprepared)}: no prepared directory under {layout.model_dir(root, '')}; "
            "the DAG's local rule prepare_model downloads (or builds) each on the login node first"
        )
    return out
