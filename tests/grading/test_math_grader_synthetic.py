"""The math grader on hand-written answers: equivalent and different forms, the integer shortcut,
answer extraction, and pathological responses (speed, deadlines, the worker pool surviving).

The real benchmark files and their quirks: test_math_grader.py."""

from __future__ import annotations

import logging
import random
import time

import pytest
from math_verify import parse, verify

from aggbench.grading.math import GradingTimeout, MathVerdict, _soft_deadline, grade_math, grade_math_batch
from aggbench.grading.math_extract import extract_answer, strip_number_decoration
from aggbench.grading.pool import GradingPool


@pytest.mark.parametrize(
    ("gold", "written"),
    [
        ("0.5", "\\frac12"),
        ("\\frac{1}{2}", "0.5"),
        ("\\dfrac{1}{2}", "\\frac{1}{2}"),
        ("025", "25"),
        ("25", "025"),
        ("(1,8,19), (2,7,13), (4,5,7)", "(4,5,7), (1,8,19), (2,7,13)"),
        ("1,3,5", "5, 3, 1"),
        ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3, \\pi/2)"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("x \\in [-2,7]", "[-2, 7]"),
        ("x \\in [-2,7]", "x \\in [-2, 7]"),  # read as Eq(x, Interval): past the equation veto
    ],
)
def test_equivalent_forms_are_correct(gold, written):
    assert grade_math(f"\\boxed{{{written}}}", gold).correct


@pytest.mark.parametrize(
    ("gold", "written"),
    [
        ("(3, \\frac{\\pi}{2})", "(\\frac{\\pi}{2}, 3)"),  # an ordered pair: order matters
        ("\\frac12", "0.51"),
        ("25", "24"),
        ("1,3,5", "1, 3"),
        ("2\\sqrt{2}", "2\\sqrt{3}"),
    ],
)
def test_different_answers_are_wrong(gold, written):
    assert not grade_math(f"\\boxed{{{written}}}", gold).correct


def test_integer_shortcut_agrees_with_math_verify():
    """The integer shortcut must give math-verify's verdict in both directions."""
    rng = random.Random(7)
    pairs = [("025", "25"), ("25", "025"), ("0", "000"), ("-7", "-07"), ("100", "1000"), ("12", "21")]
    pairs += [
        (str(rng.randint(0, 999)).zfill(rng.choice([1, 3])), str(rng.randint(0, 999))) for _ in range(20)
    ]
    pairs += [(str(k), str(k).zfill(3)) for k in rng.sample(range(1000), 10)]
    for gold, pred in pairs:
        ours = grade_math(f"\\boxed{{{pred}}}", gold)
        assert ours.reason in ("integer_match", "integer_mismatch", "exact_match")
        assert ours.correct == verify(parse(f"\\boxed{{{gold}}}"), parse(f"\\boxed{{{pred}}}")), (gold, pred)


