"""Math answers: extract the final answer from a response and judge it against the gold answer.

One grader serves training rewards and checkpoint evaluation, so the two can never disagree.

Extraction (:func:`extract_answer`, in :mod:`aggbench.grading.math_extract`), in this order:
  1. the last ``\\boxed{...}`` / ``\\boxed ...`` / ``\\fbox{...}`` whose braces close;
  2. else the last DAPO ``Answer: ...`` line (``Answer: $42$``, ``Answer: 42``);
  3. else Minerva's ``The final answer is ... I hope it is correct.``;
  4. else, where the response has no box command at all, the unboxed last sentence as
     Qwen2.5-Math's evaluation and math-verify read it (``so the answer is 12.``, ``... is $x$.``,
     ``Therefore, she has 12 coins.``), with math-verify's own patterns on the response's tail.
  None when the response has none of them. A bare number decorated with ordinal or unit text
  (``5^{\\mathrm{th}}\\text{ term}``) is then reduced to the number.

Equivalence is math-verify's (``verify(gold, pred)``, gold first; both sides are parsed as
``\\boxed{<answer>}``), after normalising the quirks of the real benchmark files (see
/work/shared/data/PROVENANCE.md): OlympiadBench golds wrapped in ``$...$`` (several ``$..$,$..$``
groups, a trailing period), Minerva golds that are a whole solution with one ``\\boxed{}`` and a
unit outside it or Python literals (``4.5e33``, ``-1./3``, ``np.arcsin(10/13)``), and ``°``. math-verify itself already handles ``025`` = 25,
``10,\\!080``, ``\\text{(C)}`` = ``C``, ``^\\circ``, ``\\dfrac``, ``\\text{ cm}`` units and unordered
lists of answers; the tests pin those behaviours. One deliberate deviation: math-verify calls any
two numbers below ~5e-7 equal (it compares 6 decimal places), so for golds below 1e-3 a numeric
prediction must also agree to a relative 1e-3 (Minerva's 7e-19 is not 2.88e-19). Another: an
equation that only agrees with an equation gold up to a scale factor is accepted only when it is
itself in a normalised form (``4x - 2y + 6z = 16`` for ``2x - y + 3z = 8`` is refused, ``y = -x/2 + 3/4``
for ``2x + 4y - 3 = 0`` accepted; see :mod:`aggbench.grading.math_equations`). A response ending in
a list of boxes is graded as the set of them where the problem asks for several answers
(:func:`grade_math`'s ``multiple_answer``). On top of
math-verify: an optional absolute
numeric ``tolerance`` (OlympiadBench ``error``) and an optional ``unit`` stripped from the end of
the prediction (OlympiadBench ``unit``, e.g. ``cm^2`` or ``%``, which math-verify does not know).

Safety: only the extracted answer (at most :data:`MAX_ANSWER_CHARS`) ever reaches the parser;
extraction itself is linear in the response length (step 4 reads a bounded tail), so no cap on the response is needed and none
can change a verdict. math-verify's own SIGALRM timeouts are disabled because they reset any
other ITIMER_REAL (ours included) and log the whole response on expiry; :func:`grade_math` sets
its own soft deadline instead, and :func:`grade_math_batch` grades in worker processes that are
killed on a hard deadline (see :mod:`aggbench.grading.pool`).
"""

from __future__ import annotations

import functools
import logging
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

from aggbench.grading.math_equations import compare_equations, first_equation
from aggbench.grading.math_extract import (
    _BOX_COMMANDS,
    MAX_ANSWER_CHARS,
    extract_answer,
    extract_answers,
    final_boxes,
    strip_number_decoration,
)

if TYPE_CHECKING:
    from aggbench.grading.pool import GradingPool

__all__ = [
    "MathVerdict",
    "clean_gold",
    "grade_math",
    "grade_math_batch",
    "grade_math_item",
    "grading_options",
]

# math-verify warns once that its timeouts are off (we own them) and, with them on, logs the
# whole response on a timeout: both are noise for a trainer grading thousands of responses.
logging.getLogger("math_verify").setLevel(logging.ERROR)

DEFAULT_SOFT_TIMEOUT_S = 5.0

_PARSE_CONFIG = (LatexExtractionConfig(), ExprExtractionConfig())


