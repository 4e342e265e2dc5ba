"""Evaluation metric names, in one place: ``avg@k``, ``pass@k``, ``maj@k`` (k a sample count), the
report's ``@n`` form (n = the benchmark's samples per problem), and their MLflow keys
``eval/{benchmark}/{name}`` with ``@`` spelled ``_at_`` (MLflow refuses ``@``).

Benchmark specs (data/), scoring and metrics (evaluation/) and the report all parse names here.
"""

from __future__ import annotations

import re

KINDS = ("avg", "pass", "maj")
# the context policy's per-benchmark counts (aggbench.evaluation.context): prompts longer than the
# model's context (not generated, graded wrong) and responses whose max_tokens the context cut short
CONTEXT_COUNTS = ("not_generated", "context_capped")
_METRIC = re.compile(r"^(avg|pass|maj)@([1-9][0-9]*)$")
_REPORT_METRIC = re.compile(r"^(avg|pass|maj)@(n|[1-9][0-9]*)$")


def parse(name: str) -> tuple[str, int] | None:
    """``"pass@4"`` -> ``("pass", 4)``; a name that is not kind@k (k >= 1) -> None."""
    m = _METRIC.match(name)
    return (m.group(1), int(m.group(2))) if m else None


def is_report_metric(name: str) -> bool:
    """kind@k, or kind@n (n resolved per benchmark by the report)."""
    return bool(_REPORT_METRIC.match(name))


def mlflow_key(benchmark: str, name: str) -> str:
    """``eval/{benchmark}/{name}`` with ``@`` spelled ``_at_``."""
    return f"{mlflow_prefix(benchmark)}{name.replace('@', '_at_')}"


def mlflow_prefix(benchmark: str) -> str:
    return f"eval/{benchmark}/"


def from_mlflow(key: str, benchmark: str) -> str:
    """The metric name of an MLflow key of ``benchmark`` (inverse of :func:`mlflow_key`)."""
    return key[len(mlflow_prefix(benchmark)) :].replace("_at_", "@")
