"""The built-in task's probability metric (issue 27, item 4; aggbench.tiny.probability): the
templates are the warm start's whole style set, the cached teacher-forcing equals a plain forward
pass per answer, and generate/score carry it into metrics.json. Its agreement with sampled avg@k on a
warm-started model is tests/workflow/test_smoke_dag.py's (the smoke DAG's 500-step model)."""

from __future__ import annotations

import json
import math
import random

import pytest

from aggbench.tiny.probability import answer_templates, parse_prompt, summarize, template_probabilities
from aggbench.tiny.task import TaskConfig, make_task, sample_problem, sft_examples, style_target, task_reward

torch = pytest.importorskip("torch")

KNOBS = [
    TaskConfig(),
    TaskConfig(gap="negative"),
    TaskConfig(spread="high"),
    TaskConfig(gap="negative", spread="high", verbosity=1),
    # lab v2's: one-line gaps, the echo lines before the box, the echo control
    TaskConfig(gap="positive_line", spread="echo"),
    TaskConfig(gap="negative_line", spread="echo", verbosity=1),
    TaskConfig(spread="echo_worked"),
]


@pytest.mark.parametrize("cfg", KNOBS, ids=lambda c: f"{c.gap}-{c.spread}-v{c.verbosity}")
def test_the_templates_are_the_warm_starts_whole_style_set(cfg):
    rng = random.Random(0)
    for _ in range(40):
        p = sample_problem(rng, cfg)
        assert parse_prompt(p.prompt) == p
        texts = dict(answer_templates(p, cfg))
        assert len(texts) == len(answer_templates(p, cfg))  # distinct
        for text, correct in texts.items():
            assert correct == (task_reward(text, p.answer) == 1.0)
        # worked + the right guess, each padded or not (echo_worked: not the guess)
        variants = (2 if cfg.spread != "low" else 1) * 2 - (cfg.spread == "echo_worked")
        assert sum(texts.values()) == variants
        for style in ("worked", "guess"):
            for padded in (False, True) if cfg.pads(style) else (False,):
                assert style_target(p, cfg, style, padded=padded) in texts
    # and every warm-start example of the task (its answer under the knobs) is one of them
    for prompt, target, _ in sft_examples(random.Random(1), cfg, 200):
        assert target in dict(answer_templates(parse_prompt(prompt), cfg))


def _reference(model, tokenizer, prompt, cfg, temperature):
    """Each template's probability by one plain forward pass over prompt + answer + eos."""
    from aggbench.tiny.model import render_prompt

    ids = tokenizer(render_prompt(tokenizer, prompt), add_special_tokens=False)["input_ids"]
    right = covered = 0.0
    for text, correct in answer_templates(parse_prompt(prompt), cfg):
        ans = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids + ans])).logits[0]
        lp = torch.log_softmax(logits.double() / temperature, dim=-1)
        p = math.exp(sum(float(lp[len(ids) - 1 + t, a]) for t, a in enumerate(ans)))
        covered += p
        right += p if correct else 0.0
    return right, covered


@pytest.mark.parametrize(
    "cfg", [KNOBS[1], KNOBS[2], KNOBS[4], KNOBS[6]], ids=["negative", "high", "echo", "echo_worked"]
)
def test_cached_teacher_forcing_equals_a_forward_pass_per_answer(tiny_model_dir, cfg):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    _, test = make_task(0, 0, 6, cfg=cfg)
    prompts = [r["prompt"] for r in test]
    got = template_probabilities(model, tok, prompts, cfg, temperature=0.7, group_size=4)
    for prompt, row in zip(prompts, got, strict=True):
        right, covered = _reference(model, tok, prompt, cfg, 0.7)
        assert row["p_correct"] == pytest.approx(right, rel=1e-4, abs=1e-12)
        assert row["p_covered"] == pytest.approx(covered, rel=1e-4, abs=1e-12)
    s = summarize(got)
    assert 0 <= s["prob_correct"] <= 1 - s["prob_uncovered"] + 1e-9 and s["prob_uncovered_max"] <= 1


