"""Reading a grid's metrics from MLflow for the report (see ``aggbench.report.tables`` for the tables).

``collect`` reads, once, every cell's tabulated evaluation metric and its training curves (through
``metric_history``, one value per step) and every base model's step-0 evaluation; ``Collected``
holds them for the tables (``aggbench.report.tables``) and the plots (``aggbench.report.plots``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aggbench import layout, metric_names
from aggbench.grid import Cell, cells, eval_steps, results_dir, total_steps
from aggbench.report.ingest import base_id, find_runs
from aggbench.run_config import data_changes
from aggbench.tracking import SENTINEL, metric_history

TRAIN_KEYS = ("loss/pg", "len/pos_mean", "len/neg_mean", "len/gap", "accuracy", "reward/mean")


@dataclass
class CellData:
    """One cell's MLflow data. evals: {benchmark: {step: percent}} (MLflow's unit for proportions,
    ``metric_names.in_mlflow_units``); train: {key: {step: value}}."""

    cell: Cell
    run_id: str | None
    has_files: bool
    total: int
    expected: list[int]
    evals: dict[str, dict[int, float]] = field(default_factory=dict)
    train: dict[str, dict[int, float]] = field(default_factory=dict)
    rule_version: str | None = None  # what the run was trained under (aggregation.json, else its tag)
    expected_version: str | None = None  # the grid's rule version today
    # the evaluation's counts (metric_names.EVAL_COUNTS): {"not_generated" | "context_capped" |
    # "not_judged" | "n_problems": {benchmark: {step: n}}}
    context: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)
    # what the evaluation noted per benchmark (MLflow tag eval/{benchmark}/notes): "public tests only"
    # for a code benchmark graded on its public tests only
    bench_notes: dict[str, str] = field(default_factory=dict)
    # the grader-disagreement ledger (aggbench.grading.ledger): {count: {benchmark: {step: n}}}
    ledger: dict[str, dict[str, dict[int, float]]] = field(default_factory=dict)
    # the evaluation's bootstrap interval of the tabulated metric, where it has one (avg@n):
    # {benchmark: {step: (low, high)}} in percent; shown when a row has one seed
    ci: dict[str, dict[int, tuple[float, float]]] = field(default_factory=dict)
    # fields that change training and differ between the config the cell was trained under
    # (config.resolved.yaml) and the one the grid gives it now: a grid edited after training
    config_changes: list[str] = field(default_factory=list)
    # the training record sets a resume went on to after the first (run_config.data_changes: a
    # resume told to continue on other records with --allow-config-change)
    data_changes: list[str] = field(default_factory=list)

    @property
    def stale(self) -> bool:
        """Trained under another version of its rule: its numbers mean something else, never tabled."""
        return (
            None not in (self.rule_version, self.expected_version)
            and self.rule_version != self.expected_version
        )

    @property
    def trained_to(self) -> int:
        return max(self.train.get(SENTINEL, {}), default=0)

    def complete_steps(self, benchmarks: Sequence[str]) -> list[int]:
        """Evaluation steps at which every benchmark has a value."""
        steps = set.intersection(*(set(self.evals.get(b, {})) for b in benchmarks)) if benchmarks else set()
        return sorted(steps)

    def issue(self, benchmarks: Sequence[str]) -> str | None:
        """Why this cell is missing or unfinished, or None."""
        if self.stale:
            return (
                f"trained under {self.cell.aggregation} version {self.rule_version}, but the grid's rule is "
                f"version {self.expected_version}: not tabled (the rule's meaning changed; retrain the cell "
                "after moving its run directory away)"
            )
        if self.run_id is None:
            why = "run files exist; run `aggbench ingest`" if self.has_files else "no run files either"
            return f"no MLflow run ({why})"
        parts = []
        if self.config_changes:
            shown = ", ".join(self.config_changes[:3]) + (", ..." if len(self.config_changes) > 3 else "")
            parts.append(
                f"trained under another config than the grid's now ({shown}); a finished cell is not "
                "retrained when the grid changes: to retrain it, move its run directory away and delete "
                "its MLflow run (the new run's params would conflict with the old one's)"
            )
        if self.data_changes:
            parts.append(
                f"continued on other training records ({'; '.join(self.data_changes)}; data.json): its "
                "later steps read prompts its seed never chose from the first set"
            )
        if self.trained_to < self.total:
            parts.append(f"trained to step {self.trained_to} of {self.total}")
        have = self.complete_steps(benchmarks)
        if not set(self.expected) <= set(have):
            parts.append(f"evaluated at steps {_steps(have)} of {_steps(self.expected)}")
        if extra := sorted(set(have) - set(self.expected)):  # its peaks and drop run over them too
            parts.append(
                f"evaluated at steps {_steps(extra)} that the grid does not evaluate now (total_steps or "
                "evaluation.every changed since it ran): tabled with the others"
            )
        return "; ".join(parts) or None


@dataclass
class Collected:
    """Everything the tables and plots need, read from MLflow once."""

    exp: dict
    metric: str  # as shown: avg@4, or avg@n (per benchmark) when n differs
    benchmarks: list[str]
    keys: dict[str, str]  # benchmark -> MLflow key of the tabulated metric
    cells: list[CellData]
    base: dict[str, dict[str, float]]  # model -> benchmark -> percent at step 0
    base_expected: bool
    base_ci: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)  # as ``base``
    base_problems: dict[str, dict[str, int]] = field(default_factory=dict)  # model -> benchmark -> n

    def blocks(self) -> list[tuple[str, str]]:
        return list(dict.fromkeys((c.cell.model, c.cell.dataset) for c in self.cells))

    def tidy(self) -> list[dict[str, Any]]:
        """Every tabulated value read from MLflow, one dict per (cell or base, benchmark, step)."""
        rows = [
            {"model": m, "dataset": "", "aggregation": "base", "seed": "", "cell_id": base_id(m), "benchmark": b,
             "step": 0, "value": v}
            for m, by_b in self.base.items() for b, v in by_b.items()
        ]  # fmt: skip
        for c in self.cells:
            for b, by_step in c.evals.items():
                rows += [
                    {"model": c.cell.model, "dataset": c.cell.dataset, "aggregation": c.cell.aggregation,
                     "seed": c.cell.seed, "cell_id": c.cell.id, "benchmark": b, "step": t, "value": v}
                    for t, v in sorted(by_step.items())
                ]  # fmt: skip
        return rows

    def rule_cells(self, model: str, dataset: str) -> dict[str, list[CellData]]:
        """{rule instance: its cells (one per seed)}, in the config's order."""
        out: dict[str, list[CellData]] = {}
        for c in self.cells:
            if (c.cell.model, c.cell.dataset) == (model, dataset):
                out.setdefault(c.cell.aggregation, []).append(c)
        return out


