"""The grader registry: every caller that branches on a benchmark's or a dataset's grader asks here.

A grader is one registered entry: what a record of its benchmarks carries (``record``: an
``answer``, code ``tests``, or an ``evalplus`` task reloaded by evalplus), the function that turns
sample rows into verdicts, optionally a row check run before any grading, and, for graders that
can reward training, a reward function. Data specs (which fields a record needs), ``score``
(which fields a sample needs, which metrics apply, what is kept), the training config and the
trainer's reward all read the entry, so a new grader is one ``register_grader`` call::

    from aggbench.graders import register_grader

    @register_grader("exact", record="answer")
    def exact(rows, *, workers=None, timeout_s=None, progress=False):
        return [{"correct": r["response"].strip() == str(r["answer"]), "extracted": r["response"].strip(),
                 "reason": "exact_match"} for r in rows]

then ``grader: {name: exact}`` in a benchmark YAML. Put the module in the config's ``plugins:``
(or import it) so it registers before the spec is read.

The built-in entries name their functions as ``"module:function"`` strings, resolved on first use:
this module imports nothing, so data specs and the config can consult it without loading a grader
(math-verify, the sandbox, torch).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from aggbench.errors import InputError
from aggbench.registry import Registry

Record = Literal["answer", "tests", "evalplus"]
# grade(rows, *, workers, timeout_s, progress) -> one verdict dict per row: correct, extracted,
# reason (+ for programs: n_tests, test_results, error_kind, layers)
GradeFn = Callable[..., list[dict[str, Any]]]
# check_row(path, line, row): raise aggbench.data.jsonl.DataError naming the bad field
RowCheck = Callable[[str | Path, int, Mapping[str, Any]], None]
# reward(responses, answers, pool) -> one float per response (pool: a GradingPool or None)
RewardFn = Callable[..., list[float]]

# Fields a sample row must carry, by record kind (besides id and response).
SAMPLE_FIELDS: dict[str, tuple[str, ...]] = {
    "answer": ("answer",),
    "tests": ("tests",),
    "evalplus": ("evalplus_dataset",),
}


class GradingError(InputError, ValueError):
    """A grader could not judge the rows at all (missing ground truth, a broken install): bad input,
    reported as one line, never as wrong answers."""


def resolve_target(target: str | Callable) -> Callable:
    """A callable, or a ``"module:function"`` string -> the function (importing its module now).

    The one resolver: grader entries here and :class:`~aggbench.grading.pool.GradingPool` tasks."""
    if callable(target):
        return target
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"fn must be a callable or 'module:function', got {target!r}")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class GraderSpec:
    """One grader. ``programs``: it grades programs (no majority vote over them; sandbox layers are
    recorded). ``pooled``: its grade/reward functions run in a GradingPool of killable workers.
    ``same_answer``: ``f(a, b) -> bool``, whether two extracted answers are one answer in maj@k's
    vote (None: identical strings only). ``version``: bumped when a change can move a score (what it
    extracts, how it compares, how maj@k pools); metrics.json records it as ``grader_version``."""

    name: str
    record: Record
    grade: str | GradeFn
    check_row: str | RowCheck | None = None
    reward: str | RewardFn | None = None
    programs: bool = False
    pooled: bool = False
    same_answer: str | Callable[[str, str], bool] | None = None
    version: str = "1"

    def grade_fn(self) -> GradeFn:
        return resolve_target(self.grade)

    def row_check(self) -> RowCheck | None:
        return None if self.check_row is None else resolve_target(self.check_row)

    def reward_fn(self) -> RewardFn | None:
        return None if self.reward is None else resolve_target(self.reward)

    def same_answer_fn(self) -> Callable[[str, str], bool] | None:
        return None if self.same_answer is None else resolve_target(self.same_answer)

    def sample_fields(self) -> tuple[str, ...]:
        """What a row to grade must carry."""
        return ("id", "response", *SAMPLE_FIELDS[self.record])


GRADERS: Registry[GraderSpec] = Registry("grader")


def register_grader(
    name: str,
    *,
    record: Record = "answer",
    check_row: str | RowCheck | None = None,
    reward: str | RewardFn | None = None,
    programs: bool = False,
    pooled: bool = False,
    same_answer: str | Callable[[str, str], bool] | None = None,
    version: str = "1",
) -> Callable[[GradeFn], GradeFn]:
    """Decorator: register ``fn(rows, *, workers, timeout_s, progress)`` as grader ``name``
    (``version``: see :class:`GraderSpec`)."""
    if record not in SAMPLE_FIELDS:
        raise ValueError(f"grader {name!r}: record must be one of {', '.join(SAMPLE_FIELDS)}, got {record!r}")

    def decorator(fn: GradeFn) -> GradeFn:
        GRADERS.add(
            name,
            GraderSpec(name, record, fn, check_row, reward, programs, pooled, same_answer, version),
            same=lambda a, b: _same_function(a.grade, b.grade),
        )
        return fn

    return decorator


def _same_function(a: Any, b: Any) -> bool:
    return a is b or (
        getattr(a, "__module__", a) == getattr(b, "__module__", b)
        and getattr(a, "__qualname__", None) == getattr(b, "__qualname__", None)
    )


def get_grader(name: str) -> GraderSpec:
    """The entry, or RegistryError listing the valid names (with a did-you-mean)."""
    return GRADERS.get(name)


def grader_names(*, rewards: bool = False) -> list[str]:
    """Registered graders in registration order; ``rewards``: only those that can reward training."""
    return [n for n in GRADERS.names() if not rewards or GRADERS.get(n).reward is not None]


# The built-in graders, in the order error messages list them. Their functions live in
# aggbench.grading.verdicts (grading) and aggbench.grading.rows (row checks).
_V, _R = "aggbench.grading.verdicts", "aggbench.grading.rows"
for _name, _kw in (
    ("tiny", dict(record="answer", check_row=f"{_R}:check_tiny_row", reward=f"{_V}:tiny_rewards")),
    (
        "math",
        dict(
            record="answer",
            check_row=f"{_R}:check_math_row",
            reward=f"{_V}:math_rewards",
            pooled=True,
            same_answer="aggbench.grading.math:same_answer",  # maj@k pools "0.5" and "1/2"
            # 2 (2026-12-07): a plain Answer: line after a box no longer overrides it; maj@k pools
            version="2",
        ),
    ),
    # the DAPO recipe's reward (verl math_dapo.compute_score, ported): DAPO-17k's training reward
    ("dapo", dict(record="answer", check_row=f"{_R}:check_math_row", reward=f"{_V}:dapo_rewards")),
    ("code", dict(record="tests", check_row=f"{_R}:check_code_row", programs=True, pooled=True)),
    ("evalplus", dict(record="evalplus", programs=True)),
):
    GRADERS.add(_name, GraderSpec(_name, grade=f"{_V}:grade_{_name}", **_kw))  # type: ignore[arg-type]
