"""The grader-disagreement ledger (issue 28, item 7): for every evaluation verdict of an answer
benchmark, what two other verifiers say about the same response, so a table's reader knows how much
its numbers rest on the grader.

- the benchmark's own grader (``math`` for the paper's math benchmarks, ``tiny`` for the smoke's);
- a plain math-verify call, ``verify(parse("\\boxed{gold}"), parse(response))`` with math-verify's
  defaults (benchmarks/grade_math.py's plain loop), run in the grading pool's workers under the same
  hard deadline as the grader where there is a pool;
- the DAPO recipe's verifier (:mod:`aggbench.grading.dapo`, string work, in this process).

``counts`` gives, for one benchmark's verdicts: ``ledger_verdicts`` (responses), ``ledger_disagree``
(responses on which the three do not all agree; a math-verify time-out counts as a disagreement),
``ledger_vs_math_verify`` and ``ledger_vs_dapo`` (the benchmark grader against each), and
``grading_timeouts`` (the grader's and math-verify's time-outs). ``aggbench score`` writes them into
metrics.json, MLflow holds them per step, and the tables' notes show them per cell.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from aggbench.metric_names import LEDGER_COUNTS


def _golds(answer: Any) -> list[str]:
    return [str(a) for a in answer] if isinstance(answer, list) else [str(answer)]


def plain_verdict(item: tuple[str, Any]) -> bool | None:
    """math-verify's own verdict with its defaults: ``(response, answer)`` -> correct, or None where
    one of math-verify's own time-outs fired (pool entry point). Its defaults swallow errors and
    time-outs alike (``raise_on_error=False`` returns "wrong"); here they are raised so a time-out is
    counted as one, and any other error is the "wrong" the defaults would have given."""
    from math_verify import parse, verify
    from math_verify.errors import TimeoutException

    response, answer = item
    try:
        gold = [x for g in _golds(answer) for x in parse("\\boxed{" + g + "}", raise_on_error=True)]
        return bool(verify(gold, parse(response, raise_on_error=True), raise_on_error=True))
    except TimeoutException:
        return None
    except Exception:  # what math-verify's defaults turn into "wrong"
        return False


def plain_verdicts(rows: Sequence[Mapping[str, Any]], pool: Any = None) -> list[bool | None]:
    """One plain math-verify verdict per row; None where it timed out or failed (in a pool: past the
    pool's deadline; without one, math-verify's own time-outs on the main thread)."""
    items = [(str(r["response"]), r["answer"]) for r in rows]
    if pool is not None:
        return pool.map("aggbench.grading.ledger:plain_verdict", items, failure=lambda _reason: None)
    return [plain_verdict(item) for item in items]


def counts(rows: Sequence[Mapping[str, Any]], verdicts: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """The ledger of one benchmark's graded rows. ``verdicts[i]``: the grader's verdict of row i,
    with ``math_verify`` (bool or None) where the grader computed it in its pool; otherwise it is
    computed here."""
    from aggbench.grading.dapo import dapo_verdict, ground_truth

    plain: list[bool | None]
    if all("math_verify" in v for v in verdicts):
        plain = [v["math_verify"] for v in verdicts]
    else:
        plain = plain_verdicts(rows)
    out = dict.fromkeys(LEDGER_COUNTS, 0)
    for row, v, mv in zip(rows, verdicts, plain, strict=True):
        ours = bool(v["correct"])
        dapo = dapo_verdict(str(row["response"]), ground_truth(row["answer"])).correct
        out["ledger_verdicts"] += 1
        out["ledger_vs_math_verify"] += mv is None or mv != ours
        out["ledger_vs_dapo"] += dapo != ours
        out["ledger_disagree"] += mv is None or not (ours == mv == dapo)
        out["grading_timeouts"] += (v.get("reason") == "timeout") + (mv is None)
    return out
