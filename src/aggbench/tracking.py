"""metrics.jsonl (the source of truth) and its idempotent mirror in MLflow.

Policy (say it once, use it everywhere): a step's metrics reach MLflow only after the checkpoint
that contains the step has committed, and the sync is idempotent: it asks MLflow which steps the
sentinel metric ``train/step`` has and logs only the others, each step in one ``log_batch``
call (one database transaction), with the sentinel inside it; steps MLflow lacks are
logged (a gap left by hand-editing the store is filled too). A crash at any point therefore
leaves MLflow holding each step at most once, and the next sync (on resume, or ``aggbench ingest``)
fills in what is missing. Readers also go through ``metric_history``, which keeps one value per
step, so even a store written by something else cannot show a step twice.

Run status (a run is never left RUNNING by a process that could still say how it ended):

* A training segment (one ``aggbench train --until-step N`` job, under the run lock) sets RUNNING
  when it starts and, when it returns, FINISHED if the run has reached ``algorithm.total_steps``,
  else SCHEDULED: more segments are to come and no process trains it meanwhile (a run extended by a
  larger total_steps goes back to RUNNING, then SCHEDULED or FINISHED). So between the segments of
  a DAG a run is SCHEDULED, and once the last segment is done FINISHED.
* SIGTERM (what SLURM and Snakemake send) marks it KILLED, and so does Ctrl-C; any other exception
  marks it FAILED; the process then exits non-zero (143 for SIGTERM) or the exception propagates.
  A SIGKILL, an out-of-memory kill or a crash-test fault leaves it RUNNING: nothing can run then.
  The next segment (the resume) sets RUNNING again, and FINISHED at the end. (The trainer's
  ``aggbench.train.run_status`` does this.)
* A base model's run (``{model}__base``, step-0 evaluation) is FINISHED as soon as its metrics
  are logged; the report's summary run once its artifacts are. ``aggbench ingest`` marks a cell
  FINISHED when its files hold the last step (and SCHEDULED if it created the run for a cell still
  being trained): a store rebuilt from the files holds no RUNNING run either.

Parameters: a cell's run carries its resolved config as params (``run_config.flat_config``), logged
once; a resume compares them with the run's and refuses a different value (MLflow's params cannot
change). The experiment carries ``mlflow.experimentKind`` (custom_model_development), which MLflow
3.17's UI does not read for its landing view: ``ui_url`` opens the runs table through the address's
``workflowType`` instead.

Every write to MLflow is made here (``tests/test_layering.py`` checks that no other module imports
mlflow or names a write of its client): the trainer, the evaluator, ``aggbench ingest`` and the
report's summary run write through ``MlflowRun`` and ``log_table``; readers take the client of
``init_store`` (or ``MlflowRun.client``) and read metrics through ``metric_history``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import posixpath
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlparse

from aggbench.files import relative_to_file, write_atomic
from aggbench.provenance import tag_value

SENTINEL = "train/step"
# The UI's ExperimentKind (mlflow/server/js; "custom_model_development" is "Machine learning"). MLflow
# 3.17's UI ignores it for the landing view: that follows the browser's "mlflow.workflowType"
# (localStorage, default "genai") unless the URL says ?workflowType=machine_learning (test_mlflow_ui).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
UI_QUERY = "workflowType=machine_learning"
BATCH = 100  # params or tags per log_batch call: MLflow's MAX_PARAMS_TAGS_PER_BATCH
METRICS_PER_BATCH = 1000  # metrics per log_batch call: MLflow's MAX_METRICS_PER_BATCH

log = logging.getLogger("aggbench.tracking")


class MetricsLog:
    """Append-only JSONL of per-step metric rows, cut back to a checkpoint on resume."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def read(self) -> list[dict[str, Any]]:
        """Rows ordered by step, one per step (a later line for the same step wins)."""
        if not self.path.exists():
            return []
        by_step: dict[int, dict[str, Any]] = {}
        lines = self.path.read_text().splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                # a torn last line from a crash mid-write: everything before it is intact
                if n == len(lines):
                    log.warning(
                        "%s:%d: the last line is torn (a crash while it was written: %r); it is left out, "
                        "and a resume rewrites the file without it",
                        self.path,
                        n,
                        line[:60] + ("..." if len(line) > 60 else ""),
                    )
                    break
                raise ValueError(f"{self.path}:{n}: not valid JSON") from None
            by_step[int(row["step"])] = row
        return [by_step[s] for s in sorted(by_step)]

    def truncate_after(self, step: int) -> None:
        """Keep only rows with ``row.step <= step`` (atomic rewrite)."""
        rows = [r for r in self.read() if r["step"] <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
        os.replace(tmp, self.path)

    def append(self, row: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def results_root(run_dir: Path) -> Path:
    """``results/`` for ``results/runs/<cell>`` and ``results/base/<model>``; else the directory itself."""
    from aggbench.layout import results_of

    return results_of(run_dir)


def resolve_tracking_uri(configured: str | None, run_dir: Path) -> str:
    """Config value, else $MLFLOW_TRACKING_URI, else an embedded SQLite file under results/."""
    if configured:
        return configured
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    from aggbench.layout import mlflow_db

    return f"sqlite:///{mlflow_db(results_root(run_dir))}"


def _transient(exc: Exception) -> bool:
    """SQLite's 'database is locked' / 'busy': worth retrying."""
    return "locked" in str(exc).lower() or "busy" in str(exc).lower()


def _retry(fn, *args, attempts: int = 8, **kwargs):
    """SQLite under concurrent jobs answers 'database is locked' now and then: back off and retry."""
    delay = 0.2
    for i in range(attempts):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # mlflow wraps sqlalchemy errors in MlflowException
            if i == attempts - 1 or not _transient(exc):
                raise
            time.sleep(delay)
            delay = min(delay * 2, 3.0)


@contextlib.contextmanager
def _flock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def init_store(uri: str) -> Any:
    """An MlflowClient whose store is created (and, for a new SQLite file, migrated) under a lock.

    MLflow migrates a fresh SQLite database on first use without any lock, and jobs that start
    together on a new store then fail ("table _alembic_tmp_tags already exists", "duplicate column
    name"); measured here with 4 processes. The store is cached per process, so taking an
    exclusive ``flock`` next to the database for the first client is enough.
    """
    from mlflow.tracking import MlflowClient

    if not uri.startswith("sqlite:///"):
        return MlflowClient(tracking_uri=uri)
    db = Path(uri[len("sqlite:///") :])
    with _flock(db.with_name(db.name + ".init.lock")):
        if db.is_file():
            repoint_copied_store(db)
        return MlflowClient(tracking_uri=uri)


def repoint_copied_store(db: Path) -> tuple[int, int]:
    """Make a copied (or moved) results directory's store write only into itself.

    MLflow keeps each experiment's artifact location and each run's artifact URI as absolute URIs
    and has no API to change them, so after ``cp -a results elsewhere/`` the copy's ``mlflow.db``
    still names the original's ``mlartifacts`` and everything the copy logs (the report's plots and
    tables) would land in the original. aggbench's SQLite stores keep artifacts in ``mlartifacts``
    beside the database; each location that follows that layout but names another directory's
    ``mlartifacts`` is re-pointed here, in the SQLite file, to this database's own (a store on a
    tracking server keeps its own artifact root: untouched). Returns (experiments, runs) re-pointed.
    """
    import sqlite3

    own = (db.parent / "mlartifacts").resolve()

    def moved(uri: str | None) -> str | None:
        local = _local_path(uri or "")
        if local is None or "mlartifacts" not in local.parts:
            return None
        parts = local.parts
        i = len(parts) - 1 - parts[::-1].index("mlartifacts")
        if Path(*parts[: i + 1]).resolve() == own:
            return None
        return own.joinpath(*parts[i + 1 :]).as_uri()

    con = sqlite3.connect(db, timeout=60)
    try:
        with con:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not {"experiments", "runs"} <= tables:
                return 0, 0  # a new database MLflow has not migrated yet
            exps = [
                (new, eid)
                for eid, loc in con.execute("SELECT experiment_id, artifact_location FROM experiments")
                if (new := moved(loc))
            ]
            runs = [
                (new, rid)
                for rid, loc in con.execute("SELECT run_uuid, artifact_uri FROM runs")
                if (new := moved(loc))
            ]
            con.executemany("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", exps)
            con.executemany("UPDATE runs SET artifact_uri = ? WHERE run_uuid = ?", runs)
    finally:
        con.close()
    if exps or runs:
        log.warning(
            "%s names artifact folders of another results directory (copied or moved): %d experiment(s) and "
            "%d run(s) re-pointed to %s, so this results directory writes only into itself",
            db,
            len(exps),
            len(runs),
            own,
        )
    return len(exps), len(runs)


class MlflowRun:
    """One MLflow run per cell: found by the ``aggbench.cell_id`` tag, created once, reused on resume.

    ``run_dir/mlflow_run.json`` caches the run id; with ``run_dir=None`` nothing is written and the
    run is found by its tag every time (the report's summary run: its output folder holds tables only).
    """

    def __init__(self, tracking_uri: str, experiment: str, cell_id: str, run_dir: Path | None) -> None:
        self.uri = tracking_uri
        self.client = init_store(tracking_uri)
        self.cell_id = cell_id
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.experiment_id = _retry(self._experiment, experiment)
        self.created = False  # whether this object created the run (``_find_or_create``)
        self.run_id = _retry(self._find_or_create)

    def _experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            if EXPERIMENT_KIND_TAG not in exp.tags:  # made before aggbench set it, or by hand
                self.client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return exp.experiment_id
        artifacts = None
        if self.uri.startswith("sqlite:///"):
            artifacts = (Path(self.uri[len("sqlite:///") :]).parent / "mlartifacts").as_uri()
        try:
            kind = {EXPERIMENT_KIND_TAG: EXPERIMENT_KIND}
            return self.client.create_experiment(name, artifact_location=artifacts, tags=kind)
        except Exception:  # created concurrently by another job
            exp = self.client.get_experiment_by_name(name)
            if exp is None:
                raise
            return exp.experiment_id

    def _find_or_create(self) -> str:
        marker = None if self.run_dir is None else self.run_dir / "mlflow_run.json"
        saved = _read_marker(marker) if marker is not None else None
        if saved is not None and _same_store(saved, self.uri, marker) and self._alive(saved["run_id"]):
            return saved["run_id"]
        found = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`aggbench.cell_id` = '{self.cell_id}'", max_results=5
        )
        self.created = not found
        if found:
            run_id = sorted(found, key=lambda r: r.info.start_time)[0].info.run_id
        else:
            run = self.client.create_run(
                self.experiment_id, run_name=self.cell_id, tags={"aggbench.cell_id": self.cell_id}
            )
            run_id = run.info.run_id
        if marker is not None:  # atomic: a crash never leaves a torn marker
            write_atomic(marker, json.dumps({**_store_record(self.uri, marker), "run_id": run_id}))
        return run_id

    def _alive(self, run_id: str) -> bool:
        """Whether the store holds ``run_id``, not deleted (a marker outlives a deleted run or store)."""
        try:
            return self.client.get_run(run_id).info.lifecycle_stage == "active"
        except Exception as exc:  # RESOURCE_DOES_NOT_EXIST; a locked database is retried by the caller
            if _transient(exc):
                raise
            return False

    def set_tags(self, tags: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        items = [RunTag(k, tag_value(v)) for k, v in tags.items()]
        for i in range(0, len(items), BATCH):
            _retry(self.client.log_batch, self.run_id, tags=items[i : i + BATCH])

    def param_conflicts(self, params: dict[str, str]) -> list[str]:
        """``key: 'in MLflow' -> 'given'`` for each param the run holds with another value, or that
        ``params`` lacks (a key ``params`` adds is not a conflict: a field added since the run began)."""
        have = _retry(self.client.get_run, self.run_id).data.params
        return [
            f"{k}: {v!r} -> {params.get(k, '<absent>')!r}"
            for k, v in sorted(have.items())
            if params.get(k) != v
        ]

    def log_params(self, params: dict[str, str], have: Mapping[str, str] | None = None) -> int:
        """Log the params the run lacks (MLflow refuses to change one: check ``param_conflicts``
        first), ``BATCH`` per call; ``have``: the run's params when the caller just read them.
        Returns how many were logged."""
        from mlflow.entities import Param

        if have is None:
            have = _retry(self.client.get_run, self.run_id).data.params
        items = [Param(k, v) for k, v in params.items() if k not in have]
        for i in range(0, len(items), BATCH):
            _retry(self.client.log_batch, self.run_id, params=items[i : i + BATCH])
        return len(items)

    def status(self) -> str:
        return _retry(self.client.get_run, self.run_id).info.status

    def set_status(self, status: str) -> None:
        """RUNNING and SCHEDULED keep the run open; FINISHED, FAILED and KILLED end it (end time set)."""
        if status in ("RUNNING", "SCHEDULED"):
            _retry(self.client.update_run, self.run_id, status=status)
        else:
            _retry(self.client.set_terminated, self.run_id, status)

    def delete(self) -> None:
        """Delete the run (MLflow cannot delete single metric values: a run whose history disagrees
        with its files is deleted and rebuilt from them, ``report.ingest``)."""
        _retry(self.client.delete_run, self.run_id)

    def synced_steps(self) -> set[int]:
        """Steps whose whole batch reached MLflow (the sentinel is logged in the same transaction)."""
        return {int(m.step) for m in _retry(self.client.get_metric_history, self.run_id, SENTINEL)}

    def last_synced_step(self) -> int:
        return max(self.synced_steps(), default=0)

    def sync(self, rows: Iterable[dict[str, Any]], *, upto: int | None = None) -> int:
        """Log every row with step <= upto that MLflow lacks (a gap is filled too); return the count."""
        from mlflow.entities import Metric

        done = self.synced_steps()
        logged = 0
        for row in rows:
            step = int(row["step"])
            if step in done or (upto is not None and step > upto):
                continue
            ts = int(row.get("time", time.time()) * 1000)
            metrics = [
                Metric(k, float(v), ts, step)
                for k, v in row.items()
                if k not in ("step", "time", SENTINEL)
                and isinstance(v, int | float)
                and not isinstance(v, bool)
            ]
            metrics.append(Metric(SENTINEL, float(step), ts, step))  # last: marks the step as synced
            if len(metrics) > METRICS_PER_BATCH:
                raise ValueError(
                    f"step {step} has {len(metrics)} metrics; MLflow's log_batch takes at most "
                    f"{METRICS_PER_BATCH}"
                )
            _retry(self.client.log_batch, self.run_id, metrics=metrics)
            logged += 1
        return logged

    def log_step_metrics(
        self, step: int, values: Mapping[str, float], tags: dict[str, str] | None = None
    ) -> tuple[list[str], list[str]]:
        """Log ``values`` at ``step``, idempotently, then ``tags``: (logged keys, skipped keys).

        A key that already has a value at ``step`` (read through ``metric_history``) is skipped, so
        re-running never stores a second value (nor replaces the first); the rest go in ``log_batch``
        calls of ``METRICS_PER_BATCH``. A checkpoint's evaluation metrics at its training step come
        this way, live (``aggbench evaluate``) and replayed from the files (``aggbench ingest``).
        """
        from mlflow.entities import Metric

        logged, skipped = [], []
        now = int(time.time() * 1000)
        batch = []
        for key, value in values.items():
            if step in metric_history(self.client, self.run_id, key):
                skipped.append(key)
            else:
                batch.append(Metric(key, value, now, int(step)))
                logged.append(key)
        for i in range(0, len(batch), METRICS_PER_BATCH):
            _retry(self.client.log_batch, self.run_id, metrics=batch[i : i + METRICS_PER_BATCH])
        if tags:
            self.set_tags(tags)
        return logged, skipped

    def log_file(self, path: Path, folder: str) -> None:
        """The file ``path`` as an artifact of the run, under ``folder``."""
        _retry(self.client.log_artifact, self.run_id, str(path), folder)

    def clear_artifacts(self) -> None:
        """Delete the run's artifacts where its artifact store is a local directory (a remote store
        is left as it is: ``log_table`` then overwrites a table instead of appending to it)."""
        local = _local_path(self.client.get_run(self.run_id).info.artifact_uri)
        if local is not None and local.is_dir():
            for child in local.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()


def log_table(client: Any, run_id: str, frame: Any, artifact_file: str) -> None:
    """``frame`` (a pandas DataFrame) as the MLflow table ``artifact_file``, replacing one logged before.

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


def _local_path(uri: str) -> Path | None:
    """The directory of a ``file:`` (or scheme-less) artifact URI; None for a remote store."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme == "" and uri:
        return Path(uri)
    return None


def _store_record(uri: str, marker: Path) -> dict[str, str]:
    """mlflow_run.json's record of the store: a SQLite file as a path relative to the marker's folder
    (``store``), so a copied results directory finds its own store's run; a server by its URI."""
    if uri.startswith("sqlite:///"):
        return {"store": relative_to_file(uri[len("sqlite:///") :], marker)}
    return {"tracking_uri": uri}


def _same_store(saved: dict[str, Any], uri: str, marker: Path) -> bool:
    if "store" in saved:
        here = (marker.parent / saved["store"]).resolve()
        return uri.startswith("sqlite:///") and here == Path(uri[len("sqlite:///") :]).resolve()
    return saved.get("tracking_uri") == uri  # a marker written before the relative record


def _read_marker(path: Path) -> dict[str, Any] | None:
    """``mlflow_run.json``, or None when absent or unreadable (e.g. torn by a crash before writes were
    atomic): it is a cache, so the run is then found by its tag and the marker written again."""
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(saved, dict) and isinstance(saved.get("run_id"), str)
    return saved if ok else None


def metric_history(client: Any, run_id: str, key: str) -> dict[int, float]:
    """One value per step (the latest logged wins): every reader of MLflow metrics goes through this."""
    out: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        prev = out.get(int(m.step))
        if prev is None or m.timestamp >= prev[0]:
            out[int(m.step)] = (m.timestamp, m.value)
    return {s: v for s, (_, v) in sorted(out.items())}


def ui_url(server: str, experiment_id: str, search: str = "") -> str:
    """The UI address opening ``experiment_id`` on its runs (``UI_QUERY``), ``search`` the run filter."""
    query = UI_QUERY + (f"&searchFilter={quote(search)}" if search else "")
    return f"{server.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def finite(x: float) -> float:
    return x if math.isfinite(x) else float("nan")
