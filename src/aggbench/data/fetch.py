"""Benchmark data for offline compute nodes: fetched once where there is internet, then the only copy read.

Compute nodes of a cluster are often offline, and every workflow job runs with
``HF_DATASETS_OFFLINE=1``. So the local rule ``fetch_benchmarks`` (or ``aggbench data fetch``) runs
on the login node and writes, under the results directory::

    {results}/data/benchmarks/<name>.jsonl     canonical records (before any date window)
    {results}/data/benchmarks/lock.json        per benchmark: where the rows came from, the spec's
                                               data key, the file's sha256 and its record count

Rows are read with the spec's own loader (:func:`aggbench.data.benchmarks.iter_records`: the
offline file under ``$AGGBENCH_DATA_DIR`` if there, else ``datasets.load_dataset`` at the pinned
revision, else the pinned URL): the code that runs on a cluster is the code that runs in the tests.

The sha256 is recorded on the first fetch and checked on every later fetch and on every load
(:func:`read_fetched`, which ``aggbench generate --fetched DIR`` uses): a changed or corrupt file is
refused with the command that fetches it again. A spec whose data fields changed since the fetch
(another revision, field map, version) is refused the same way, so a copy never silently stands in
for different data. The built-in task needs no data and is never fetched.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from aggbench.data.jsonl import DataError, iter_jsonl
from aggbench.data.sources import DataUnavailableError
from aggbench.files import atomic_writer, sha256_file, write_atomic

LOCK_NAME = "lock.json"
LOCK_FORMAT = 1
# The spec fields that decide which records a fetch produces; any change needs a new fetch.
_DATA_FIELDS = (
    "version",
    "hub",
    "url",
    "offline_file",
    "offline_join",
    "offline_public_tests_only",
    "evalplus",
    "fields",
    "answer_from",
    "answer_transform",
)


class FetchedDataError(DataUnavailableError):
    """The fetched copy is missing, changed since its lock, or was fetched for other spec data."""


def records_file(root: str | Path, name: str) -> Path:
    return Path(root) / f"{name}.jsonl"


def lock_file(root: str | Path) -> Path:
    return Path(root) / LOCK_NAME


def data_key(spec: Any) -> str:
    """sha256 of the spec fields that decide the records (:data:`_DATA_FIELDS`; for ``holdout_of``,
    also its training dataset's, so a changed holdout needs a new fetch), 16 hex digits."""
    dumped = spec.model_dump(mode="json")
    fields = {k: dumped.get(k) for k in _DATA_FIELDS}
    if isinstance(fields["offline_join"], dict):  # its sha256 pin checks the file, it selects nothing
        fields["offline_join"] = {k: v for k, v in fields["offline_join"].items() if k != "sha256"}
    if getattr(spec, "holdout_of", None):  # its records are decided by its training set's spec
        from aggbench.data.holdout import training_data_key
        from aggbench.data.training import load_training_spec

        fields["holdout_of"] = training_data_key(load_training_spec(spec.holdout_of))
    payload = json.dumps(fields, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def read_lock(root: str | Path) -> dict[str, dict[str, Any]]:
    """The lock's ``{name: entry}`` ({} when there is no lock yet)."""
    path = lock_file(root)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FetchedDataError(
            f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); delete it and fetch again "
            f"(aggbench data fetch ... --out {path.parent})"
        ) from None
    if not isinstance(data, dict) or data.get("format") != LOCK_FORMAT:
        raise FetchedDataError(f"{path}: not a benchmark data lock of format {LOCK_FORMAT}")
    return data.get("benchmarks", {})


def _write_lock(root: Path, entries: dict[str, dict[str, Any]]) -> None:
    body = {"format": LOCK_FORMAT, "benchmarks": dict(sorted(entries.items()))}
    write_atomic(lock_file(root), json.dumps(body, indent=2) + "\n")


def _refetch_hint(name: str, root: Path) -> str:
    return f"aggbench data fetch --benchmarks {name} --out {root} --refetch {name}"


def stale_entry(spec: Any, entry: dict[str, Any], root: Path) -> str | None:
    """Why a lock entry was fetched for other data than ``spec`` now names, with the fix (None:
    the same data). Cheap (no file is read): the config check runs it before any job."""
    if entry.get("data_key") == data_key(spec):
        return None
    why = ""
    if getattr(spec, "holdout_of", None):
        why = f" (holdout_of {spec.holdout_of}: that training set's data or holdout changed since)"
    return (
        f"{spec.name}: {records_file(root, spec.name)} was fetched for other spec data (version "
        f"{entry.get('spec_version')}, source {entry.get('source')}); the spec now has version "
        f"{spec.version} and data key {data_key(spec)} (lock: {entry.get('data_key')}){why}: fetch it "
        f"again where there is internet: {_refetch_hint(spec.name, root)}"
    )


def check_entry(spec: Any, entry: dict[str, Any], root: Path) -> Path:
    """The records file of ``spec`` under ``root`` if it is the one its lock entry describes and was
    fetched for this spec's data; else :class:`FetchedDataError` saying what differs and the fix."""
    path = records_file(root, spec.name)
    fix = f"fetch it again where there is internet: {_refetch_hint(spec.name, root)}"
    stale = stale_entry(spec, entry, root)
    if stale:
        raise FetchedDataError(stale)
    if not path.is_file():
        raise FetchedDataError(f"{spec.name}: {path} is listed in {lock_file(root)} but missing: {fix}")
    want = getattr(spec, "expected_rows", None)
    if want is not None and entry.get("records") != want:  # fetched before the spec declared it
        raise FetchedDataError(
            f"{spec.name}: the fetched copy {path} holds {entry.get('records')} records, but the spec's "
            f"expected_rows is {want}: another split or revision than the spec was written for. {fix[0].upper()}{fix[1:]}"
        )
    got = sha256_file(path)
    if got != entry.get("sha256"):
        raise FetchedDataError(
            f"{spec.name}: {path} has sha256 {got}, but {lock_file(root)} recorded {entry.get('sha256')} "
            f"when it was fetched: the file changed or is corrupt. {fix[0].upper()}{fix[1:]}"
        )
    return path


def read_fetched(spec: Any, root: str | Path) -> tuple[list[dict[str, Any]], str]:
    """The canonical records of ``spec`` from the fetched copy under ``root``, checked against the
    lock, and the source to report (``<where the rows came from> (fetched, sha256 <12 hex>)``)."""
    root = Path(root)
    entries = read_lock(root)
    entry = entries.get(spec.name)
    if entry is None:
        listed = ", ".join(sorted(entries)) or "none"
        raise FetchedDataError(
            f"{spec.name}: not in the fetched benchmark data {root} (its {LOCK_NAME} lists: {listed}). "
            f"Fetch it where there is internet (a login node): aggbench data fetch --benchmarks "
            f"{spec.name} --out {root}; the workflow's fetch_benchmarks rule does this for the grid"
        )
    path = check_entry(spec, entry, root)
    records = [row for _line, row in iter_jsonl(path)]
    if len(records) != entry.get("records"):
        raise DataError(path, None, None, f"has {len(records)} records, its lock says {entry.get('records')}")
    return records, f"{entry['source']} (fetched, sha256 {entry['sha256'][:12]})"


def fetch_benchmarks(
    names: Iterable[str],
    root: str | Path,
    *,
    refetch: Iterable[str] = (),
    data_dir: str | Path | None = None,
    echo: Callable[[str], None] = print,
    allow_public_tests_only: bool = True,
) -> dict[str, dict[str, Any]]:
    """Fetch every benchmark of ``names`` into ``root`` (see the module docstring); returns the lock.

    ``allow_public_tests_only=False`` (the grid's default, ``evaluation.allow_public_tests_only``)
    refuses a code benchmark whose only source here has public tests only (the offline
    LiveCodeBench copy): its pass rates are not the benchmark's; nothing is written for it.

    Already fetched benchmarks are checked, not fetched again, unless named in ``refetch``. The lock
    is rewritten after each benchmark, so an interruption keeps what was fetched. Errors from one
    benchmark stop the fetch (nothing half-written stays: the records file is written atomically).
    """
    from aggbench.data.benchmarks import check_row_count, iter_records, load_benchmark_spec

    names, refetch, root = list(dict.fromkeys(names)), set(refetch), Path(root)
    unknown = sorted(refetch - set(names))
    if unknown:
        raise FetchedDataError(
            f"--refetch {', '.join(unknown)}: not among the benchmarks fetched ({', '.join(names)})"
        )
    root.mkdir(parents=True, exist_ok=True)
    entries = read_lock(root)
    for name in names:
        spec = load_benchmark_spec(name)
        if spec.builtin is not None:
            echo(f"{name}: built in (aggbench.tiny), nothing to fetch")
            continue
        if name in entries and name not in refetch:
            check_entry(spec, entries[name], root)
            if (
                spec.grader.entry.programs
                and not allow_public_tests_only
                and _public_only(entries[name], root)
            ):
                raise FetchedDataError(
                    f"{name}: the fetched copy under {root} has public tests only for "
                    f"{_public_only(entries[name], root)} problems (fetched from {entries[name].get('source')}); "
                    f"{_PUBLIC_FIX}"
                )
            echo(f"{name}: already fetched, sha256 checked ({entries[name]['records']} records)")
            continue
        t0 = time.perf_counter()
        rows, source = iter_records(spec, data_dir)
        digest, count = hashlib.sha256(), 0
        public_only = 0
        with atomic_writer(records_file(root, name)) as fh:
            for record in rows:
                line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
                digest.update(line.encode("utf-8"))
                fh.write(line)
                count += 1
                public_only += bool(record.get("public_tests_only"))
            check_row_count(spec, count, source)  # raised inside: the file is not kept
            if public_only and not allow_public_tests_only:  # raised inside: the file is not kept
                raise FetchedDataError(
                    f"{name}: the source here ({source}) has public tests only for {public_only} of "
                    f"{count} problems, so its pass rates would not be the benchmark's. {_PUBLIC_FIX}"
                )
            entry = _entry(spec, source, digest.hexdigest(), count, public_only, rows)
            _check_split(root, name, entry)  # raised inside: a refused refetch keeps the old copy
        _lock(root, name, entry, entries)
        echo(f"{name}: {count} records from {source} in {time.perf_counter() - t0:.1f} s")
    if not lock_file(root).is_file():
        _write_lock(root, entries)  # a grid of built-in benchmarks only: the rule's output still exists
    return entries


def _check_split(root: Path, name: str, entry: dict[str, Any]) -> None:
    """A holdout benchmark's problems against those a prepared training file of its set beside the
    copy left out (``data.holdout.check_against_prepared``); nothing for other benchmarks."""
    if "held_digest" in entry:
        from aggbench.data.holdout import check_against_prepared

        check_against_prepared(root, name, entry)


def _lock(root: Path, name: str, entry: dict[str, Any], entries: dict[str, dict[str, Any]]) -> None:
    """Add ``entry`` to the lock, then check the split again: a prepare-data job running beside
    this fetch may have written its record after the check before the copy was committed; the
    two write before they check, so one of them sees the other. Refused: the entry and its file go."""
    from aggbench.data.sources import SpecError

    entries[name] = entry
    _write_lock(root, entries)
    try:
        _check_split(root, name, entry)
    except SpecError:
        del entries[name]
        _write_lock(root, entries)
        records_file(root, name).unlink(missing_ok=True)
        raise


def _entry(spec: Any, source: str, sha256: str, count: int, public_only: int, rows: Any) -> dict[str, Any]:
    """The lock entry of a benchmark just fetched (``rows``: what was written)."""
    entry = {
        "source": source,
        "spec_version": spec.version,
        "data_key": data_key(spec),
        "file": records_file(".", spec.name).name,
        "sha256": sha256,
        "records": count,
        "public_tests_only": public_only,
        "fetched_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if spec.holdout_of is not None:  # the problems it holds, compared with prepare-data's record
        from aggbench.data.holdout import held_digest, training_data_key
        from aggbench.data.training import load_training_spec

        owner = load_training_spec(spec.holdout_of)
        # the set it is held out of: its name, and the key of the spec data that decides the split
        entry["holdout_of"], entry["holdout_key"] = owner.name, training_data_key(owner)
        entry["held_digest"] = held_digest(rows)  # a list: load_holdout's
    return entry


_PUBLIC_FIX = (
    "Fetch where the hub is reachable (the private tests; --refetch NAME replaces a copy), or set "
    "evaluation.allow_public_tests_only: true in the config (aggbench data fetch "
    "--allow-public-tests-only) to evaluate on public tests only (the tables then footnote it)"
)


def _public_only(entry: dict[str, Any], root: Path) -> int:
    """How many records of a locked copy have public tests only (counted from its file when a lock
    written before the count was kept lacks it)."""
    if "public_tests_only" in entry:
        return int(entry["public_tests_only"])
    return sum(bool(r.get("public_tests_only")) for _, r in iter_jsonl(root / entry["file"]))


def unfetched(names: Iterable[str], root: str | Path) -> list[str]:
    """The benchmarks of ``names`` that need data and have no entry in the lock under ``root``."""
    from aggbench.data.benchmarks import load_benchmark_spec

    try:
        entries = read_lock(root)
    except FetchedDataError:
        entries = {}
    return [n for n in names if load_benchmark_spec(n).builtin is None and n not in entries]
