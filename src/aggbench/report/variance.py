"""Where the variance of a benchmark score comes from: training seed, evaluation sampling, problems.

A grid with two or more training seeds per row and ``evaluation.extra_seeds`` (each evaluated
checkpoint sampled again under other evaluation seeds: ``eval/step_N/eval_seed_K/``) gives, per row
(model x dataset x rule) and benchmark at the last step evaluated under every seed, a balanced
S x E x P design: y[s, e, p] is the fraction of problem p's n samples that are correct, for training
seed s and evaluation seed e. The random-effects model

    y[s, e, p] = mu + a[s] + b[p] + ab[s, p] + eps[s, e, p]

(a: training seed, b: problem, ab: their interaction, eps: evaluation sampling, all independent
with variances sa, sb, sab, se) makes the benchmark score X[s, e] = mean_p y[s, e, p] vary, over a
fresh training seed, evaluation seed and problem set of the same size P, by

    Var(X) = sa + sab / P + se / P + sb / P
             ^^   ^^^^^^^   ^^^^^^   ^^^^^^
             |    |         |        problems: which P problems the benchmark holds
             |    |         evaluation sampling: n answers per problem
             |    training seed x problem: where on these problems a run is better or worse
             training seed: how much better or worse a run is on every problem

The components are estimated from the ANOVA mean squares (their expectations: MS_e = se,
MS_sp = se + E sab, MS_s = se + E sab + E P sa, MS_p = se + E sab + S E sb; a negative estimate is
set to 0, as is usual for variance components). Written by hand: statsmodels' MixedLM fits one
grouping factor with variance components by REML iteratively, and the balanced crossed design has
these closed forms (Searle, Casella & McCulloch, Variance Components, ch. 4).

For a paired comparison of two rules on the same problems only b cancels: the seed x problem part
belongs to each training run (two rules at one seed are two runs), so on a fixed benchmark it adds
to a cell's variance as the training seed's does, and only more seeds buy either down; more samples
per problem buy down the sampling part (``aggbench power``); tests/report/test_variance.py
checks this on simulated pairs.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aggbench import grid, layout
from aggbench.data.jsonl import iter_jsonl

SOURCES = ("training seed", "seed x problem", "evaluation sampling", "problems")


@dataclass(frozen=True)
class Components:
    """The variance of one benchmark score split by source. training/seed_problem/sampling/problems
    are sa, sab/P, se/P and sb/P of Var(X) (fraction units squared; module docstring); S, E, P the
    design's sizes; mean the grand mean."""

    training: float
    seed_problem: float
    sampling: float
    problems: float
    mean: float
    S: int
    E: int
    P: int

    @property
    def total(self) -> float:
        return self.training + self.seed_problem + self.sampling + self.problems

    def shares(self) -> dict[str, float]:
        """{source: share of the total} (all 0 when the total is 0)."""
        values = (self.training, self.seed_problem, self.sampling, self.problems)
        parts = dict(zip(SOURCES, values, strict=True))
        return {k: (v / self.total if self.total > 0 else 0.0) for k, v in parts.items()}


def decompose(y: np.ndarray) -> Components:
    """``y`` [S, E, P]: per training seed, evaluation seed and problem, the fraction correct.
    Needs S >= 2, E >= 2, P >= 2 (else ValueError naming what is short)."""
    y = np.asarray(y, dtype=float)
    if y.ndim != 3:
        raise ValueError(f"y must be [training seeds, evaluation seeds, problems], got shape {y.shape}")
    S, E, P = y.shape
    if min(S, E, P) < 2:
        raise ValueError(
            f"a variance decomposition needs >= 2 training seeds, evaluation seeds and problems; got "
            f"{S}, {E}, {P}"
        )
    m = y.mean()
    m_s = y.mean(axis=(1, 2))  # [S]
    m_p = y.mean(axis=(0, 1))  # [P]
    m_sp = y.mean(axis=1)  # [S, P]
    ms_e = ((y - m_sp[:, None, :]) ** 2).sum() / (S * P * (E - 1))
    ms_sp = E * ((m_sp - m_s[:, None] - m_p[None, :] + m) ** 2).sum() / ((S - 1) * (P - 1))
    ms_s = E * P * ((m_s - m) ** 2).sum() / (S - 1)
    ms_p = S * E * ((m_p - m) ** 2).sum() / (P - 1)
    se = ms_e
    sab = max(0.0, (ms_sp - ms_e) / E)
    sa = max(0.0, (ms_s - ms_sp) / (E * P))
    sb = max(0.0, (ms_p - ms_sp) / (S * E))
    return Components(
        training=float(sa),
        seed_problem=float(sab / P),
        sampling=float(se / P),
        problems=float(sb / P),
        mean=float(m),
        S=S,
        E=E,
        P=P,
    )


def _per_problem(path: Path) -> dict[str, float]:
    """{problem id: fraction of its samples graded correct} of one graded samples file."""
    hits: dict[str, list[bool]] = {}
    for _, row in iter_jsonl(path):
        hits.setdefault(row["id"], []).append(bool(row["correct"]))
    return {k: sum(v) / len(v) for k, v in hits.items()}


@dataclass(frozen=True)
class Row:
    model: str
    dataset: str
    rule: str
    benchmark: str
    step: int
    components: Components