@dataclass(frozen=True)
class MathVerdict:
    """The grade of one response: ``reason`` says which rule decided (stable strings).

    correct: ``exact_match``, ``integer_match``, ``equivalent`` (math-verify), ``within_tolerance``.
    wrong: ``no_answer``, ``empty_answer``, ``answer_too_long``, ``integer_mismatch``,
    ``not_equivalent``, ``small_number_mismatch`` (see :func:`_small_numbers_differ`),
    ``scaled_equation`` (see :mod:`aggbench.grading.math_equations`),
    ``gold_unparseable``, ``timeout``, ``worker_crashed``, ``error: ...``.
    """

    correct: bool
    extracted: str | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"correct": self.correct, "extracted": self.extracted, "reason": self.reason}


# --------------------------------------------------------------------------- extraction


# --------------------------------------------------------------------------- normalisation

_E_NOTATION = re.compile(r"(?<![\w.])(-?\d+(?:\.\d*)?)[eE]([+-]?\d+)(?![\w.])")
_INTEGER = re.compile(r"-?\d{1,1000}")  # Python refuses int() of more than 4300 digits
_HAS_ALNUM = re.compile(r"[0-9A-Za-z]")
_COMMAND = re.compile(r"\\[A-Za-z]+")
_BARE_POINT = re.compile(r"(?<=\d)\.(?=\s*(?:[/*)\]},]|$))")
_NUMPY = re.compile(r"\bnp\.(arcsin|arccos|arctan|sin|cos|tan|sqrt|exp|log|pi)\b")
_DOLLAR = re.compile(r"(?<!\\)\$")


def _common(s: str) -> str:
    """Normalisations applied to both sides (each makes math-verify parse what it otherwise misreads)."""
    s = s.strip()
    s = s.replace("°", "^{\\circ}")  # math-verify reads "30°" as a string, "30^{\circ}" as 30
    s = _E_NOTATION.sub(r"\1\\times 10^{\2}", s)  # Minerva golds: "4.5e33" (else e is a symbol)
    s = _BARE_POINT.sub("", s)  # Minerva golds: "-1./3" (unparseable) -> "-1/3"
    s = _NUMPY.sub(r"\\\1", s)  # Minerva gold: "np.arcsin(10/13)" -> "\arcsin(10/13)"
    return s


def clean_gold(gold: str) -> str:
    """A gold string as stored in the benchmark files -> the bare answer.

    A string with a ``\\boxed{}`` (Minerva: the whole solution) gives that box's content, so a unit
    written after the box is dropped; a list of boxes ending the string (``\\boxed{1} and
    \\boxed{-2}``, see :func:`~aggbench.grading.math_extract.final_boxes`) gives their contents
    joined by commas. A gold that starts with ``$`` loses its ``$`` signs
    (OlympiadBench ``'$69$,$84$'`` -> ``69,84``) and a trailing period (``'$(-\\infty, 0)$.'``).
    An escaped ``\\$`` (MATH-500 ``'\\$18.90'``) stays; math-verify reads it as a currency sign.
    """
    if not isinstance(gold, str):
        gold = str(gold)  # ints (the AReaL copy of AIME 2025)
    if any(c in gold for c in _BOX_COMMANDS):
        boxes = final_boxes(gold)  # one box, or a list of them ("\\boxed{1} and \\boxed{-2}")
        if boxes:
            gold = ", ".join(boxes)
    gold = gold.strip()
    if gold.startswith("$"):
        # Remove every unescaped $ rather than pairing them: one OlympiadBench gold is '$221,$8$'.
        gold = _DOLLAR.sub("", gold).strip()
        if gold.endswith(".") and not gold.endswith(".."):
            gold = gold[:-1]
    return _common(gold)


def _strip_unit(pred: str, unit: str | None) -> str:
    """Remove ``unit`` (OlympiadBench: ``km``, ``$cm^2$``, ``%``, ``^{\\circ}``) from the end of pred."""
    if not unit:
        return pred
    u = unit.strip().strip("$").strip()
    if not u:
        return pred
    forms = [re.escape(u)]
    if u == "%":
        forms.append(r"\\%")
    if u.startswith("^"):  # ^{\circ} == ^\circ
        forms.append(re.escape(u.replace("{", "").replace("}", "")))
    body = "|".join(forms)
    pattern = rf"(?:\\[,;:! ]|~|\s)*(?:(?:\\(?:text|mathrm|mbox|operatorname)\s*\{{\s*~?\s*(?:{body})\s*\}})|(?:{body}))\s*$"
    stripped = re.sub(pattern, "", pred).strip()
    return stripped or pred


