"""The length-bias lab's knobs (``TaskConfig.gap`` and ``.spread``): the default task is unchanged,
the warm-start data has the lengths the knobs promise, and (slow) the warm-started model's samples
move the measured gap and CV in the configured direction."""

from __future__ import annotations

import hashlib
import json
import random
import statistics

import pytest

from aggbench.tiny.task import (
    BOX,
    ECHO_LINES,
    ECHO_PROB,
    PAD_LINES,
    PAD_PROB,
    TaskConfig,
    hop_line,
    make_task,
    response_style,
    sample_problem,
    sft_examples,
    style_target,
    task_reward,
)

# sha256 of make_task + sft_examples + max_response_tokens for three task configs, computed with the
# code before the knobs existed (commit 2283147, `_digest` below run on it): the default task and
# every existing knob draw exactly what they drew before.
BEFORE_KNOBS = {
    (): "9c4e9db029dd2d355f9d2f5fce995717a99cbbaf150708a3198049732d8eef7f",
    (
        ("verbosity", 2),
        ("worked_fraction", 0.5),
    ): "db6943c2556d7216f67106092025ff638c37faf23925492316de5000e263b25a",
    (("max_hops", 6), ("min_hops", 2), ("n_nodes", 8), ("random_letters", True), ("verbosity", 1)): (
        "0e352660dc381791696c715749e529789c3c0e4ce891a44c3bf27dbd08461144"
    ),
}


