"""Evaluation metrics over graded samples: avg@k, unbiased pass@k, maj@k and bootstrap intervals.

Shapes: P problems, k (or n) samples per problem. Every metric first scores each problem, then
averages over problems, so each problem weighs the same and :func:`bootstrap_ci` can resample
problems (the unit of sampling of a benchmark).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from aggbench.metric_names import parse as parse_metric

CorrectOfAnswer = Callable[[int, Hashable], bool] | Sequence[Mapping[Hashable, bool]]


def avg_at_k(correct: Any) -> float:
    """Mean correctness over all samples.

    correct: [P, k] bool or 0/1 (problem x sample). Every problem has k samples, so this equals
    the mean over problems of each problem's fraction correct.
    """
    arr = _binary_matrix(correct)
    return float(arr.mean())


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one problem with ``c`` correct out of ``n`` samples (Chen et al. 2021).

    pass@k = 1 - C(n-c, k) / C(n, k), computed as 1 - prod_{i=n-c+1}^{n} (1 - k / i), which
    never forms the huge binomials. 1.0 when fewer than k samples are wrong (n - c < k).
    """
    if not (0 <= c <= n) or not (1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_mean(correct: Any, k: int) -> float:
    """Mean unbiased pass@k over problems. correct: [P, n] bool or 0/1, k <= n."""
    arr = _binary_matrix(correct)
    n = arr.shape[1]
    return float(np.mean([pass_at_k(n, int(c), k) for c in arr.sum(axis=1)]))


def maj_at_k(
    answers: Sequence[Sequence[Hashable | None]], correct_of_answer: CorrectOfAnswer, *, k: int | None = None
) -> float:
    """Fraction of problems whose majority answer is correct.

    answers: [P][k] extracted (canonical) answers; None = no answer extracted. Only the first
    ``k`` samples of each problem are used when ``k`` is given.
    correct_of_answer: ``f(problem_index, answer) -> bool``, or one mapping answer -> bool per problem.

    Voting: the most frequent answer wins; a tie goes to the tied answer that appears FIRST among
    the samples (deterministic given sample order). No answer (None, or an empty or blank string:
    ``\\boxed{}``) never wins: a problem whose samples have none scores 0. Answers are compared as given (exact equality), so pass
    canonicalised strings (e.g. the grader's normalised form) if "0.5" and "1/2" should pool.
    """
    scores = [
        _vote_correct(p, list(row if k is None else row[:k]), correct_of_answer)
        for p, row in enumerate(answers)
    ]
    if not scores:
        raise ValueError("maj@k needs at least one problem")
    return float(np.mean(scores))


def majority_answer(row: Sequence[Hashable | None]) -> Hashable | None:
    """The voted answer of one problem (see :func:`maj_at_k` for the rule); None if none has one."""
    votes = [a for a in row if answered(a)]
    counts = Counter(votes)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in votes if counts[a] == best)


def answered(answer: Hashable | None) -> bool:
    """An answer that can take part in a vote: not None and not an empty or blank string."""
    return answer is not None and not (isinstance(answer, str) and not answer.strip())


def _vote_correct(p: int, row: list[Hashable | None], correct_of_answer: CorrectOfAnswer) -> float:
    winner = majority_answer(row)
    if winner is None:
        return 0.0
    ok = correct_of_answer(p, winner) if callable(correct_of_answer) else correct_of_answer[p][winner]
    return float(bool(ok))


