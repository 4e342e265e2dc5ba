"""Selection splits held out of a training set (issue 27, item 3): checkpoints chosen without
looking at a test set.

A training spec's ``holdout: {n, seed}`` keeps ``n`` distinct problems out of training; a benchmark
with ``holdout_of: <that dataset>`` evaluates exactly them (configs/benchmarks/dapo17k_val.yaml).

- **Which problems**: the ``n`` whose ``sha256(seed, key)`` is smallest, over the WHOLE set, where
  ``key`` is the problem text in Unicode NFKC with its whitespace collapsed
  (:func:`problem_key`), so the split depends on the problems alone, not on their order or on the
  other rows' count.
- **What leaves training**: every row whose key is one of them, so a repeat of a held-out problem
  (Polaris is published with repeats: ``dedupe: false``) or a copy that differs only in spacing
  cannot leak back in.
- **Staying in step**: ``prepare-data`` records beside the prepared file the training spec's data
  key (:func:`training_data_key`: every field that decides which problems are held out and which
  rows train); the config check refuses a prepared file whose record is missing or differs
  (:func:`stale_holdout`), because Snakemake does not rerun ``prepare_data`` when a spec's contents
  change. It also records a digest of the held-out problems (:func:`held_digest`), and the fetch
  of the ``holdout_of`` benchmark records the digest of the problems it wrote: the two read the
  training set's rows separately (a data directory set for one and not the other, a newer offline
  file), so whichever job runs second compares them (:func:`check_against_lock`,
  :func:`check_against_prepared`), and so does the config check
  (:func:`aggbench.data.grid_checks.split_problems`).
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import Field

from aggbench.data.sources import SpecError, Strict

if TYPE_CHECKING:
    from aggbench.data.training import TrainingDatasetSpec

# The training spec's fields that decide its records and its holdout: any change needs a new
# prepared file and a new fetch of the holdout benchmark.
DATA_FIELDS = (
    "version",
    "hub",
    "url",
    "offline_file",
    "builtin",
    "fields",
    "answer_transform",
    "strip_instruction",
    "instruction_template",
    "dedupe",
    "holdout",
)


class Holdout(Strict):
    """``n`` distinct problems kept out of training for checkpoint selection, chosen by ``seed``."""

    n: int = Field(ge=1)
    seed: int = 0


def problem_key(text: str) -> str:
    """The text two rows must share to be the same problem: NFKC, whitespace runs as one space."""
    return " ".join(unicodedata.normalize("NFKC", text).split())


def _rank(seed: int, key: str) -> tuple[str, str]:
    return hashlib.sha256(f"{seed}\n{key}".encode()).hexdigest(), key


def split_holdout(
    spec: TrainingDatasetSpec, records: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, held-out rows) of ALL of a spec's records: the ``holdout.n`` distinct problems
    of smallest ``sha256(seed, problem_key)`` leave training with every row that shares their key."""
    assert spec.holdout is not None
    n, seed = spec.holdout.n, spec.holdout.seed
    keys = sorted({problem_key(r["prompt"]) for r in records}, key=lambda k: _rank(seed, k))
    if n >= len(keys):
        raise SpecError(
            f"training dataset {spec.name!r}: holdout.n={n} would leave no problem to train on "
            f"({len(keys)} distinct problems); lower holdout.n"
        )
    held = set(keys[:n])
    out: tuple[list[dict[str, Any]], list[dict[str, Any]]] = ([], [])
    for r in records:
        out[problem_key(r["prompt"]) in held].append(r)
    return out


def load_holdout(
    spec: TrainingDatasetSpec | str | Path, *, data_dir: str | Path | None = None
) -> tuple[list[dict[str, Any]], str]:
    """The ``holdout`` problems of a training set (one record per distinct problem, its first row,
    in the order they were chosen) and where they came from: what a ``holdout_of`` benchmark reads."""
    from aggbench.data.rows import resolve_data_dir
    from aggbench.data.training import TrainingDatasetSpec, _records, load_training_spec

    if not isinstance(spec, TrainingDatasetSpec):
        spec = load_training_spec(spec)
    if spec.holdout is None:
        where = spec.source_path or spec.name
        raise SpecError(
            f"training dataset {spec.name!r} ({where}) has no holdout: add `holdout: {{n: N, seed: 0}}` to it "
            "(its training rows then leave those N problems out), or select on another benchmark"
        )
    opened = spec.open_rows(resolve_data_dir(data_dir))
    _train, held = split_holdout(spec, _records(spec, opened.fields, opened.rows, None))
    first: dict[str, dict[str, Any]] = {}
    for record in held:
        first.setdefault(problem_key(record["prompt"]), record)
    seed = spec.holdout.seed
    source = f"holdout of {spec.name} (n={spec.holdout.n}, seed={seed}) from {opened.source}"
    return [first[k] for k in sorted(first, key=lambda k: _rank(seed, k))], source


def training_data_key(spec: TrainingDatasetSpec) -> str:
    """sha256 of the training spec's :data:`DATA_FIELDS`, 16 hex digits."""
    dumped = spec.model_dump(mode="json")
    payload = json.dumps({k: dumped.get(k) for k in DATA_FIELDS}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def held_digest(records: list[dict[str, Any]]) -> str:
    """sha256 of the distinct problem keys of ``records`` (sorted: order and repeats do not count),
    16 hex digits: equal for the prepared file's held-out rows and the holdout benchmark's records
    exactly when they are the same problems."""
    keys = sorted({problem_key(r["prompt"]) for r in records})
    return hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]


def holdout_record_file(data: str | Path) -> Path:
    """Beside a prepared training file: the spec it was written from (``prepare-data``)."""
    return Path(data).with_suffix(".holdout.json")


