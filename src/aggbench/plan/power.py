"""Power of a paired comparison of two aggregation rules: the seeds it needs, what it can detect.

The unit is a training seed: the two rules trained with the same seed give one paired difference of
a benchmark score, and the test is the two-sided paired t test on those differences (a one-sample t
test of the differences, df = n - 1). Its power at n pairs, a true mean difference ``delta`` and a
standard deviation ``sd`` of the differences is exact under normal differences: the noncentral t
distribution with noncentrality ``delta / sd * sqrt(n)``, both tails (not the normal approximation,
which overstates power at few seeds). The tails are scipy's ``nct``; statsmodels' ``TTestPower``
computes the same formula but takes the lower tail as ``nct.cdf(-c)``, which is NaN where it
underflows (df 1, noncentrality above ~10: a planner bisecting on it then accepts n = 2), so the
lower tail here is ``nct.sf(c)`` at the negated noncentrality, the same number, computed stably.

    seeds_needed(delta=1, sd=1)  -> 10 (achieved power 0.803, as standard power tables give)
    min_delta(n=10, sd=1)        -> 0.996

A pilot (a results directory, :func:`pilot`) gives ``sd`` from its own paired differences, and splits
it into what comes from training (seeds) and what from sampling k answers per problem, so the planner
can also say what more evaluation samples would buy: ``sd(k')^2 = sd_train^2 + sd_eval(k)^2 * k / k'``.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from aggbench.errors import InputError
from aggbench.layout import RUNS, eval_metrics_file, step_of

N_MIN = 2  # a paired t test needs two pairs (df = 1)
N_MAX = 1_000_000


class PowerError(InputError, ValueError):
    """A power question that has no answer (delta 0, sd <= 0, alpha or power outside (0, 1))."""


def _check(*, sd: float, alpha: float, power: float | None = None, delta: float | None = None) -> None:
    if not (sd > 0 and math.isfinite(sd)):
        raise PowerError(f"--sd must be a positive number (got {sd})")
    if not 0 < alpha < 1:
        raise PowerError(f"--alpha must lie in (0, 1) (got {alpha})")
    if power is not None and not 0 < power < 1:
        raise PowerError(f"--power must lie in (0, 1) (got {power})")
    if power is not None and power <= alpha:
        raise PowerError(
            f"--power must exceed --alpha (got power {power} <= alpha {alpha}): with no difference at all "
            "the test already rejects with probability alpha"
        )
    if delta is not None and (delta == 0 or not math.isfinite(delta)):
        raise PowerError(f"--delta must be a nonzero number (got {delta}): no number of seeds detects 0")


def achieved_power(n: int, delta: float, sd: float, alpha: float = 0.05) -> float:
    """Power of the two-sided paired t test with ``n`` pairs when the true mean difference is
    ``delta`` and the differences' standard deviation ``sd`` (noncentral t, both tails)."""
    from scipy.stats import nct, t

    _check(sd=sd, alpha=alpha)
    if n < N_MIN:
        raise PowerError(f"a paired t test needs at least {N_MIN} pairs (got n = {n})")
    df, nc = n - 1, abs(delta) / sd * math.sqrt(n)
    crit = float(t.isf(alpha / 2, df))
    out = float(nct.sf(crit, df, nc) + nct.sf(crit, df, -nc))  # P(T > c) + P(T < -c)
    if not math.isfinite(out):
        raise PowerError(
            f"power at n = {n}, delta/sd = {abs(delta) / sd:g} is not computable (scipy nct: {out})"
        )
    return out


def seeds_needed(delta: float, sd: float, alpha: float = 0.05, power: float = 0.8) -> int:
    """The smallest number of pairs (seeds) whose power reaches ``power`` (at least 2)."""
    _check(sd=sd, alpha=alpha, power=power, delta=delta)
    lo, hi = N_MIN, N_MIN
    while achieved_power(hi, delta, sd, alpha) < power:  # power rises with n: bracket, then bisect
        lo, hi = hi, hi * 2
        if hi > N_MAX:
            raise PowerError(f"more than {N_MAX} seeds would be needed for delta {delta} at sd {sd}")
    if lo == hi:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if achieved_power(mid, delta, sd, alpha) >= power else (mid, hi)
    return hi


def min_delta(n: int, sd: float, alpha: float = 0.05, power: float = 0.8) -> float:
    """The smallest true difference that ``n`` pairs detect with probability ``power``: the inverse
    of :func:`achieved_power` in delta (power rises with delta, so a root on a bracket)."""
    from scipy.optimize import brentq

    _check(sd=sd, alpha=alpha, power=power)
    if n < N_MIN:
        raise PowerError(f"a paired t test needs at least {N_MIN} pairs (got n = {n})")
    hi = sd
    while achieved_power(n, hi, sd, alpha) < power:
        hi *= 2
    return float(brentq(lambda d: achieved_power(n, d, sd, alpha) - power, 0.0, hi, xtol=1e-12 * sd))


