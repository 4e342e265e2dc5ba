"""The summary MLflow run ``{experiment}__summary``: the report's tables and plots as artifacts."""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

from aggbench.report.ingest import KIND_TAG, open_run, summary_id
from aggbench.tracking import _retry


def _local_path(uri: str) -> Path | None:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri:
        return Path(uri)
    return None


def log_summary(uri: str, experiment: str, tables: list[Path], plots: list[Path]) -> str:
    """Log tables and plots to the run ``{experiment}__summary``, replacing its earlier artifacts
    (deleted first where the artifact store is a local directory; overwritten elsewhere)."""
    run = open_run(uri, experiment, summary_id(experiment), None)  # no marker file under out/
    client = run.client
    run.set_tags({KIND_TAG: "summary"})
    local = _local_path(client.get_run(run.run_id).info.artifact_uri)
    if local is not None and local.is_dir():
        for child in local.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    for p in tables:
        _retry(client.log_artifact, run.run_id, str(p), "tables")
    for p in plots:
        _retry(client.log_artifact, run.run_id, str(p), "plots")
    _retry(client.set_terminated, run.run_id, "FINISHED")
    return run.run_id