def _steps(steps: Iterable[int]) -> str:
    return ", ".join(map(str, steps)) or "none"


def check_metric_name(metric: str) -> str:
    """``metric`` if ``report --metric`` can tabulate it (avg@n, maj@n, pass@n, or one of them with
    a number k: pass@1, avg@4); else ValueError listing the valid forms."""
    if not metric_names.is_report_metric(metric):
        raise ValueError(
            f"unknown metric {metric!r}; use avg@n, maj@n or pass@n (n = the benchmark's samples per "
            "problem), or avg@K, maj@K, pass@K with a number K (e.g. pass@1)"
        )
    return metric


def metric_name(benchmark: str, metric: str, exp: dict) -> str:
    """``avg@n``, ``maj@n``, ``pass@n`` with n = the benchmark's samples per problem (the grid's
    ``evaluation.n``, else the benchmark's own); any other name (``pass@1``) as it is."""
    if not metric.endswith("@n"):
        return metric
    n = exp.get("evaluation", {}).get("n")
    if not n:
        from aggbench.data import load_benchmark_spec

        n = load_benchmark_spec(benchmark).sampling.n
    return f"{metric[:-2]}@{n}"


def metric_key(benchmark: str, metric: str, exp: dict) -> str:
    """MLflow key of ``metric`` for one benchmark (see ``metric_name``)."""
    return metric_names.mlflow_key(benchmark, metric_name(benchmark, metric, exp))


