"""Problems a selection benchmark shares with a test benchmark (issue 27, item 3's honest peaks):
a checkpoint chosen on a split that holds test problems has seen part of the test it reports; and
problems a prepared training file shares with a test benchmark: every cell trained on those.

Two records are the same problem when their problem text is equal after Unicode NFKC and collapsing
whitespace (:func:`aggbench.data.holdout.problem_key`, the key the holdout split uses). This finds
verbatim copies only: a problem reworded, renumbered or with its numbers changed is not found (a
fuzzy match over every pair would need an n-gram index; none of the field's libraries here does it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from aggbench.data.holdout import problem_key

if TYPE_CHECKING:
    from aggbench.data.training import TrainingDatasetSpec

# per (selection, test) pair: the problems both hold, or why they could not be compared here
Overlap = int | str


@dataclass(frozen=True)
class TrainingFile:
    """A prepared training file (``aggbench prepare-data``'s output, ``layout.data_file``) as one side
    of a pair. ``spec``: its training spec, whose ``instruction_template`` prepare-data put around
    each problem and :meth:`~aggbench.data.training.TrainingDatasetSpec.strip` takes off again before
    comparing (benchmark records hold the bare problem)."""

    dataset: str
    path: Path
    spec: TrainingDatasetSpec = field(compare=False)

    def __str__(self) -> str:
        return f"training set {self.dataset}"


def _training_keys(side: TrainingFile) -> set[str]:
    """The problem keys of a prepared training file, its instruction template taken off. Raises
    DataError naming the file, line and field for a row without a text prompt or one the template
    does not wrap (prepared under another spec)."""
    from aggbench.data.jsonl import DataError, iter_jsonl
    from aggbench.data.rows import as_text

    where, keys = str(side.path), set()
    for line, row in iter_jsonl(side.path):
        text = as_text(row.get("prompt"), where, line, "prompt")
        try:
            bare = side.spec.strip(text, where=where, line=line, field="prompt")
        except DataError as exc:
            raise DataError(
                where, line, "prompt", f"{exc.reason}: prepared under another spec? prepare it again"
            ) from exc
        keys.add(problem_key(bare))
    return keys


def _keys(name: str | TrainingFile, fetched: Path) -> set[str]:
    """The problem keys of benchmark ``name`` as the evaluation reads it: the built-in task, or the
    fetched copy's records in the spec's date window. Only each line's prompt is kept (a code
    benchmark's tests can be gigabytes), and the file is not hashed again (the generate jobs check
    it against the lock). Raises InputError / OSError when it cannot be read here."""
    from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
    from aggbench.data.fetch import FetchedDataError, read_lock, records_file
    from aggbench.data.jsonl import iter_jsonl

    if isinstance(name, TrainingFile):
        return _training_keys(name)
    spec = load_benchmark_spec(name)
    if spec.builtin is not None:
        return {problem_key(r["prompt"]) for r in load_benchmark(spec)}
    if name not in read_lock(fetched):
        raise FetchedDataError(f"{name}: not in the fetched copy {fetched}")
    window = spec.date_window
    return {
        problem_key(row["prompt"])
        for _line, row in iter_jsonl(records_file(fetched, name))
        if window is None or window.contains(datetime.fromisoformat(row["date"]))
    }


def shared_problems(
    pairs: Iterable[tuple[str | TrainingFile, str]], fetched: str | Path
) -> dict[tuple[str | TrainingFile, str], Overlap]:
    """{(selection benchmark or training file, test benchmark): how many distinct problems both
    hold, or why they were not compared} for each pair of ``pairs``. ``fetched``: the grid's
    fetched benchmark copy (``layout.benchmark_data_dir``). A record without a prompt or a date
    where its window needs one is a reason, not a crash: the caller's report goes on."""
    from aggbench.errors import InputError

    cache: dict[str | TrainingFile, set[str] | str] = {}
    for name in {n for pair in pairs for n in pair}:
        try:
            cache[name] = _keys(name, Path(fetched))
        except (InputError, OSError, KeyError, TypeError, ValueError) as exc:
            cache[name] = f"{name}: {exc}" if isinstance(exc, KeyError) else str(exc)
    out: dict[tuple[str | TrainingFile, str], Overlap] = {}
    for sel, test in dict.fromkeys(pairs):
        a, b = cache[sel], cache[test]
        out[sel, test] = a if isinstance(a, str) else b if isinstance(b, str) else len(a & b)
    return out
