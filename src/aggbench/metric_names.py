"""Evaluation metric names, in one place: ``avg@k``, ``pass@k``, ``maj@k`` (k a sample count), the
report's ``@n`` form (n = the benchmark's samples per problem), and their MLflow keys
``eval/{benchmark}/{name}`` with ``@`` spelled ``_at_`` (MLflow refuses ``@``).

Units: a benchmark's ``metrics.json`` holds proportions as fractions (0.734); MLflow holds them in
percent (73.4), as the tables and plots print them (:data:`PERCENT_NAMES`, :func:`in_mlflow_units`),
so a curve in the UI reads like the table beside it. Lengths and counts are the same in both.

Benchmark specs (data/), scoring and metrics (evaluation/) and the report all parse names here.
What one checkpoint's evaluation puts in its MLflow run (``eval_to_mlflow``) is decided here too: the
evaluator logs it (``aggbench.evaluation.mlflow``), ``aggbench ingest`` replays it from the files
and the report's check compares the store with it (``aggbench.report.ingest``), and report/ does not
import evaluation/.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

KINDS = ("avg", "pass", "maj")
# per-benchmark counts of responses the tables' notes name: not generated because their prompt is
# longer than the model's context (aggbench.evaluation.context; graded wrong), whose max_tokens the
# context cut short, and decided by the grading harness (a time-out, a crashed worker, an error;
# graded wrong)
NOTED_COUNTS = ("not_generated", "context_capped", "not_judged")
# ... and the problems a benchmark was scored on, which the report compares across a table's cells
# (an evaluation.limit or a trimmed samples file would put a score over other problems beside them)
EVAL_COUNTS = (*NOTED_COUNTS, "n_problems")
# the grader-disagreement ledger of an answer benchmark (aggbench.grading.ledger.LEDGER_COUNTS)
LEDGER_COUNTS = (
    "ledger_verdicts",
    "ledger_disagree",
    "ledger_vs_math_verify",
    "ledger_vs_dapo",
    "grading_timeouts",
)
# besides every avg@k/pass@k/maj@k: the proportions a metrics.json holds, logged to MLflow in percent
PERCENT_NAMES = ("ci_low", "ci_high", "truncation_rate", "prob_correct", "prob_uncovered")
# the built-in task's probability metric (aggbench.tiny.probability): computed, not sampled; its gate
# (prob_usable, 1 or 0) logged with it, so an MLflow curve of prob_correct is read beside it
PROBABILITY = ("prob_correct", "prob_uncovered", "prob_usable")
# the greedy n=1 protocol's accuracy (evaluation.greedy): one decode per problem at temperature 0
GREEDY = "greedy@1"
# what the greedy protocol's metrics.json gives its benchmark in MLflow: {name: its field there}
GREEDY_NAMES = {
    GREEDY: "avg@1",
    "greedy_mean_length": "mean_length",
    "greedy_truncation_rate": "truncation_rate",
    **{f"greedy_{kind}": kind for kind in EVAL_COUNTS},  # its own counts: the greedy tables' notes
}
_METRIC = re.compile(r"^(avg|pass|maj)@([1-9][0-9]*)$")
_REPORT_METRIC = re.compile(r"^(avg|pass|maj)@(n|[1-9][0-9]*)$|^greedy@1$")


def parse(name: str) -> tuple[str, int] | None:
    """``"pass@4"`` -> ``("pass", 4)``; a name that is not kind@k (k >= 1) -> None."""
    m = _METRIC.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def is_report_metric(name: str) -> bool:
    """kind@k, or kind@n (n resolved per benchmark by the report), or greedy@1."""
    return bool(_REPORT_METRIC.match(name))


def mlflow_key(benchmark: str, name: str) -> str:
    """``eval/{benchmark}/{name}`` with ``@`` spelled ``_at_``."""
    return f"{mlflow_prefix(benchmark)}{name.replace('@', '_at_')}"


def count_key(benchmark: str, kind: str, metric: str) -> str:
    """The MLflow key of an :data:`EVAL_COUNTS` count of the evaluation ``metric`` is computed on:
    the greedy protocol's own (``greedy_{kind}``) for greedy@1, which scores its own samples."""
    return mlflow_key(benchmark, f"greedy_{kind}" if metric == GREEDY else kind)


def mlflow_prefix(benchmark: str) -> str:
    return f"eval/{benchmark}/"


def from_mlflow(key: str, benchmark: str) -> str:
    """The metric name of an MLflow key of ``benchmark`` (inverse of :func:`mlflow_key`)."""
    return key[len(mlflow_prefix(benchmark)) :].replace("_at_", "@")


def in_mlflow_units(name: str, value: Any) -> float:
    """A metrics.json value as MLflow holds it: proportions (kind@k, :data:`PERCENT_NAMES`) in
    percent, the rest as they are."""
    return 100.0 * float(value) if parse(name) or name in PERCENT_NAMES else float(value)


def eval_metric_values(benchmark: str, metrics: Mapping[str, Any]) -> dict[str, float]:
    """The MLflow metrics of one benchmark's ``metrics.json`` content: every avg@/pass@/maj@ value
    (``metrics["metrics"]`` lists them), the CI of avg@n and the truncation rate, all in percent;
    the mean length, the problem and context counts and the grader ledger's counts as they are; and, where
    ``metrics["greedy"]`` holds the greedy protocol's metrics.json, :data:`GREEDY_NAMES` from it."""
    out = {
        mlflow_key(benchmark, m): in_mlflow_units(m, metrics[m])
        for m in metrics.get("metrics", [])
        if m in metrics
    }
    for name in (
        "ci_low",
        "ci_high",
        "mean_length",
        "truncation_rate",
        *PROBABILITY,
        *EVAL_COUNTS,
        *LEDGER_COUNTS,
    ):
        if metrics.get(name) is not None:
            out[mlflow_key(benchmark, name)] = in_mlflow_units(name, metrics[name])
    greedy = metrics.get("greedy") or {}  # the greedy protocol's own metrics.json, where it ran
    for name, field in GREEDY_NAMES.items():
        if greedy.get(field) is not None:
            out[mlflow_key(benchmark, name)] = in_mlflow_units(field, greedy[field])
    return out


def eval_to_mlflow(
    metrics_by_benchmark: Mapping[str, Mapping[str, Any]],
) -> tuple[dict[str, float], dict[str, str]]:
    """({MLflow key: value}, {tag: value}) of one checkpoint's evaluation, {benchmark: metrics.json
    content}: the metrics of every benchmark and, for a code benchmark graded on its public tests
    only, the tag ``eval/{benchmark}/notes``."""
    values: dict[str, float] = {}
    tags: dict[str, str] = {}
    for bench, metrics in metrics_by_benchmark.items():
        values.update(eval_metric_values(bench, metrics))
        if metrics.get("public_tests_only"):
            tags[mlflow_key(bench, "notes")] = "public tests only"
    return values, tags