def metric_label(benchmarks: Sequence[str], metric: str, exp: dict) -> str:
    """``avg@4``, or ``avg@n (a: avg@4, b: avg@16)`` when n differs between benchmarks."""
    names = {b: metric_name(b, metric, exp) for b in benchmarks}
    if len(set(names.values())) == 1:
        return next(iter(names.values()))
    return f"{metric} (" + ", ".join(f"{b}: {m}" for b, m in names.items()) + ")"


def _trained_version(run_dir: Any, run: Any) -> str | None:
    """The rule version a cell was trained under: its run directory's aggregation.json (written
    when training starts, kept on resumes), else its MLflow tag ``aggregation.version``."""
    import json

    path = layout.rule_file(run_dir)
    if path.is_file():
        try:
            return str(json.loads(path.read_text())["version"])
        except (ValueError, KeyError, TypeError):
            pass
    tag = run.data.tags.get("aggregation.version") if run is not None else None
    return str(tag) if tag is not None else None


def config_changes(exp: dict) -> dict[str, list[str]]:
    """{cell id: what a resume would refuse} (``run_config.resume_conflicts``: the fields that change
    training) between each cell's stored resolved config and the config the grid gives it now; a
    cell before the trainer wrote one is left out. Computed once per report (each table set's
    ``collect`` is handed it), the dataset specs loaded once per dataset."""
    from aggbench.grid import cell_train_config
    from aggbench.run_config import ResolvedUnreadable, read_resolved, resume_conflicts

    root, specs, out = results_dir(exp), {}, {}
    for c in cells(exp):
        try:
            previous = read_resolved(layout.run_dir(root, c.id))
        except ResolvedUnreadable as exc:
            out[c.id] = [f"{exc.path.name} unreadable ({exc.cause})"]
            continue
        if previous is not None:
            out[c.id] = resume_conflicts(previous, cell_train_config(exp, c.id, specs=specs))
    return out


def collect(
    exp: dict,
    client: Any,
    *,
    metric: str = "avg@n",
    train_keys: Sequence[str] = TRAIN_KEYS,
    rule_versions: Mapping[str, str] | None = None,
    changes: Mapping[str, list[str]] | None = None,
) -> Collected:
    """Read every cell's and base model's metrics (through ``metric_history``) from MLflow.

    rule_versions: {aggregation instance: its rule's version now}; a cell trained under another
    version is collected without its numbers (``CellData.stale``), so no table mixes two meanings.
    changes: ``config_changes(exp)``, computed here when not given.
    """
    benchmarks = list(exp["benchmarks"])
    check_metric_name(metric)
    keys = {b: metric_key(b, metric, exp) for b in benchmarks}
    runs, _ = find_runs(client, exp["experiment"])
    _check_metric(keys, runs.values())
    # ci_low/ci_high bound avg@n, n the samples per problem: the interval of this metric only
    boot = [b for b in benchmarks if metric_name(b, metric, exp) == metric_name(b, "avg@n", exp)]
    root, changes = results_dir(exp), config_changes(exp) if changes is None else changes
    out = []
    for c in cells(exp):
        run, run_dir = runs.get(c.id), layout.run_dir(root, c.id)
        data = CellData(
            c,
            run.info.run_id if run else None,
            run_dir.is_dir(),
            total_steps(exp, c.model),
            eval_steps(exp, c.model),
        )
        data.expected_version = (rule_versions or {}).get(c.aggregation)
        data.rule_version = _trained_version(run_dir, run)
        data.config_changes, data.data_changes = changes.get(c.id, []), data_changes(run_dir)
        if run is not None and not data.stale:
            rid = run.info.run_id
            # A cell run's step 0 is the base model's evaluation, copied there by ingest so the
            # cell's curves start at 0; the tables keep it in the base row, so a rule's peak and
            # drop are over its trained checkpoints only.
            data.evals = {b: _trained(metric_history(client, rid, k)) for b, k in keys.items()}
            data.ci = {b: _trained(_ci(client, rid, b)) for b in boot}
            data.context = {
                kind: {
                    b: _trained(metric_history(client, rid, metric_names.count_key(b, kind, metric)))
                    for b in benchmarks
                }
                for kind in metric_names.EVAL_COUNTS
            }
            data.ledger = {  # the sampled responses' verdicts: not the greedy protocol's
                kind: {
                    b: _trained(metric_history(client, rid, metric_names.mlflow_key(b, kind)))
                    for b in benchmarks
                }
                for kind in metric_names.LEDGER_COUNTS
                if metric != metric_names.GREEDY
            }
            data.bench_notes = {
                b: note
                for b in benchmarks
                if (note := run.data.tags.get(metric_names.mlflow_key(b, "notes")))
            }
            weights = [f"agg/{c.aggregation}/{w}" for w in ("weight_pos", "weight_neg", "weight_ratio")]
            wanted = [SENTINEL, *train_keys, *weights]
            data.train = {k: metric_history(client, rid, k) for k in wanted}
        out.append(data)
    base_expected = bool(exp.get("evaluation", {}).get("base_model", True))
    label = metric_label(benchmarks, metric, exp)
    col = Collected(exp, label, benchmarks, keys, out, {}, base_expected)
    for model in exp["models"]:
        run = runs.get(base_id(model))
        if run is not None:
            _collect_base(col, client, model, run.info.run_id, boot, metric)
    return col


