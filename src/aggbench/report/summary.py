"""The summary MLflow run ``{experiment}__summary``: the report's tables and plots as artifacts.

Every table file is there as written (``tables/{peak,last}.{md,csv,tex}``, ``tables/values.csv``)
and each CSV also as an MLflow table (``tables/{name}.json``), so a notebook reads it back with
``mlflow.load_table("tables/last.json", run_ids=[...])``: the CSV's columns and rows as pandas reads
them (peak and last: one row per table x rule x column, the long form; values: one row per cell x
benchmark x step), empty cells null. The run is FINISHED once they are logged.
"""

from __future__ import annotations

import posixpath
import shutil
import tempfile
from pathlib import Path
from typing import Any
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


def table_frame(csv_path: Path) -> Any:
    """The report's CSV ``csv_path`` as a pandas DataFrame [lines, CSV columns] (empty cells NaN)."""
    import pandas as pd

    return pd.read_csv(csv_path)


def log_table(client: Any, run_id: str, frame: Any, artifact_file: str) -> None:
    """``frame`` as the MLflow table ``artifact_file``, replacing one logged before.

    MLflow's ``log_table`` appends to an existing table; where the old artifacts could not be
    deleted first (a remote artifact store), the file is overwritten in the format ``log_table``
    writes (JSON, orient "split"), which ``load_table`` reads.
    """
    folder = posixpath.dirname(artifact_file) or None
    if artifact_file not in {f.path for f in _retry(client.list_artifacts, run_id, folder)}:
        client.log_table(run_id, frame, artifact_file)  # not retried: a second try would append
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / posixpath.basename(artifact_file)
        frame.to_json(path, orient="split", index=False, date_format="iso")
        _retry(client.log_artifact, run_id, str(path), folder)


def log_summary(uri: str, experiment: str, tables: list[Path], plots: list[Path]) -> str:
    """Log tables (each CSV also as an MLflow table) and plots to the run ``{experiment}__summary``,
    replacing its earlier artifacts (deleted first where the artifact store is a local directory;
    overwritten elsewhere)."""
    run = open_run(uri, experiment, summary_id(experiment), None)  # no marker file under out/
    client = run.client
    run.set_tags({KIND_TAG: "summary"})
    local = _local_path(client.get_run(run.run_id).info.artifact_uri)
    if local is not None and local.is_dir():
        for child in local.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    for p in tables:
        _retry(client.log_artifact, run.run_id, str(p), "tables")
        if p.suffix == ".csv":
            log_table(client, run.run_id, table_frame(p), f"tables/{p.stem}.json")
    for p in plots:
        _retry(client.log_artifact, run.run_id, str(p), "plots")
    run.set_status("FINISHED")
    return run.run_id
