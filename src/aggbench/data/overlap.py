"""Problems a selection benchmark shares with a test benchmark (issue 27, item 3's honest peaks):
a checkpoint chosen on a split that holds test problems has seen part of the test it reports; and
problems a prepared training file shares with a test benchmark: every cell trained on those.

Two kinds of shared problem are counted, each test problem at most once:

- **verbatim**: equal problem text after Unicode NFKC and collapsing whitespace
  (:func:`aggbench.data.holdout.problem_key`, the key the holdout split uses);
- **reworded**: not verbatim, but a problem of the other side has one of its own ``NEAR_WORDS``-word
  spans (a span no other problem of its benchmark has: not an instruction or a stock phrase) and a
  ``difflib`` similarity of at least ``NEAR_RATIO`` over the words, both after lm-eval's
  decontamination normalisation (:func:`normalise`). The span finds the candidates, as lm-eval's
  and GPT-3's 13-gram decontamination does; the similarity keeps out problems that share a phrase
  only; the similarity is over each problem's own words (an instruction wrapper every problem of
  a benchmark carries, such as LiveCodeBench's, is left out). Measured on the real rows of
  ../shared/data (tests/data/test_overlap.py): 13-word spans alone flag AIME's "... relatively
  prime positive integers. Find $m+n$" between aime24 and aime25; the two rewordings there score
  0.61 (aime24's torus problem in DAPO's copy) and 0.59 (MATH-500's two-dice product problem in
  OlympiadBench); the most similar unrelated math pair with a shared span 0.40, and LiveCodeBench's
  Aug-Oct against its Nov-Jan 2024 problems at most 0.37 (0.65 with the wrapper in). A reworded
  count is a pointer to look at, not a proof; a rewording with new numbers and new words is not
  found, nor one of a problem with fewer than ``NEAR_MIN_WORDS`` own words (compared verbatim only:
  two of the built-in task's 13-word puzzles with the same map and another start look alike and
  are two problems; 199 of MATH-500's 500 problems are that short).
"""

from __future__ import annotations

import difflib
import string
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from aggbench.data.holdout import problem_key

if TYPE_CHECKING:
    from aggbench.data.training import TrainingDatasetSpec

NEAR_WORDS = 8  # words in a span two problems must share to be compared for rewording
NEAR_RATIO = 0.5  # difflib ratio of the normalised words from which a problem counts as reworded
# own words a test problem needs to be looked for reworded: in a shorter one, a changed number or
# two make another problem (the built-in task's 13-word puzzles differ in a map or a start)
NEAR_MIN_WORDS = 20

# lm-eval's decontamination Janitor.normalize_string: ASCII letters lower-cased, ASCII punctuation
# deleted. Written out here because importing lm_eval.decontamination prints a traceback when its
# C++ extension is absent (always, from PyPI), and lm-eval is an extra the report must not need;
# tests/data/test_overlap.py checks both give the same words and spans on the real benchmarks.
_JANITOR = str.maketrans(string.ascii_uppercase, string.ascii_lowercase, string.punctuation)


@dataclass(frozen=True)
class Shared:
    """Of one test benchmark's distinct problems, how many the other side holds ``verbatim`` and
    how many more it holds ``reworded`` (the module docstring defines both)."""

    verbatim: int
    reworded: int = 0

    def __bool__(self) -> bool:
        return bool(self.verbatim or self.reworded)

    def describe(self, test: str) -> str:
        """'24 of aime24's problems verbatim and 1 more reworded (...)' for a note's sentence."""
        parts = [f"{self.verbatim} of {test}'s problems verbatim"] if self.verbatim else []
        if self.reworded:
            more = " more" if self.verbatim else f" of {test}'s problems"
            parts.append(f"{self.reworded}{more} reworded")
        return (
            " and ".join(parts) + " (verbatim: the same text up to Unicode form and spacing; reworded: "
            f"a span of {NEAR_WORDS} words of its own in common and a word similarity of at least {NEAR_RATIO}, "
            "aggbench.data.overlap)"
        )


# per (selection, test) pair: the problems both hold, or why they could not be compared here
Overlap = Shared | str


def normalise(text: str) -> str:
    """``text`` as lm-eval's decontamination compares it: ASCII lower-cased, ASCII punctuation
    deleted (so ``$\\frac{m}{n}$`` is the word ``fracmn``), whitespace runs as one space."""
    return " ".join(text.translate(_JANITOR).split())


