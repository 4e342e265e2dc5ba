"""Final-answer extraction from a math response (the first half of :mod:`aggbench.grading.math`).

:func:`extract_answer`, in this order:
  1. the last ``\\boxed{...}`` / ``\\boxed ...`` / ``\\fbox{...}`` whose braces close;
  2. else the last DAPO ``Answer: ...`` line (``Answer: $42$``, ``Answer: 42``);
  3. else Minerva's ``The final answer is ... I hope it is correct.``
  None when the response has none of them.

Every pattern is linear in the response length and an extracted answer is cut at
:data:`MAX_ANSWER_CHARS` (+1, so it grades as too long), so no cap on the response is needed.
Pure string work: no math-verify or sympy import.
"""

from __future__ import annotations

import re

# The longest gold answer in MATH-500, AIME, OlympiadBench and Minerva is ~200 characters; an
# extracted answer ten times longer than that is never a normal final answer (tests check the
# margin on the real files), so it is graded wrong without being parsed.
MAX_ANSWER_CHARS = 2000
# How many earlier boxes to try when the last one never closes (a response cut off mid-box).
_MAX_BOX_TRIES = 8

_BOX_COMMANDS = ("\\boxed", "\\fbox")
_TOKEN = re.compile(r"[^\s$]+")  # "\boxed 42": the answer is one token
# Every pattern here is linear in the text: no lazy group followed by an optional run (those are
# quadratic on a line of spaces), and the span pattern only ever sees a line of bounded length.
_ANSWER_LINE = re.compile(r"^[ \t>#*_]*(?:final[ \t]+)?answer[ \t]*\**[ \t]*[:：]([^\n]*)", re.I | re.M)
_MINERVA = re.compile(r"final answer is[ \t:]*([^\n]*)", re.I)
_MINERVA_END = "i hope it is correct"
# $$..$$, $..$ (not the escaped dollar of "\$36"), \(..\), \[..\]
_MATH_SPAN = re.compile(
    r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\((.+?)\\\)|\\\[(.+?)\\\]", re.S
)


def _balanced(text: str, open_pos: int) -> str | None:
    """Content of the brace group opening at ``text[open_pos] == '{'``.

    None if it never closes; a string longer than MAX_ANSWER_CHARS (cut there) if it is longer
    than that, so the scan is bounded.
    """
    depth = 0
    stop = min(len(text), open_pos + MAX_ANSWER_CHARS + 2)
    for i in range(open_pos, stop):
        c = text[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return text[open_pos + 1 : i]
    if stop < len(text):
        return text[open_pos + 1 : stop]  # too long: the caller grades it wrong unparsed
    return None


def _last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 42`` content, or None."""
    end = len(text)
    for _ in range(_MAX_BOX_TRIES):
        start, command = max((text.rfind(c, 0, end), c) for c in _BOX_COMMANDS)
        if start < 0:
            return None
        end = start
        pos = start + len(command)
        while pos < len(text) and text[pos] in " \t\n":
            pos += 1
        if pos < len(text) and text[pos] == "{":
            content = _balanced(text, pos)
            if content is not None:
                return content.strip()
            continue  # cut off mid-box: the previous box may be complete
        if pos > start + len(command):  # "\boxed 42": one token
            m = _TOKEN.match(text, pos, pos + MAX_ANSWER_CHARS + 1)
            if m:
                return m.group(0).rstrip(".,;")
        # "\boxedfoo" is another command: keep looking
    return None


def _unwrap_math(s: str) -> str:
    """``$a$, $b$`` -> ``a, b``; text without math delimiters is returned stripped.

    A line longer than 2 x MAX_ANSWER_CHARS is not searched (the span pattern is quadratic on
    ``\\(`` spam) but cut to MAX_ANSWER_CHARS + 1 characters, which grades as too long.
    """
    s = s.strip()
    if len(s) > 2 * MAX_ANSWER_CHARS:
        return s[: MAX_ANSWER_CHARS + 1]
    spans = [next(g for g in m.groups() if g is not None).strip() for m in _MATH_SPAN.finditer(s)]
    s = ", ".join(spans) if spans else s
    return s.rstrip(". ").strip() if not s.endswith("..") else s


def _minerva(text: str) -> str | None:
    """Minerva's ``The final answer is $X$. I hope it is correct.`` (the last one), or None."""
    last = None
    for last in _MINERVA.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    answer = last.group(1)
    end = answer.lower().find(_MINERVA_END)
    if end >= 0:
        answer = answer[:end]
    return _unwrap_math(answer) or None


def extract_answer(response: str) -> str | None:
    """The final answer written in ``response`` (see the module docstring), or None."""
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    boxed = _last_boxed(response)
    if boxed is not None:
        return boxed
    last = None
    for last in _ANSWER_LINE.finditer(response):  # noqa: B007 - we want the last match
        pass
    if last is not None:
        line = last.group(1).strip().strip("*").strip()  # "**Answer:** 17" leaves "** 17"
        if "final answer is" in line.lower():
            return _minerva(line)
        answer = _unwrap_math(line)
        if answer:
            return answer
    return _minerva(response)
