"""The experiment config's data checks (``aggbench.grid.validate_experiment`` runs them before any
job; ``aggbench grid check`` prints them): each returns the problems it finds, each naming the key
and the fix. The specs are read once (:func:`load_data_specs`, ~20 YAML files for the paper grid at
every Snakefile parse) and handed to each check.

- :func:`selection_problems`: ``evaluation.selection`` chooses on held-out splits only, and a
  holdout benchmark (``holdout_of``) selects only the cells that trained on exactly the spec it
  was held out of (same data, same holdout), so its problems cannot be among theirs.
- :func:`holdout_problems`: every ``holdout_of`` names a training set that has a holdout, and no
  prepared training file predates its spec's holdout (Snakemake would not rerun prepare_data).
- :func:`split_problems`: a holdout benchmark's fetched problems are the ones each prepared file of
  its training set left out (both recorded a digest; the two read the source separately).
- :func:`fetched_problems`: no fetched benchmark copy was fetched for other spec data (Snakemake
  would not rerun fetch_benchmarks; every generate job would fail instead).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Iterator

    from aggbench.data.benchmarks import BenchmarkSpec
    from aggbench.data.training import TrainingDatasetSpec


@dataclass
class DataSpecs:
    """The grid's specs, each read once. ``problems``: the load errors, one per spec that did not
    load (each check skips what is missing here, so every error is reported once)."""

    benchmarks: dict[str, BenchmarkSpec] = field(default_factory=dict)  # {benchmark: spec}
    datasets: dict[str, TrainingDatasetSpec] = field(default_factory=dict)  # {dataset: its spec}
    owners: dict[str, TrainingDatasetSpec] = field(default_factory=dict)  # {holdout_of: that spec}
    problems: list[str] = field(default_factory=list)

    def owner_of(self, benchmark: str) -> TrainingDatasetSpec | None:
        """The training set ``benchmark`` is held out of; None when it is not a holdout benchmark,
        or when its spec or its owner's did not load (that problem is in ``problems``)."""
        bench = self.benchmarks.get(benchmark)
        return self.owners.get(bench.holdout_of) if bench is not None and bench.holdout_of else None


def trains_on_owner(spec: TrainingDatasetSpec, owner: TrainingDatasetSpec) -> bool:
    """Whether a dataset of spec ``spec`` trains on exactly the set ``owner`` (same name, same data
    and holdout): the one rule by which a holdout benchmark of ``owner`` is paired with the grid's
    datasets (:func:`holdout_pairs`; :func:`selection_problems` names which part differs)."""
    from aggbench.data.holdout import training_data_key

    return spec.name == owner.name and training_data_key(spec) == training_data_key(owner)


def holdout_pairs(specs: DataSpecs) -> Iterator[tuple[str, TrainingDatasetSpec, str]]:
    """(holdout benchmark, the set it is held out of, a dataset of the grid trained on exactly that
    set) for every such pair: whose prepared file must have left out the benchmark's problems."""
    for b in specs.benchmarks:
        owner = specs.owner_of(b)
        if owner is None:
            continue
        for name, spec in specs.datasets.items():
            if trains_on_owner(spec, owner):
                yield b, owner, name


def load_data_specs(exp: dict) -> DataSpecs:
    """Every benchmark, dataset and ``holdout_of`` spec of ``exp``, each read once."""
    from aggbench.data.benchmarks import load_benchmark_spec
    from aggbench.data.training import load_training_spec

    specs = DataSpecs()
    for b in exp["benchmarks"]:
        try:
            specs.benchmarks[b] = load_benchmark_spec(b)
        except Exception as exc:  # the message names the benchmark, the known ones and where it looked
            specs.problems.append(f"benchmarks: {exc}")
    for name, ds in exp["datasets"].items():
        try:
            specs.datasets[name] = load_training_spec(ds["spec"])
        except Exception as exc:
            specs.problems.append(f"datasets.{name}.spec: {exc}")
    for b, spec in specs.benchmarks.items():
        of = spec.holdout_of
        if of is None or of in specs.owners:
            continue
        try:
            specs.owners[of] = load_training_spec(of)
        except Exception as exc:
            specs.problems.append(f"benchmarks: {b} is holdout_of {of!r}: {exc}")
    return specs


