"""The built-in synthetic verifiable task: a chain of last-digit operations.

A problem is a start digit and a few distinct operations applied left to right, keeping only the
last digit after each one::

    prompt:  "Start at 7, apply +3 *7 -5 left to right; last digit?"
    answer:  "5"            (7+3=10 -> 0, 0*7=0, 0-5=-5 -> 5)

Why this task and not plain addition (measured before: on plain addition the length gap between
right and wrong answers vanished after ~20 GRPO steps, and with equal lengths every aggregation
rule is the same rule): the supervised warm start teaches two answer styles,

- *guess*: ``\\boxed{5}`` at once (4 tokens with eos). The operations are bijections of the digits
  (+a, -a, and *3, *7, *9, the units modulo 10), so the answer is uniform over the ten digits
  unless the whole chain is composed in one forward pass, which a 4-layer model does not learn:
  guesses stay near 10% accuracy however long it trains;
- *worked*: one short line per operation, then the box. Each line needs only the previous line's
  result, the next operation copied from the prompt (operations in a prompt are distinct, so the
  copy is unambiguous) and a 10x10 table, so a tiny model gets it mostly right.

So inside every GRPO group that has reward variance the correct responses are mostly worked (long)
and the wrong ones mostly guesses (short), for as long as the policy still guesses at all: the
sign-length gap lasts, and its size is set by ``verbosity`` (characters per worked line) and the
number of operations. The mix after the warm start, and so the starting accuracy, is set by
``worked_fraction``.

Records use the harness's canonical form ``{"id", "prompt", "answer"}``; the prompt is the user
message only (the chat template is applied elsewhere). Test problems and training problems come
from two fixed halves of the problem space (a hash of the problem, independent of any seed), so
no training split and no warm-start batch can ever contain a test problem, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

BOX = "\\boxed{"

# +a and -a for a in 1..9, and multiplication by the units of Z/10 other than 1: every operation
# is a bijection of {0..9}, so a guess that skips the chain is right 1 time in 10.
OPERATIONS: tuple[tuple[str, int], ...] = (
    *(("+", a) for a in range(1, 10)),
    *(("-", a) for a in range(1, 10)),
    *(("*", a) for a in (3, 7, 9)),
)

# One in TEST_BUCKETS of all problems (by hash) is reserved for test splits.
TEST_BUCKETS = 8
VERBOSITY_LEVELS = (0, 1, 2)


def apply_op(value: int, op: str, operand: int) -> tuple[int, int]:
    """Return (full result, last digit) of ``value op operand``; the last digit is taken mod 10."""
    if op == "+":
        full = value + operand
    elif op == "-":
        full = value - operand
    elif op == "*":
        full = value * operand
    else:
        raise ValueError(f"unknown operation {op!r}; expected one of '+', '-', '*'")
    return full, full % 10


@dataclass(frozen=True)
class Problem:
    """A start digit and distinct operations ``[(op, operand), ...]``."""

    start: int
    ops: tuple[tuple[str, int], ...]

    @property
    def prompt(self) -> str:
        chain = " ".join(f"{op}{a}" for op, a in self.ops)
        return f"Start at {self.start}, apply {chain} left to right; last digit?"

    @property
    def answer(self) -> str:
        value = self.start
        for op, a in self.ops:
            value = apply_op(value, op, a)[1]
        return str(value)

    def is_test(self) -> bool:
        """Whether this problem belongs to the test half of the problem space (fixed, seedless)."""
        digest = hashlib.blake2b(self.prompt.encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") % TEST_BUCKETS == 0

    def guess_target(self) -> str:
        """The short answer style: the box alone."""
        return f"{BOX}{self.answer}}}"

    def worked_target(self, verbosity: int = 0) -> str:
        """The long answer style: one line per operation, then the box.

        verbosity 0: ``7+3=0``  (5 characters a line, plus the newline)
        verbosity 1: ``7+3=10 -> 0``  (the full value, then its last digit)
        verbosity 2: ``step 1: 7+3=10, last digit 0``
        """
        if verbosity not in VERBOSITY_LEVELS:
            raise ValueError(f"verbosity must be one of {VERBOSITY_LEVELS}, got {verbosity!r}")
        lines = []
        value = self.start
        for i, (op, a) in enumerate(self.ops, start=1):
            full, last = apply_op(value, op, a)
            if verbosity == 0:
                lines.append(f"{value}{op}{a}={last}")
            elif verbosity == 1:
                lines.append(f"{value}{op}{a}={full} -> {last}")
            else:
                lines.append(f"step {i}: {value}{op}{a}={full}, last digit {last}")
            value = last
        lines.append(self.guess_target())
        return "\n".join(lines)


@dataclass(frozen=True)
class TaskConfig:
    """Knobs of the task and of the warm-start answer mix.

    min_ops/max_ops: operations per problem (uniform in the range); more operations make worked
        answers longer and a little less accurate.
    worked_fraction: share of worked answers in the warm-start data; the warmed-up policy copies
        this mix, so it sets the starting accuracy (about worked_fraction * worked accuracy +
        (1 - worked_fraction) * 0.1).
    verbosity: worked-line format (see ``Problem.worked_target``); sets the length gap.
    """

    min_ops: int = 3
    max_ops: int = 5
    worked_fraction: float = 0.5
    verbosity: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.min_ops <= self.max_ops <= len(OPERATIONS):
            raise ValueError(
                f"need 1 <= min_ops <= max_ops <= {len(OPERATIONS)}, got min_ops={self.min_ops}, "
                f"max_ops={self.max_ops}"
            )
        if not 0.0 <= self.worked_fraction <= 1.0:
            raise ValueError(f"worked_fraction must be in [0, 1], got {self.worked_fraction!r}")
        if self.verbosity not in VERBOSITY_LEVELS:
            raise ValueError(f"verbosity must be one of {VERBOSITY_LEVELS}, got {self.verbosity!r}")

    def max_response_chars(self) -> int:
        """An upper bound on the tokens of a worked answer (without eos): size max_new_tokens by it."""
        worst = Problem(start=9, ops=(("-", 9),) * self.max_ops)  # the widest line of every format
        return len(worst.worked_target(self.verbosity)) + 2 * self.max_ops  # slack for "step 10:"


def sample_problem(rng: random.Random, cfg: TaskConfig) -> Problem:
    n_ops = rng.randint(cfg.min_ops, cfg.max_ops)
    ops = tuple(rng.sample(OPERATIONS, n_ops))
    return Problem(start=rng.randrange(10), ops=ops)


def sample_problems(rng: random.Random, cfg: TaskConfig, n: int, *, test: bool) -> list[Problem]:
    """``n`` distinct problems from the test half (``test=True``) or the training half of the space."""
    out: list[Problem] = []
    seen: set[Problem] = set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise ValueError(
                f"could not draw {n} distinct {'test' if test else 'train'} problems with "
                f"min_ops={cfg.min_ops}, max_ops={cfg.max_ops}: the space is too small; raise max_ops"
            )
        p = sample_problem(rng, cfg)
        if p.is_test() == test and p not in seen:
            seen.add(p)
            out.append(p)
    return out


def to_record(problem: Problem, split: str, index: int) -> dict[str, str]:
    return {"id": f"tiny-{split}-{index:06d}", "prompt": problem.prompt, "answer": problem.answer}


def make_task(
    seed: int, n_train: int, n_test: int, *, cfg: TaskConfig | None = None
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """Deterministic train and test records ``{"id", "prompt", "answer"}``; the splits are disjoint.

    The two splits are drawn from independent streams, so the test split does not change when
    ``n_train`` does (and vice versa).
    """
    cfg = cfg or TaskConfig()
    train = sample_problems(random.Random(f"tiny-train-{seed}"), cfg, n_train, test=False)
    test = sample_problems(random.Random(f"tiny-test-{seed}"), cfg, n_test, test=True)
    return (
        [to_record(p, "train", i) for i, p in enumerate(train)],
        [to_record(p, "test", i) for i, p in enumerate(test)],
    )


def sft_examples(rng: random.Random, cfg: TaskConfig, n: int) -> list[tuple[str, str, str]]:
    """``n`` warm-start examples ``(prompt, target, style)`` from the training half; style is
    ``"worked"`` with probability ``cfg.worked_fraction``, else ``"guess"``."""
    out = []
    for _ in range(n):
        p = sample_problem(rng, cfg)
        while p.is_test():
            p = sample_problem(rng, cfg)
        if rng.random() < cfg.worked_fraction:
            out.append((p.prompt, p.worked_target(cfg.verbosity), "worked"))
        else:
            out.append((p.prompt, p.guess_target(), "guess"))
    return out


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (balanced braces), or None when there is
    no box or the last one is not closed.

    Written here rather than taken from math-verify because the task's reward is exact string
    match of the box content, and this must be fast and dependency-free in the rollout loop.
    """
    start = text.rfind(BOX)
    if start == -1:
        return None
    depth = 1
    for i in range(start + len(BOX), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start + len(BOX) : i].strip()
    return None  # the last box is never closed (a truncated answer): no answer, as in verl


def task_reward(response: str, answer: str) -> float:
    """1.0 when the last box of ``response`` holds exactly ``answer`` (spaces stripped), else 0.0."""
    got = extract_boxed(response)
    return 1.0 if got is not None and got == answer.strip() else 0.0
