"""Final-answer extraction from a math response (the first half of :mod:`aggbench.grading.math`).

:func:`extract_answer`, in this order:
  1. the last ``\\boxed{...}`` / ``\\boxed ...`` / ``\\fbox{...}`` whose braces close;
  2. else the last DAPO ``Answer: ...`` line (``Answer: $42$``, ``Answer: 42``);
  3. else Minerva's ``The final answer is ... I hope it is correct.``;
  4. else, only where the response holds no box command at all, the unboxed final answer the way
     Qwen2.5-Math's evaluation and math-verify find it (``so the answer is 12.``, ``... is $x$.``,
     ``Therefore, she has 12 coins.``): math-verify's own extraction patterns and priorities
     (an ``answer`` anchor first, else the rightmost math or number), run on the response's tail.
  None when the response has none of them. A response with a box that never closes (cut off
  mid-box) stays None: its earlier numbers are reasoning, not an answer.

:func:`strip_number_decoration` then reduces an answer that is a bare number decorated with
ordinal or unit text (``5^{\\mathrm{th}}\\text{ term}``, ``\\text{the }5^{\\text{th}}``) to the number.

Every pattern of steps 1-3 is linear in the response length and step 4 reads at most
:data:`UNBOXED_WINDOW` characters, so no cap on the response is needed; an extracted answer is cut
at :data:`MAX_ANSWER_CHARS` (+1, so it grades as too long). Steps 1-3 are pure string work; step 4
uses math-verify's compiled patterns (plain ``re``), never its parser.
"""

from __future__ import annotations

import re
from itertools import groupby

from math_verify import ExprExtractionConfig, LatexExtractionConfig
from math_verify.parser import get_extraction_regexes

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


# --------------------------------------------------------------------------- unboxed answers

# How much of the response's end step 4 reads. math-verify scans the whole text, and its math
# patterns are quadratic on spam such as "\[" repeated (each opening scans to the end): 10,000
# characters of it take math-verify's parse() past 5 s; 2,000 take ~0.2 s. A final sentence is
# short, and the rightmost match (what the unanchored rule takes) is always in the tail; only an
# "answer is" sentence followed by more than this much text is missed, and then the tail's last
# math or number is taken instead.
UNBOXED_WINDOW = 2000
# math-verify's extraction targets as its parse() defaults them (LaTeX, then plain expressions and
# numbers), with its box patterns off: step 4 only runs where no box command is present.
_UNBOXED_TARGETS = get_extraction_regexes(
    [LatexExtractionConfig(boxed_match_priority=-1), ExprExtractionConfig()]
)
_UNBOXED_PATTERNS = [
    (priority, [(pattern, target) for _p, pattern, target in group])
    for priority, group in groupby(
        sorted(
            (
                (priority, pattern, target)
                for patterns, target in _UNBOXED_TARGETS
                for pattern, priority in patterns
            ),
            key=lambda x: x[0],
        ),
        key=lambda x: x[0],
    )
]
_NEXT_GROUPS = 5  # math-verify joins up to five more math spans ("$1$, $2$ and $3$") to the first


def _tail(text: str) -> str:
    """The last :data:`UNBOXED_WINDOW` characters, starting at a line start (or a space) so that
    no ``$...$`` pair is cut in half."""
    if len(text) <= UNBOXED_WINDOW:
        return text
    tail = text[-UNBOXED_WINDOW:]
    for sep in ("\n", " "):
        cut = tail.find(sep)
        if cut >= 0:
            return tail[cut + 1 :]
    return tail


def _matched_text(match: re.Match, latex: bool) -> str | None:
    """The answer text of one math-verify match, as written (LaTeX) or as math-verify reads it
    (a number: thousands separators dropped, a decimal comma made a point).

    Why not math-verify's parse(): it returns its own normalisation of the match, and that breaks
    exactly the decorated numbers graded below (``5^{\\text{th}}`` becomes ``5^{``), and a plain
    number loses its percent sign. The text goes through the same normalisation and comparison as
    a boxed answer instead.
    """
    groups = match.groupdict()
    if latex:
        parts = []
        for prefix in ["first_", *(f"next{i}_" for i in range(1, _NEXT_GROUPS + 1))]:
            value = next((v for k, v in groups.items() if k.startswith(prefix + "latex") and v), None)
            if value is not None:
                parts.append(value.strip() + ("\\%" if groups.get(prefix + "percent") else ""))
        return ", ".join(parts) or None
    if groups.get("expr"):
        return groups["expr"].strip()
    integer = next((v for k, v in groups.items() if k.startswith("integer") and v), "")
    decimal = next((v for k, v in groups.items() if k.startswith("decimal") and v), "")
    if not (integer or decimal):
        return None
    number = integer.replace(",", "").replace(" ", "") + decimal.replace(",", ".")
    return number + ("\\%" if groups.get("percent") else "")