def variance_rows(exp: dict, stale: Collection[str] = ()) -> tuple[list[Row], list[str]]:
    """One row per (model, dataset, rule, benchmark) with >= 2 training seeds, at the last step
    every seed has under every evaluation seed; and notes on what could not be decomposed.
    ``stale``: cell ids trained under another version of their rule (the tables leave them out:
    ``CellData.stale``), left out here too and named in the notes."""
    results = grid.results_dir(exp)
    extra = [int(k) for k in exp["evaluation"].get("extra_seeds") or []]
    rows: list[Row] = []
    notes = [f"{cid}: trained under another version of its rule, left out" for cid in sorted(stale)]
    groups: dict[tuple[str, str, str], list[grid.Cell]] = {}
    for c in grid.cells(exp):
        if c.id not in stale:
            groups.setdefault((c.model, c.dataset, c.aggregation), []).append(c)
    for (model, dataset, rule), cells in groups.items():
        steps = grid.eval_steps(exp, model)
        for bench in grid.test_benchmarks(exp):
            where = f"{model} / {dataset} / {rule} / {bench}"
            if len(cells) < 2 or not extra:
                notes.append(f"{where}: needs >= 2 training seeds and evaluation.extra_seeds")
                continue
            step = next(
                (
                    t
                    for t in sorted(steps, reverse=True)
                    if all(
                        layout.graded_file(layout.run_dir(results, c.id), t, bench, k).is_file()
                        for c in cells
                        for k in [None, *extra]
                    )
                ),
                None,
            )
            if step is None:
                notes.append(f"{where}: no step is graded under every training and evaluation seed yet")
                continue
            per = [
                [
                    _per_problem(layout.graded_file(layout.run_dir(results, c.id), step, bench, k))
                    for k in [None, *extra]
                ]
                for c in cells
            ]
            ids = sorted(set.intersection(*(set(d) for seed in per for d in seed)))
            y = np.array([[[d[i] for i in ids] for d in seed] for seed in per])
            rows.append(Row(model, dataset, rule, bench, step, decompose(y)))
    return rows, notes


CSV_FIELDS = [
    "model", "dataset", "rule", "benchmark", "step", "training_seeds", "evaluation_seeds", "problems",
    "mean", "sd", "var_training_seed", "var_seed_x_problem", "var_evaluation_sampling", "var_problems",
    "share_training_seed", "share_seed_x_problem", "share_evaluation_sampling", "share_problems",
]  # fmt: skip


def to_records(rows: Sequence[Row]) -> list[dict]:
    """CSV/JSON records: variances in percent points squared, shares in percent."""
    out = []
    for r in rows:
        c, sh = r.components, r.components.shares()
        out.append(
            {
                "model": r.model, "dataset": r.dataset, "rule": r.rule, "benchmark": r.benchmark, "step": r.step,
                "training_seeds": c.S, "evaluation_seeds": c.E, "problems": c.P,
                "mean": round(100 * c.mean, 4), "sd": round(100 * c.total**0.5, 4),
                "var_training_seed": round(1e4 * c.training, 4), "var_seed_x_problem": round(1e4 * c.seed_problem, 4),
                "var_evaluation_sampling": round(1e4 * c.sampling, 4), "var_problems": round(1e4 * c.problems, 4),
                "share_training_seed": round(100 * sh["training seed"], 2),
                "share_seed_x_problem": round(100 * sh["seed x problem"], 2),
                "share_evaluation_sampling": round(100 * sh["evaluation sampling"], 2),
                "share_problems": round(100 * sh["problems"], 2),
            }
        )  # fmt: skip
    return out


def to_markdown(rows: Sequence[Row], notes: Sequence[str], experiment: str) -> str:
    lines = [
        f"# Where the variance comes from: {experiment}",
        "",
        "Per row and benchmark, at the last step graded under every training and evaluation seed: the "
        "variance of one cell's benchmark score (a fresh training seed, evaluation seed and problem set of "
        "the same size) split into training seed, training seed x problem, evaluation sampling and problems "
        "(random-effects ANOVA, aggbench.report.variance). sd in points; shares in percent. In a paired "
        "comparison of rules on the same problems only the problems' share cancels: seed x problem belongs "
        "to each training run, as the training seed's share does, and only more seeds buy both down.",
        "",
        "| model | dataset | rule | benchmark | step | S x E x P | mean | sd | training seed | seed x problem "
        "| evaluation sampling | problems |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for rec in to_records(rows):
        lines.append(
            f"| {rec['model']} | {rec['dataset']} | {rec['rule']} | {rec['benchmark']} | {rec['step']} | "
            f"{rec['training_seeds']} x {rec['evaluation_seeds']} x {rec['problems']} | {rec['mean']:.1f} | "
            f"{rec['sd']:.2f} | {rec['share_training_seed']:.0f}% | {rec['share_seed_x_problem']:.0f}% | "
            f"{rec['share_evaluation_sampling']:.0f}% | {rec['share_problems']:.0f}% |"
        )
    if notes:
        lines += ["", "Not decomposed:", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"


def write_variance(exp: dict, out_dir: Path, stale: Collection[str] = ()) -> list[Path]:
    """``variance.md`` and ``variance.csv`` under ``out_dir`` (atomic; ``stale`` as in
    :func:`variance_rows`); returns the paths."""
    import csv
    import io

    from aggbench.files import write_atomic

    rows, notes = variance_rows(exp, stale)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()
    w.writerows(to_records(rows))
    return [
        write_atomic(out_dir / "variance.md", to_markdown(rows, notes, exp["experiment"])),
        write_atomic(out_dir / "variance.csv", buf.getvalue()),
    ]
