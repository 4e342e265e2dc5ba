"""The footnotes under a block's tables, one list per block: why a cell is missing or unfinished,
MLflow differing from its run files, the evaluation's counts (prompts that did not fit the context,
responses the grading harness decided), the grader ledger, an evaluation's own notes, a cell or
the base model scored on other problems than the others, and test problems the training set holds.
Split from ``aggbench.report.tables``, which lays out the tables they sit under.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from aggbench import metric_names
from aggbench.report.collect import CellData

if TYPE_CHECKING:
    from aggbench.data.overlap import Overlap

CONTEXT_NOTES = dict(
    zip(
        metric_names.NOTED_COUNTS,
        (
            "responses not generated (their prompt is longer than the model's context), graded wrong",
            "responses whose max_tokens the model's context cut short",
            "responses the grading harness decided (a time-out, a crashed worker, an error), graded wrong",
        ),
        strict=True,
    )
)

# a run whose MLflow data differ from its files, tabled with `aggbench report --allow-mismatch`
MISMATCH_NOTE = "MLflow differs from the run files (reported with --allow-mismatch)"


def _context_notes(context: Mapping[str, Mapping[str, Mapping[int, float]]]) -> list[str]:
    """One note per (kind, benchmark) the context policy touched at some step (aggbench.evaluation.
    context): prompts that did not fit (not generated, graded wrong), budgets it capped."""
    out = []
    for kind, what in CONTEXT_NOTES.items():
        for bench, by_step in context.get(kind, {}).items():
            counts = {t: int(v) for t, v in sorted(by_step.items()) if v}
            if counts:
                out.append(f"{bench}: {what}: " + ", ".join(f"{n} at step {t}" for t, n in counts.items()))
    return out


def _ledger_notes(ledger: Mapping[str, Mapping[str, Mapping[int, float]]]) -> list[str]:
    """One note per benchmark with a grader ledger (aggbench.grading.ledger): its counts summed over
    the cell's evaluated steps, so a reader sees how many verdicts rest on the grader's choice."""
    out = []
    for bench, by_step in sorted(ledger.get("ledger_verdicts", {}).items()):
        if not by_step:
            continue
        total = {k: int(sum(ledger.get(k, {}).get(bench, {}).values())) for k in ledger}
        steps = ", ".join(str(t) for t in sorted(by_step))
        out.append(
            f"{bench}: grader ledger over steps {steps}: {total['ledger_disagree']} of "
            f"{total['ledger_verdicts']} verdicts differ among the benchmark's grader, plain math-verify "
            f"and the DAPO verifier ({total['ledger_vs_math_verify']} vs math-verify, "
            f"{total['ledger_vs_dapo']} vs DAPO), {total['grading_timeouts']} grading time-outs"
        )
    return out


def _bench_note(note: str) -> str:
    """An evaluation's note as a footnote: public tests only says what it means for the number."""
    if note == "public tests only":
        return (
            "public tests only (the offline copy has no private tests): a pass rate on public tests "
            "is higher than, and not comparable with, one on the full tests"
        )
    return note


def _problem_counts(
    groups: Mapping[str, Sequence[CellData]], benchmark: str
) -> tuple[list[tuple[str, CellData, dict[int, int]]], dict[int, int]]:
    """([(rule, cell, {step: problems scored})], {step: the most problems any cell had there}) of
    one benchmark over a block's cells (steps where a cell logged no n_problems are absent)."""
    sizes = [
        (rule, c, {t: int(n) for t, n in c.context.get("n_problems", {}).get(benchmark, {}).items()})
        for rule, seeds in groups.items()
        for c in seeds
    ]
    most: dict[int, int] = {}
    for _, _, by_step in sizes:
        for t, n in by_step.items():
            most[t] = max(most.get(t, n), n)
    return sizes, most


