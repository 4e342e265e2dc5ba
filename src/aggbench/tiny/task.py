"""The built-in synthetic verifiable task: follow a letter map a few hops.

A problem is a map on a few letters (one cycle through all of them), a start letter and a hop
count::

    prompt:  "Map c>i d>p e>s i>d p>e s>c. From i, apply it 4 times."
    answer:  "s"            (i>d, d>p, p>e, e>s)

Why this task and not addition (measured before: on plain addition the length gap between right
and wrong answers vanished after ~20 GRPO steps, and with equal lengths every aggregation rule is
the same rule; and a 2.6M model does not learn a digit table such as (a + b) mod 10 in a few
hundred warm-start steps, while it learns to copy from its context in ~150): the warm start
teaches two answer styles,

- *guess*: ``\\boxed{c}`` at once (4 tokens with eos). Composing several in-context look-ups in
  one forward pass is beyond a 4-layer model, and the map is one cycle, so a guess is right about
  1 time in n_nodes - 1 (1 in 7 by default) however long it trains;
- *worked*: one short line per hop (``1) i>d``), then the box. Each line copies the previous
  line's letter and looks its image up in the prompt (an induction-head copy), so a tiny model
  gets it mostly right.

So inside every GRPO group with reward variance the correct responses are mostly worked (long)
and the wrong ones mostly guesses (short), for as long as the policy still guesses at all: the
sign-length gap lasts, and its size is set by ``verbosity`` (tokens per worked line) and the hop
count. The mix after the warm start, and so the starting accuracy, is set by ``worked_fraction``.

Two knobs of the warm start make a controlled length-bias lab (``gap`` x ``spread``, each default
today's task). Both only add text that needs no computing (the worked lines, the skill, are the
same in every setting, so accuracy stays about the same), and neither touches the problems:
``make_task``'s records and so the training set and the benchmark are the same for every setting,
only the warm-started model differs.

- ``gap="negative"``: a guess opens with numbered filler lines (``skip 0``, ``skip 1``, ...) as
  wide as a worked line, one more of them than the longest worked answer has hop lines, so every
  guess is longer than every worked answer and the wrong answers (mostly guesses) are the long
  ones. ``"positive"`` (default) is the task above: the right answers are the long ones.
- ``gap="positive_line"`` / ``"negative_line"`` (lab v2): a guess opens with ``hops - 1`` /
  ``hops + 1`` filler lines, so it is exactly one line shorter / longer than the worked answer to
  the same problem. Within a prompt group (one problem) the two styles then differ by one line
  either way, so the two gap arms have the same gap size and nearly the same length CV (v1's
  ``positive`` guess is the box alone, CV near 1, against ``negative``'s 0.13: the gap knob moved
  the CV more than the spread knob did).
- ``spread="high"``: with probability ``PAD_PROB`` an answer of either style opens with a block of
  ``PAD_LINES`` numbered padding lines (``wait 1`` ...), drawn independently of the style, so
  correctness does not change it. An all-or-nothing block, not a random line count, because the
  positive-gap task's lengths are already bimodal (a length CV near 1): adding independent
  padding raises the CV only where the padding's own CV is larger than that, and an all-or-nothing
  block has CV sqrt((1 - q) / q) = 2.4 at q = 0.15, while a uniform line count has at most 0.58 and
  would lower the pooled CV. A wider hop range would also spread the lengths, but it changes the
  problems and their difficulty. ``"low"`` (default): no padding.
- ``spread="echo"`` (lab v2): with probability ``ECHO_PROB`` an answer of either style writes its
  letter on ``ECHO_LINES`` lines (``so c``) just before its box. Each line copies the letter of the
  line above, the copy a worked hop line already makes, so the block is meant not to cost accuracy
  (v1's opening block did: worked answers 0.97 -> 0.85 right, the first hop line moved away from
  the prompt) and cannot write a second box after the answer (pilot 1's ``"tail"`` block after the
  box did: padded answers ended wrong more often and pos-high's gap turned negative in RL).
- ``spread="echo_worked"`` (lab v2's positive control, with the default ``gap``): the echo block
  on worked answers only (with probability ``ECHO_PROB``), so the right answers come in two
  lengths, equally right, and the wrong ones (guesses, the box alone) have no block to choose.
  Sequence aggregation's 1/|o| weighting must then favour the short form among right answers, where
  token aggregation has no preference between them; no wrong answer makes the same choice, so
  nothing pulls the other way (with ``"echo"``, token aggregation's larger weight on long wrong
  guesses pushes the block down in a context much like the worked answers').
- Pilot 1's ``verbose_share`` control (a share of the worked answers written at verbosity 2) was
  refuted twice (docs/lab.md: taught with the skill or after it, the look-up was lost) and removed
  after lab v2 ran; ``"echo_worked"`` replaced it (the code is at commit a8044b7).

Records use the harness's canonical form ``{"id", "prompt", "answer"}``; the prompt is the user
message only (the chat template is applied elsewhere). Test problems come from a fixed eighth of
the problem space (a hash of the prompt, independent of any seed) and training problems from the
rest, so no training split and no warm-start batch can contain a test problem, whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

BOX = "\\boxed{"
NODES = "abcdefghijklmnopqrstuvwxyz"
VERBOSITY_LEVELS = (0, 1, 2)
GAPS = ("positive", "negative", "positive_line", "negative_line")
SPREADS = ("low", "high", "echo", "echo_worked")
# spread="high": the share of warm-start answers that open with the padding block, and its lines.
PAD_PROB = 0.15
PAD_LINES = 9
# spread="echo" (lab v2): the share of warm-start answers that echo their letter before the box, and
# the echo lines: half, so the block's own length CV is 1 (sqrt((1 - q) / q)).
ECHO_PROB = 0.5
ECHO_LINES = 6
PAD_PROBS = {"high": PAD_PROB, "echo": ECHO_PROB, "echo_worked": ECHO_PROB}
# One in TEST_BUCKETS of all problems (by hash) is reserved for test splits.
TEST_BUCKETS = 8


def is_test_prompt(prompt: str) -> bool:
    """Whether a prompt belongs to the test part of the problem space (fixed, seedless)."""
    digest = hashlib.blake2b(prompt.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % TEST_BUCKETS == 0


@dataclass(frozen=True)
class Problem:
    """A map ``((source, image), ...)`` (one cycle through its letters, listed by source), a start
    letter and a hop count."""

    mapping: tuple[tuple[str, str], ...]
    start: str
    hops: int

    @property
    def prompt(self) -> str:
        pairs = " ".join(f"{src}>{dst}" for src, dst in self.mapping)
        return f"Map {pairs}. From {self.start}, apply it {self.hops} times."

    def path(self) -> list[str]:
        """The visited letters, start first: hops + 1 entries."""
        image = dict(self.mapping)
        out = [self.start]
        for _ in range(self.hops):
            out.append(image[out[-1]])
        return out

    @property
    def answer(self) -> str:
        return self.path()[-1]

    def is_test(self) -> bool:
        return is_test_prompt(self.prompt)

    def guess_target(self) -> str:
        """The short answer style: the box alone."""
        return f"{BOX}{self.answer}}}"

    def worked_target(self, verbosity: int = 0) -> str:
        """The long answer style: one line per hop, then the box.

        verbosity 0: ``1) a>c``  (6 characters a line, plus the newline)
        verbosity 1: ``1) from a go to c``  (17 + 1)
        verbosity 2: ``step 1: the map sends a to c``  (27 + 1)
        """
        path = self.path()
        lines = [
            hop_line(step, src, dst, verbosity)
            for step, (src, dst) in enumerate(zip(path, path[1:], strict=False), 1)
        ]
        lines.append(self.guess_target())
        return "\n".join(lines)


def hop_line(step: int, src: str, dst: str, verbosity: int) -> str:
    """One line of a worked answer (see ``Problem.worked_target``)."""
    if verbosity not in VERBOSITY_LEVELS:
        raise ValueError(f"verbosity must be one of {VERBOSITY_LEVELS}, got {verbosity!r}")
    if verbosity == 0:
        return f"{step}) {src}>{dst}"
    if verbosity == 1:
        return f"{step}) from {src} go to {dst}"
    return f"step {step}: the map sends {src} to {dst}"


def _filler_lines(word: str, numbers: range, verbosity: int) -> list[str]:
    """Lines ``WORD N`` padded with dots to a worked line's width: text a model can emit without
    computing anything, as long per line as a hop line."""
    width = len(hop_line(1, "a", "b", verbosity))
    return [f"{word} {n}".ljust(width, ".") for n in numbers]


def echo_lines(letter: str) -> list[str]:
    """``spread="echo"``'s block before the box: the answer's letter, once a line."""
    return [f"so {letter}"] * ECHO_LINES


def has_echo(text: str) -> bool:
    """Whether a response writes an echo line (``so X``), as ``spread="echo"`` answers do."""
    return any(line.startswith("so ") for line in text.splitlines())


@dataclass(frozen=True)
class TaskConfig:
    """Knobs of the task and of the warm-start answer mix.

    n_nodes: letters in the map (one cycle, so a blind guess is right 1 time in n_nodes - 1).
    min_hops/max_hops: hops per problem (uniform in the range, at most 9 so labels are one digit);
        more hops make worked answers longer.
    worked_fraction: share of worked answers in the warm-start data; the warmed-up policy copies
        this mix, so it sets the starting accuracy (about worked_fraction * worked accuracy +
        (1 - worked_fraction) / (n_nodes - 1)).
    verbosity: worked-line format (see ``Problem.worked_target``): the length gap per hop.
    random_letters: draw the map's letters from a-z instead of using the first n_nodes letters.
        The default (False) keeps each letter's pair at a fixed place in the prompt, which a tiny
        model learns to look up in ~250 warm-start steps; random letters need content-based look-up,
        which 500 steps did not teach (worked accuracy stayed ~18%). The price of fixed letters is
        a small problem space: (n_nodes - 1)! * n_nodes * (max_hops - min_hops + 1) problems, 2160
        by default (1/8 of them test problems).
    gap: ``"positive"`` (default: worked answers, mostly right, are the long ones) or
        ``"negative"`` (guesses, mostly wrong, open with filler lines and are the long ones); see
        the module docstring. A warm-start knob: the problems do not depend on it.
    spread: ``"low"`` (default: no padding) or ``"high"`` (a share ``PAD_PROB`` of the answers, of
        either style, open with ``PAD_LINES`` padding lines) or ``"echo"`` (a share ``ECHO_PROB``
        write ``ECHO_LINES`` lines echoing their letter before the box) or ``"echo_worked"`` (the same
        on worked answers only); a warm-start knob like ``gap``.
    """

    n_nodes: int = 6
    min_hops: int = 3
    max_hops: int = 5
    worked_fraction: float = 0.35
    verbosity: int = 0
    random_letters: bool = False
    gap: str = "positive"
    spread: str = "low"

    def __post_init__(self) -> None:
        if not 3 <= self.n_nodes <= len(NODES):
            raise ValueError(f"n_nodes must be in [3, {len(NODES)}], got {self.n_nodes!r}")
        if not 1 <= self.min_hops <= self.max_hops <= 9:
            raise ValueError(
                f"need 1 <= min_hops <= max_hops <= 9, got min_hops={self.min_hops}, max_hops={self.max_hops}"
            )
        if not 0.0 <= self.worked_fraction <= 1.0:
            raise ValueError(f"worked_fraction must be in [0, 1], got {self.worked_fraction!r}")
        if self.verbosity not in VERBOSITY_LEVELS:
            raise ValueError(f"verbosity must be one of {VERBOSITY_LEVELS}, got {self.verbosity!r}")
        if self.gap not in GAPS:
            raise ValueError(f"gap must be one of {GAPS}, got {self.gap!r}")
        if self.spread not in SPREADS:
            raise ValueError(f"spread must be one of {SPREADS}, got {self.spread!r}")

    def max_response_tokens(self) -> int:
        """Tokens of the longest warm-start answer, eos included: size max_new_tokens at least this."""
        cycle = NODES[: self.n_nodes]
        mapping = tuple((c, cycle[(i + 1) % self.n_nodes]) for i, c in enumerate(cycle))
        longest = Problem(mapping=mapping, start="a", hops=self.max_hops)
        padded = self.spread != "low"
        targets = [style_target(longest, self, s, padded=padded) for s in STYLES]
        return max(len(t) for t in targets) - len(BOX) + 1 + 1  # BOX is one token; eos

    def pads(self, style: str) -> bool:
        """Whether the spread knob pads answers of ``style`` (some of them)."""
        return self.spread != "low" and (self.spread != "echo_worked" or style == "worked")

    def knobs(self) -> dict[str, str]:
        """The lab knobs that differ from the default task (empty for today's task)."""
        return {k: getattr(self, k) for k in KNOBS if getattr(self, k) != getattr(TaskConfig, k)}


STYLES = ("worked", "guess")
KNOBS = ("gap", "spread")  # the warm-start knobs (the skill phase leaves them out: worked answers only)


def style_target(
    problem: Problem,
    cfg: TaskConfig,
    style: str,
    *,
    padded: bool = False,
    letter: str | None = None,
) -> str:
    """A warm-start answer of ``style`` under ``cfg``'s knobs; ``padded`` adds the spread knob's
    padding block (before the answer for ``"high"``, the echo lines before the box for ``"echo"``;
    ignored where the knob does not pad ``style``, see ``TaskConfig.pads``); ``letter`` is the answer
    a guess gives (default: the right one, as the warm start teaches; a worked answer always boxes
    the answer its hop lines reach)."""
    if letter is not None and style != "guess":
        raise ValueError(
            f"letter is for guesses (a worked answer's box is its last hop), got style={style!r}"
        )
    answer = letter or problem.answer
    padded = padded and cfg.pads(style)
    if style == "worked":
        lines = problem.worked_target(cfg.verbosity).splitlines()[:-1]
    elif cfg.gap == "positive":
        lines = []
    else:
        fillers = {
            "negative": cfg.max_hops + 1,
            "negative_line": problem.hops + 1,
            "positive_line": problem.hops - 1,
        }
        lines = _filler_lines("skip", range(fillers[cfg.gap]), cfg.verbosity)
    if padded and cfg.spread.startswith("echo"):
        lines += echo_lines(answer)
    elif padded:
        lines = _filler_lines("wait", range(1, PAD_LINES + 1), cfg.verbosity) + lines
    return "\n".join([*lines, f"{BOX}{answer}}}"])


def response_style(text: str) -> str:
    """``"worked"`` when a response has a first hop line (after any padding), else ``"guess"``."""
    first = next((line for line in text.splitlines() if line.startswith(("1) ", "step 1: "))), None)
    return "guess" if first is None else "worked"


def sample_problem(rng: random.Random, cfg: TaskConfig) -> Problem:
    # One cycle through the letters: no hop count below n_nodes leads back to the start, and the
    # answer is uniform over the other letters (no "answer = start" shortcut that shorter cycles
    # would open).
    letters = rng.sample(NODES, cfg.n_nodes) if cfg.random_letters else list(NODES[: cfg.n_nodes])
    order = rng.sample(letters, cfg.n_nodes)
    image = {src: order[(i + 1) % cfg.n_nodes] for i, src in enumerate(order)}
    return Problem(
        mapping=tuple(sorted(image.items())),
        start=rng.choice(letters),
        hops=rng.randint(cfg.min_hops, cfg.max_hops),
    )


def sample_problems(rng: random.Random, cfg: TaskConfig, n: int, *, test: bool) -> list[Problem]:
    """``n`` distinct problems from the test half (``test=True``) or the training half of the space."""
    out: list[Problem] = []
    seen: set[Problem] = set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 100 * n + 1000:
            raise ValueError(
                f"could not draw {n} distinct {'test' if test else 'train'} problems from {cfg}: "
                "the problem space is too small; raise n_nodes or widen the hop range"
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


def make_validation(
    seed: int, n_validation: int, n_test: int, *, cfg: TaskConfig | None = None
) -> list[dict[str, str]]:
    """A validation split: ``n_validation`` problems from the held-out (test) half of the problem
    space, none of them in ``make_task(seed, ..., n_test)``'s test split, drawn from their own stream
    (so neither the training nor the test split changes). For choosing checkpoints without looking
    at the test split (``evaluation.selection``)."""
    cfg = cfg or TaskConfig()
    _, test = make_task(seed, 0, n_test, cfg=cfg)
    taken = {r["prompt"] for r in test}
    rng = random.Random(f"tiny-validation-{seed}")
    pool = sample_problems(rng, cfg, n_validation + n_test, test=True)
    chosen = [p for p in pool if p.prompt not in taken][:n_validation]
    if len(chosen) < n_validation:  # (at most n_test of the pool were taken)
        raise ValueError(f"could not draw {n_validation} validation problems apart from the test split")
    return [to_record(p, "validation", i) for i, p in enumerate(chosen)]


def sft_examples(rng: random.Random, cfg: TaskConfig, n: int) -> list[tuple[str, str, str]]:
    """``n`` warm-start examples ``(prompt, target, style)`` from the training half; style is
    ``"worked"`` with probability ``cfg.worked_fraction``, else ``"guess"``. With a spread other than
    ``"low"`` one more draw per example decides the padding (applied where ``cfg.pads(style)``; the
    default task draws exactly as before the knobs)."""
    out = []
    for _ in range(n):
        p = sample_problem(rng, cfg)
        while p.is_test():
            p = sample_problem(rng, cfg)
        style = "worked" if rng.random() < cfg.worked_fraction else "guess"
        padded = cfg.spread != "low" and rng.random() < PAD_PROBS[cfg.spread]
        out.append((p.prompt, style_target(p, cfg, style, padded=padded), style))
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
