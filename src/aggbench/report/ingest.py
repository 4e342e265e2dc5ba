"""Run files -> MLflow, idempotently, and the check that MLflow still agrees with the files.

The files under ``results/`` are the source of truth::

    results/runs/{cell}/metrics.jsonl                      one row per training step
    results/runs/{cell}/checkpoints/step_{N}/COMPLETE      steps up to the latest one are committed
    results/runs/{cell}/eval/step_{N}/{bench}.metrics.json evaluation summary at training step N
    results/base/{model}/eval/step_0/{bench}.metrics.json  the base model, evaluated once per model

``ingest`` mirrors them into one MLflow run per cell (tag ``aggbench.cell_id``) and one run per
model for its base evaluation (``{model}__base``; its step 0 is also logged into each of the
model's cells, so their eval curves start at step 0), through the same idempotent writers the trainer
and the evaluator use (``MlflowRun.sync``; ``MlflowRun.log_step_metrics`` of
``metric_names.eval_to_mlflow``, as ``aggbench.evaluation.mlflow`` does), so running it twice, or after
a live-logging job, stores nothing twice. ``verify`` reads MLflow back and lists every value that is
in the files but missing or different in MLflow.

Training rows past the latest complete checkpoint are not committed (a resume cuts them off and
trains those steps again), so they are neither ingested nor checked: the trainer's own policy.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggbench import layout
from aggbench.grid import cells, results_dir, total_steps
from aggbench.metric_names import eval_metric_values, eval_to_mlflow
from aggbench.provenance import read_recorded_tags
from aggbench.tracking import (
    SENTINEL,
    MetricsLog,
    MlflowRun,
    init_store,
    metric_history,
    resolve_tracking_uri,
)

log = logging.getLogger("aggbench.ingest")
CELL_TAG = "aggbench.cell_id"
KIND_TAG = "aggbench.kind"


def base_id(model: str) -> str:
    """Cell id of a model's base (step 0) evaluation run."""
    return f"{model}__base"


def summary_id(experiment: str) -> str:
    """Cell id of the report's summary run."""
    return f"{experiment}__summary"


def tracking_uri(exp: dict) -> str:
    """The grid's MLflow store: config, else $MLFLOW_TRACKING_URI, else results_dir/mlflow.db.

    Computed from the results directory, not from a run directory, so the base runs (under
    ``results/base``) land in the same store as the cells (``resolve_tracking_uri`` maps only
    ``results/runs/<cell>`` to ``results/``).
    """
    return resolve_tracking_uri(exp.get("tracking_uri"), results_dir(exp).resolve() / "runs" / "_")


# --------------------------------------------------------------------------- run files


@dataclass
class Source:
    """The run files behind one MLflow run: a grid cell or a model's base evaluation."""

    cell_id: str
    run_dir: Path
    kind: str  # "cell" | "base"
    tags: dict[str, str] = field(default_factory=dict)
    total_steps: int = 0
    base_dir: Path | None = None  # a cell's model's base run: its step 0 is the cell's step 0 too

    def rows(self) -> list[dict[str, Any]]:
        return MetricsLog(layout.metrics_file(self.run_dir)).read()

    def committed_step(self, rows: Sequence[dict[str, Any]]) -> int:
        """The latest training step whose metrics are final (see the module docstring)."""
        done = layout.complete_steps(self.run_dir)
        if done:
            return done[-1]
        # No checkpoint left (deleted after training): only a run that reached its last step counts.
        if rows and int(rows[-1]["step"]) >= self.total_steps:
            return int(rows[-1]["step"])
        return 0

    def evals(self, upto: int) -> dict[int, dict[str, dict[str, Any]]]:
        """{step: {benchmark: metrics.json content}} of every evaluation on disk up to step ``upto``
        (the committed step: one past it evaluated a checkpoint that a retrain discarded); a cell
        without its own step 0 takes its base model's (``base_dir``), so its eval curves start at 0."""
        out = {step: by for step, by in _evals_in(self.run_dir).items() if step <= upto}
        if self.base_dir is not None and 0 not in out:
            base = _evals_in(self.base_dir).get(0)
            if base:
                out = {0: base, **out}
        return out