def no_holdout(benchmark: str, of: str, spec: TrainingDatasetSpec) -> str:
    """The problem of a ``holdout_of`` naming a training set that holds nothing out (the config
    check and ``aggbench plan`` both say it)."""
    return (
        f"benchmarks: {benchmark} is holdout_of {of!r}, which holds nothing out: add `holdout: {{n: N, "
        f"seed: 0}}` to {spec.source_path or of} (its training rows then leave those N out)"
    )


def selection_problems(exp: dict, chosen: dict[str, Any], specs: DataSpecs) -> list[str]:
    """``chosen``: ``evaluation.selection`` as written (``aggbench.grid.selection``)."""
    problems = []
    listed, datasets = exp["benchmarks"], list(exp.get("datasets") or {})
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
            problems += _held_out_of_these(specs, at, sel, for_datasets)
    return problems


def _held_out_of_these(specs: DataSpecs, where: str, sel: str, datasets: list[str]) -> list[str]:
    """A holdout benchmark selects only the cells of the training set it was held out of: for any
    other set (or the same name with other data or another holdout), its problems may be trained on."""
    owner = specs.owner_of(sel)
    if owner is None:  # not a holdout benchmark, or a spec that did not load (reported once)
        return []
    out = []
    for ds in datasets:
        trained = specs.datasets.get(ds)
        if trained is None or trains_on_owner(trained, owner):
            continue
        if trained.name != owner.name:
            out.append(
                f"{where}: {sel!r} is held out of the training set {owner.name!r}, but the cells of "
                f"dataset {ds!r} train on {trained.name!r}: select them on a holdout of their own set "
                f"(per dataset: {{{ds}: <benchmark>}})"
            )
        else:  # the same name with other data or another holdout
            out.append(
                f"{where}: {sel!r} holds out the problems of {owner.source_path or owner.name}, but "
                f"dataset {ds!r} trains on {trained.source_path or trained.name}, whose data or holdout "
                f"differ (holdout {owner.holdout} vs {trained.holdout}): its cells may train on the "
                "selection split; give both the same training spec"
            )
    return out


def holdout_problems(specs: DataSpecs, prepared: dict[str, Path]) -> list[str]:
    """``prepared``: {dataset: its prepared training file under the results directory}."""
    from aggbench.data.holdout import stale_holdout

    problems = []
    for b, spec in specs.benchmarks.items():
        owner = specs.owner_of(b)
        if owner is not None and owner.holdout is None:
            problems.append(no_holdout(b, spec.holdout_of, owner))
    for name, spec in specs.datasets.items():
        stale = stale_holdout(prepared[name], spec)
        if stale:
            problems.append(f"datasets.{name}: {stale}")
    return problems


def fetched_problems(specs: DataSpecs, fetched: Path) -> list[str]:
    """``fetched``: the grid's fetched benchmark copy (``{results}/data/benchmarks``)."""
    from aggbench.data.fetch import FetchedDataError, read_lock, stale_entry

    try:
        entries = read_lock(fetched)
    except FetchedDataError as exc:
        return [f"benchmarks: {exc}"]
    problems = []
    for b, spec in specs.benchmarks.items():
        stale = stale_entry(spec, entries[b], fetched) if b in entries else None
        if stale:
            problems.append(f"benchmarks: {stale}")
    return problems


def split_problems(specs: DataSpecs, prepared: dict[str, Path], fetched: Path) -> list[str]:
    """Each fetched holdout benchmark holds exactly the problems each prepared file of its training
    set left out: ``prepared``: {dataset: its prepared file}; ``fetched``: the grid's fetched copy.
    Cheap (two small JSON files per pair); a pair without both digests (not fetched or prepared yet,
    or recorded before digests were kept) is not compared."""
    from aggbench.data.fetch import FetchedDataError, read_lock
    from aggbench.data.holdout import held_mismatch, recorded_held_digest

    try:
        entries = read_lock(fetched)
    except FetchedDataError:
        return []  # fetched_problems reports it
    problems = []
    for b, owner, name in holdout_pairs(specs):  # other pairings: selection_problems says so
        fetched_digest = entries.get(b, {}).get("held_digest")
        digest = recorded_held_digest(prepared[name])
        if fetched_digest is not None and digest is not None and digest != fetched_digest:
            message = held_mismatch(prepared[name], digest, b, fetched_digest, fetched, owner.name)
            problems.append(f"datasets.{name}: {message}")
    return problems
