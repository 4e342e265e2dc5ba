"""The math grader beside a plain math-verify parse/verify loop, on MATH-500 answers written without a
box, decorated with ordinal or unit text, or as equations, and on controls written the same way with
a different number or expression (the rows of benchmarks/grade_math.py, built from ../shared/data).

False negatives and false positives are counted apart: the unboxed fallback must find the right
answers without letting a wrong one through."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from aggbench.grading.math import grade_math, grade_math_batch
from aggbench.grading.pool import GradingPool

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    """benchmarks/grade_math.py as a module: the test grades the rows the benchmark reports on."""
    spec = importlib.util.spec_from_file_location(
        "grade_math_benchmark", REPO / "benchmarks" / "grade_math.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compare(bench, rows: list[dict]) -> dict[str, dict[str, tuple[int, int, int]]]:
    """{style: {"aggbench": (right, FN, FP), "plain": (right, FN, FP)}} and the same for "all"."""
    with GradingPool(workers=2, timeout_s=30.0) as pool:
        ours = [
            v.correct
            for v in grade_math_batch([r["response"] for r in rows], [r["answer"] for r in rows], pool=pool)
        ]
    plain = bench.plain_loop(rows)
    bench.report_styles(rows, ours, plain, show=20)
    out = {}
    for style in [*dict.fromkeys(r["style"] for r in rows), "all"]:
        idx = [i for i, r in enumerate(rows) if style in ("all", r["style"])]
        intended = [rows[i]["intended"] for i in idx]
        out[style] = {
            "aggbench": bench.confusion([ours[i] for i in idx], intended),
            "plain": bench.confusion([plain[i] for i in idx], intended),
        }
    return out


def _check(table: dict[str, dict[str, tuple[int, int, int]]]) -> None:
    for style, t in table.items():
        (a_right, a_fn, a_fp), (p_right, _p_fn, p_fp) = t["aggbench"], t["plain"]
        assert a_right >= p_right, (style, t)  # at least as accurate as the plain loop
        assert a_fp <= p_fp, (style, t)  # and no more false positives
        assert (a_fn, a_fp) == (0, 0), (style, t)  # in fact no miss at all on these rows


def test_answer_styles_beside_plain_math_verify(bench, shared_data):
    """Every fourth MATH-500 problem in every style (the full set: the slow test below)."""
    rows = [r for r in bench.style_rows(shared_data) if int(r["id"].rsplit("/", 1)[1].split(".")[0]) % 4 == 0]
    styles = {r["style"] for r in rows}
    assert {
        "unboxed_answer_is",
        "unboxed_is_math",
        "unboxed_sentence",
        "decorated",
        "unboxed_decorated",
    } <= styles
    assert sum(r["intended"] for r in rows) * 2 >= len(rows) - 8  # a wrong control beside each right one
    _check(_compare(bench, rows))


@pytest.mark.slow
def test_answer_styles_beside_plain_math_verify_all_problems(bench, shared_data):
    rows = bench.style_rows(shared_data)
    assert len(rows) > 3500
    _check(_compare(bench, rows))


def test_a_plane_asked_in_normalised_form(shared_data):
    """MATH-500's plane "Enter your answer in the form Ax + By + Cz + D = 0, where ... A > 0 and
    gcd(|A|,|B|,|C|,|D|) = 1": twice the equation is the same plane but not the asked form, which
    math-verify alone accepts (it compares the solution sets)."""
    rows = {
        r["unique_id"]: r
        for r in map(
            json.loads, (shared_data / "math500" / "test.jsonl").read_text(encoding="utf-8").splitlines()
        )
    }
    row = rows["test/precalculus/659.json"]
    assert row["answer"] == "5x - 7y + 11z + 4 = 0" and "gcd" in row["problem"]
    assert grade_math("\\boxed{5x - 7y + 11z + 4 = 0}", row["answer"]).correct
    assert grade_math("\\boxed{5x - 7y + 11z = -4}", row["answer"]).correct
    verdict = grade_math("\\boxed{10x - 14y + 22z + 8 = 0}", row["answer"])
    assert (verdict.correct, verdict.reason) == (False, "scaled_equation")
    # the lines of MATH-500 asked as y = mx + b
    for gold, scaled in (("y = -2x", "2y = -4x"), ("y = 2x + 3", "3y = 6x + 9")):
        assert any(r["answer"] == gold for r in rows.values())
        assert grade_math(f"\\boxed{{{gold}}}", gold).correct
        assert not grade_math(f"\\boxed{{{scaled}}}", gold).correct