def test_generate_and_score_put_it_beside_avg_at_k(tiny_model_dir, tmp_path):
    from click.testing import CliRunner

    from aggbench.cli import main

    out = tmp_path / "samples"
    res = CliRunner().invoke(
        main,
        ["generate", "--checkpoint", str(tiny_model_dir), "--benchmarks", "tiny_test", "--out", str(out),
         "--limit", "4", "--n", "2", "--tiny-task", '{"gap": "negative"}', "--quiet"],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    prob = json.loads((out / "generation.json").read_text())["benchmarks"]["tiny_test"]["probability"]
    assert (
        set(prob["per_problem"]) == {f"tiny-test-{i:06d}" for i in range(4)} and prob["usable_below"] == 0.02
    )
    res = CliRunner().invoke(
        main,
        [
            "score",
            "--benchmark",
            "tiny_test",
            "--samples",
            str(out / "tiny_test.jsonl"),
            "--out",
            str(tmp_path / "e.jsonl"),
            "--quiet",
        ],
    )
    assert res.exit_code == 0, res.output
    metrics = json.loads((tmp_path / "e.metrics.json").read_text())
    assert metrics["prob_correct"] == prob["prob_correct"] and metrics["prob_usable"] is False  # untrained
    from aggbench.metric_names import eval_metric_values

    logged = eval_metric_values("tiny_test", metrics)
    assert logged["eval/tiny_test/prob_correct"] == pytest.approx(100 * prob["prob_correct"])
    assert logged["eval/tiny_test/prob_usable"] == 0.0  # its gate beside it, 1 or 0
    res = CliRunner().invoke(
        main, ["generate", "--checkpoint", str(tiny_model_dir), "--benchmarks", "tiny_test", "--out", str(tmp_path / "x"),
               "--limit", "1", "--tiny-task", '{"gap": "sideways"}', "--quiet"]
    )  # fmt: skip
    assert res.exit_code != 0 and "--tiny-task" in res.output and "gap must be one of" in res.output, (
        res.output
    )
    # a max_tokens that cuts the longest template (the negative gap's guesses: 45 tokens up to the
    # box's closing brace, 46 with eos): skipped, saying why, since a cut template counted as correct
    # would break the lower bound; at 45 the answer is whole (eos not needed to grade it): computed
    for max_tokens in (44, 45):
        out = tmp_path / f"cut{max_tokens}"
        res = CliRunner().invoke(
            main, ["generate", "--checkpoint", str(tiny_model_dir), "--benchmarks", "tiny_test", "--out", str(out),
                   "--limit", "1", "--n", "1", "--max-tokens", str(max_tokens), "--tiny-task", '{"gap": "negative"}',
                   "--quiet"]
        )  # fmt: skip
        assert res.exit_code == 0, res.output
        prob = json.loads((out / "generation.json").read_text())["benchmarks"]["tiny_test"]["probability"]
        if max_tokens == 44:
            assert prob == {
                "skipped": "the task's longest answer template is 45 tokens up to its box's closing brace, "
                "above max_tokens 44, which cuts it: raise max_tokens to at least 45"
            }
        else:
            assert "skipped" not in prob and 0 <= prob["prob_correct"] <= 1, prob


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory):
    from helpers.tiny_models import tiny_model_for_tests

    return tiny_model_for_tests(tmp_path_factory.mktemp("prob"), sft_steps=2)


@pytest.mark.parametrize(("uncovered", "usable"), [(0.019, True), (0.02, False), (0.021, False)])
def test_the_gate_is_the_uncovered_mass_strictly_below_two_points(tmp_path, uncovered, usable):
    """score's prob_usable: the mean uncovered mass below USABLE_BELOW (0.02, as docs/evaluation.md
    says), logged to MLflow as 1 or 0 beside prob_correct."""
    from aggbench.evaluation.score import _probability
    from aggbench.metric_names import eval_metric_values
    from aggbench.tiny.probability import USABLE_BELOW

    assert USABLE_BELOW == 0.02
    prob = {"prob_correct": 0.5, "prob_uncovered": uncovered, "prob_uncovered_max": 0.2, "usable_below": 0.02}
    (tmp_path / "generation.json").write_text(
        json.dumps({"benchmarks": {"tiny_test": {"probability": prob}}})
    )
    got = _probability(tmp_path / "tiny_test.jsonl", "tiny_test")
    assert got["prob_usable"] is usable and got["prob_uncovered"] == uncovered
    assert eval_metric_values("tiny_test", got)["eval/tiny_test/prob_usable"] == float(usable)
