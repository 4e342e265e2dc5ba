"""Problems a selection benchmark shares with a test benchmark (issue 27, item 3's honest peaks):
a checkpoint chosen on a split that holds test problems has seen part of the test it reports.

Two records are the same problem when their problem text is equal after Unicode NFKC and collapsing
whitespace (:func:`aggbench.data.holdout.problem_key`, the key the holdout split uses). This finds
verbatim copies only: a problem reworded, renumbered or with its numbers changed is not found (a
fuzzy match over every pair would need an n-gram index; none of the field's libraries here does it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from aggbench.data.holdout import problem_key


def _keys(name: str, fetched: Path, cache: dict[str, set[str] | None]) -> set[str] | None:
    """The problem keys of benchmark ``name`` as the evaluation reads it (the fetched copy, or the
    built-in task); None where it cannot be read here (not fetched yet: other checks say so)."""
    if name not in cache:
        from aggbench.data.benchmarks import load_benchmark
        from aggbench.errors import InputError

        try:
            cache[name] = {problem_key(r["prompt"]) for r in load_benchmark(name, fetched=fetched)}
        except (InputError, OSError):
            cache[name] = None
    return cache[name]


def shared_problems(pairs: Iterable[tuple[str, str]], fetched: str | Path) -> dict[tuple[str, str], int]:
    """{(selection benchmark, test benchmark): how many distinct problems both hold} for each pair
    of ``pairs`` that shares any; pairs either of whose records cannot be read are left out.
    ``fetched``: the grid's fetched benchmark copy (``layout.benchmark_data_dir``)."""
    cache: dict[str, set[str] | None] = {}
    out = {}
    for sel, test in dict.fromkeys(pairs):
        a, b = _keys(sel, Path(fetched), cache), _keys(test, Path(fetched), cache)
        if a is not None and b is not None and (n := len(a & b)):
            out[sel, test] = n
    return out
