"""Final-answer extraction from a math response (the first half of :mod:`aggbench.grading.math`).

:func:`extract_answer`, in this order:
  1. the last ``\\boxed{...}`` / ``\\boxed ...`` / ``\\fbox{...}`` whose braces close, unless
     Minerva's sentence (3, also inside an ``Answer:`` line) with a number or math comes after it
     ("\\boxed{255} ... The final answer is $10,455$. I hope it is correct.": the sentence is the
     final word); a later plain ``Answer:`` line (2) does not override a box;
     :func:`extract_answers` gives a final list of boxes (``\\boxed{1}, \\boxed{2}``) apart;
  2. else the last DAPO ``Answer: ...`` line (``Answer: $42$``, ``Answer: 42``; in a sentence, what
     follows its verb: ``Answer: The largest $n$ is 34.`` -> 34);
  3. else Minerva's ``The final answer is ... I hope it is correct.``;
  4. else, only where the response holds no box command at all, an unboxed final answer where the
     response states one (:func:`unboxed_answer`): math-verify's anchored patterns near the end
     (``so the answer is 12.``), or a concluding last sentence (``Therefore, she has 12 coins.``).
     A response that never states an answer (a value met mid-derivation, then "let me know if
     you'd like me to elaborate") has none.
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
from collections.abc import Iterator
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


def _box_at(text: str, start: int, command: str) -> tuple[int, str] | None | bool:
    """The box command at ``text[start:]``: (end, content); None if its braces never close; False
    if it is another command (``\\boxedfoo``)."""
    pos = start + len(command)
    while pos < len(text) and text[pos] in " \t\n":
        pos += 1
    if pos < len(text) and text[pos] == "{":
        content = _balanced(text, pos)
        if content is None:
            return None
        return pos + 1 + len(content) + 1, content.strip()
    if pos > start + len(command):  # "\boxed 42": one token
        m = _TOKEN.match(text, pos, pos + MAX_ANSWER_CHARS + 1)
        if m:
            return m.end(), m.group(0).rstrip(".,;")
    return False


def _boxes_backwards(text: str) -> Iterator[tuple[int, int, str]]:
    """(start, end, content) of the complete boxes of ``text``, last first. A box that never
    closes is skipped while no complete box has been found (at most :data:`_MAX_BOX_TRIES` of
    them: a response cut off mid-box); after one, an unclosed box ends the scan."""
    end, found = len(text), False
    # bounded: each step is a scan of the text, and a response may repeat "\boxedfoo" at will
    for _ in range(_MAX_BOX_TRIES + _MAX_LIST_BOXES):
        start, command = max((text.rfind(c, 0, end), c) for c in _BOX_COMMANDS)
        if start < 0:
            return
        end = start
        box = _box_at(text, start, command)
        if box is False:
            continue  # "\boxedfoo" is another command: keep looking
        if box is None:
            if found:
                return
            continue  # cut off mid-box: the previous box may be complete
        found = True
        yield start, box[0], box[1]


def _last_box(text: str) -> tuple[int, int, str] | None:
    """(start, end, content) of the last complete ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 42``."""
    return next(_boxes_backwards(text), None)


def _last_boxed(text: str) -> str | None:
    """The last ``\\boxed{...}`` / ``\\fbox{...}`` / ``\\boxed 42`` content, or None."""
    box = _last_box(text)
    return None if box is None else box[2]


# What may stand between two boxes of one list of answers (``\\boxed{1}, \\boxed{2} and
# \\boxed{3}``, ``\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}``, ``\\(y_1 = \\boxed{..}\\) and
# \\(y_2 = \\boxed{..}\\)``, one box per line of a list): spaces, commas and semicolons, math
# delimiters, spacing commands, "and"/"or" (after one word: "\\boxed{1} papers and \\boxed{2}"), a
# short \\text{} without digits, a name and "=". Any
# other text (a sentence, "no no no", a number) ends the list: the earlier box is reasoning.
_LIST_GAP = re.compile(
    r"(?:[\s,;&~*\-]|\$|\\[()\[\]]|\\\\|\\q?quad\b|\\[,;:! ]|\b(?:and|or)\b"
    r"|\\(?:text|textrm|mathrm|mbox)\s*\{[^{}\d\\]{0,40}\}"
    r"|[A-Za-z](?:_\{?\w{1,3}\}?)?\s*=|\b[A-Za-z]{1,15}\s+(?:and|or)\b)*",
    re.I,
)
_MAX_LIST_GAP = 80
_MAX_LIST_BOXES = 32


def final_boxes(text: str) -> list[str]:
    """The contents of the last run of boxes that form one list of answers (see ``_LIST_GAP``),
    in order; one element for a single final box; empty without a complete box."""
    group: list[str] = []
    next_start = None
    for start, end, content in _boxes_backwards(text):
        if next_start is not None:
            gap = text[end:next_start]
            if end > next_start or len(gap) > _MAX_LIST_GAP or not _LIST_GAP.fullmatch(gap):
                break
        group.append(content)
        next_start = start
        if len(group) >= _MAX_LIST_BOXES:
            break
    return group[::-1]


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


def _minerva_answer(answer: str) -> str | None:
    end = answer.lower().find(_MINERVA_END)
    if end >= 0:
        answer = answer[:end]
    return _unwrap_math(answer) or None


def _minerva(text: str) -> tuple[int, str | None] | None:
    """(where, answer) of Minerva's ``The final answer is $X$. I hope it is correct.`` (the last
    one), or None."""
    last = None
    for last in _MINERVA.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    return last.start(), _minerva_answer(last.group(1))


# "Final Answer: The largest $n$ is 34." states its answer after a verb: the math before it is the
# subject (math-verify reads 34 here too). The verb is looked for outside math spans only.
_VERB = re.compile(r"\b(?:is|are|equals|=)[ \t:]+", re.I)


def _after_verb(line: str) -> str:
    """The part of an ``Answer:`` line after its last ``is``/``are``/``equals`` outside math, when
    that part holds a number or math; else the whole line."""
    if len(line) > 2 * MAX_ANSWER_CHARS:
        return line  # the span pattern is quadratic on "\\(" spam; such a line grades as too long
    masked = _MATH_SPAN.sub(lambda m: "\x00" * len(m.group(0)), line)
    last = None
    for last in _VERB.finditer(masked):  # noqa: B007 - we want the last match
        pass
    if last is None or not re.search(r"[A-Za-z]", masked[: last.start()].replace("\x00", "")):
        return line
    rest = line[last.end() :]
    return rest if re.search(r"\d|\$|\\[(\[]", rest) else line


def _statement(text: str) -> tuple[int, str, bool] | None:
    """(where, answer, a Minerva sentence?) of the last stated final answer outside a box: the last
    DAPO ``Answer:`` line when it holds an answer (a Minerva sentence when it says "The final answer
    is ..."), else Minerva's sentence; None when the response has neither."""
    last = None
    for last in _ANSWER_LINE.finditer(text):  # noqa: B007 - we want the last match
        pass
    if last is not None:
        line = last.group(1).strip().strip("*").strip()  # "**Answer:** 17" leaves "** 17"
        sentence = "final answer is" in line.lower()
        if sentence:
            answer = _minerva_answer(line[line.lower().index("final answer is") + 15 :].lstrip(" \t:"))
        else:
            answer = _unwrap_math(_after_verb(line))
        if answer:
            return last.start(), answer, sentence
    minerva = _minerva(text)
    return (minerva[0], minerva[1], True) if minerva is not None and minerva[1] else None


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


# math-verify's priorities 0-200 need an anchor ("final answer is", "answer:", "answer"); 300 is
# its unanchored rightmost math or number, which also reads a value met mid-derivation in a
# response that never states an answer ("... = 12. Let me know if you'd like me to elaborate").
_UNANCHORED = 300
# An anchored statement must end this close to the response's end to be its final answer.
FINAL_STATEMENT_CHARS = 600
# A concluding last sentence ("Therefore, she has 18 coins."): a conclusion word opens it, it ends
# at a full stop (not a decimal point) or a line break, and no number or math follows it.
_CONCLUSION = re.compile(
    r"(?:^|(?<=[.!?:\n])\s*|\s)(?:therefore|thus|hence|so|consequently|finally|overall|altogether"
    r"|in (?:conclusion|summary|total)|putting (?:it|this|everything) (?:all )?together)\b",
    re.I,
)
_SENTENCE_END = re.compile(r"(?<!\\)[.!?](?=\s|$)|\n")  # not "\\!" (a space in math)
_HAS_VALUE = re.compile(r"\d|(?<!\\)\$|\\[(\[]")


def _best(window: str, patterns: list, lo: int = 0, hi: int | None = None) -> str | None:
    """The rightmost match of ``patterns`` in ``window[lo:hi]``, as answer text."""
    found = [
        (m.end(), -m.start(), m, isinstance(target, LatexExtractionConfig))
        for pattern, target in patterns
        for m in pattern.finditer(window, lo, len(window) if hi is None else hi)
    ]
    if not found:
        return None
    _end, _start, match, latex = max(found, key=lambda x: (x[0], x[1]))
    answer = _matched_text(match, latex)
    if not answer:
        return None
    return answer.rstrip(".").strip() if not answer.endswith("..") else answer


def _concluding_sentence(window: str) -> tuple[int, int] | None:
    """(start, end) of the last sentence holding a number or math, if a conclusion word opens it."""
    last = None
    for last in _CONCLUSION.finditer(window):  # noqa: B007 - we want the last match
        pass
    if last is None:
        return None
    stop = _SENTENCE_END.search(window, last.end())
    end = len(window) if stop is None else stop.end()
    if _HAS_VALUE.search(window, end):
        return None  # a number or math after it: the sentence is not the last word
    return last.start(), end


# A response that is nothing but its answer ("$\\frac{1}{12}$", "x = 5", "1,000.99€"): short and
# one sentence. math-verify's regression cases are mostly of this kind.
ANSWER_ONLY_CHARS = 200


def _answer_only(text: str) -> bool:
    stripped = text.strip()
    stop = _SENTENCE_END.search(stripped)
    return len(stripped) <= ANSWER_ONLY_CHARS and (stop is None or stop.end() >= len(stripped))


def unboxed_answer(text: str) -> str | None:
    """The final answer of a response without a box, where the response states one, or None.

    Stated means (1) math-verify's anchored patterns (priorities as in its parse(); Qwen2.5-Math's
    evaluation does the same with "he answer is"): a ``final answer ... is`` anchor, then an
    ``answer`` anchor followed within 50 characters by math or a number; within a priority the
    rightmost match wins, and it must end within :data:`FINAL_STATEMENT_CHARS` of the end; or
    (2) a concluding last sentence (``Therefore, she has 18 coins.``, ``Putting it all together,
    the value is $x$.``), or a response that is only its answer (one short sentence, at most
    :data:`ANSWER_ONLY_CHARS`: ``$\\frac{1}{12}$``): its rightmost math or number. math-verify's unanchored rule (the
    rightmost math or number anywhere) is not used: it reads a value met mid-derivation from a
    response that never gives an answer. The search runs on the tail of ``text`` only (see
    :data:`UNBOXED_WINDOW`) and takes the first match as the answer (math-verify's
    ``first_match`` mode): what it holds is graded like a boxed answer.
    """
    window = _tail(text)
    near_end = max(0, len(window) - FINAL_STATEMENT_CHARS)
    for priority, patterns in _UNBOXED_PATTERNS:
        if priority >= _UNANCHORED:
            break
        found = [m for pattern, _t in patterns for m in pattern.finditer(window)]
        if found and max(m.end() for m in found) >= near_end:
            answer = _best(window, patterns)
            if answer:
                return answer
    sentence = _concluding_sentence(window)
    if sentence is None and _answer_only(text):
        sentence = (0, len(window))
    if sentence is None:
        return None
    unanchored = [
        pt for priority, patterns in _UNBOXED_PATTERNS if priority >= _UNANCHORED for pt in patterns
    ]
    return _best(window, unanchored, *sentence)


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


def _final(response: str) -> tuple[tuple[int, int, str] | None, tuple[int, str, bool] | None]:
    """(the last box, a stated answer that comes after it or stands alone)."""
    if not isinstance(response, str):
        raise TypeError(f"response must be a str, got {type(response).__name__}")
    box = _last_box(response)
    statement = _statement(response)
    if box is not None and statement is not None:
        # A box, then "The final answer is $10,455$. I hope it is correct." (math-verify's
        # regression case): the later sentence is the final answer; it must hold a number or math,
        # so "The final answer is above" leaves the box in charge. A later DAPO "Answer:" line does
        # not override a box: math-verify ranks it below boxes, and after a box it is most often the
        # box restated with words ("Answer: 33 (m = 11, n = 22)") or a run-on ("Question: ...
        # Answer: 5"), which would grade a boxed right answer wrong.
        later = statement[0] >= box[1] and statement[2] and re.search(r"[\d\\]", statement[1])
        if not later:
            statement = None
    return box, statement


def extract_answer(response: str) -> str | None:
    """The final answer written in ``response`` (see the module docstring), or None."""
    box, statement = _final(response)
    if statement is not None:
        return statement[1]
    if box is not None:
        return box[2]
    if any(c in response for c in _BOX_COMMANDS):
        return None
    return unboxed_answer(response)


def extract_answers(response: str) -> list[str] | None:
    """The final answer as a list of boxes (``\\boxed{(1,8,19)}, \\boxed{(2,7,13)}``, see
    :func:`final_boxes`) when the response ends in two or more boxes of one list, else None (then
    :func:`extract_answer` holds the one final answer)."""
    box, statement = _final(response)
    if box is None or statement is not None:
        return None
    group = final_boxes(response)
    return group if len(group) > 1 else None
