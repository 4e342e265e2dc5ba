"""The `dapo` grader (aggbench.grading.dapo) against the recipe's reward, verl 0.9.1's
``verl/utils/reward_score/math_dapo.py`` ``compute_score``.

Two checks. The table below was derived by reading that function, one or more rows per branch; its
expected verdicts are written by hand, so it holds without verl. Then, where verl's file is on disk
(every CI leg installs verl 0.9.1 --no-deps; the verl leg requires it), the port's verdict and
extraction equal verl's own on a few hundred generated responses. math_dapo.py imports only ``re``
and ``typing``, so it is loaded by file path, without ``verl/__init__`` (which needs verl's stack).
"""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path

import pytest

from aggbench.grading.dapo import BOX_WINDOW, WINDOW, dapo_verdict, ground_truth, last_box, normalize
from aggbench.grading.verdicts import dapo_rewards, grade_dapo

FILLER = "We check the computation once more and nothing changes. "

# (response, ground truth, expected verdict, expected reason): each row names the branch it covers.
CASES = [
    # the Answer: line (Minerva): the last one, case-insensitive, up to the end of its line
    ("So we get 42.\nAnswer: 42", "42", True, "answer_line_match"),
    ("So we get 41.\nAnswer: 41", "42", False, "answer_line_mismatch"),
    ("Answer: 42\nWait, recheck.\nAnswer: 41", "42", False, "answer_line_mismatch"),
    ("Answer: 41\nWait, recheck.\nAnswer: 42", "42", True, "answer_line_match"),
    ("answer :   42", "42", True, "answer_line_match"),
    ("Final Answer: 42\nThat is all.", "42", True, "answer_line_match"),
    # `=` splitting: only what follows the last `=` (of the line and of the ground truth)
    ("Answer: x = 42", "42", True, "answer_line_match"),
    ("Answer: 6*7 = 42", "x=42", True, "answer_line_match"),
    ("Answer: 42 = x", "42", False, "answer_line_mismatch"),
    # removed units and words
    ("Answer: 42 degrees", "42", True, "answer_line_match"),
    ("Answer: 5 dollars", "5", True, "answer_line_match"),
    ("Answer: 12 inches", "12", True, "answer_line_match"),
    ("Answer: 30^\\circ", "30", True, "answer_line_match"),
    ("Answer: 7 students", "7", True, "answer_line_match"),
    ("Answer: 42 apples", "42", False, "answer_line_mismatch"),  # "apples" is not in the list
    # \text{} stripping (and \textbf, \overline, \boxed unwrapped)
    ("Answer: \\text{42}", "42", True, "answer_line_match"),
    ("Answer: 9\\text{ cm}", "9", True, "answer_line_match"),
    ("Answer: \\textbf{42}", "42", True, "answer_line_match"),
    ("Answer: \\boxed{42}", "42", True, "answer_line_match"),
    ("Answer: \\overline{12}", "12", True, "answer_line_match"),
    # dollars, spaces, shorthand fractions and roots, thousands separators
    ("Answer: $42$.", "42", True, "answer_line_match"),
    ("Answer: \\$ 42", "42", True, "answer_line_match"),
    ("Answer: \\frac12", "\\frac{1}{2}", True, "answer_line_match"),
    ("Answer: \\sqrt2", "\\sqrt{2}", True, "answer_line_match"),
    ("Answer: \\frac{1}{2}", "1/2", False, "answer_line_mismatch"),  # a string comparison: no algebra
    ("Answer: 10,455", "10455", True, "answer_line_match"),
    ("Answer: 1,2", "12", True, "answer_line_match"),  # the same rule: commas dropped from digit strings
    ("Answer: 0.5", "1/2", False, "answer_line_mismatch"),
    # the Answer: line wins over a box, whichever comes last
    ("\\boxed{42}\nAnswer: 41", "42", False, "answer_line_mismatch"),
    ("Answer: 42\nso \\boxed{41}", "42", True, "answer_line_match"),
    # the strict box fallback: no Answer: line, last box in the last 100 characters, verbatim
    ("Thus the result is \\boxed{42}.", "42", True, "box_match"),
    ("Thus the result is \\boxed{42.0}.", "42", False, "box_mismatch"),
    ("Thus the result is \\boxed{ 42}.", "42", False, "box_mismatch"),
    ("Thus the result is \\boxed{42 degrees}.", "42", False, "box_mismatch"),  # no normalisation
    ("\\boxed{41} first, then \\boxed{42}", "42", True, "box_match"),
    ("\\boxed{42} first, then \\boxed{41}", "42", False, "box_mismatch"),
    ("So \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", True, "box_match"),
    ("So \\boxed{42} and then \\boxed{4", "42", False, "no_answer"),  # an open last box hides the rest
    ("So \\boxed{42}" + " " + FILLER * 2, "42", False, "no_answer"),  # box outside the last 100
    # the 300-character window: an Answer: line further back is not read
    ("Answer: 42\n" + FILLER * 6, "42", False, "no_answer"),
    ("Answer: 42\n" + "x" * (WINDOW - len("Answer: 42\n")), "42", True, "answer_line_match"),
    ("Answer: 42\n" + "x" * (WINDOW - len("Answer: 42\n") + 1), "42", False, "no_answer"),  # "nswer: 42"
    # neither a line nor a box
    ("The answer is 42.", "42", False, "no_answer"),
    ("", "42", False, "no_answer"),
]


