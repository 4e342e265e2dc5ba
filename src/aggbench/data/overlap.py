"""Problems a selection benchmark shares with a test benchmark (issue 27, item 3's honest peaks):
a checkpoint chosen on a split that holds test problems has seen part of the test it reports.

Two records are the same problem when their problem text is equal after Unicode NFKC and collapsing
whitespace (:func:`aggbench.data.holdout.problem_key`, the key the holdout split uses). This finds
verbatim copies only: a problem reworded, renumbered or with its numbers changed is not found (a
fuzzy match over every pair would need an n-gram index; none of the field's libraries here does it).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from pathlib import Path

from aggbench.data.holdout import problem_key

# per (selection, test) pair: the problems both hold, or why they could not be compared here
Overlap = int | str


def _keys(name: str, fetched: Path) -> set[str]:
    """The problem keys of benchmark ``name`` as the evaluation reads it: the built-in task, or the
    fetched copy's records in the spec's date window. Only each line's prompt is kept (a code
    benchmark's tests can be gigabytes), and the file is not hashed again (the generate jobs check
    it against the lock). Raises InputError / OSError when it cannot be read here."""
    from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
    from aggbench.data.fetch import FetchedDataError, read_lock, records_file
    from aggbench.data.jsonl import iter_jsonl

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


def shared_problems(pairs: Iterable[tuple[str, str]], fetched: str | Path) -> dict[tuple[str, str], Overlap]:
    """{(selection benchmark, test benchmark): how many distinct problems both hold, or why they
    were not compared} for each pair of ``pairs``. ``fetched``: the grid's fetched benchmark copy
    (``layout.benchmark_data_dir``). A record without a prompt or a date where its window needs one
    is a reason, not a crash: the caller's report goes on."""
    from aggbench.errors import InputError

    cache: dict[str, set[str] | str] = {}
    for name in {n for pair in pairs for n in pair}:
        try:
            cache[name] = _keys(name, Path(fetched))
        except (InputError, OSError, KeyError, TypeError, ValueError) as exc:
            cache[name] = f"{name}: {exc}" if isinstance(exc, KeyError) else str(exc)
    out: dict[tuple[str, str], Overlap] = {}
    for sel, test in dict.fromkeys(pairs):
        a, b = cache[sel], cache[test]
        out[sel, test] = a if isinstance(a, str) else b if isinstance(b, str) else len(a & b)
    return out
