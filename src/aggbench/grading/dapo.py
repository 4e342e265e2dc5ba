"""The DAPO recipe's training reward, ported: verl's ``reward_model.reward_manager=dapo`` scores a
DAPO-Math-17k response with ``verl/utils/reward_score/math_dapo.py`` ``compute_score``.

Source: volcengine/verl v0.9.1 (the PyPI release, file verl/utils/reward_score/math_dapo.py; the
same file at the recipe's pinned commit 246cac4 and at b178a3cd5 of the main branch lacks the boxed
fallback, step 3 below). Written
from that function's behaviour, not copied; tests/grading/test_dapo_grader.py checks the verdicts on
a table of cases per branch and, where verl 0.9.1's own function is importable (it is installed in
every CI leg), against it on a few hundred generated cases.

What it does, in order (why a port and not math-verify: the recipe's reward is a string comparison,
and what the aggregation weights depend on is which responses that comparison calls correct):

1. Only the last 300 characters of the response are read.
2. The last ``Answer: ...`` line (case-insensitive, up to the end of the line) is normalised with
   the Minerva rules (:func:`normalize`) and compared as a string with the normalised ground truth.
3. Only when there is no such line: the last ``\\boxed{...}`` within the last 100 characters of that
   window, its content compared verbatim (no normalisation) with the ground truth.
4. Neither: wrong. verl scores +1/-1; aggbench's rewards are 0/1 (the overlong penalty is rescaled
   accordingly in the config), so the verdict is ``score > 0``.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

WINDOW = 300  # characters of the response that are read at all
BOX_WINDOW = 100  # characters of that window the boxed fallback reads
_ANSWER_LINE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
_INVALID = "[INVALID]"  # verl's placeholder for "no Answer: line"; a normalised answer equal to it is none

# Minerva's normalisation (Lewkowycz et al. 2022, appendix D), as math_dapo.py applies it: first
# these literal replacements, in this order ...
_REPLACE = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
    (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)  # fmt: skip
# ... then these substrings (units, words, spacing commands) are deleted, in this order ...
_DELETE = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
    "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
    "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
    "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;",
    ",\\!", "{,}", '"', "\\dots",
)  # fmt: skip
# ... then these rewrites: the first $...$ of a line kept alone, wrappers unwrapped (the first
# closing brace ends \text/\textbf/\overline, the last one ends \boxed), shorthand \fracab and
# \sqrta given their braces.
_REWRITE = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), r"$\3$"),
    (re.compile(r"(\\text\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), r"\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), r"\2"),
    (re.compile(r"(frac)([^{])(.)"), r"frac{\2}{\3}"),
    (re.compile(r"(sqrt)([^{])"), r"sqrt{\2}"),
)


class DapoVerdict(NamedTuple):
    correct: bool
    extracted: str | None  # the normalised Answer: line, the raw box content, or None
    reason: str  # answer_line_match / answer_line_mismatch / box_match / box_mismatch / no_answer


def normalize(answer: str) -> str:
    """A final answer in Minerva's normal form: the part after the last ``=``, spaces, units and
    wrappers removed, ``$`` dropped, thousands separators removed from a plain integer."""
    text = answer.split("=")[-1]
    for old, new in _REPLACE:
        text = text.replace(old, new)
    for old in _DELETE:
        text = text.replace(old, "")
    for pattern, repl in _REWRITE:
        text = pattern.sub(repl, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def last_box(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` whose braces close in ``text``, else None (a last box
    left open hides any earlier one, as in verl)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len("\\boxed{") : i]
    return None


def dapo_verdict(response: str, answer: str) -> DapoVerdict:
    """The recipe's verdict on one response: verl 0.9.1 ``compute_score(response, answer)["score"] > 0``."""
    window = response[-WINDOW:]
    lines = _ANSWER_LINE.findall(window)
    pred = normalize(lines[-1] if lines else _INVALID)
    if pred != _INVALID:
        ok = pred == normalize(answer)
        return DapoVerdict(ok, pred, "answer_line_match" if ok else "answer_line_mismatch")
    boxed = last_box(window[-BOX_WINDOW:])
    if boxed is not None:
        ok = boxed == answer
        return DapoVerdict(ok, boxed, "box_match" if ok else "box_mismatch")
    # no usable line, no box: wrong (verl compares "[INVALID]" with the normalised ground truth)
    return DapoVerdict(normalize(answer) == _INVALID, None, "no_answer")


def ground_truth(answer: Any) -> str:
    """A row's ``answer`` as verl reads it: one string (DAPO-17k's are integers written as strings;
    of a list of acceptable answers, the recipe knows the first)."""
    if isinstance(answer, list):
        return str(answer[0]) if answer else ""
    return str(answer)
