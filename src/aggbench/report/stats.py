"""The report's statistics over seeds: Student-t intervals and the peak-to-last drop.

Definitions (docs/workflow.md, "Reading the tables", says the same):

* A table value with n >= 2 seeds is the mean over the per-seed values with a 95% Student-t
  interval, mean +- t(0.975, n - 1) * s / sqrt(n), s the sample standard deviation (ddof = 1). With
  3 seeds t = 4.30, with 2 seeds t = 12.71: an interval that wide is what two or three seeds can
  say, and it is shown rather than a +- std that looks tighter than the evidence.
* With one seed the value is that seed's, and a benchmark's interval is the evaluation's own
  bootstrap over problems (``ci_low``/``ci_high`` of avg@n, ``aggbench.evaluation.metrics``); the
  average column and other metrics have none.
* The peak-to-last drop (the paper's stability measure) of one seed is the peak minus the last value
  of its benchmark-average curve: the average over benchmarks at each evaluation step that has every
  benchmark, peak its maximum over those steps, last its value at the latest of them; in points, >= 0.
  The table shows its mean over seeds, with the t interval when there are several.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

LEVEL = 0.95


def t_quantile(df: int, level: float = LEVEL) -> float:
    """The two-sided Student-t quantile t((1 + level) / 2, df); df >= 1."""
    from scipy.stats import t

    if df < 1:
        raise ValueError(f"a Student-t interval needs df >= 1 (two values or more), got df={df}")
    return float(t.ppf((1.0 + level) / 2.0, df))


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """(low, high) of the ``level`` Student-t interval for the mean of ``values`` (two or more)."""
    n = len(values)
    if n < 2:
        raise ValueError(f"a Student-t interval needs two values or more, got {n}")
    mean = statistics.fmean(values)
    half = t_quantile(n - 1, level) * statistics.stdev(values) / math.sqrt(n)
    return mean - half, mean + half


def average_curve(evals: Mapping[str, Mapping[int, float]], benchmarks: Sequence[str]) -> dict[int, float]:
    """{step: mean over ``benchmarks`` of evals[b][step]} at the steps where every benchmark has a value.

    evals: {benchmark: {step: value}} of one seed.
    """
    if not benchmarks:
        return {}
    steps = set.intersection(*(set(evals.get(b, {})) for b in benchmarks))
    return {t: statistics.fmean(evals[b][t] for b in benchmarks) for t in sorted(steps)}


def curve_drop(curve: Mapping[int, float]) -> float:
    """Peak minus last value of a (non-empty) {step: value} curve: the peak-to-last drop (of one
    seed's benchmark average, ``average_curve``, in the tables' drop column)."""
    return max(curve.values()) - curve[max(curve)]