def _digest(cfg: TaskConfig) -> str:
    train, test = make_task(0, 500, 200, cfg=cfg)
    sft = sft_examples(random.Random("tiny-sft-0"), cfg, 400)
    blob = json.dumps([train, test, sft, cfg.max_response_tokens()], sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def _tokens(text: str) -> int:
    """Tokens of a response under the tiny tokenizer (one per character, the box one), plus eos."""
    return len(text) - text.count(BOX) * (len(BOX) - 1) + 1


@pytest.mark.parametrize("fields", list(BEFORE_KNOBS))
def test_the_default_task_is_unchanged(fields):
    assert _digest(TaskConfig(**dict(fields))) == BEFORE_KNOBS[fields]
    assert TaskConfig().knobs() == {}


@pytest.mark.parametrize("gap", ["positive", "negative"])
@pytest.mark.parametrize("spread", ["low", "high"])
def test_knobs_leave_the_problems_alone(gap, spread):
    cfg = TaskConfig(gap=gap, spread=spread)
    assert make_task(3, 200, 50, cfg=cfg) == make_task(3, 200, 50)
    examples = sft_examples(random.Random(0), cfg, 200)
    default = sft_examples(random.Random(0), TaskConfig(), 200)
    for (prompt, target, style), (p0, _, s0) in zip(examples, default, strict=True):
        assert style == response_style(target)  # the style is readable from the text
        if spread == "low":  # the same draws: the same problems and styles
            assert (prompt, style) == (p0, s0)
        answer = target.rsplit(BOX, 1)[1].rstrip("}")
        assert task_reward(target, answer) == 1.0  # still one box at the end


def test_negative_gap_makes_every_guess_longer_than_every_worked_answer():
    for verbosity in (0, 1, 2):
        cfg = TaskConfig(gap="negative", verbosity=verbosity)
        rng = random.Random(verbosity)
        problems = [sample_problem(rng, cfg) for _ in range(50)]
        worked = [_tokens(style_target(p, cfg, "worked")) for p in problems]
        guesses = [_tokens(style_target(p, cfg, "guess")) for p in problems]
        assert min(guesses) > max(worked)
        assert max(guesses) == cfg.max_response_tokens()
        # positive: the task as before, guesses are the box alone
        assert all(
            style_target(p, TaskConfig(verbosity=verbosity), "guess") == p.guess_target() for p in problems
        )


def test_high_spread_pads_either_style_at_the_configured_rate():
    cfg = TaskConfig(spread="high")
    examples = sft_examples(random.Random(0), cfg, 4000)
    for style in ("worked", "guess"):
        padded = [t.startswith("wait 1") for _, t, s in examples if s == style]
        assert abs(statistics.mean(padded) - PAD_PROB) < 0.03  # independent of the style
    block = [t for _, t, _ in examples if t.startswith("wait")][0].splitlines()[:PAD_LINES]
    assert block == [f"wait {i}" for i in range(1, PAD_LINES + 1)]  # as wide as a hop line "1) a>b"
    assert cfg.max_response_tokens() == TaskConfig().max_response_tokens() + 7 * PAD_LINES


def test_line_gaps_make_a_guess_one_line_shorter_or_longer_than_its_worked_answer():
    for verbosity in (0, 1, 2):
        rng = random.Random(verbosity)
        for p in [sample_problem(rng, TaskConfig()) for _ in range(50)]:
            line = len(hop_line(1, "a", "b", verbosity)) + 1  # a hop line and its newline, in tokens
            for gap, sign in (("positive_line", 1), ("negative_line", -1)):
                cfg = TaskConfig(gap=gap, verbosity=verbosity)
                worked, guess = (_tokens(style_target(p, cfg, s)) for s in ("worked", "guess"))
                assert worked - guess == sign * line
                assert response_style(style_target(p, cfg, "guess")) == "guess"


def test_echo_spread_echoes_the_letter_before_the_box_at_its_rate_and_keeps_the_reward():
    cfg = TaskConfig(gap="negative_line", spread="echo")
    examples = sft_examples(random.Random(0), cfg, 4000)
    for style in ("worked", "guess"):
        padded = [("so " in t) for _, t, s in examples if s == style]
        assert abs(statistics.mean(padded) - ECHO_PROB) < 0.03  # independent of the style
    for _, target, style in examples[:200]:
        answer = target.split(BOX)[1].split("}")[0]
        assert task_reward(target, answer) == 1.0 and response_style(target) == style
        if "so " in target:  # the block: the letter on ECHO_LINES lines, then the box, nothing after
            assert target.endswith("\n".join([f"so {answer}"] * ECHO_LINES + [f"{BOX}{answer}}}"]))
    assert cfg.max_response_tokens() == TaskConfig(gap="negative_line").max_response_tokens() + 5 * ECHO_LINES


def test_echo_worked_echoes_only_worked_answers_the_controls_two_right_lengths():
    cfg = TaskConfig(spread="echo_worked")
    examples = sft_examples(random.Random(0), cfg, 4000)
    padded = [("so " in t) for _, t, s in examples if s == "worked"]
    assert abs(statistics.mean(padded) - ECHO_PROB) < 0.03
    assert all(t.startswith(BOX) and "\n" not in t for _, t, s in examples if s == "guess")  # the box alone
    assert cfg.pads("worked") and not cfg.pads("guess") and TaskConfig(spread="echo").pads("guess")
    problem = sample_problem(random.Random(1), cfg)
    assert style_target(problem, cfg, "guess", padded=True) == problem.guess_target()  # nothing to pad
    assert cfg.knobs() == {"spread": "echo_worked"}


def test_letter_sets_a_guess_only():
    cfg = TaskConfig(spread="echo")
    problem = sample_problem(random.Random(2), cfg)
    other = next(x for x, _ in problem.mapping if x != problem.answer)
    guess = style_target(problem, cfg, "guess", padded=True, letter=other)
    assert guess.endswith(f"so {other}\n{BOX}{other}}}") and task_reward(guess, problem.answer) == 0.0
    with pytest.raises(ValueError, match="letter is for guesses"):
        style_target(problem, cfg, "worked", letter=other)


def test_bad_knob_values_name_the_field_and_the_choices():
    with pytest.raises(
        ValueError,
        match=r"gap must be one of \('positive', 'negative', 'positive_line', 'negative_line'\), got 'longer'",
    ):
        TaskConfig(gap="longer")
    with pytest.raises(
        ValueError, match=r"spread must be one of \('low', 'high', 'echo', 'echo_worked'\), got 'wide'"
    ):
        TaskConfig(spread="wide")


def test_shared_warm_starts_equal_separate_ones(tmp_path):
    """warm_start_settings runs the knob-free skill phase once and forks it: each model is the one
    sft_warm_start would have trained alone."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from aggbench.tiny.lab import warm_start_settings
    from aggbench.tiny.model import build_tiny_model, sft_warm_start

    settings = {"neg-high": TaskConfig(gap="negative", spread="high"), "pos-low": TaskConfig()}
    shared = warm_start_settings(tmp_path / "shared", settings, steps=4, batch_size=4, seed=1)
    for name, cfg in settings.items():
        alone = build_tiny_model(tmp_path / f"alone-{name}", seed=1)
        sft_warm_start(alone, steps=4, batch_size=4, seed=1, task=cfg, progress=False)
        a, b = (AutoModelForCausalLM.from_pretrained(d).state_dict() for d in (shared[name], alone))
        assert all(torch.equal(a[k], b[k]) for k in a), name
    with pytest.raises(ValueError, match=r"skill_steps must be in \[0, steps=4\], got 5"):
        warm_start_settings(tmp_path / "y", settings, steps=4, skill_steps=5)
    with pytest.raises(ValueError, match="share no skill phase"):
        warm_start_settings(tmp_path / "x", {"a": TaskConfig(), "b": TaskConfig(n_nodes=5)}, steps=2)


# --- the warm-started model's samples (slow) --------------------------------------------------

# The lab's own warm start (configs/lab.yaml: 500 steps; 300 and 400 leave the look-up unlearned:
# worked answers 16-40% right at 400, so the negative gap is not clear). One shared 250-step skill
# phase, four 250-step mix phases: 388 s of setup in CI (2026-12-06), above issue 27's 2 minutes.
# Cheaper warm starts tried on 2026-12-06 (benchmarks/lab_knobs.py --lr/--skill-steps and the same
# forks at other schedules, 1 thread each) all left worked answers 11-51% right (the test needs
# > 70%): lr 3e-3 (150 steps, skill 100) and 4e-3 (120/80); 290 steps with the 250-step skill
# phase (its lr then decays before the look-up forms); a 5-letter, 2-4-hop task (260/220); a
# 600-step schedule stopped after a 250-step skill phase + 100 mix steps, or 270 + 60. The skill
# phase alone at lr 1e-3 loses its plateau only at ~200-250 steps (at 3e-3 it never does), and the
# mix phase keeps teaching the look-up: the 1250 steps stay. Measured with these settings
# (benchmarks/lab_knobs.py, 16 training prompts x 8 samples, seed 0):
#   setting    accuracy  worked/guess acc  gap (within)    CV (within)   mean len
#   pos-low    0.40      0.97 / 0.15       +21.9 (+22.5)   1.06 (0.94)   13.8
#   pos-high   0.42      0.85 / 0.17       +14.5 (+22.4)   1.16 (1.08)   25.2
#   neg-low    0.45      0.96 / 0.18        -7.6 (-7.5)    0.15 (0.13)   42.1
#   neg-high   0.41      0.85 / 0.17        -6.3 (-5.3)    0.43 (0.36)   50.6
LAB_SFT_STEPS = 500


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    pytest.importorskip("torch")
    import torch

    from aggbench.tiny.lab import SETTINGS, measure, warm_start_settings

    torch.set_num_threads(2)  # the tests run one at a time: both cores
    dirs = warm_start_settings(tmp_path_factory.mktemp("lab"), SETTINGS, steps=LAB_SFT_STEPS, seed=0)
    return {
        name: measure(dirs[name], cfg, n_prompts=16, n_samples=8, seed=0) for name, cfg in SETTINGS.items()
    }


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_gap_knob_sets_the_sign_of_the_measured_gap(measured):
    for spread in ("low", "high"):
        pos, neg = measured[f"pos-{spread}"], measured[f"neg-{spread}"]
        assert pos["gap"] > 5 and pos["gap_within"] > 5, pos
        assert neg["gap"] < -3 and neg["gap_within"] < -3, neg
        for row in (pos, neg):  # the skill is learned: worked answers are mostly right, guesses not
            assert row["accuracy_worked"] > 0.7 and row["accuracy_guess"] < 0.35, row


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_spread_knob_raises_the_measured_cv(measured):
    for gap in ("pos", "neg"):
        low, high = measured[f"{gap}-low"], measured[f"{gap}-high"]
        assert high["cv"] > low["cv"] + 0.05, (low, high)
        assert high["cv_within"] > low["cv_within"] + 0.05, (low, high)


def test_the_skill_phase_drops_gap_and_spread_so_all_five_v2_settings_share_it():
    """The skill phase teaches worked answers without the mix phase's knobs, so the four gap x spread
    settings and the echo control share one."""
    from aggbench.tiny.lab import SETTINGS_V2, shared_skill_phases
    from aggbench.tiny.model import skill_task

    assert skill_task(TaskConfig(gap="negative_line", spread="echo")) == TaskConfig(worked_fraction=1.0)
    assert skill_task(TaskConfig(spread="echo_worked", verbosity=1)) == TaskConfig(
        worked_fraction=1.0, verbosity=1
    )
    models = {
        f"tiny-{k}": {"source": "tiny", "sft_steps": 500, "task": cfg.knobs()}
        for k, cfg in SETTINGS_V2.items()
    }
    (shared,) = shared_skill_phases(models).values()
    assert sorted(shared) == [
        "tiny-control",
        "tiny-neg-high",
        "tiny-neg-low",
        "tiny-pos-high",
        "tiny-pos-low",
    ]
