"""aggbench.report.stats: the Student-t interval and the peak-to-last drop, against hand values."""

from __future__ import annotations

import math

import pytest

from aggbench.report.stats import average_curve, curve_drop, t_interval, t_quantile


def test_t_quantiles_are_the_textbook_ones():
    # two-sided 95%: df 1 -> 12.706, df 2 -> 4.303, df 9 -> 2.262 (any t table)
    assert t_quantile(1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(2) == pytest.approx(4.3027, abs=1e-4)
    assert t_quantile(9) == pytest.approx(2.2622, abs=1e-4)
    with pytest.raises(ValueError, match="df >= 1"):
        t_quantile(0)


def test_t_interval_by_hand():
    # 40, 50, 60: mean 50, s = 10, half-width 4.3027 * 10 / sqrt(3) = 24.842
    lo, hi = t_interval([40.0, 50.0, 60.0])
    assert (lo, hi) == pytest.approx((50 - 24.842, 50 + 24.842), abs=1e-3)
    # two values 30, 50: s = 14.142, half-width 12.706 * 14.142 / sqrt(2) = 127.06
    lo, hi = t_interval([30.0, 50.0])
    assert hi - 40.0 == pytest.approx(12.7062 * math.sqrt(200) / math.sqrt(2), abs=1e-3)
    with pytest.raises(ValueError, match="two values or more"):
        t_interval([1.0])


def test_drop_uses_the_average_over_benchmarks_at_complete_steps():
    evals = {"a": {4: 0.2, 8: 0.6, 12: 0.3, 16: 0.9}, "b": {4: 0.4, 8: 0.4, 12: 0.3}}
    # step 16 lacks b: not a point of the curve
    assert average_curve(evals, ["a", "b"]) == pytest.approx({4: 0.3, 8: 0.5, 12: 0.3})
    assert curve_drop(average_curve(evals, ["a", "b"])) == pytest.approx(0.2)  # peak .5 at 8, last .3 at 12
    assert curve_drop(average_curve({"a": {4: 0.1, 8: 0.5}}, ["a"])) == 0.0  # last is the peak
    assert average_curve({"a": {4: 0.1}, "b": {8: 0.5}}, ["a", "b"]) == {}  # no step has both