@dataclass(frozen=True)
class Pilot:
    """A pilot's paired differences (points: 100 x the metric) of rule ``b`` minus rule ``a``."""

    a: str
    b: str
    benchmark: str
    metric: str
    step: int
    samples: int  # answers per problem (k)
    differences: dict[str, float]  # pair (model__dataset__s<seed>) -> b - a
    settings: int  # model x dataset settings among the pairs: the sd is pooled within each
    sd: float  # of the differences, pooled within settings (df = pairs - settings)
    # the part of it that k samples per problem add (binomial, from the graded files); None for a
    # metric other than avg@k (pass@k, maj@k), whose sampling variance the graded rows do not give so,
    # and for k = 1 (no problem answered twice: nothing to estimate it from)
    sd_eval: float | None
    sd_train: float | None  # the rest: what training seeds add (0 when sampling explains it all)

    def sd_at(self, samples: int) -> float:
        """The differences' standard deviation with ``samples`` answers per problem instead of k."""
        if self.sd_eval is None or self.sd_train is None:
            if samples == self.samples:
                return self.sd
            raise PowerError(
                f"--samples: the pilot's sd splits into training and sampling for avg@k only, not {self.metric}"
                if self.metric != f"avg@{self.samples}"
                else "--samples: the pilot's sd splits into training and sampling only with k >= 2 answers "
                "per problem (the pilot has 1): evaluate the pilot with n_samples >= 2"
            )
        return math.sqrt(self.sd_train**2 + self.sd_eval**2 * self.samples / samples)


def pilot(
    results: str | Path, a: str, b: str, benchmark: str, *, step: int | None = None, metric: str | None = None
) -> Pilot:
    """Paired differences ``b - a`` of a results directory's cells (same model, dataset and seed;
    the aggregation names ``a`` and ``b``) at ``step`` (default: the latest step every one of them
    evaluated, so no pair is read at another step). Their sd is pooled within model x dataset
    settings: settings whose mean differences differ by design (a lab's arms) do not add to it."""
    runs = Path(results) / RUNS
    if not runs.is_dir():
        raise PowerError(f"{results}: no {RUNS}/ folder; give a results directory (the report's) as --pilot")
    cells: dict[tuple[str, str], Path] = {}
    for run in sorted(runs.iterdir()):
        parts = run.name.split("__")
        if len(parts) == 4 and parts[2] in (a, b):
            cells[("__".join((parts[0], parts[1], parts[3])), parts[2])] = run
    pairs = sorted(p for p, rule in cells if rule == a and (p, b) in cells)
    if len(pairs) < N_MIN:
        found = sorted({rule for _, rule in cells}) or "none"
        raise PowerError(
            f"{results}: {len(pairs)} pair(s) of {a!r} and {b!r} cells with the same model, dataset and seed; "
            f"a pilot needs at least {N_MIN} (aggregations found among them: {found})"
        )
    at = step if step is not None else _common_step([cells[(p, r)] for p in pairs for r in (a, b)], benchmark)
    diffs, evals, k_seen, m_seen = {}, [], set(), set()
    for p in pairs:
        both = [cells[(p, a)], cells[(p, b)]]
        scores = []
        for run in both:
            score, var, k, name = _score(run, at, benchmark, metric)
            scores.append(score)
            evals.append(var)
            k_seen.add(k)
            m_seen.add(name)
        diffs[p] = scores[1] - scores[0]
    if len(k_seen) != 1 or len(m_seen) != 1:
        raise PowerError(
            f"{results}: the pilot's cells differ in samples per problem {sorted(k_seen)} or metric"
        )
    settings = _by_setting(diffs)
    df = len(diffs) - len(settings)
    if df < 1:
        raise PowerError(
            f"{results}: each model x dataset setting has one pair ({', '.join(settings)}); the sd of "
            "paired differences is taken within a setting, so one of them needs at least two seeds"
        )
    sd = math.sqrt(sum((d - statistics.fmean(ds)) ** 2 for ds in settings.values() for d in ds) / df)
    metric_name, k = m_seen.pop(), k_seen.pop()
    # of a difference: the two cells' sampling is independent. Only avg@k's is the graded rows' binomial.
    # One answer per problem (k = 1) gives no within-problem estimate: unsplit too (were it split, all
    # of the sd would be booked as training and more samples would seem to buy nothing).
    var_eval = 2 * statistics.fmean(evals) if metric_name == f"avg@{k}" and k >= 2 else None
    return Pilot(
        a=a,
        b=b,
        benchmark=benchmark,
        metric=metric_name,
        step=int(at),
        samples=k,
        differences=diffs,
        settings=len(settings),
        sd=sd,
        # at most the whole sd: where sampling explains all of it, training's part is 0 and sd_at(k)
        # is the pilot's sd at its own k (and falls with more samples, never rises)
        sd_eval=None if var_eval is None else min(math.sqrt(var_eval), sd),
        sd_train=None if var_eval is None else math.sqrt(max(0.0, sd**2 - var_eval)),
    )


def _by_setting(diffs: dict[str, float]) -> dict[str, list[float]]:
    """{model__dataset: its pairs' differences} from {model__dataset__s<seed>: difference}."""
    out: dict[str, list[float]] = {}
    for pair, d in diffs.items():
        out.setdefault(pair.rsplit("__", 1)[0], []).append(d)
    return out


