"""Problems a selection benchmark shares with a test benchmark (issue 27, item 3's honest peaks):
a checkpoint chosen on a split that holds test problems has seen part of the test it reports; and
problems a prepared training file shares with a test benchmark: every cell trained on those.

Two kinds of shared problem are counted, each test problem at most once: **verbatim**, equal
problem text after Unicode NFKC and collapsing whitespace (:func:`aggbench.data.holdout.problem_key`,
the key the holdout split uses); and **near copies** (:mod:`aggbench.data.near`): the same problem
reformatted (maths delimiters, case, closing punctuation), reworded or with other numbers, a
pointer to check.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from aggbench.data.near import Problems, common_spans, near_copies

if TYPE_CHECKING:
    from aggbench.data.training import TrainingDatasetSpec


@dataclass(frozen=True)
class Shared:
    """Of one test benchmark's distinct problems, how many the other side holds ``verbatim`` and
    how many more it holds a ``near`` copy of (the module docstring defines both); ``examples``:
    where the first near copies are ("aime24 id 60 against line 12 of dapo.jsonl"), to check."""

    verbatim: int
    near: int = 0
    examples: tuple[str, ...] = field(default=(), compare=False)

    def __bool__(self) -> bool:
        return bool(self.verbatim or self.near)

    def describe(self, test: str) -> str:
        """'24 of aime24's problems verbatim and 1 more as a near copy (...)' for a note."""
        parts, means = [], []
        if self.verbatim:
            parts.append(f"{self.verbatim} of {test}'s problems verbatim")
            means.append("verbatim: the same text up to Unicode form and spacing")
        if self.near:
            more = " more" if self.verbatim else f" of {test}'s problems"
            parts.append(f"{self.near}{more} as {'a near copy' if self.near == 1 else 'near copies'}")
            means.append(
                "near copy: the same problem reformatted, reworded or with other numbers, "
                f"aggbench.data.near; check {', '.join(self.examples)}"
            )
        return " and ".join(parts) + f" ({'; '.join(means)})"


# per (selection, test) pair: the problems both hold, or why they could not be compared here
Overlap = Shared | str


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


def _training_texts(side: TrainingFile) -> list[tuple[str, str]]:
    """(where, problem) of each row of a prepared training file, its instruction template taken
    off. Raises DataError naming the file, line and field for a row without a text prompt or one
    the template does not wrap (prepared under another spec)."""
    from aggbench.data.jsonl import DataError, iter_jsonl
    from aggbench.data.rows import as_text

    where, texts = str(side.path), []
    for line, row in iter_jsonl(side.path):
        text = as_text(row.get("prompt"), where, line, "prompt")
        try:
            texts.append(
                (
                    f"line {line} of {side.path.name}",
                    side.spec.strip(text, where=where, line=line, field="prompt"),
                )
            )
        except DataError as exc:
            raise DataError(
                where, line, "prompt", f"{exc.reason}: prepared under another spec? prepare it again"
            ) from exc
    return texts


def _problems(name: str | TrainingFile, fetched: Path) -> Problems:
    """The problems of benchmark ``name`` as the evaluation reads it (the built-in task, or the
    fetched copy's records in the spec's date window) or of a training file. Only each line's
    prompt is kept (a code benchmark's tests can be gigabytes), and the file is not hashed again
    (the generate jobs check it against the lock). Raises InputError / OSError when it cannot be
    read here, FetchedDataError when it holds no problem."""
    from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
    from aggbench.data.fetch import FetchedDataError, read_lock, records_file
    from aggbench.data.jsonl import iter_jsonl

    if isinstance(name, TrainingFile):
        return Problems.of(_training_texts(name))
    spec = load_benchmark_spec(name)
    if spec.builtin is not None:
        got = Problems.of((f"{name} id {r['id']}", r["prompt"]) for r in load_benchmark(spec))
    elif name not in read_lock(fetched):
        raise FetchedDataError(f"{name}: not in the fetched copy {fetched}")
    else:
        window = spec.date_window
        got = Problems.of(
            (f"{name} id {row.get('id', f'line {line}')}", row["prompt"])
            for line, row in iter_jsonl(records_file(fetched, name))
            if window is None or window.contains(datetime.fromisoformat(row["date"]))
        )
    if not got.raw:
        raise FetchedDataError(f"{name}: no problems{' in its date window' if spec.date_window else ''}")
    return got


def shared_problems(
    pairs: Iterable[tuple[str | TrainingFile, str]], fetched: str | Path
) -> dict[tuple[str | TrainingFile, str], Overlap]:
    """{(selection benchmark or training file, test benchmark): of the test's distinct problems, how
    many the first holds verbatim and as near copies (:class:`Shared`), or why not compared} for
    each pair of ``pairs``. ``fetched``: the grid's fetched benchmark copy
    (``layout.benchmark_data_dir``). A record without a prompt or a date where its window needs one,
    or a benchmark without problems, is a reason, not a crash: the caller's report goes on. The
    boilerplate spans near copies leave out are counted over all the pairs' test benchmarks."""
    from aggbench.errors import InputError

    pairs = list(dict.fromkeys(pairs))
    cache: dict[str | TrainingFile, Problems | str] = {}
    for name in {n for pair in pairs for n in pair}:
        try:
            cache[name] = _problems(name, Path(fetched))
        except (InputError, OSError, KeyError, TypeError, ValueError) as exc:
            cache[name] = f"{name}: {exc}" if isinstance(exc, KeyError) else str(exc)
    common = common_spans(p for b in {b for _, b in pairs} if not isinstance(p := cache[b], str))
    out: dict[tuple[str | TrainingFile, str], Overlap] = {}
    for side in dict.fromkeys(a for a, _ in pairs):
        mine, tests = cache[side], {b: cache[b] for a, b in pairs if a == side}
        if isinstance(mine, str):
            out |= {(side, b): mine for b in tests}
            continue
        near = near_copies(mine, {b: got for b, got in tests.items() if not isinstance(got, str)}, common)
        for b, got in tests.items():
            if isinstance(got, str):
                out[side, b] = got
                continue
            examples = tuple(f"{got.where[k]} against {mine.where[o]}" for k, o in near[b][:2])
            out[side, b] = Shared(len(mine.raw.keys() & got.raw.keys()), len(near[b]), examples)
    return out
