"""What is not wrong with a valid grid but will not work, or will cost a download, as it stands
(``aggbench grid check``'s warnings)."""

from __future__ import annotations

import os

from aggbench import layout
from aggbench.data.fetch import unfetched
from aggbench.grid import results_dir
from aggbench.resources import partial_keys


def readiness_warnings(exp: dict, *, cluster: bool, config: str = "CONFIG") -> list[str]:
    """What is not wrong with a valid grid but will not work, or will cost a download, as it stands:
    a null ``tracking_uri`` on a cluster (``cluster``: a cluster profile, or GPUs requested), a
    SLURM key set for some models' jobs only (:func:`aggbench.resources.partial_keys`), benchmarks
    without fetched data, holdout splits the split check cannot compare, models without a
    prepared directory. Each names the fix."""
    out, root = [], results_dir(exp)
    if cluster:
        out += [w for w in [sqlite_on_cluster(exp)] if w] + partial_keys(exp)
    data = layout.benchmark_data_dir(root)
    missing = unfetched(exp["benchmarks"], data)
    if missing:
        out.append(
            f"benchmarks {', '.join(missing)}: no fetched data under {data}; the DAG's local rule "
            f"fetch_benchmarks fetches them on the login node, or now: aggbench data fetch --config {config}"
        )
    out += unchecked_splits(exp)
    unprepared = [m for m in exp["models"] if not layout.model_dir(root, m).is_dir()]
    if unprepared:
        out.append(
            f"models {', '.join(unprepared)}: no prepared directory under {layout.model_dir(root, '')}; "
            "the DAG's local rule prepare_model downloads (or builds) each on the login node first"
        )
    return out


def sqlite_on_cluster(exp: dict) -> str | None:
    """The warning for a cluster run with no tracking server (None when one is set): also printed by
    the workflow when it submits jobs (the Snakefile's onstart), not only by ``grid check``."""
    if exp.get("tracking_uri") is not None or os.environ.get("MLFLOW_TRACKING_URI"):
        return None
    return (
        f"tracking_uri is null, so every job would write one SQLite file, {layout.mlflow_db(results_dir(exp))}, "
        "on a shared filesystem, whose locks are unsafe across nodes: start an MLflow server on the login "
        "node (with --allowed-hosts naming LOGIN-NODE:5000: MLflow answers 403 to any other host "
        "name than localhost's and private IPs') and set tracking_uri: http://LOGIN-NODE:5000 (or "
        "export MLFLOW_TRACKING_URI); docs/workflow.md, 'Running the paper grid on a SLURM cluster'"
    )


def unchecked_splits(exp: dict) -> list[str]:
    """A holdout benchmark whose fetched copy, or a prepared training file of its set, was written
    before held-out digests were recorded: the split check (``data.grid_checks.split_problems``)
    cannot tell whether the two hold the same problems out, so it says nothing; this says so."""
    from aggbench.data.fetch import FetchedDataError, read_lock
    from aggbench.data.grid_checks import holdout_pairs, load_data_specs
    from aggbench.data.holdout import recorded_held_digest

    # The config check read these specs too (~20 ms for the paper grid): not worth threading through
    # load_experiment, whose every caller would carry them.
    root, specs = results_dir(exp), load_data_specs(exp)
    fetched = layout.benchmark_data_dir(root)
    try:
        entries = read_lock(fetched)
    except FetchedDataError:
        return []  # the config check names a broken lock
    old: dict[str, list[str]] = {}  # {benchmark: what was written before digests}
    owners = {}
    for b, owner, name in holdout_pairs(specs):  # the split check compares exactly these pairs
        if b not in entries:
            continue
        owners[b] = owner.name
        if not entries[b].get("held_digest"):
            refetch = f"aggbench data fetch --benchmarks {b} --out {fetched} --refetch {b}"
            old.setdefault(b, [f"{fetched} (refetch: {refetch})"])
        prepared = layout.data_file(root, name)
        if prepared.is_file() and recorded_held_digest(prepared) is None:
            old.setdefault(b, []).append(f"{prepared} (delete it: prepare_data writes it again)")
    return [
        f"benchmark {b} (holdout of {owners[b]}): written before held-out digests were recorded, so "
        f"nothing checks that training left out the problems it evaluates: {'; '.join(files)}"
        for b, files in old.items()
    ]