def spans(normalised: str, n: int = NEAR_WORDS) -> set[str]:
    """The ``n``-word spans of a :func:`normalise` d text (lm-eval's ``word_ngrams``); none when it
    has fewer than ``n`` words (such a problem is compared verbatim only)."""
    words = normalised.split()
    return {" ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


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


def _training_texts(side: TrainingFile) -> list[str]:
    """The problems of a prepared training file, its instruction template taken off. Raises
    DataError naming the file, line and field for a row without a text prompt or one the template
    does not wrap (prepared under another spec)."""
    from aggbench.data.jsonl import DataError, iter_jsonl
    from aggbench.data.rows import as_text

    where, texts = str(side.path), []
    for line, row in iter_jsonl(side.path):
        text = as_text(row.get("prompt"), where, line, "prompt")
        try:
            texts.append(side.spec.strip(text, where=where, line=line, field="prompt"))
        except DataError as exc:
            raise DataError(
                where, line, "prompt", f"{exc.reason}: prepared under another spec? prepare it again"
            ) from exc
    return texts


@dataclass(frozen=True)
class _Problems:
    """One side's distinct problems, keyed by :func:`~aggbench.data.holdout.problem_key`:
    ``texts`` normalised (:func:`normalise`); ``own`` without the words of spans another problem of
    its benchmark has too (an instruction wrapper, a stock phrase; a training file's, whose template
    is already off, whole); ``distinct`` its spans no other problem of its benchmark has."""

    texts: dict[str, str]
    own: dict[str, str]
    distinct: dict[str, set[str]]

    @classmethod
    def of(cls, raw: Iterable[str], *, benchmark: bool) -> _Problems:
        texts = {problem_key(t): normalise(t) for t in raw}
        if not benchmark:  # 10^5 problems: no span counts (their template is already off)
            return cls(texts, texts, {})
        words = {key: text.split() for key, text in texts.items()}
        starts = {key: _starts(w) for key, w in words.items()}
        common = Counter(span for each in starts.values() for span in set(each.values()))
        own, distinct = {}, {}
        for key, each in starts.items():
            shared = {j for i, span in each.items() if common[span] > 1 for j in range(i, i + NEAR_WORDS)}
            own[key] = " ".join(w for j, w in enumerate(words[key]) if j not in shared)
            distinct[key] = {span for span in each.values() if common[span] == 1}
        return cls(texts, own, distinct)


def _starts(words: list[str]) -> dict[int, str]:
    """{start: the ``NEAR_WORDS``-word span there} of a word list."""
    return {i: " ".join(words[i : i + NEAR_WORDS]) for i in range(len(words) - NEAR_WORDS + 1)}


def _problems(name: str | TrainingFile, fetched: Path) -> _Problems:
    """The problems of benchmark ``name`` as the evaluation reads it (the built-in task, or the
    fetched copy's records in the spec's date window) or of a training file. Only each line's
    prompt is kept (a code benchmark's tests can be gigabytes), and the file is not hashed again
    (the generate jobs check it against the lock). Raises InputError / OSError when it cannot be
    read here."""
    from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
    from aggbench.data.fetch import FetchedDataError, read_lock, records_file
    from aggbench.data.jsonl import iter_jsonl

    if isinstance(name, TrainingFile):
        return _Problems.of(_training_texts(name), benchmark=False)
    spec = load_benchmark_spec(name)
    if spec.builtin is not None:
        return _Problems.of((r["prompt"] for r in load_benchmark(spec)), benchmark=True)
    if name not in read_lock(fetched):
        raise FetchedDataError(f"{name}: not in the fetched copy {fetched}")
    window = spec.date_window
    rows = (row for _line, row in iter_jsonl(records_file(fetched, name)))
    return _Problems.of(
        (r["prompt"] for r in rows if window is None or window.contains(datetime.fromisoformat(r["date"]))),
        benchmark=True,
    )


def _similar(a: str, b: str) -> bool:
    """Whether two normalised texts are at least ``NEAR_RATIO`` alike word by word (difflib's
    ratio, its cheap upper bounds first)."""
    m = difflib.SequenceMatcher(None, a.split(), b.split(), autojunk=False)
    return m.real_quick_ratio() >= NEAR_RATIO and m.quick_ratio() >= NEAR_RATIO and m.ratio() >= NEAR_RATIO


def _reworded(side: _Problems, tests: dict[str, _Problems]) -> dict[str, int]:
    """{test: how many of its problems, not held verbatim, ``side`` holds reworded}. One pass over
    ``side`` (a training set can hold 10^5 problems) against an index of the tests' own spans; the
    similarity compares own words (an instruction every problem of a benchmark carries is not
    evidence that two problems are one)."""
    index: dict[str, list[tuple[str, str]]] = {}
    for test, problems in tests.items():
        for key, each in problems.distinct.items():
            if key in side.texts or len(problems.own[key].split()) < NEAR_MIN_WORDS:
                continue  # held verbatim; too short to tell a rewording from another problem
            for span in each:
                index.setdefault(span, []).append((test, key))
    found: set[tuple[str, str]] = set()
    for key, text in side.texts.items():
        for test, other in {hit for span in spans(text) for hit in index.get(span, ())} - found:
            if _similar(side.own[key], tests[test].own[other]):
                found.add((test, other))
    return {test: sum(t == test for t, _ in found) for test in tests}


def shared_problems(
    pairs: Iterable[tuple[str | TrainingFile, str]], fetched: str | Path
) -> dict[tuple[str | TrainingFile, str], Overlap]:
    """{(selection benchmark or training file, test benchmark): of the test's distinct problems, how
    many the first holds verbatim and reworded (:class:`Shared`), or why they were not compared} for
    each pair of ``pairs``. ``fetched``: the grid's fetched benchmark copy
    (``layout.benchmark_data_dir``). A record without a prompt or a date where its window needs one
    is a reason, not a crash: the caller's report goes on."""
    from aggbench.errors import InputError

    pairs = list(dict.fromkeys(pairs))
    cache: dict[str | TrainingFile, _Problems | str] = {}
    for name in {n for pair in pairs for n in pair}:
        try:
            cache[name] = _problems(name, Path(fetched))
        except (InputError, OSError, KeyError, TypeError, ValueError) as exc:
            cache[name] = f"{name}: {exc}" if isinstance(exc, KeyError) else str(exc)
    out: dict[tuple[str | TrainingFile, str], Overlap] = {}
    for side in dict.fromkeys(a for a, _ in pairs):
        mine, tests = cache[side], {b: cache[b] for a, b in pairs if a == side}
        if isinstance(mine, str):
            out |= {(side, b): mine for b in tests}
            continue
        readable = {b: got for b, got in tests.items() if not isinstance(got, str)}
        near = _reworded(mine, readable)
        for b, got in tests.items():
            out[side, b] = (
                got if isinstance(got, str) else Shared(len(mine.texts.keys() & got.texts.keys()), near[b])
            )
    return out
