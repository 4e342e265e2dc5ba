"""Scoring one benchmark's samples: grade every sample with the benchmark's grader, then metrics.

Split from ``aggbench.evaluation.generate`` (generation) so each module is one idea; ``aggbench score`` and
``aggbench evaluate`` both come here.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from aggbench.errors import InputError
from aggbench.files import relative_to_file, write_atomic
from aggbench.metric_names import parse as parse_metric


class EvaluationError(InputError, ValueError):
    """Bad input to the evaluator: the message names the file, line and field, and the fix."""


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> Path:
    """:func:`aggbench.data.jsonl.write_jsonl` (atomic), returning the path."""
    from aggbench.data.jsonl import write_jsonl as write_rows

    write_rows(path, rows)
    return Path(path)


def write_json(path: str | Path, obj: Any) -> Path:
    return write_atomic(path, json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def read_jsonl(path: str | Path, *, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Rows of a JSONL file; each must be an object holding ``required`` (errors name file:line)."""
    return [row for _, row in read_numbered(path, required=required)]


def read_numbered(path: str | Path, *, required: Sequence[str] = ()) -> list[tuple[int, dict[str, Any]]]:
    """``(line number, row)`` of every row of a JSONL file (see :func:`read_jsonl`)."""
    from aggbench.data.jsonl import iter_jsonl  # lazy: the aggbench.data package imports pydantic

    path = Path(path)
    if not path.is_file():
        raise EvaluationError(f"{path}: no such file")
    rows = []
    for lineno, row in iter_jsonl(path):  # a line that is not a JSON object: DataError (file:line)
        for key in required:
            if key not in row:
                raise EvaluationError(f"{path}:{lineno}: field {key!r} is missing")
        rows.append((lineno, row))
    if not rows:
        raise EvaluationError(f"{path}: no samples in the file")
    return rows


# --------------------------------------------------------------------------- generation


def grade_rows(
    grader: str,
    rows: Sequence[Mapping[str, Any]],
    *,
    workers: int | None = None,
    timeout_s: float | None = None,
    progress: bool | None = False,
    **extra: Any,
) -> list[dict[str, Any]]:
    """One verdict dict per row (``correct``, ``extracted``, ``reason``; programs add ``n_tests``,
    ``test_results``, ``error_kind``, ``layers``), from the registered grader (``aggbench.graders``)."""
    from aggbench.graders import GradingError, get_grader
    from aggbench.registry import RegistryError

    try:
        spec = get_grader(grader)
    except RegistryError as exc:
        raise EvaluationError(str(exc)) from None
    try:
        return spec.grade_fn()(rows, workers=workers, timeout_s=timeout_s, progress=progress, **extra)
    except GradingError as exc:
        raise EvaluationError(str(exc)) from None


def metric_names(grader: str, n: int, spec_metrics: Sequence[str] = ()) -> list[str]:
    """avg@n, pass@1, pass@n, maj@n (not for programs), plus the spec's metrics whose k fits in n."""
    from aggbench.graders import get_grader

    code = get_grader(grader).programs  # no majority vote over programs
    names = [f"avg@{n}", "pass@1", f"pass@{n}"] + ([f"maj@{n}"] if not code else [])
    for m in spec_metrics:
        parsed = parse_metric(m)
        if parsed and parsed[1] <= n and not (code and parsed[0] == "maj"):
            names.append(m)
    return list(dict.fromkeys(names))