def base_problem_notes(
    base: str,
    scored: Mapping[str, int],
    groups: Mapping[str, Sequence[CellData]],
    benchmarks: Sequence[str],
    columns: Sequence[str],
) -> tuple[list[str], bool]:
    """(notes, flag the base row): the base model (run ``base``, ``scored``: {benchmark: problems
    its step-0 evaluation scored}) scored on another number of problems than the most any cell of
    its table had at a step, so a rule's gain over the base row is over two problem sets. Fewer or
    more both count (an ``evaluation.limit`` set after the base ran trims every cell alike). A
    column flags the base row; a selection benchmark is noted only; no count, no comparison."""
    notes, flag = [], False
    for b in benchmarks:
        n0 = scored.get(b)
        if n0 is None:
            continue
        _, most = _problem_counts(groups, b)
        other = {t: n for t, n in sorted(most.items()) if n != n0}
        if other:
            flag |= b in columns
            every = len(other) == len(most) and len(set(other.values())) == 1
            at = (
                f"{next(iter(other.values()))} at every evaluated step"
                if every
                else ", ".join(f"{n} at step {t}" for t, n in other.items())
            )
            notes.append(
                f"base: {base}: {b}: scored on {n0} problems, the cells on {at}: gains over the base row "
                "are over other problem sets; evaluate both on the same set"
            )
    return notes, flag


def _problem_set_notes(
    groups: Mapping[str, Sequence[CellData]], benchmarks: Sequence[str], columns: Sequence[str]
) -> tuple[list[str], set[str]]:
    """(notes, rules to flag): a cell scored on fewer problems than another cell of its table at the
    same step (an ``evaluation.limit``, a trimmed samples file) has a score over another problem
    set, not comparable with theirs. Compared step by step (a limit changed for every cell between
    two steps leaves each step comparable); the most problems any cell had at the step is the
    reference. A benchmark that is a column (``columns``) flags the row; a selection benchmark is
    noted only. Cells from before n_problems was logged (no values) are not compared; a table
    whose every cell was trimmed alike is not flagged (``evaluation.limit`` on the grid says so)."""
    notes, flagged = [], set()
    for b in benchmarks:
        sizes, most = _problem_counts(groups, b)
        for rule, c, by_step in sizes:
            fewer = {t: n for t, n in sorted(by_step.items()) if n < most[t]}
            if fewer:
                flagged |= {rule} if b in columns else set()
                at = ", ".join(f"{n} of {most[t]} at step {t}" for t, n in fewer.items())
                notes.append(
                    f"{rule}: {c.cell.id}: {b}: scored on fewer problems than other cells at the same step "
                    f"({at}): not comparable; evaluate it on the full set again"
                )
    return notes, flagged


def cell_notes(
    groups: Mapping[str, Sequence[CellData]],
    benchmarks: Sequence[str],
    columns: Sequence[str],
    bad: set[str],
) -> tuple[list[str], set[str]]:
    """(notes, rules to flag) of one block's cells ({rule: its seeds' cells}): why a cell is missing
    or unfinished, MLflow differing from its files (``bad``: cell ids), its context, harness and
    grader-ledger counts, and fewer problems than its table's other cells (``columns``: the test
    benchmarks, which flag; the others are noted only)."""
    notes, flagged = [], set()
    for rule, seeds in groups.items():
        for c in seeds:
            why = [w for w in [c.issue(benchmarks)] if w]  # the selection benchmarks too
            if c.cell.id in bad:
                why.append(MISMATCH_NOTE)
            if why:
                flagged.add(rule)
                notes.append(f"{rule}: {c.cell.id}: {'; '.join(why)}")
            notes += [f"{rule}: {c.cell.id}: {n}" for n in _context_notes(c.context)]
            notes += [f"{rule}: {c.cell.id}: {b}: {_bench_note(n)}" for b, n in sorted(c.bench_notes.items())]
            notes += [f"{rule}: {c.cell.id}: {n}" for n in _ledger_notes(c.ledger)]
    sizes, unequal = _problem_set_notes(groups, benchmarks, columns)
    return notes + sizes, flagged | unequal


def training_overlap_notes(
    dataset: str, benchmarks: Sequence[str], trained: Mapping[tuple[str, str], Overlap]
) -> list[str]:
    """The test problems a block's training set holds too (``trained``: {(dataset, test benchmark):
    problems both hold, or why they were not compared}, ``data.overlap.shared_problems``): every
    cell of the block trained on them, so its score on them may be recall. A reason shared by
    several benchmarks is said once."""
    out, reasons = [], {}
    for b in benchmarks:
        got = trained.get((dataset, b))
        if isinstance(got, str):
            reasons.setdefault(got, []).append(b)
        elif got:
            out.append(
                f"training set {dataset} holds {got.describe(b)}: every cell of this table trained on them"
            )
    out += [
        f"training set {dataset} not compared with {', '.join(bs)} for shared problems: {why}"
        for why, bs in reasons.items()
    ]
    return out