def _common_step(runs: list[Path], benchmark: str) -> int:
    """The latest step at which every run evaluated ``benchmark``."""
    evaluated = {}
    for run in runs:
        evaluated[run] = {
            step
            for d in (run / "eval").glob("step_*")
            if (step := step_of(d.name)) is not None and eval_metrics_file(run, step, benchmark).is_file()
        }
        if not evaluated[run]:
            raise PowerError(f"{run}: no evaluation of {benchmark!r} (eval/step_N/{benchmark}.metrics.json)")
    common = set.intersection(*evaluated.values())
    if not common:
        last = ", ".join(f"{run.name} {max(steps)}" for run, steps in evaluated.items())
        raise PowerError(
            f"no step at which every pilot cell evaluated {benchmark!r} (last steps: {last}); every pair is "
            "read at one step: give a pilot directory whose cells share an evaluated step"
        )
    return max(common)


def _score(run: Path, step: int, benchmark: str, metric: str | None) -> tuple[float, float, int, str]:
    """(score in points, its sampling variance in points^2, k, metric name) of one cell at ``step``.

    The variance is the binomial one of k answers per problem over the fixed problems:
    sum_i p_i (1 - p_i) / k / P^2, with p_i (1 - p_i) estimated without bias by
    p^_i (1 - p^_i) k / (k - 1) from the graded file."""
    path = eval_metrics_file(run, step, benchmark)
    if not path.is_file():
        raise PowerError(f"{path} is missing: evaluate step {step} of {run.name}, or pass another --step")
    try:
        m = json.loads(path.read_text())
        k = int(m["n_samples"])
    except (ValueError, KeyError, TypeError) as exc:
        raise PowerError(
            f"{path}: not a grade job's metrics ({type(exc).__name__}: {exc}); re-run its grade job"
        ) from None
    name = metric or f"avg@{k}"
    if name not in m:
        raise PowerError(f"{path}: no metric {name!r} (metrics: {', '.join(sorted(m))})")
    if k < 2 or name != f"avg@{k}":
        # one answer per problem: no within-problem estimate; another metric than avg@k: its sampling
        # variance is not the binomial one. Either way the pilot leaves its sd unsplit (var unused).
        var = 0.0
    else:
        per = _graded(path.with_name(f"{benchmark}.jsonl"))
        var = (
            sum(statistics.fmean(c) * (1 - statistics.fmean(c)) / (len(c) - 1) for c in per.values())
            / len(per) ** 2
        )
    return 100 * float(m[name]), 1e4 * var, k, name


def _graded(path: Path) -> dict[str, list[bool]]:
    """{problem id: each sample's correctness} from a grade job's graded file (k >= 2 per problem)."""
    if not path.is_file():
        raise PowerError(
            f"{path} is missing: the sampling variance is computed from each evaluation's graded samples; "
            f"copy eval/step_N/{path.name} from the pilot's results beside its metrics.json"
        )
    # Lazy: the aggbench.data package imports pydantic, which `power --sd` never needs.
    from aggbench.data.jsonl import DataError, get_field, iter_jsonl

    per: dict[str, list[bool]] = {}
    try:  # iter_jsonl names the file and line for bytes that are not UTF-8, bad JSON and non-objects
        for lineno, row in iter_jsonl(path):
            correct = get_field(row, "correct", where=path, line=lineno)
            per.setdefault(str(get_field(row, "id", where=path, line=lineno)), []).append(bool(correct))
    except DataError as exc:
        raise PowerError(f"{exc}; not a grade job's graded file: re-run its grade job") from None
    short = [pid for pid, c in per.items() if len(c) < 2]
    if not per or short:
        what = "no graded rows" if not per else f"problem {short[0]!r} has one graded sample"
        raise PowerError(f"{path}: {what}, where its metrics say several per problem; re-run its grade job")
    return per


def plan(
    *,
    sd: float,
    alpha: float = 0.05,
    power: float = 0.8,
    delta: float | None = None,
    n: int | None = None,
) -> dict[str, Any]:
    """``{"n", "min_delta", "power"}``: with ``delta``, the seeds needed and the power they achieve
    (and the difference they detect); with ``n``, the minimum detectable difference (and the power
    at ``delta`` when given too)."""
    if delta is None and n is None:
        raise PowerError("give --delta (how many seeds are needed) or --n (what n seeds can detect), or both")
    n = n if n is not None else seeds_needed(delta, sd, alpha, power)
    detectable = min_delta(n, sd, alpha, power)
    return {
        "n": n,
        "min_delta": detectable,
        "power": achieved_power(n, detectable if delta is None else delta, sd, alpha),
    }


def pilot_summary(p: Pilot) -> dict[str, Any]:
    out = asdict(p)
    out["mean"] = statistics.fmean(p.differences.values())
    out["setting_means"] = {name: statistics.fmean(ds) for name, ds in _by_setting(p.differences).items()}
    return out