def compute_metrics(
    rows: Sequence[Mapping[str, Any]],
    *,
    grader: str,
    spec_metrics: Sequence[str] = (),
    n_boot: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Metrics of one benchmark's graded samples (``id``, ``sample``, ``correct``, ``extracted``).

    avg@k uses each problem's first k samples; pass@k is the unbiased estimator over all n;
    maj@k votes among the first k extracted answers (ties: the first to appear; answers the
    grader's ``same_answer`` calls one answer pool, so the math grader's ``0.5`` and ``1/2`` vote
    together, other graders' only as written; an empty one does not vote) and takes the verdict of
    the winning answer's first sample that the grader actually judged (not a timeout or a crash).
    ``n_samples`` is the number of samples per problem; ``ci_low``/``ci_high`` bound avg@n
    (bootstrap over problems). ``mean_length`` and ``truncation_rate`` are over the responses that
    were generated (not those whose prompt did not fit the context: ``not_generated`` counts them);
    ``not_judged`` counts the responses the grading harness, not the grader, decided (a time-out, a
    crashed worker, an error: :func:`aggbench.grading.pool.harness_failed`), all scored wrong.
    """
    import numpy as np

    from aggbench.evaluation.context import PROMPT_TOO_LONG
    from aggbench.evaluation.metrics import bootstrap_ci, summarize
    from aggbench.graders import get_grader
    from aggbench.grading.pool import harness_failed

    problems: dict[Any, list[Mapping[str, Any]]] = {}
    for r in rows:
        problems.setdefault(r["id"], []).append(r)
    ordered = [sorted(v, key=lambda r: r.get("sample", 0)) for v in problems.values()]
    n = min(len(v) for v in ordered)
    names = metric_names(grader, n, spec_metrics)
    same = get_grader(grader).same_answer_fn()  # which answers maj@k pools (None: identical ones)
    flat = [r for v in ordered for r in v]
    out = summarize(flat, metrics=[m for m in names if not m.startswith("maj@")], n_boot=n_boot, seed=seed)
    for m in (m for m in names if m.startswith("maj@")):
        k = int(m.split("@")[1])
        scores = np.array([_majority_correct(v[:k], harness_failed, same) for v in ordered])
        out[m] = float(scores.mean())
        out[f"{m}_ci"] = list(bootstrap_ci(scores, n_boot=n_boot, seed=seed))
    generated = [r for r in flat if r.get("finish_reason") != PROMPT_TOO_LONG]
    lengths = [r["length"] for r in generated if isinstance(r.get("length"), int)]
    reasons = [r["finish_reason"] for r in generated if r.get("finish_reason") is not None]
    out.update(
        {
            "metrics": names,
            "n_responses": len(flat),
            "n_correct": int(sum(bool(r["correct"]) for r in flat)),
            "ci_low": out[f"avg@{n}_ci"][0],
            "ci_high": out[f"avg@{n}_ci"][1],
            "mean_length": float(np.mean(lengths)) if lengths else None,
            "truncation_rate": float(np.mean([x == "length" for x in reasons])) if reasons else None,
            # responses not generated: their prompt had no room in the model's context
            # (aggbench.evaluation.context), graded wrong
            "not_generated": len(flat) - len(generated),
            # responses whose budget the context cut below the benchmark's max_tokens
            "context_capped": sum(bool(r.get("context_capped")) for r in flat),
            # responses the grading harness decided (time-out, crashed worker, error), graded wrong
            "not_judged": sum(harness_failed(r.get("reason")) for r in flat),
        }
    )
    return out


# Seconds maj@k may spend pooling one problem's answers by the grader's ``same_answer`` (each call
# also has its own soft deadline); past it the remaining answers pool as written.
POOL_BUDGET_S = 30.0


def _majority_correct(
    samples: Sequence[Mapping[str, Any]],
    harness_failed: Callable[[Any], bool],
    same: Callable[[str, str], bool] | None = None,
) -> float:
    """1.0 when the majority answer of ``samples`` (one problem's first k) is graded correct.

    Answers vote together where they are one answer: identical strings, and where the grader's
    ``same`` says so (math: ``0.5``, ``\\frac{1}{2}`` and ``1/2``), each answer joining the first
    earlier pool it matches; a sample the grading harness failed (a time-out: its answer may be what
    hung the grader) pools by identical strings only, as does every answer after ``POOL_BUDGET_S``
    spent on the problem (``same`` runs in this process: its deadline is soft). The largest pool
    wins, ties to the pool whose first answer came first (without ``same``:
    :func:`~aggbench.evaluation.metrics.majority_answer`); its verdict is that of its first sample
    the grader judged, else of its first sample."""
    from aggbench.evaluation.metrics import answered

    pools: list[list[Mapping[str, Any]]] = []
    t0 = time.monotonic()
    for s in samples:
        a = s.get("extracted")
        if not answered(a):
            continue
        # past POOL_BUDGET_S on one problem, answers pool as written (a soft bound on sympy's time)
        compare = (
            same is not None
            and isinstance(a, str)
            and not harness_failed(s.get("reason"))
            and time.monotonic() - t0 < POOL_BUDGET_S
        )
        for pool in pools:
            b = pool[0].get("extracted")
            if a == b or (
                compare and isinstance(b, str) and not harness_failed(pool[0].get("reason")) and same(a, b)
            ):
                pool.append(s)
                break
        else:
            pools.append([s])
    if not pools:
        return 0.0
    winner = max(pools, key=len)  # the first of the largest
    judged = [s for s in winner if not harness_failed(s.get("reason"))]
    return float(bool((judged or winner)[0]["correct"]))


def score_benchmark(
    benchmark: str,
    samples_path: str | Path,
    out_path: str | Path,
    *,
    workers: int | None = None,
    timeout_s: float | None = None,
    progress: bool = False,
    n_boot: int = 1000,
) -> dict[str, Any]:
    """Grade ``samples_path`` with the benchmark's grader; write the graded samples to ``out_path``
    and the metrics to ``<out_path minus .jsonl>.metrics.json``; return the metrics."""
    from aggbench.data.benchmarks import load_benchmark_spec
    from aggbench.graders import get_grader

    spec = load_benchmark_spec(benchmark)
    grader = spec.grader.name
    entry = get_grader(grader)
    numbered = read_numbered(samples_path, required=entry.sample_fields())
    check_samples(samples_path, numbered, spec.name, grader)
    rows = [r for _, r in numbered]
    t0 = time.perf_counter()
    # a bar on a terminal only: evaluation runs inside snakemake's logs
    # the math grader also gives the ledger's plain math-verify verdicts from its own workers
    extra = {"ledger": True} if grader == "math" else {}  # the built-in math grader's own option
    verdicts = grade_rows(
        grader, rows, workers=workers, timeout_s=timeout_s, progress=None if progress else False, **extra
    )
    graded = []
    for r, v in zip(rows, verdicts, strict=True):
        base = {k: val for k, val in r.items() if not (entry.record == "tests" and k == "tests")}
        graded.append({**base, **{k: val for k, val in v.items() if k != "layers"}})
    try:
        metrics = compute_metrics(graded, grader=grader, spec_metrics=spec.metrics, n_boot=n_boot)
    except ValueError as exc:  # samples the metrics cannot be computed from (one line, naming the file)
        raise EvaluationError(f"{samples_path}: {exc}") from exc
    metrics = {
        "benchmark": spec.name,
        "grader": grader,
        "grader_version": entry.version,  # a new one moves scores: never mix the two in a table
        **metrics,
        "grading_s": round(time.perf_counter() - t0, 3),
        # relative to the metrics file (a copied results directory reads its own samples)
        "samples": relative_to_file(samples_path, metrics_path(out_path)),
    }
    if entry.record == "answer":  # the grader-disagreement ledger (aggbench.grading.ledger)
        from aggbench.grading.ledger import counts

        metrics.update(counts(rows, verdicts))
    if entry.record == "tests":
        metrics["public_tests_only"] = any(bool(r.get("public_tests_only")) for r in rows)
        metrics["notes"] = ["public tests only"] if metrics["public_tests_only"] else []
    if entry.programs:
        metrics["sandbox_layers"] = next((v["layers"] for v in verdicts if v.get("layers")), {})
    metrics.update(_probability(Path(samples_path), spec.name))
    out_path = Path(out_path)
    write_jsonl(out_path, graded)
    write_json(metrics_path(out_path), metrics)
    return metrics


def _probability(samples_path: Path, benchmark: str) -> dict[str, Any]:
    """The probability metric that generation computed beside these samples (a built-in task
    benchmark: generation.json's ``probability``), for metrics.json; {} where there is none."""
    from aggbench.evaluation.generate import GENERATION_FILE  # (generate imports this module)

    info = samples_path.parent / GENERATION_FILE
    if not info.is_file():
        return {}
    prob = (json.loads(info.read_text()).get("benchmarks", {}).get(benchmark) or {}).get("probability") or {}
    keys = ("prob_correct", "prob_uncovered", "prob_uncovered_max")
    if "prob_correct" not in prob:
        return {"prob_skipped": prob["skipped"]} if prob.get("skipped") else {}
    return {**{k: prob[k] for k in keys}, "prob_usable": prob["prob_uncovered"] < prob["usable_below"]}


def check_samples(
    path: str | Path, numbered: Sequence[tuple[int, Mapping[str, Any]]], benchmark: str, grader: str
) -> None:
    """Everything about the samples that can be wrong, checked before any grading: each row is
    from ``benchmark`` and passes the grader's row check (the one ``aggbench grade`` runs:
    :func:`aggbench.grading.rows.check_row`), ids are strings or integers, no (id, sample) pair
    repeats (two files joined, or one appended twice, would count a sample twice), and every
    problem has the same number of samples."""
    from aggbench.evaluation.metrics import uneven_samples
    from aggbench.grading.rows import check_row

    seen: dict[tuple[Any, Any], int] = {}
    for lineno, r in numbered:
        if r.get("benchmark", benchmark) != benchmark:
            raise EvaluationError(
                f"{path}:{lineno}: the sample is from benchmark {r['benchmark']!r}, not {benchmark!r}"
            )
        if not isinstance(r["id"], str | int) or isinstance(r["id"], bool):
            raise EvaluationError(
                f"{path}:{lineno}: field 'id': expected a string or an integer, got {r['id']!r:.80}"
            )
        check_row(path, lineno, r, grader)
        if "sample" in r:
            first = seen.setdefault((r["id"], r["sample"]), lineno)
            if first != lineno:
                raise EvaluationError(
                    f"{path}:{lineno}: problem {r['id']!r} sample {r['sample']!r} repeats line {first}; "
                    "each sample once: regenerate the file with `aggbench generate` instead of joining files"
                )
    uneven = uneven_samples(Counter(r["id"] for _, r in numbered))
    if uneven:
        raise EvaluationError(
            f"{path}: {uneven}; regenerate them with `aggbench generate` "
            "(one run writes n samples for every problem)"
        )


def metrics_path(eval_path: str | Path) -> Path:
    p = Path(eval_path)
    return p.with_name((p.name[: -len(".jsonl")] if p.name.endswith(".jsonl") else p.name) + ".metrics.json")


# --------------------------------------------------------------------------- MLflow