def _collect_base(
    col: Collected, client: Any, model: str, run_id: str, boot: Sequence[str], metric: str
) -> None:
    """``model``'s step-0 evaluation into ``col``: its values, avg@n intervals (``boot``: the
    benchmarks whose tabulated metric is avg@n) and the problems each was scored on."""
    hist = {b: metric_history(client, run_id, k) for b, k in col.keys.items()}
    col.base[model] = {b: h[0] for b, h in hist.items() if 0 in h}
    cis = {b: _ci(client, run_id, b) for b in boot}
    col.base_ci[model] = {b: ci[0] for b, ci in cis.items() if 0 in ci}
    sizes = {
        b: metric_history(client, run_id, metric_names.count_key(b, "n_problems", metric)) for b in col.keys
    }
    col.base_problems[model] = {b: int(h[0]) for b, h in sizes.items() if 0 in h}


def _trained(by_step: dict[int, Any]) -> dict[int, Any]:
    """A cell's values at its trained checkpoints (steps > 0)."""
    return {t: v for t, v in by_step.items() if t > 0}


def _ci(client: Any, run_id: str, benchmark: str) -> dict[int, tuple[float, float]]:
    """{step: (ci_low, ci_high)} of one benchmark's evaluations (steps having both bounds)."""
    lo = metric_history(client, run_id, metric_names.mlflow_key(benchmark, "ci_low"))
    hi = metric_history(client, run_id, metric_names.mlflow_key(benchmark, "ci_high"))
    return {t: (lo[t], hi[t]) for t in lo if t in hi}


def _check_metric(keys: Mapping[str, str], runs: Iterable[Any]) -> None:
    """A benchmark whose tabulated key no run has, while runs hold other metrics of it, means a
    wrong --metric (or evaluation.n changed): say which names exist instead of an empty table."""
    seen: set[str] = set()
    for r in runs:
        seen.update(r.data.metrics)
    for bench, key in keys.items():
        prefix = metric_names.mlflow_prefix(bench)
        others = sorted(metric_names.from_mlflow(k, bench) for k in seen if k.startswith(prefix))
        if key not in seen and others:
            raise ValueError(
                f"no run has {key} ({bench}); its metrics in MLflow are: {', '.join(others)}; "
                "choose one with --metric (avg@n, maj@n and pass@n use the grid's n)"
            )
