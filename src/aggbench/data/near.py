"""Near copies of test problems (``aggbench.data.overlap``'s second kind of shared problem): a
problem of the other side that is not the test problem's text but is, or may be, the same problem.

A test problem not held verbatim has a near copy when a problem of the other side

- reads the same but for maths delimiters, case and closing punctuation (:func:`plain`: ``$x$``
  for ``\\(x\\)``, a trailing period), at any length; or
- shares at least ``NEAR_SPANS`` of the test problem's ``NEAR_WORDS``-word spans after lm-eval's
  decontamination normalisation (:func:`normalise`; lm-eval and GPT-3 find contamination by 13-word
  spans), and is at least ``NEAR_RATIO`` alike word by word (``difflib``) once the spans that
  ``COMMON_IN`` or more of the test benchmarks' problems have (an instruction wrapper, an AtCoder
  "Input/Output/Constraints" block, AIME's "relatively prime positive integers. Find $m+n$") are
  out of both. Only a test problem with at least ``NEAR_MIN_WORDS`` words left is compared so: in a
  short one a changed number or two make another problem (the built-in task's 13-word puzzles
  differ in a map or a start), so a rewording of a short problem is not found.

Only spans fewer than ``COMMON_IN`` problems have find candidates, and ``NEAR_SPANS`` of them are
needed: both cut the pairs difflib compares (a single shared span is mostly a phrase the
similarity then rejects). The spans are counted over all the test benchmarks of one report
(problems with the same words once), so a small benchmark's boilerplate is still found.

A near copy is a pointer to check, not a proof: it is the same problem reworded, or a variant of
it with other numbers (aime24 with every number raised by one is 25 near copies of its 30
problems), and a rewording with new numbers and new words is not found. Measured on the real rows
of ../shared/data (tests/data/test_overlap.py): the two rewordings there score 0.59 (MATH-500's
two-dice product problem in OlympiadBench) and 0.63 (aime24's torus problem in DAPO's copy), and
no other pair of the real math benchmarks is counted.
"""

from __future__ import annotations

import difflib
import re
import string
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from aggbench.data.holdout import problem_key

NEAR_WORDS = 8  # words in a span two problems must share to be compared
NEAR_SPANS = 2  # rare spans a candidate must share before difflib compares it
NEAR_RATIO = 0.5  # difflib ratio of the compared words from which a candidate is a near copy
NEAR_MIN_WORDS = 20  # words a test problem needs left to be compared by similarity
COMMON_IN = 3  # a span this many test problems have is a wrapper or a stock phrase

# lm-eval's decontamination Janitor.normalize_string: ASCII letters lower-cased, ASCII punctuation
# deleted. Written out here because importing lm_eval.decontamination prints a traceback when its
# C++ extension is absent (always, from PyPI), and lm-eval is an extra the report must not need;
# tests/data/test_overlap.py checks both give the same words and spans on the real benchmarks.
_JANITOR = str.maketrans(string.ascii_uppercase, string.ascii_lowercase, string.punctuation)
_DELIMITERS = re.compile(r"\$|\\[()\[\]]")


def normalise(text: str) -> str:
    """``text`` as lm-eval's decontamination compares it: ASCII lower-cased, ASCII punctuation
    deleted (so ``$\\frac{m}{n}$`` is the word ``fracmn``), whitespace runs as one space."""
    return " ".join(text.translate(_JANITOR).split())


def plain(text: str) -> str:
    """``text`` without maths delimiters (``$``, ``\\(``, ``\\)``, ``\\[``, ``\\]``), lower-cased,
    whitespace runs as one space, closing ``.!?`` off: what a copy reformatted keeps (the signs,
    powers and decimal points that make another problem stay)."""
    return " ".join(_DELIMITERS.sub(" ", text).lower().split()).rstrip(" .!?")


def spans(normalised: str, n: int = NEAR_WORDS) -> set[str]:
    """The ``n``-word spans of a :func:`normalise` d text (lm-eval's ``word_ngrams``); none when it
    has fewer than ``n`` words."""
    return set(_starts(normalised.split(), n).values())


def _starts(words: list[str], n: int = NEAR_WORDS) -> dict[int, str]:
    """{start: the ``n``-word span there} of a word list."""
    return {i: " ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def _without(text: str, common: frozenset[str]) -> list[str]:
    """``text``'s words that no span in ``common`` covers."""
    words = text.split()
    gone = {j for i, span in _starts(words).items() if span in common for j in range(i, i + NEAR_WORDS)}
    return [w for j, w in enumerate(words) if j not in gone]


@dataclass(frozen=True)
class Problems:
    """One side's distinct problems, keyed by :func:`~aggbench.data.holdout.problem_key`: ``raw``
    as written, ``texts`` normalised, ``where`` each one is (a record's id, a file's line)."""

    raw: dict[str, str]
    texts: dict[str, str]
    where: dict[str, str]

    @classmethod
    def of(cls, rows: Iterable[tuple[str, str]]) -> Problems:
        """From (where, text) pairs; a repeated problem keeps its first place."""
        raw, where = {}, {}
        for place, text in rows:
            key = problem_key(text)
            if key not in raw:
                raw[key], where[key] = text, place
        return cls(raw, {key: normalise(t) for key, t in raw.items()}, where)


def common_spans(benchmarks: Iterable[Problems]) -> frozenset[str]:
    """The spans ``COMMON_IN`` or more problems of ``benchmarks`` have (same-worded ones once)."""
    texts = {text for problems in benchmarks for text in problems.texts.values()}
    counts = Counter(span for text in texts for span in spans(text))
    return frozenset(span for span, n in counts.items() if n >= COMMON_IN)


def near_copies(
    side: Problems, tests: dict[str, Problems], common: frozenset[str] | None = None
) -> dict[str, list[tuple[str, str]]]:
    """{test: (its problem's key, the key of ``side``'s near copy) for each of its problems not held
    verbatim that ``side`` holds a near copy of}, in the test's order. ``common``: the boilerplate
    spans (default: :func:`common_spans` of ``tests``). One pass over ``side`` (a training set can
    hold 10^5 problems) against an index of the tests' rarer spans."""
    common = common_spans(tests.values()) if common is None else common
    plains = {p: key for key, t in reversed(side.raw.items()) if (p := plain(t))}
    found: dict[tuple[str, str], str] = {}
    index: dict[str, list[tuple[str, str]]] = {}
    own: dict[tuple[str, str], list[str]] = {}
    for test, problems in tests.items():
        for key, text in problems.texts.items():
            if key in side.raw:
                continue  # verbatim
            if (copy := plains.get(plain(problems.raw[key]))) is not None:
                found[test, key] = copy
            elif len(words := _without(text, common)) >= NEAR_MIN_WORDS:
                own[test, key] = words
                for span in spans(text) - common:
                    index.setdefault(span, []).append((test, key))
    for other, text in side.texts.items():
        hits = Counter(hit for span in spans(text) for hit in index.get(span, ()))
        candidates = [h for h, n in hits.items() if n >= NEAR_SPANS and h not in found]
        if candidates:
            m = difflib.SequenceMatcher(None, autojunk=False)
            m.set_seq2(_without(text, common))  # difflib indexes the second sequence: once per problem
            for hit in candidates:
                m.set_seq1(own[hit])
                if (
                    m.real_quick_ratio() >= NEAR_RATIO
                    and m.quick_ratio() >= NEAR_RATIO
                    and m.ratio() >= NEAR_RATIO
                ):
                    found[hit] = other
    return {
        test: [(key, found[test, key]) for key in problems.texts if (test, key) in found]
        for test, problems in tests.items()
    }