# --------------------------------------------------------------------------- extraction


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("so \\boxed{\\frac{1}{2}} and", "\\frac{1}{2}"),
        ("first \\boxed{1}, finally \\boxed{2}.", "2"),
        ("\\boxed{\\left\\{ 1, 2 \\right\\}}", "\\left\\{ 1, 2 \\right\\}"),
        ("The answer is $\\boxed 42$.", "42"),
        ("\\fbox{7}", "7"),
        ("\\boxed{5} then I was cut off \\boxed{\\frac{3", "5"),  # last box never closes
        ("\\boxed{}", ""),
        ("Step 1...\nAnswer: $42$", "42"),
        ("Step 1...\n**Answer:** 17", "17"),
        ("Answer: 3\nAnswer: $\\frac{1}{4}$.", "\\frac{1}{4}"),
        ("Final Answer: The final answer is $1.6$. I hope it is correct.", "1.6"),
        ("... the final answer is 12.", "12"),
        ("no answer here", None),
        ("\\boxedx{3}", None),
        # no box at all: math-verify's extraction on the tail (an "answer" anchor, else the rightmost)
        ("We add them up, so the answer is 12.", "12"),
        ("Then $x^2 = 9$, so the value of $k$ is $\\frac{3}{4}$.", "\\frac{3}{4}"),
        ("She starts with $3 \\times 6 = 18$ coins. Therefore, she has 18 coins.", "18"),
        ("The answer is:\n$$\\frac{1}{2}$$", "\\frac{1}{2}"),
        ("The answer is 7. We double-check it on 9 more examples.", "7"),  # the anchor wins
        ("The answer is 25%.", "25\\%"),
        ("the roots are $1$, $2$ and $3$.", "1, 2, 3"),
        ("It comes to 1,234.5 dollars.", "1234.5"),
        # a box that never closes: the response was cut off, its numbers are reasoning
        ("so 3 + 4 = 7 and the answer is \\boxed{\\frac{7", None),
    ],
)
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("Let me compute. 3 + 4 = 7, so the answer is 7.", "7"),
        ("Let me compute.\nSo the answer is $\\frac{1}{2}$.", "0.5"),
        ("We find $k$. Thus the value of $k$ is $\\frac{3}{4}$.", "\\frac34"),
        ("She had 12 and got 6 more. Therefore, she has 18 coins.", "18"),
        ("The answer is: $\\left( 3, \\frac{\\pi}{2} \\right)$.", "\\left( 3, \\frac{\\pi}{2} \\right)"),
        ("Hence the final answer is\n$$2\\sqrt{2}$$", "2\\sqrt{2}"),
        ("So the answer is the $5^{\\text{th}}$ term.", "5"),
    ],
)
def test_unboxed_final_answers_are_read(response, gold):
    verdict = grade_math(response, gold)
    assert verdict.correct, verdict


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("Let me compute. 3 + 4 = 7, so the answer is 8.", "7"),
        ("So the answer is $\\frac{1}{3}$.", "0.5"),
        ("Thus the value of $k$ is $\\frac{4}{3}$.", "\\frac34"),
        ("Therefore, she has 19 coins.", "18"),
        ("So the answer is the $6^{\\text{th}}$ term.", "5"),
        ("I counted 18 coins, then lost some, so \\boxed{", "18"),  # cut off inside a box
        ("We have 18 coins.\n\\boxedx{3}", "18"),  # a box command of sorts: no fallback
    ],
)
def test_unboxed_wrong_answers_stay_wrong(response, gold):
    assert not grade_math(response, gold).correct


@pytest.mark.parametrize(
    "written",
    [
        "5^{\\mathrm{th}}\\text{ term}",
        "5^{\\text{th}}",
        "5^\\text{th}",
        "5^{th}",
        "5^{\\rm th}",
        "5\\textsuperscript{th}",
        "\\text{the }5^{\\text{th}}\\text{ day}",
        "5^{\\text{th}} \\text{ term}",
        "5~\\text{cm}",
        "\\text{5 days}",
        "\\text{5th}",
    ],
)
def test_ordinal_and_unit_text_around_a_bare_number(written):
    assert grade_math(f"so it is \\boxed{{{written}}}", "5").correct, written
    assert not grade_math(f"so it is \\boxed{{{written}}}", "6").correct, written


@pytest.mark.parametrize(
    "written",
    [
        "\\text{not }5",
        "\\text{day }5",
        "5\\text{ and }7",
        "5nd",
        "2.5^{\\text{th}}",
        "5^{\\text{th}}+1",
        "x^{th}",
    ],
)
def test_decorations_that_are_more_than_decoration_are_kept(written):
    """Only a whole answer that is one bare number with ordinal or unit text is reduced to it."""
    assert strip_number_decoration(written) == written
    assert not grade_math(f"\\boxed{{{written}}}", "5").correct, written


def test_an_equation_is_not_accepted_up_to_a_scale_factor():
    gold = "2x - y + 3z = 8"
    for same in ("2x - y + 3z = 8", "2x - y + 3z - 8 = 0", "8 = 2x - y + 3z", "3z + 2x - y = 8"):
        assert grade_math(f"\\boxed{{{same}}}", gold).correct, same
    for scaled in ("4x - 2y + 6z = 16", "x - \\frac{y}{2} + \\frac{3z}{2} = 4", "-4x + 2y - 6z = -16"):
        verdict = grade_math(f"\\boxed{{{scaled}}}", gold)
        assert verdict == MathVerdict(False, scaled, "scaled_equation"), scaled
    assert not grade_math("\\boxed{2x - y + 3z = 9}", gold).correct
    # equations as lines: y = mx + b is asked, 2y = 4x + 6 is the same line, not the form
    assert grade_math("\\boxed{y = 3 + 2x}", "y = 2x + 3").correct
    assert not grade_math("\\boxed{2y = 4x + 6}", "y = 2x + 3").correct
    assert grade_math("\\boxed{5}", "x=5").correct  # an assignment's value is still its answer