def bootstrap_ci(
    per_problem_scores: Any, *, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0
) -> tuple[float, float]:
    """Percentile bootstrap interval for the mean over problems.

    per_problem_scores: [P] floats (a problem's avg@k, pass@k or maj@k score). Problems are
    resampled with replacement ``n_boot`` times; returns the alpha/2 and 1-alpha/2 quantiles of
    the resampled means. Deterministic for a given ``seed``.
    """
    scores = np.asarray(per_problem_scores, dtype=float).ravel()
    if scores.size == 0:
        raise ValueError("bootstrap_ci needs at least one problem score")
    if not (0.0 < alpha < 1.0) or n_boot < 1:
        raise ValueError(f"need 0 < alpha < 1 and n_boot >= 1; got alpha={alpha}, n_boot={n_boot}")
    rng = np.random.default_rng(seed)
    means = np.empty(n_boot)
    chunk = max(1, 2_000_000 // scores.size)  # bound the [chunk, P] index matrix's memory
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        means[start:stop] = scores[rng.integers(0, scores.size, size=(stop - start, scores.size))].mean(
            axis=1
        )
    lo, hi = np.quantile(means, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def summarize(
    records: Sequence[Mapping[str, Any]],
    *,
    metrics: Sequence[str] | None = None,
    id_key: str = "id",
    correct_key: str = "correct",
    answer_key: str = "extracted",
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, Any]:
    """All metrics for one benchmark's graded samples.

    records: one per sample, ``{id_key: problem id, correct_key: bool, answer_key: answer or None}``
    (``answer_key`` is optional; without it maj@k is skipped). Every problem must have the same
    number of samples n. ``metrics`` (e.g. a spec's ``["avg@4", "pass@1", "maj@4"]``) defaults to
    avg@n, pass@k for k in 1, 2, 4, ... and n, and maj@n when answers are present. avg@k and
    maj@k with k < n use each problem's first k samples; pass@k uses all n (unbiased estimator).
    maj@k here votes on answers as written (:func:`maj_at_k`); ``aggbench score`` computes its own,
    pooling the answers its grader calls one (``aggbench.evaluation.score.compute_metrics``).

    Returns ``{"n_problems", "n_samples", <metric>: value, "<metric>_ci": [lo, hi], ...}``.
    """
    by_problem: dict[Any, list[Mapping[str, Any]]] = {}
    for i, rec in enumerate(records):
        if id_key not in rec or correct_key not in rec:
            raise ValueError(f"graded record {i} lacks {id_key!r} or {correct_key!r}: {dict(rec)!r}")
        by_problem.setdefault(rec[id_key], []).append(rec)
    if not by_problem:
        raise ValueError("summarize needs at least one graded record")
    uneven = uneven_samples({pid: len(rows) for pid, rows in by_problem.items()})
    if uneven:
        raise ValueError(uneven)
    n = len(next(iter(by_problem.values())))
    rows = list(by_problem.values())
    correct = _binary_matrix([[r[correct_key] for r in row] for row in rows])
    has_answers = all(answer_key in r for row in rows for r in row)
    if metrics is None:
        ks = sorted({*(2**i for i in range(n.bit_length()) if 2**i <= n), n})
        metrics = [f"avg@{n}", *(f"pass@{k}" for k in ks), *([f"maj@{n}"] if has_answers else [])]
    out: dict[str, Any] = {"n_problems": len(rows), "n_samples": n}
    for metric in metrics:
        per_problem = _per_problem(metric, correct, rows, answer_key, correct_key, has_answers)
        out[metric] = float(per_problem.mean())
        out[f"{metric}_ci"] = list(bootstrap_ci(per_problem, n_boot=n_boot, alpha=alpha, seed=seed))
    return out


def uneven_samples(sizes: Mapping[Hashable, int], *, show: int = 5) -> str | None:
    """Why ``sizes`` (problem -> its number of samples) cannot be scored, or None when every
    problem has the same count. The message gives the most common count and the problems that
    differ from it (the first ``show``)."""
    counts = Counter(sizes.values())
    if len(counts) <= 1:
        return None
    usual = max(counts, key=lambda c: (counts[c], c))  # the most common count (ties: the larger)
    odd = [f"{pid!r}: {s}" for pid, s in sizes.items() if s != usual]
    more = f" and {len(odd) - show} more" if len(odd) > show else ""
    return (
        f"every problem needs the same number of samples; {counts[usual]} of {len(sizes)} problems "
        f"have {usual}, but {', '.join(odd[:show])}{more}"
    )


def _per_problem(
    metric: str,
    correct: np.ndarray,
    rows: list[list[Mapping[str, Any]]],
    answer_key: str,
    correct_key: str,
    has_answers: bool,
) -> np.ndarray:
    """[P] per-problem scores of one metric name (avg@k / pass@k / maj@k)."""
    parsed = parse_metric(metric)
    if parsed is None:
        raise ValueError(f"unknown metric {metric!r}; use avg@k, pass@k or maj@k")
    kind, k = parsed
    n = correct.shape[1]
    if k > n:
        raise ValueError(f"{metric} needs k <= the {n} samples per problem")
    if kind == "avg":
        return correct[:, :k].mean(axis=1)  # the first k samples, as sampled
    if kind == "pass":
        return np.array([pass_at_k(n, int(c), k) for c in correct.sum(axis=1)])
    if not has_answers:
        raise ValueError(f"{metric} needs extracted answers ({answer_key!r}) in every graded record")
    out = []
    for p, row in enumerate(rows):
        table: dict[Hashable, bool] = {}
        for r in row:
            a, ok = r[answer_key], bool(r[correct_key])
            if a is not None and table.setdefault(a, ok) != ok:
                raise ValueError(
                    f"answer {a!r} of problem {p} is graded both correct and wrong; the grader is inconsistent"
                )
        winner = majority_answer([r[answer_key] for r in row[:k]])
        out.append(0.0 if winner is None else float(table[winner]))
    return np.array(out)


def _binary_matrix(correct: Any) -> np.ndarray:
    arr = np.asarray(correct)
    if arr.ndim != 2 or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise ValueError(f"expected a non-empty [P, k] matrix of correctness, got shape {arr.shape}")
    if arr.dtype != bool and not np.isin(arr, (0, 1)).all():
        raise ValueError("correctness must be bool or 0/1")
    return arr.astype(float)