@functools.lru_cache(maxsize=16384)
def _parse(answer: str) -> tuple:
    """math-verify's parse of one extracted answer, cached: golds repeat across the G responses of
    a prompt, and so do the answers of those responses. Parsed values are immutable sympy
    objects and strings, so sharing them is safe."""
    # first_match: the answer is already extracted, so do not dig a number out of an unparseable box
    return tuple(
        parse(
            "\\boxed{" + answer + "}",
            extraction_config=_PARSE_CONFIG,
            extraction_mode="first_match",
            parsing_timeout=None,
        )
    )


def _as_float(values: Sequence[Any]) -> float | None:
    for v in values:
        if isinstance(v, sympy.Basic) and getattr(v, "is_number", False):
            try:
                x = complex(v.evalf())
            except (TypeError, ValueError):
                continue
            if x.imag == 0 and x.real == x.real and abs(x.real) != float("inf"):
                return x.real
    return None


@functools.lru_cache(maxsize=16384)
def _gold_value(gold: str) -> float | None:
    return _as_float(_parse(gold))


def _small_numbers_differ(gold: str, pred_parsed: Sequence[Any]) -> bool:
    """A veto on math-verify's "equal" for numbers below 1e-3 (the one rule that makes us stricter).

    math-verify compares numbers to 6 decimal places (and chops differences below ~1e-15), so
    every number under 5e-7 "equals" every other: 7e-19 == 2.88e-19. Minerva has 20 golds under
    1e-3 (physics constants). For those, when the prediction is a number too, we keep
    math-verify's "equal" only if the two agree to a relative 1e-3: the precision math-verify's
    6 places give at 1e-3, carried down to smaller scales (so the rule is continuous at 1e-3 and
    never stricter than math-verify is at that size).
    """
    g = _gold_value(gold)
    if g is None or g == 0 or abs(g) >= 1e-3:
        return False
    p = _as_float(pred_parsed)
    return p is not None and abs(p - g) > 1e-3 * abs(g)


def _compare(pred: str, gold: str, tolerance: float | None) -> MathVerdict:
    # Shortcut 1: identical strings. It cannot change a verdict: identical strings parse to
    # identical results, and math-verify also compares its fallback strings (the normalised
    # LaTeX), which are then equal, so verify() says True. The fallback is empty only for a
    # string its normalisation erases ("$", "\\!"), hence the letter-or-digit condition.
    if pred == gold and _HAS_ALNUM.search(_COMMAND.sub("", pred)):
        return MathVerdict(True, pred, "exact_match")
    # Shortcut 2: two plain integers. math-verify parses "025" and "25" to Integer(25) and
    # compares Integers exactly, so comparing int() values gives its verdict in both directions
    # (tests check this against math-verify on a sample of pairs).
    if _INTEGER.fullmatch(pred) and _INTEGER.fullmatch(gold):
        same = int(pred) == int(gold)
        return MathVerdict(same, pred, "integer_match" if same else "integer_mismatch")
    gold_parsed = _parse(gold)
    if not gold_parsed:
        return MathVerdict(False, pred, "gold_unparseable")
    pred_parsed = _parse(pred)
    gold_eq, pred_eq = first_equation(gold_parsed), first_equation(pred_parsed)
    if gold_eq is not None and pred_eq is not None:
        same, reason = compare_equations(gold_eq, pred_eq)
        return MathVerdict(same, pred, reason)
    equal = verify(list(gold_parsed), list(pred_parsed), timeout_seconds=None)
    vetoed = equal and _small_numbers_differ(gold, pred_parsed)
    if equal and not vetoed:
        return MathVerdict(True, pred, "equivalent")
    if tolerance is not None:
        g, p = _as_float(gold_parsed), _as_float(pred_parsed)
        if g is not None and p is not None and abs(g - p) <= tolerance * (1 + 1e-9):
            return MathVerdict(True, pred, "within_tolerance")
    return MathVerdict(False, pred, "small_number_mismatch" if vetoed else "not_equivalent")


class GradingTimeout(BaseException):
    """Raised by the soft deadline. A BaseException so that math-verify's and sympy's
    ``except Exception`` blocks do not swallow it."""


@contextmanager
def _soft_deadline(seconds: float | None) -> Iterator[None]:
    """Raise GradingTimeout after ``seconds`` (ITIMER_REAL; main thread only, else no deadline).

    It interrupts Python code only: one long C call (a huge integer power) runs on, which is why
    :func:`grade_math_batch` adds a hard deadline by killing the worker process.
    """
    if not seconds or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise GradingTimeout

    old_handler = signal.signal(signal.SIGALRM, _raise)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    t0 = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay:  # give back a timer someone else had set, minus the time we used
            signal.setitimer(signal.ITIMER_REAL, max(1e-3, old_delay - (time.monotonic() - t0)), old_interval)