def _evals_in(run_dir: Path) -> dict[int, dict[str, dict[str, Any]]]:
    """{step: {benchmark: metrics.json content}} under ``run_dir``'s eval folder; the greedy
    protocol's metrics.json (``step_N/greedy/``) goes in as its benchmark's ``greedy`` entry."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    root = layout.eval_root(run_dir)
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        step = layout.step_of(d.name)
        if step is None or not d.is_dir():
            continue
        for bench, content in _metrics_files(d):
            out.setdefault(step, {}).setdefault(bench, {}).update(content)
        for bench, content in _metrics_files(layout.greedy_dir(d)):
            out.setdefault(step, {}).setdefault(bench, {})["greedy"] = content
    return out


def _metrics_files(d: Path) -> list[tuple[str, dict[str, Any]]]:
    """(benchmark, content) of every ``{benchmark}.metrics.json`` in folder ``d`` (none if absent)."""
    out = []
    for f in sorted(d.glob(f"*{layout.METRICS_SUFFIX}")) if d.is_dir() else []:
        if f.name.startswith("."):
            continue
        try:
            content = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{f}: not valid JSON ({exc.msg}); re-run its grade job") from None
        out.append((f.name[: -len(layout.METRICS_SUFFIX)], content))
    return out


def sources(exp: dict) -> list[Source]:
    """Every MLflow run the grid has files for, or should have: cells, then base models."""
    root = results_dir(exp)
    with_base = exp.get("evaluation", {}).get("base_model", True)
    out = [
        Source(
            c.id,
            layout.run_dir(root, c.id),
            "cell",
            {
                CELL_TAG: c.id,
                KIND_TAG: "cell",
                "model": c.model,
                "dataset": c.dataset,
                "aggregation": c.aggregation,
                "seed": str(c.seed),
            },
            total_steps(exp, c.model),
            layout.base_dir(root, c.model) if with_base else None,
        )
        for c in cells(exp)
    ]
    if with_base:
        for model in exp["models"]:
            tags = {CELL_TAG: base_id(model), KIND_TAG: "base", "model": model}
            out.append(Source(base_id(model), layout.base_dir(root, model), "base", tags, 0))
    return out


# --------------------------------------------------------------------------- ingest


def open_run(uri: str, experiment: str, cell_id: str, run_dir: Path | None) -> MlflowRun:
    """``MlflowRun``: a ``mlflow_run.json`` that names a run the store no longer has (the database
    was deleted and is being rebuilt from the files, or the run was deleted) is replaced;
    ``run_dir=None``: no marker file, the run is found by its tag."""
    return MlflowRun(uri, experiment, cell_id, run_dir)


def status_from_files(src: Source, rows: Sequence[dict[str, Any]], created: bool) -> str | None:
    """The status ingest gives a run (the policy in ``aggbench.tracking``), or None to leave it:
    FINISHED for a base model's run and for a cell whose files hold its last step; FAILED for a
    cell whose last segment stopped on a full disk (``failure.json``: the store may have been full
    too); SCHEDULED for a cell's run this ingest created while the cell is unfinished (no trainer
    logs to it)."""
    if src.kind != "cell" or (rows and src.committed_step(rows) >= src.total_steps):
        return "FINISHED"
    if layout.failure_file(src.run_dir).is_file():
        return "FAILED"
    return "SCHEDULED" if created else None


def log_cell_params(run: MlflowRun, run_dir: Path, have: Mapping[str, str] | None = None) -> int:
    """Give a cell's run the params its trainer gives it (``run_config.mlflow_fields`` of the resolved
    config: params, and resume-mutable fields as tags) when the run lacks them: a store rebuilt from
    the run files, or a run this ingest created. Params the run already holds (``have``: its params,
    when the caller has them) are never sent again. Returns how many."""
    import yaml

    from aggbench.run_config import mlflow_fields

    path = layout.resolved_config_file(run_dir)
    if not path.is_file():  # the trainer has not started this cell
        return 0
    params, tags = mlflow_fields(yaml.safe_load(path.read_text()))
    n = run.log_params(params, have=have)
    if n:
        run.set_tags(tags)
    return n


def ingest_source(src: Source, uri: str, experiment: str) -> dict[str, Any]:
    """Mirror one source's files into its MLflow run; returns what was logged. A run holding values
    its files do not (a discarded attempt) is replaced by one rebuilt from the files."""
    run = open_run(uri, experiment, src.cell_id, src.run_dir)
    replaced = None
    if not run.created and (stale := discarded_values(src, run.client, run.run_id)):
        replaced = run.run_id
        log.warning(
            "%s: MLflow run %s holds %d value(s) its run files do not (a discarded attempt, e.g. %s); "
            "it is deleted and rebuilt from the files",
            src.cell_id,
            run.run_id,
            len(stale),
            stale[0],
        )
        run.delete()  # MLflow cannot delete single metric values
        run = open_run(uri, experiment, src.cell_id, src.run_dir)
    before = run.client.get_run(run.run_id)
    have = before.data.tags
    # the trainer's tags from the run files (commit, versions, config hash, rule identity), then the grid's
    recorded = read_recorded_tags(src.run_dir) if src.kind == "cell" else {}
    changed = {k: v for k, v in {**recorded, **src.tags}.items() if have.get(k) != v}
    if changed:
        run.set_tags(changed)
    params = log_cell_params(run, src.run_dir, have=before.data.params) if src.kind == "cell" else 0
    rows = src.rows()
    committed = src.committed_step(rows)
    steps = run.sync(rows, upto=committed) if rows else 0
    eval_values = 0
    for step, by_bench in sorted(src.evals(upto=committed).items()):
        logged, _ = run.log_step_metrics(step, *eval_to_mlflow(by_bench))
        eval_values += len(logged)
    status = status_from_files(src, rows, run.created)
    if status is not None and status != before.info.status:
        run.set_status(status)
    return {
        "cell_id": src.cell_id,
        "run_id": run.run_id,
        "steps": steps,
        "eval_values": eval_values,
        "tags": len(changed),
        "params": params,
        "replaced": replaced,
    }


def discarded_values(src: Source, client: Any, run_id: str) -> list[Problem]:
    """Values the run holds that the committed files hold differently, or training steps the files
    do not hold: what an attempt left that the files discarded (a checkpoint deleted and retrained)."""
    return [
        p
        for p in verify_source(src, client, client.get_run(run_id))
        if p.kind == "different" or (p.kind == "extra" and p.step is not None)
    ]


def ingest(
    exp: dict, *, only: Sequence[str] | None = None, progress: bool | None = None
) -> list[dict[str, Any]]:
    """Ingest every source with files on disk (``only``: these cell ids). ``progress=None``: a bar
    when stderr is a terminal. Returns one summary dict per ingested source."""
    from tqdm.auto import tqdm

    todo = [s for s in sources(exp) if s.run_dir.is_dir()]
    if only:
        known = {s.cell_id for s in sources(exp)}
        unknown = sorted(set(only) - known)
        if unknown:
            raise ValueError(
                f"--cell {', '.join(unknown)}: not in this grid; known: {', '.join(sorted(known))}"
            )
        todo = [s for s in todo if s.cell_id in set(only)]
    uri = tracking_uri(exp)
    init_store(uri)
    out = []
    bar = tqdm(todo, desc="ingest", unit="run", disable=None if progress is None else not progress)
    for src in bar:
        bar.set_postfix_str(src.cell_id)
        out.append(ingest_source(src, uri, exp["experiment"]))
    return out


# --------------------------------------------------------------------------- verify


@dataclass(frozen=True)
class Problem:
    """A disagreement between the run files and MLflow. Errors: ``no_run``, ``missing``,
    ``different`` (the files hold something MLflow lacks or holds otherwise), ``extra`` (MLflow holds
    a training step or an evaluation that the committed files do not: rows cut off by a resume, an
    evaluation whose files were removed; ``aggbench ingest`` rebuilds such a run from the files) and
    ``no_files`` (MLflow holds a run for a grid cell whose run files are gone: a deleted run
    directory). Warning: ``duplicate_runs`` (several runs carry one cell's tag; readers use the
    earliest)."""

    cell_id: str
    kind: str
    key: str = ""
    step: int | None = None
    in_files: float | None = None
    in_mlflow: float | None = None

    @property
    def is_error(self) -> bool:
        return self.kind in ("no_run", "missing", "different", "extra", "no_files")

    def __str__(self) -> str:
        where = (
            f"{self.cell_id}"
            + (f" {self.key}" if self.key else "")
            + (f" @ step {self.step}" if self.step is not None else "")
        )
        if self.kind == "no_run":
            return f"{where}: run files exist but MLflow has no run tagged {CELL_TAG}={self.cell_id}"
        if self.kind == "missing":
            return f"{where}: {self.in_files!r} in the files, missing in MLflow"
        if self.kind == "different":
            return f"{where}: {self.in_files!r} in the files, {self.in_mlflow!r} in MLflow"
        if self.kind == "no_files":
            return (
                f"{where}: MLflow holds a run for this cell but its run files are gone (a deleted run "
                "directory): its values are not the grid's; retrain the cell (snakemake) or delete the run"
            )
        if self.kind == "duplicate_runs":
            return f"{self.cell_id}: {self.key}; the earliest is read"
        return f"{where}: in MLflow ({self.in_mlflow!r}) but not in the committed run files"


def summarize(problems: Sequence[Problem], *, each: int = 5) -> list[str]:
    """One line per problem, except that a cell with more than ``each`` problems of one kind gets
    one line saying how many, at which steps, and a few of the keys."""
    groups: dict[tuple[str, str], list[Problem]] = {}
    for p in problems:
        groups.setdefault((p.cell_id, p.kind), []).append(p)
    lines = []
    what = {
        "missing": "values in the files are missing in MLflow",
        "different": "values differ between the files and MLflow",
        "extra": "training steps or evaluations are in MLflow but not in the committed files",
    }
    for (cid, kind), ps in groups.items():
        if len(ps) <= each or kind not in what:
            lines += [str(p) for p in ps]
            continue
        steps = ", ".join(str(s) for s in sorted({p.step for p in ps if p.step is not None}))
        if kind == "different":  # the first values, as files vs MLflow
            eg = "; ".join(f"{p.key} @ {p.step}: {p.in_files!r} vs {p.in_mlflow!r}" for p in ps[:2]) + "; ..."
        else:
            keys = sorted({p.key for p in ps})
            eg = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
        lines.append(f"{cid}: {len(ps)} {what[kind]} at step(s) {steps} ({eg})")
    return lines


def find_runs(client: Any, experiment: str) -> tuple[dict[str, Any], dict[str, int]]:
    """({cell id: its MLflow run}, {cell id: number of runs when more than one}).

    With several runs for one cell (created concurrently by hand), the earliest wins, as in
    ``MlflowRun``.
    """
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return {}, {}
    found: dict[str, list[Any]] = {}
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token)
        for r in page:
            cid = r.data.tags.get(CELL_TAG)
            if cid:
                found.setdefault(cid, []).append(r)
        token = page.token
        if not token:
            break
    runs = {cid: min(rs, key=lambda r: r.info.start_time) for cid, rs in found.items()}
    return runs, {cid: len(rs) for cid, rs in found.items() if len(rs) > 1}


def _same(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b or math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _numeric(row: dict[str, Any]) -> dict[str, float]:
    """The values of a metrics row that ``MlflowRun.sync`` logs."""
    return {
        k: float(v)
        for k, v in row.items()
        if k not in ("step", "time", SENTINEL) and isinstance(v, int | float) and not isinstance(v, bool)
    }


def _compare(
    cid: str, expected: dict[str, dict[int, float]], history: Callable[[str], dict[int, float]]
) -> list[Problem]:
    out = []
    for key, by_step in sorted(expected.items()):
        hist = history(key)
        for step, value in sorted(by_step.items()):
            if step not in hist:
                out.append(Problem(cid, "missing", key, step, value))
            elif not _same(value, hist[step]):
                out.append(Problem(cid, "different", key, step, value, hist[step]))
    return out


def verify_source(src: Source, client: Any, run: Any | None) -> list[Problem]:
    """Every value in ``src``'s committed files that MLflow lacks or holds differently, and every
    training step or evaluation MLflow holds that the files do not."""
    if run is not None and not src.run_dir.is_dir():
        return [Problem(src.cell_id, "no_files")]
    rows = src.rows()
    committed = src.committed_step(rows)
    expected: dict[str, dict[int, float]] = {}
    for row in rows:
        if int(row["step"]) <= committed:
            for k, v in _numeric(row).items():
                expected.setdefault(k, {})[int(row["step"])] = v
    for step, by_bench in src.evals(upto=committed).items():
        for bench, metrics in by_bench.items():
            for k, v in eval_metric_values(bench, metrics).items():
                expected.setdefault(k, {})[step] = v
    if run is None:
        return [Problem(src.cell_id, "no_run")] if expected else []
    histories: dict[str, dict[int, float]] = {}  # each key read once (a tracking server is remote)

    def history(key: str) -> dict[int, float]:
        if key not in histories:
            histories[key] = metric_history(client, run.info.run_id, key)
        return histories[key]

    problems = _compare(src.cell_id, expected, history)
    file_steps = {int(r["step"]) for r in rows if int(r["step"]) <= committed}
    for key in sorted(k for k in run.data.metrics if k == SENTINEL or k.startswith("eval/")):
        have = file_steps if key == SENTINEL else set(expected.get(key, {}))
        for step, value in history(key).items():
            if step not in have:  # a directory with no committed values yet: all of the run's
                problems.append(Problem(src.cell_id, "extra", key, step, None, value))
    return problems


def verify(exp: dict, client: Any | None = None) -> list[Problem]:
    """Check MLflow against every source's files; errors first, then warnings."""
    client = client or init_store(tracking_uri(exp))
    runs, dupes = find_runs(client, exp["experiment"])
    problems = [
        Problem(cid, "duplicate_runs", f"{n} runs tagged {CELL_TAG}={cid}") for cid, n in dupes.items()
    ]
    for src in sources(exp):
        if src.run_dir.is_dir() or src.cell_id in runs:
            problems += verify_source(src, client, runs.get(src.cell_id))
    return sorted(problems, key=lambda p: (not p.is_error, p.cell_id, p.key, p.step or 0))