def test_box_wins_over_answer_line():
    assert extract_answer("Answer: 3\nwait, actually \\boxed{4}") == "4"


# --------------------------------------------------------------------------- pathological


SPAM = [
    "\\boxed{}" * 12_500,  # 100k chars of empty boxes
    "\\boxed{" * 14_300,  # 100k chars of boxes that never close
    "\\boxed{" * 7_000 + "}" * 7_000,  # 56k chars of nested boxes
    "\\boxed{" + "1+" * 50_000 + "1}",  # a 100k-char answer
    "Answer: " + "(" * 100_000,  # a 100k-char answer line
    "Answer: " + "\\(" * 33_000,  # quadratic for a naive "\\(...\\)" pattern
    "The final answer is " + "\\(" * 33_000,
    "Answer:" + " " * 100_000 + "x y",  # quadratic for a lazy group before optional spaces
    "final answer is " * 6_000,
    # no box: the unboxed fallback reads only the tail, so its math patterns stay cheap
    "\\[" * 50_000,
    "\\(" * 50_000,
    "$x$ and " * 12_500,
    "the answer is " * 7_000,
]
BIG_POWER = "\\boxed{10^{10^{10}}}"  # one huge integer power in C: only a killed worker surely stops it


@pytest.mark.parametrize("soft_timeout_s", [None, 0], ids=["soft-and-hard-deadline", "hard-deadline-only"])
def test_pathological_responses_are_wrong_quickly_and_the_pool_survives(soft_timeout_s):
    responses = [*SPAM, BIG_POWER]
    with GradingPool(workers=2, timeout_s=3.0) as pool:
        assert grade_math_batch(["\\boxed{1}"], ["1"], pool=pool)[0].correct  # warm
        t0 = time.monotonic()
        verdicts = grade_math_batch(
            responses, ["1"] * len(responses), pool=pool, soft_timeout_s=soft_timeout_s
        )
        elapsed = time.monotonic() - t0
        assert [v.correct for v in verdicts] == [False] * len(responses)
        assert [v.reason for v in verdicts[:5]] == [
            "empty_answer",
            "no_answer",
            "empty_answer",
            "answer_too_long",
            "answer_too_long",
        ]
        assert verdicts[-1].reason == "timeout"
        assert elapsed < 15, elapsed
        if soft_timeout_s == 0:  # nothing but SIGKILL could stop the big power
            assert pool.replaced >= 1
        # the pool still works (with the killed worker replaced)
        again = grade_math_batch(["\\boxed{2}", "\\boxed{\\frac{1}{2}}"], ["2", "0.5"], pool=pool)
        assert [v.correct for v in again] == [True, True]


def test_spam_is_cheap_and_quiet_in_process(caplog):
    with caplog.at_level(logging.DEBUG):
        for response in SPAM:
            t0 = time.monotonic()
            assert not grade_math(response, "1").correct
            assert time.monotonic() - t0 < 1.0, response[:30]
        assert not grade_math("\\boxed{x+1}", "x+2").correct  # a real math-verify call
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_soft_deadline_interrupts_python_code(monkeypatch):
    import aggbench.grading.math as m

    def spin(*_args):
        while True:
            pass

    with pytest.raises(GradingTimeout), _soft_deadline(0.1):
        spin()
    monkeypatch.setattr(m, "_compare", spin)
    t0 = time.monotonic()
    assert grade_math("\\boxed{x+1}", "x+2", timeout_s=0.2) == MathVerdict(False, "x+1", "timeout")
    assert time.monotonic() - t0 < 2.0


def test_gold_list_is_any_of_and_empty_list_is_an_error():
    assert grade_math("\\boxed{3}", ["2", "3"]).correct
    assert not grade_math("\\boxed{4}", ["2", "3"]).correct
    with pytest.raises(ValueError, match="empty"):
        grade_math("\\boxed{3}", [])