@pytest.mark.parametrize(("response", "answer", "correct", "reason"), CASES)
def test_verdict_table(response, answer, correct, reason):
    v = dapo_verdict(response, answer)
    assert (v.correct, v.reason) == (correct, reason), v


def test_normalize_and_last_box_pieces():
    assert normalize("x = \\frac12 \\text{ units}") == "\\frac{1}{2}"
    assert normalize("$1,000$") == "1000"
    assert normalize("a 5") == "5"  # "a " / "an " are dropped anywhere
    assert last_box("\\boxed{a}\\boxed{b{c}}d") == "b{c}"
    assert last_box("no box") is None
    assert BOX_WINDOW == 100 and WINDOW == 300


def test_ground_truth_and_batch_wrappers():
    assert ground_truth(["7", "seven"]) == "7" and ground_truth(42) == "42" and ground_truth([]) == ""
    rows = [
        {"id": "a", "response": "Answer: 7", "answer": "7"},
        {"id": "b", "response": "\\boxed{8}", "answer": ["7"]},
    ]
    verdicts = grade_dapo(rows)
    assert [v["correct"] for v in verdicts] == [True, False]
    assert verdicts[1] == {"correct": False, "extracted": "8", "reason": "box_mismatch"}
    assert dapo_rewards(["Answer: 7", "\\boxed{7}", "7"], ["7", "7", "7"]) == [1.0, 1.0, 0.0]


# -- against verl's own function ------------------------------------------------------------------


def _verl_math_dapo():
    spec = importlib.util.find_spec("verl")
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = next((Path(p) / "utils/reward_score/math_dapo.py" for p in locations), None)
    if path is None or not path.is_file():
        if os.environ.get("AGGBENCH_REQUIRE_VERL"):
            pytest.fail("verl is required in this leg but verl/utils/reward_score/math_dapo.py is absent")
        pytest.skip("verl is not installed (make install puts verl 0.9.1 in the venv)")
    from importlib.metadata import version

    assert version("verl") == "0.9.1", "the port is of verl 0.9.1's math_dapo.py (it has the box fallback)"
    mod_spec = importlib.util.spec_from_file_location("_verl_math_dapo", path)
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    return module


ANSWERS = ["42", "7", "10455", "\\frac{1}{2}", "\\sqrt{2}", "-3", "0.5", "x=4", "12", "(1,2)"]
WRITTEN = {  # ways a response writes a value v
    "plain": "{v}",
    "dollar": "${v}$",
    "text": "\\text{{{v}}}",
    "unit": "{v} degrees",
    "cm": "{v}\\text{{ cm}}",
    "eq": "x = {v}",
    "boxed": "\\boxed{{{v}}}",
    "spaced": " {v} ",
    "comma": "{v},000",
    "period": "{v}.",
}


def _generated(n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    cases = []
    for _ in range(n):
        gt = rng.choice(ANSWERS)
        value = gt if rng.random() < 0.6 else rng.choice(ANSWERS)
        head = FILLER * rng.randint(0, 8)
        written = rng.choice(list(WRITTEN.values())).format(v=value)
        kind = rng.choice(["line", "line", "box", "both", "none", "open", "two_lines"])
        if kind == "line":
            tail = f"{rng.choice(['Answer', 'answer', 'ANSWER'])}{rng.choice([':', ' :', ':  '])}{written}"
        elif kind == "box":
            tail = f"so the result is \\boxed{{{value}}}" + rng.choice(["", ".", " " + FILLER])
        elif kind == "both":
            tail = f"\\boxed{{{rng.choice(ANSWERS)}}}\nAnswer: {written}"
        elif kind == "two_lines":
            tail = f"Answer: {rng.choice(ANSWERS)}\n{FILLER * rng.randint(0, 5)}\nAnswer: {written}"
        elif kind == "open":
            tail = f"\\boxed{{{value}}} and \\boxed{{{value}"
        else:
            tail = f"the value is {written}"
        trailer = FILLER * rng.choice([0, 0, 0, 1, 3, 6])
        cases.append((head + tail + ("\n" + trailer if trailer else ""), gt))
    return cases


def test_port_equals_verl_0_9_1_compute_score():
    verl = _verl_math_dapo()
    cases = _generated(400) + [(r, a) for r, a, _, _ in CASES]
    kinds = set()
    for response, answer in cases:
        ref = verl.compute_score(response, answer)
        ours = dapo_verdict(response, answer)
        assert ours.correct == (ref["score"] > 0), (response, answer, ref, ours)
        if ours.reason != "no_answer":  # verl reports "[INVALID]" or None there
            assert ours.extracted == ref["pred"], (response, answer, ref, ours)
        kinds.add(ours.reason)
    # the generated cases reach every branch, both verdicts of each
    assert kinds == {"answer_line_match", "answer_line_mismatch", "box_match", "box_mismatch", "no_answer"}