def write_holdout_record(
    out: str | Path, spec: TrainingDatasetSpec, held_rows: list[dict[str, Any]] | None = None
) -> None:
    """Beside a prepared training file: the spec, data key and holdout it was written with, and the
    held-out rows' :func:`held_digest` (``held_rows``: what ``split_holdout`` left out)."""
    from aggbench.files import write_atomic

    held = spec.holdout.model_dump() if spec.holdout is not None else None
    record = {"dataset": spec.name, "data_key": training_data_key(spec), "holdout": held}
    if spec.holdout is not None and held_rows is not None:
        record["held_digest"] = held_digest(held_rows)
    write_atomic(holdout_record_file(out), json.dumps(record) + "\n")


def stale_holdout(out: str | Path, spec: TrainingDatasetSpec) -> str | None:
    """Why the prepared training file ``out`` may hold problems ``spec`` holds out now (None: it
    cannot, or there is no file yet): it was prepared without a record (before holdouts existed),
    or from other spec data (another holdout, source, revision, field map, de-duplication...)."""
    if spec.holdout is None or not Path(out).is_file():
        return None
    record = holdout_record_file(out)
    try:
        written = json.loads(record.read_text(encoding="utf-8"))
        before = f"data key {written['data_key']}, holdout {written['holdout']}"
    except (OSError, ValueError, KeyError, TypeError):
        written, before = {}, f"no record in {record.name} (prepared before holdouts existed)"
    if written.get("data_key") == training_data_key(spec):
        return None
    return (
        f"{out} was prepared from other data of {spec.name} ({before}; now data key "
        f"{training_data_key(spec)}, holdout {spec.holdout.model_dump()}), so it may train on the "
        f"selection split's problems. Delete {out} so prepare_data writes it again; runs already "
        "trained on it saw those problems (retrain them, or leave evaluation.selection out)"
    )


def recorded_held_digest(out: str | Path) -> str | None:
    """The held-out problems' digest ``prepare-data`` recorded beside the prepared file ``out``
    (None: ``out`` is gone, so prepare_data writes it again; no record; or one written before
    digests were kept)."""
    if not Path(out).is_file():
        return None
    try:
        digest = json.loads(holdout_record_file(out).read_text(encoding="utf-8")).get("held_digest")
    except (OSError, ValueError, AttributeError):
        return None
    return digest if isinstance(digest, str) else None


def held_mismatch(
    prepared: Path, digest: str, benchmark: str, fetched_digest: str, fetched: Path, owner: str
) -> str:
    """The one message for a prepared training file and a fetched holdout benchmark that hold other
    problems out, with the fix: said by the config check, ``prepare-data`` and ``data fetch``."""
    return (
        f"{prepared} left out other problems of {owner} (digest {digest}, {holdout_record_file(prepared).name}) "
        f"than benchmark {benchmark} holds (digest {fetched_digest}, {fetched}): the two read {owner}'s rows "
        "separately (a data directory set for one and not the other, a newer offline file), so some of "
        f"{benchmark}'s problems may be in training. Fix: with $AGGBENCH_DATA_DIR as the grid runs, delete "
        f"{prepared} (prepare_data writes it again) and refetch: aggbench data fetch --benchmarks {benchmark} "
        f"--out {fetched} --refetch {benchmark}; runs already trained on it saw those problems (retrain them)"
    )


def fetched_beside(prepared: str | Path) -> Path:
    """The fetched benchmark copy of the results directory a prepared training file lies in
    (``layout.data_file`` and ``layout.benchmark_data_dir`` are siblings under ``{results}/data``)."""
    from aggbench.layout import benchmark_data_dir

    return benchmark_data_dir(Path(prepared).parent.parent)


def check_against_lock(
    prepared: str | Path, spec: TrainingDatasetSpec, held_rows: list[dict[str, Any]]
) -> None:
    """``prepare-data``'s half: refuse ``prepared`` when a holdout benchmark of ``spec`` fetched
    beside it (a lock entry with the same ``holdout_key``: the same spec data, so the same split
    is meant) holds other problems than ``held_rows``. Raises SpecError (:func:`held_mismatch`)."""
    from aggbench.data.fetch import FetchedDataError, read_lock

    fetched = fetched_beside(prepared)
    try:
        entries = read_lock(fetched)
    except FetchedDataError:
        return  # the config check names a broken lock
    digest, key = held_digest(held_rows), training_data_key(spec)
    for bench, entry in entries.items():
        theirs = entry.get("held_digest")
        if entry.get("holdout_key") == key and theirs is not None and theirs != digest:
            raise SpecError(held_mismatch(Path(prepared), digest, bench, theirs, fetched, spec.name))


def check_against_prepared(fetched: str | Path, benchmark: str, entry: dict[str, Any]) -> None:
    """``data fetch``'s half: refuse a holdout benchmark's lock ``entry`` whose problems differ from
    those a prepared training file beside the copy left out (its ``.holdout.json``, written from
    the same spec data: ``data_key`` equal to the entry's ``holdout_key``)."""
    for record in sorted(Path(fetched).parent.glob("*.holdout.json")):
        prepared = record.with_name(record.name.removesuffix(".holdout.json") + ".jsonl")
        try:
            key = json.loads(record.read_text(encoding="utf-8")).get("data_key")
        except (OSError, ValueError, AttributeError):
            continue
        ours = recorded_held_digest(prepared)
        if key == entry["holdout_key"] and ours is not None and ours != entry["held_digest"]:
            owner = entry["holdout_of"]
            raise SpecError(
                held_mismatch(prepared, ours, benchmark, entry["held_digest"], Path(fetched), owner)
            )
