"""The summary MLflow run ``{experiment}__summary``: the report's tables and plots as artifacts.

Every table file is there as written (``tables/{peak,last}.{md,csv,tex}``, ``tables/values.csv``)
and each CSV also as an MLflow table (``tables/{name}.json``), so a notebook reads it back with
``mlflow.load_table("tables/last.json", run_ids=[...])``: the CSV's columns and rows as pandas reads
them (peak and last: one row per table x rule x column, the long form; values: one row per cell x
benchmark x step), empty cells null; the greedy protocol's tables (evaluation.greedy) likewise under
``tables/greedy/``. The run is FINISHED once they are logged.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aggbench.report.ingest import KIND_TAG, open_run, summary_id
from aggbench.tracking import log_table


def table_frame(csv_path: Path) -> Any:
    """The report's CSV ``csv_path`` as a pandas DataFrame [lines, CSV columns] (empty cells NaN)."""
    import pandas as pd

    return pd.read_csv(csv_path)


def log_summary(
    uri: str, experiment: str, tables: list[Path], plots: list[Path], greedy: Sequence[Path] = ()
) -> str:
    """Log tables (each CSV also as an MLflow table) and plots to the run ``{experiment}__summary``,
    replacing its earlier artifacts (deleted first where the artifact store is a local directory;
    overwritten elsewhere); ``greedy``: the greedy protocol's tables, under ``tables/greedy``."""
    run = open_run(uri, experiment, summary_id(experiment), None)  # no marker file under out/
    run.set_tags({KIND_TAG: "summary"})
    run.clear_artifacts()
    for where, paths in (("tables", tables), ("tables/greedy", greedy)):
        for p in paths:
            run.log_file(p, where)
            if p.suffix == ".csv":
                log_table(run.client, run.run_id, table_frame(p), f"{where}/{p.stem}.json")
    for p in plots:
        run.log_file(p, "plots")
    run.set_status("FINISHED")
    return run.run_id
