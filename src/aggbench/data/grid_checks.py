"""The experiment config's data checks (``aggbench.grid.validate_experiment`` runs them before any
job; ``aggbench grid check`` prints them): each returns the problems it finds, each naming the key
and the fix.

- :func:`selection_problems`: ``evaluation.selection`` chooses on held-out splits only, and a
  holdout benchmark (``holdout_of``) selects only the cells that trained on exactly the spec it
  was held out of (same data, same holdout), so its problems cannot be among theirs.
- :func:`holdout_problems`: every ``holdout_of`` names a training set that has a holdout, and no
  prepared training file predates its spec's holdout (Snakemake would not rerun prepare_data).
- :func:`fetched_problems`: no fetched benchmark copy was fetched for other spec data (Snakemake
  would not rerun fetch_benchmarks; every generate job would fail instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _selection(exp: dict) -> dict[str, Any]:
    return dict((exp.get("evaluation") or {}).get("selection") or {})


def selection_problems(exp: dict) -> list[str]:
    problems = []
    listed, datasets = exp["benchmarks"], list(exp.get("datasets") or {})
    chosen = _selection(exp)
    for test, given in chosen.items():
        where = f"evaluation.selection.{test}"
        if test not in listed:
            problems.append(f"{where}: {test!r} is not in benchmarks ({', '.join(listed)})")
        if isinstance(given, dict):
            problems += [
                f"{where}.{ds}: no dataset {ds!r} in this grid (datasets: {', '.join(datasets)})"
                for ds in given
                if ds not in datasets
            ]
            problems += [
                f"{where}: no selection benchmark for dataset {ds!r}: add `{ds}: <benchmark>` (e.g. a "
                f"holdout_of benchmark of its training set)"
                for ds in datasets
                if ds not in given
            ]
            pairs = [(f"{where}.{ds}", sel, [ds]) for ds, sel in given.items() if ds in datasets]
        else:
            pairs = [(where, given, datasets)]
        for at, sel, for_datasets in pairs:
            if sel not in listed:
                problems.append(f"{at}: the selection benchmark {sel!r} is not in benchmarks: add it there")
            if sel == test or sel in chosen:
                problems.append(
                    f"{at}: {sel!r} is a test benchmark; select on a held-out split (e.g. tiny_val)"
                )
            problems += _held_out_of_these(exp, at, sel, for_datasets)
    return problems


def _held_out_of_these(exp: dict, where: str, sel: str, datasets: list[str]) -> list[str]:
    """A holdout benchmark selects only the cells of the training set it was held out of: for any
    other set (or the same name with other data or another holdout), its problems may be trained on."""
    from aggbench.data.benchmarks import load_benchmark_spec
    from aggbench.data.holdout import training_data_key
    from aggbench.data.training import load_training_spec

    try:
        of = load_benchmark_spec(sel).holdout_of
        if of is None:
            return []
        owner = load_training_spec(of)
    except Exception:  # a spec that does not load is reported where the specs are checked
        return []
    out = []
    for ds in datasets:
        try:
            trained = load_training_spec(exp["datasets"][ds]["spec"])
        except Exception:
            continue
        if trained.name != owner.name:
            out.append(
                f"{where}: {sel!r} is held out of the training set {owner.name!r}, but the cells of "
                f"dataset {ds!r} train on {trained.name!r}: select them on a holdout of their own set "
                f"(per dataset: {{{ds}: <benchmark>}})"
            )
        elif training_data_key(trained) != training_data_key(owner):
            out.append(
                f"{where}: {sel!r} holds out the problems of {owner.source_path or owner.name}, but "
                f"dataset {ds!r} trains on {trained.source_path or trained.name}, whose data or holdout "
                f"differ (holdout {owner.holdout} vs {trained.holdout}): its cells may train on the "
                "selection split; give both the same training spec"
            )
    return out


def holdout_problems(exp: dict, prepared: dict[str, Path]) -> list[str]:
    """``prepared``: {dataset: its prepared training file under the results directory}."""
    from aggbench.data.benchmarks import load_benchmark_spec
    from aggbench.data.holdout import stale_holdout
    from aggbench.data.training import load_training_spec

    problems = []
    for b in exp["benchmarks"]:
        try:
            of = load_benchmark_spec(b).holdout_of
        except Exception:  # reported by the benchmark check
            continue
        if of is None:
            continue
        try:
            owner = load_training_spec(of)
        except Exception as exc:
            problems.append(f"benchmarks: {b} is holdout_of {of!r}: {exc}")
            continue
        if owner.holdout is None:
            problems.append(
                f"benchmarks: {b} is holdout_of {of!r}, which holds nothing out: add `holdout: {{n: N, "
                f"seed: 0}}` to {owner.source_path or of} (its training rows then leave those N out)"
            )
    for name, ds in exp["datasets"].items():
        try:
            stale = stale_holdout(prepared[name], load_training_spec(ds["spec"]))
        except Exception:  # reported by the dataset check
            continue
        if stale:
            problems.append(f"datasets.{name}: {stale}")
    return problems


def fetched_problems(exp: dict, fetched: Path) -> list[str]:
    """``fetched``: the grid's fetched benchmark copy (``{results}/data/benchmarks``)."""
    from aggbench.data.benchmarks import load_benchmark_spec
    from aggbench.data.fetch import FetchedDataError, read_lock, stale_entry

    try:
        entries = read_lock(fetched)
    except FetchedDataError as exc:
        return [f"benchmarks: {exc}"]
    problems = []
    for b in exp["benchmarks"]:
        if b not in entries:
            continue
        try:
            stale = stale_entry(load_benchmark_spec(b), entries[b], fetched)
        except Exception:  # a spec that does not load is reported by the benchmark check
            continue
        if stale:
            problems.append(f"benchmarks: {stale}")
    return problems
