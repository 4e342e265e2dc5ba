"""Near copies of test problems (``aggbench.data.overlap``'s second kind of shared problem): a
problem of the other side that is not the test problem's text but is, or may be, the same problem.

A test problem not held verbatim has a near copy when a problem of the other side

- has the same words after lm-eval's decontamination normalisation (:func:`normalise`: lower case,
  ASCII punctuation deleted), at any length (``$x$`` for ``\\(x\\)``, a trailing period); or
- shares at least ``NEAR_SPANS`` of the test problem's ``NEAR_WORDS``-word spans that fewer than
  ``COMMON_IN`` problems of its benchmark have (lm-eval's and GPT-3's n-gram decontamination finds
  candidates the same way, with 13 words), and is at least ``NEAR_RATIO`` alike word by word
  (``difflib``) once the spans ``COMMON_IN`` or more problems of the test's benchmark have (an
  instruction wrapper, an AtCoder "Input/Output/Constraints" block, a stock phrase such as AIME's
  "relatively prime positive integers. Find $m+n$") are left out of both. Test problems with fewer
  than ``NEAR_MIN_WORDS`` words left are matched by their words only: in a short problem a changed
  number or two make another problem (the built-in task's 13-word puzzles differ in a map or a
  start), and 199 of MATH-500's 500 problems are that short, so a rewording of them is not found.

A near copy is a pointer to look at, not a proof: it is the same problem reworded, or a variant of
it with other numbers (a number changed in every AIME problem makes 25 of 30 near copies; the
note says "reworded or a variant"), and a rewording with new numbers and new words is not found.
Measured on the real rows of ../shared/data (tests/data/test_overlap.py): the two rewordings there
score 0.59 (MATH-500's two-dice product problem in OlympiadBench) and 0.63 (aime24's torus problem
in DAPO's copy), and no other pair of the real math benchmarks reaches ``NEAR_RATIO``.
"""

from __future__ import annotations

import difflib
import string
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from aggbench.data.holdout import problem_key

NEAR_WORDS = 8  # words in a span two problems must share to be compared
NEAR_SPANS = 2  # rare spans a candidate must share (one shared span is too often a phrase)
NEAR_RATIO = 0.5  # difflib ratio of the compared words from which a candidate is a near copy
NEAR_MIN_WORDS = 20  # words a test problem needs left to be compared by similarity
COMMON_IN = 3  # a span this many problems of a benchmark have is its wrapper or a stock phrase

# lm-eval's decontamination Janitor.normalize_string: ASCII letters lower-cased, ASCII punctuation
# deleted. Written out here because importing lm_eval.decontamination prints a traceback when its
# C++ extension is absent (always, from PyPI), and lm-eval is an extra the report must not need;
# tests/data/test_overlap.py checks both give the same words and spans on the real benchmarks.
_JANITOR = str.maketrans(string.ascii_uppercase, string.ascii_lowercase, string.punctuation)


def normalise(text: str) -> str:
    """``text`` as lm-eval's decontamination compares it: ASCII lower-cased, ASCII punctuation
    deleted (so ``$\\frac{m}{n}$`` is the word ``fracmn``), whitespace runs as one space."""
    return " ".join(text.translate(_JANITOR).split())


def spans(normalised: str, n: int = NEAR_WORDS) -> set[str]:
    """The ``n``-word spans of a :func:`normalise` d text (lm-eval's ``word_ngrams``); none when it
    has fewer than ``n`` words."""
    return set(_starts(normalised.split(), n).values())


def _starts(words: list[str], n: int = NEAR_WORDS) -> dict[int, str]:
    """{start: the ``n``-word span there} of a word list."""
    return {i: " ".join(words[i : i + n]) for i in range(len(words) - n + 1)}


def _without(text: str, common: set[str]) -> str:
    """``text``'s words that no span in ``common`` covers."""
    words = text.split()
    gone = {j for i, span in _starts(words).items() if span in common for j in range(i, i + NEAR_WORDS)}
    return " ".join(w for j, w in enumerate(words) if j not in gone)


@dataclass(frozen=True)
class Problems:
    """One side's distinct problems, keyed by :func:`~aggbench.data.holdout.problem_key`: ``raw``
    as written, ``texts`` normalised; for a benchmark also ``common``, the spans ``COMMON_IN`` or
    more of its problems have (same-worded problems counted once), and ``own``, each text without
    them (a training file: none counted, 10^5 problems; its template is already off)."""

    raw: dict[str, str]
    texts: dict[str, str]
    common: frozenset[str]
    own: dict[str, str]

    @classmethod
    def of(cls, raw: Iterable[str], *, benchmark: bool) -> Problems:
        by_key = {problem_key(t): t for t in raw}
        texts = {key: normalise(t) for key, t in by_key.items()}
        if not benchmark:
            return cls(by_key, texts, frozenset(), texts)
        counts = Counter(span for text in set(texts.values()) for span in spans(text))
        common = frozenset(span for span, n in counts.items() if n >= COMMON_IN)
        return cls(by_key, texts, common, {key: _without(text, common) for key, text in texts.items()})


def _similar(test_own: str, other: str, common: frozenset[str]) -> bool:
    """Whether ``other`` (normalised) is at least ``NEAR_RATIO`` alike the test problem's own words,
    word by word, once the test benchmark's ``common`` spans are out of it too (difflib's ratio,
    its cheap upper bounds first)."""
    m = difflib.SequenceMatcher(None, test_own.split(), _without(other, common).split(), autojunk=False)
    return m.real_quick_ratio() >= NEAR_RATIO and m.quick_ratio() >= NEAR_RATIO and m.ratio() >= NEAR_RATIO


def near_copies(side: Problems, tests: dict[str, Problems]) -> dict[str, list[str]]:
    """{test: the keys of its problems, not held verbatim, that ``side`` holds a near copy of}, in
    the test's order. One pass over ``side`` (a training set can hold 10^5 problems) against an
    index of the tests' rare spans."""
    worded = set(side.texts.values())
    found: set[tuple[str, str]] = set()
    index: dict[str, list[tuple[str, str]]] = {}
    for test, problems in tests.items():
        for key, text in problems.texts.items():
            if key in side.texts:
                continue  # verbatim
            if text in worded:
                found.add((test, key))
            elif len(problems.own[key].split()) >= NEAR_MIN_WORDS:
                for span in spans(text) - problems.common:
                    index.setdefault(span, []).append((test, key))
    for text in side.own.values():
        hits = Counter(hit for span in spans(text) for hit in index.get(span, ()))
        for test, key in (h for h, n in hits.items() if n >= NEAR_SPANS and h not in found):
            if _similar(tests[test].own[key], text, tests[test].common):
                found.add((test, key))
    return {test: [key for key in problems.texts if (test, key) in found] for test, problems in tests.items()}