def _tolerance(value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        tol = float(value)
    except (TypeError, ValueError):
        raise ValueError(
            f"tolerance must be a number (e.g. OlympiadBench error '1e-1'), got {value!r}"
        ) from None
    if not tol >= 0:
        raise ValueError(f"tolerance must be >= 0, got {value!r}")
    return tol


def _is_list(gold: str) -> bool:
    """Whether a cleaned gold holds several answers: math-verify reads it as a set of two or more
    (``(1,8,19), (2,7,13)``, ``k = 45, n = 2``; not ``(1, 2)``, an interval, nor ``10,080``)."""
    parsed = _parse(gold)
    return bool(parsed) and isinstance(parsed[0], sympy.FiniteSet) and len(parsed[0]) > 1


def grade_math(
    response: str,
    gold: str | Sequence[str],
    *,
    tolerance: float | str | None = None,
    unit: str | None = None,
    multiple_answer: bool | None = None,
    timeout_s: float | None = DEFAULT_SOFT_TIMEOUT_S,
) -> MathVerdict:
    """Grade one response against the gold answer, in this process.

    Args:
        response: the model's whole response.
        gold: the reference answer as stored in the benchmark (``"025"``, ``"$\\frac{1}{2}$."``,
            a Minerva solution with its one ``\\boxed{}``), or a list of acceptable answers
            (correct if any matches; OlympiadBench ``final_answer`` is such a list of one).
        tolerance: absolute numeric tolerance (OlympiadBench ``error``), on top of math-verify.
        unit: a unit the prediction may carry after the number (OlympiadBench ``unit``).
        multiple_answer: the problem asks for several answers (OlympiadBench ``is_multiple_answer``).
            A response that ends in a list of boxes (``\\boxed{(1,8,19)}, \\boxed{(2,7,13)}``) is
            then graded as the set of those boxes, exactly as if one box held them all (math-verify
            compares the sets: a missing or extra answer is wrong). False: the last box only.
            None (the default): the set for a gold that holds several answers (:func:`_is_list`),
            the last box for any other gold, so single-answer grading is what it always was.
        timeout_s: soft deadline (main thread only); past it the verdict is ``timeout``.
            Use :func:`grade_math_batch` for a deadline that also stops C code.
    """
    tol = _tolerance(tolerance)
    golds = [gold] if isinstance(gold, str) or not isinstance(gold, Sequence) else list(gold)
    if not golds:
        raise ValueError("gold is an empty list; give at least one reference answer")
    extracted = extract_answer(response)
    if extracted is None:
        return MathVerdict(False, None, "no_answer")
    boxes = extract_answers(response) if multiple_answer is not False else None
    listed = None if boxes is None else ", ".join(boxes)
    if not extracted.strip():
        return MathVerdict(False, extracted, "empty_answer")
    if len(extracted) > MAX_ANSWER_CHARS or (listed is not None and len(listed) > MAX_ANSWER_CHARS):
        return MathVerdict(False, extracted[:200] + "...", "answer_too_long")
    pred = _strip_unit(_common(strip_number_decoration(extracted)), unit)
    pred_list = None
    if boxes is not None:  # each box loses its own decoration and unit ("35 cm")
        pred_list = ", ".join(_strip_unit(_common(strip_number_decoration(b)), unit) for b in boxes)
    try:
        with _soft_deadline(timeout_s):
            verdicts = []
            for g in golds:
                cg = clean_gold(g)
                as_list = pred_list is not None and (multiple_answer or _is_list(cg))
                answer = listed if as_list else extracted
                verdict = _compare(pred_list if as_list else pred, cg, tol)
                if verdict.correct:
                    return MathVerdict(True, answer, verdict.reason)
                verdicts.append(MathVerdict(False, answer, verdict.reason))
    except GradingTimeout:
        return MathVerdict(False, extracted, "timeout")
    return verdicts[0]


@functools.lru_cache(maxsize=65536)  # the k samples of a problem repeat their answers
def same_answer(a: str, b: str, *, timeout_s: float = 5.0) -> bool:
    """Whether two extracted answers are one answer for maj@k's vote (``"0.5"``, ``"\\frac{1}{2}"``
    and ``"1/2"`` pool), by the comparison grading uses between a response and its gold: both sides
    normalised alike, math-verify with this module's vetoes; ``b`` (the vote's earlier answer) in
    the gold's place. Identical strings are one answer; an answer over :data:`MAX_ANSWER_CHARS`, or a
    comparison past ``timeout_s`` (soft: main thread), is its own."""
    if a == b:
        return True
    if len(a) > MAX_ANSWER_CHARS or len(b) > MAX_ANSWER_CHARS or not a.strip() or not b.strip():
        return False
    try:
        with _soft_deadline(timeout_s):
            return _compare(
                _common(strip_number_decoration(a)), _common(strip_number_decoration(b)), None
            ).correct
    except GradingTimeout:
        return False


def grading_options(grading: Mapping[str, Any] | None) -> dict[str, Any]:
    """A benchmark record's ``grading`` dict (OlympiadBench ``error``, ``unit``,
    ``is_multiple_answer``) -> grade_math kwargs (``tolerance``, ``unit``, ``multiple_answer``)."""
    if not grading:
        return {}
    out: dict[str, Any] = {}
    tol = grading.get("tolerance", grading.get("error"))
    if tol is not None:
        out["tolerance"] = _tolerance(tol)
    if grading.get("unit"):
        out["unit"] = str(grading["unit"])
    multiple = grading.get("multiple_answer", grading.get("is_multiple_answer"))
    if multiple is not None:
        out["multiple_answer"] = bool(multiple)
    return out


def grade_math_item(item: tuple) -> MathVerdict:
    """Pool entry point: ``(response, gold, tolerance, unit, soft_timeout_s[, multiple_answer])``
    -> verdict."""
    response, gold, tolerance, unit, soft_timeout_s, *rest = item
    multiple = rest[0] if rest else None
    return grade_math(
        response, gold, tolerance=tolerance, unit=unit, multiple_answer=multiple, timeout_s=soft_timeout_s
    )


def _failure(reason: str) -> MathVerdict:
    return MathVerdict(False, None, reason)


def grade_math_batch(
    responses: Sequence[str],
    golds: Sequence[str | Sequence[str]],
    *,
    workers: int | None = None,
    timeout_s: float = 10.0,
    pool: GradingPool | None = None,
    tolerances: Sequence[float | None] | None = None,
    units: Sequence[str | None] | None = None,
    multiple_answers: Sequence[bool | None] | None = None,
    soft_timeout_s: float | None = None,
    progress: Callable[[int], Any] | None = None,
) -> list[MathVerdict]:
    """Grade many responses in worker processes with a hard per-response deadline.

    Pass a long-lived ``pool`` (a :class:`~aggbench.grading.pool.GradingPool`) when grading
    repeatedly (training rewards): starting workers costs ~1 s, a warm pool grades 64 short
    responses in well under a second. Without one, a pool of ``workers`` is started and closed
    here. ``timeout_s`` is the hard deadline when the pool is made here; a given pool keeps its
    own. A response past the deadline, or whose worker crashes, is graded wrong with reason
    ``timeout`` / ``worker_crashed``. Inside the worker a soft deadline (``soft_timeout_s``,
    default 0.8 x the hard one; 0 turns it off) stops slow Python code without losing the worker;
    the hard deadline is for C code that signals cannot interrupt. ``progress(k)`` is called as
    ``k`` more responses are graded (a progress bar's ``update``). ``multiple_answers``: each
    response's ``multiple_answer`` (see :func:`grade_math`; None: decided by its gold).
    """
    n = len(responses)
    lists = (
        ("golds", golds),
        ("tolerances", tolerances),
        ("units", units),
        ("multiple_answers", multiple_answers),
    )
    for name, seq in lists:
        if seq is not None and len(seq) != n:
            raise ValueError(f"{name} has {len(seq)} entries for {n} responses")
    if n == 0:
        return []
    from aggbench.grading.pool import GradingPool

    own = pool is None
    if pool is None:
        pool = GradingPool(workers=workers, timeout_s=timeout_s)
    soft = 0.8 * pool.timeout_s if soft_timeout_s is None else soft_timeout_s
    items = [
        (
            responses[i],
            golds[i] if isinstance(golds[i], str) else list(golds[i]),
            None if tolerances is None else _tolerance(tolerances[i]),
            None if units is None else units[i],
            soft,
            None if multiple_answers is None else multiple_answers[i],
        )
        for i in range(n)
    ]
    try:
        return pool.map(grade_math_item, items, failure=_failure, progress=progress)
    finally:
        if own:
            pool.close()
