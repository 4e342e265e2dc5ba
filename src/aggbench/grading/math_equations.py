"""Equations against an equation gold (the part of :mod:`aggbench.grading.math` that is ours, not
math-verify's).

math-verify accepts two equations when ``solve()`` gives both the same solutions, so it accepts any
non-zero multiple of the gold: ``4x - 2y + 6z = 16`` for MATH-500's plane ``2x - y + 3z = 8``,
which the problem asks "in the form Ax + By + Cz + D = 0 with A > 0 and gcd(|A|,|B|,|C|,|D|) = 1".
The grader sees no problem text, so the rule reads the prediction instead:

* equal ``lhs - rhs`` (or equal with opposite sign: the sides swapped) is equivalent;
* a non-zero constant multiple of the gold is accepted only when the prediction is itself in a
  normalised form: solved for one unknown (``y = -\\frac{1}{2}x + \\frac{3}{4}`` for
  ``2x + 4y - 3 = 0``, math-verify's own regression case), or a polynomial with integer
  coefficients whose gcd is 1 (``3x^2 + 4y^2 = 12``). A multiple that is in neither form
  (``4x - 2y + 6z = 16``, ``2y = -4x``, ``x^2/16 + y^2/12 = 1/4``) is refused as
  ``scaled_equation``: it is the same set of points written in a form no problem asks for, and
  every problem of the benchmarks whose gold is an equation asks for a normalised one.

Leaving math-verify's solve() route out also skips solve() itself, which takes 15 s on a
differential equation beside ``(x-2)(x-3) = 0``.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import gcd
from typing import Any

import sympy
from math_verify import verify


def first_equation(values: Sequence[Any]) -> sympy.Eq | None:
    """The first parsed value if it is an equation in some unknown (``2x - y + 3z = 8``), else None."""
    for v in values:
        if isinstance(v, sympy.Basic):
            return v if isinstance(v, sympy.Eq) and v.free_symbols else None
    return None


def _normalised(eq: sympy.Eq) -> bool:
    """Solved for one unknown (one side a lone symbol not on the other side), or a polynomial
    equation with integer coefficients of gcd 1."""
    for side, other in ((eq.lhs, eq.rhs), (eq.rhs, eq.lhs)):
        if isinstance(side, sympy.Symbol) and side not in other.free_symbols:
            return True
    try:
        coeffs = sympy.Poly(sympy.expand(eq.lhs - eq.rhs), *sorted(eq.free_symbols, key=str)).coeffs()
    except Exception:  # noqa: BLE001 - not a polynomial (sympy raises many kinds): not this form
        return False
    if not coeffs or not all(c.is_Integer for c in coeffs):
        return False
    g = 0
    for c in coeffs:
        g = gcd(g, int(c))
    return g == 1


def compare_equations(gold_eq: sympy.Eq, pred_eq: sympy.Eq) -> tuple[bool, str]:
    """(correct, reason) of an equation prediction against an equation gold (module docstring):
    reasons ``equivalent``, ``scaled_equation``, ``not_equivalent``."""
    try:
        dg, dp = gold_eq.lhs - gold_eq.rhs, pred_eq.lhs - pred_eq.rhs
    except TypeError:  # "x \in [-2, 7]" is read as Eq(x, Interval): math-verify's own comparison
        same = bool(verify(gold_eq, pred_eq, timeout_seconds=None))
        return same, "equivalent" if same else "not_equivalent"
    if verify(dg, dp, timeout_seconds=None) or verify(dg, -dp, timeout_seconds=None):
        return True, "equivalent"
    try:
        ratio = sympy.cancel(dg / dp)
        scaled = bool(ratio.is_number) and ratio != 0
    except Exception:  # noqa: BLE001 - sympy raises many kinds; then it is just not equivalent
        scaled = False
    if not scaled:
        return False, "not_equivalent"
    if _normalised(pred_eq):
        return True, "equivalent"
    return False, "scaled_equation"