def unboxed_answer(text: str) -> str | None:
    """The final answer of a response without a box, as math-verify's extraction picks it, or None.

    math-verify's rule (priorities as in its parse(); Qwen2.5-Math's evaluation does the same with
    "he answer is" and then the last number): a ``final answer ... is`` anchor, then an
    ``answer`` anchor followed within 50 characters by math or a number, then the rightmost math
    span or number. Within a priority the rightmost match wins. The search runs on the tail of
    ``text`` only (see :data:`UNBOXED_WINDOW`), and takes the first match as the answer (as
    math-verify's ``first_match`` mode does): what it holds is graded like a boxed answer.
    """
    window = _tail(text)
    for _priority, patterns in _UNBOXED_PATTERNS:
        found = [
            (m.end(), -m.start(), m, isinstance(target, LatexExtractionConfig))
            for pattern, target in patterns
            for m in pattern.finditer(window)
        ]
        if found:
            _end, _start, match, latex = max(found, key=lambda x: (x[0], x[1]))
            answer = _matched_text(match, latex)
            if answer:
                return answer.rstrip(".").strip() if not answer.endswith("..") else answer
    return None


# --------------------------------------------------------------------------- decorated numbers

# math-verify already drops unit text after a number (``12\text{ coins}``, ``5\,\mathrm{cm}``),
# but an ordinal breaks its normalisation (``5^{\mathrm{th}}\text{ term}`` becomes ``5^{}``, ``5^{th}``
# reads as 5**(t*h)), and it keeps text before a number (``\text{the }5``) and a number inside text
# (``\text{5 days}``). Only a whole answer that is one bare number with such decoration is reduced;
# anything else (``\text{not }5``, ``5\text{ and }7``, ``\text{(C)}``) is left to math-verify.
_TEXT_CMD = r"\\(?:text|textrm|textup|textnormal|textbf|textit|mathrm|mathbf|mbox|rm)"
_ORD = r"(?:st|nd|rd|th)"
_ORDINAL = (
    rf"\^\s*\{{\s*(?:{_TEXT_CMD}\s*\{{\s*{_ORD}\s*\}}|{_TEXT_CMD}\s+{_ORD}|{_ORD})\s*\}}"  # ^{\mathrm{th}} ^{\rm th} ^{th}
    rf"|\^\s*{_TEXT_CMD}\s*\{{\s*{_ORD}\s*\}}"  # ^\text{th}
    rf"|(?:{_TEXT_CMD}|\\textsuperscript)\s*\{{\s*{_ORD}\s*\}}"  # \text{th} \textsuperscript{th}
    rf"|(?P<glued>{_ORD})(?![A-Za-z])"  # 5th (checked against the number's own suffix)
)
_SPACE = r"(?:\\[,;:! ]|~|\s)*"
_WORDS = rf"{_TEXT_CMD}\s*\{{[^{{}}\d\\]*\}}(?:\^\s*(?:\{{\s*[23]\s*\}}|[23]))?"  # \text{ cm}^2
_NUMBER = r"-?\d+(?:\.\d+)?"
_DECORATED = re.compile(
    rf"{_SPACE}(?P<lead>{_TEXT_CMD}\s*\{{\s*(?:the|a|an)\s*\}})?{_SPACE}"
    rf"(?:(?P<num>{_NUMBER}){_SPACE}(?P<ord>{_ORDINAL})?"
    rf"|{_TEXT_CMD}\s*\{{\s*(?P<innum>{_NUMBER})\s*(?P<inord>{_ORD})?(?P<inwords>\s[^{{}}\d\\]*)?\}})"
    rf"(?P<words>(?:{_SPACE}{_WORDS})*){_SPACE}",
    re.I,
)


def _ordinal_suffix(n: int) -> str:
    return "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")


def strip_number_decoration(answer: str) -> str:
    """``5^{\\mathrm{th}}\\text{ term}``, ``\\text{the }5^{\\text{th}}``, ``21st``, ``\\text{5 days}``,
    ``12~\\text{cm}`` -> the bare number; any other answer unchanged (see the comment above)."""
    m = _DECORATED.fullmatch(answer) if len(answer) <= 200 else None
    if m is None:
        return answer
    num = m.group("num") or m.group("innum")
    ordinal = m.group("ord") or m.group("inord")
    if not (m.group("lead") or ordinal or m.group("words") or m.group("innum")):
        return answer  # a bare number already
    if ordinal is not None:
        if not re.fullmatch(r"\d+", num):
            return answer  # "2.5th" is no ordinal
        glued = m.group("glued") or m.group("inord")
        if glued is not None and glued.lower() != _ordinal_suffix(int(num)):
            return answer  # "5nd": letters after a number, not an ordinal
    return num


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
    minerva = _minerva(response)
    if minerva is not None or any(c in response for c in _BOX_COMMANDS):
        return minerva
    return unboxed_answer(response)
