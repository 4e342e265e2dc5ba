"""Issue 28, item 4(a): the 7B's math evaluation prompt is Qwen2.5-Math's own, byte for byte.

SOURCE below is ``PROMPT_TEMPLATES["qwen25-math-cot"]`` of QwenLM/Qwen2.5-Math evaluation/utils.py at
commit a45202bd16f1ec06f433442dc1152d0074773465 (lines 141-147), as a Python literal: (input
template, output template, splitter). math_eval.py formats the first element with
``.format(input=question)`` and, without ``--apply_chat_template`` (its default), sends that string
as it is. aggbench renders the same prompt with the chat template off (``prompt_format``), so the
comparison needs no Qwen tokenizer; the tiny model's tokenizer then only turns it into ids.
"""

from __future__ import annotations

import json

import pytest

from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
from aggbench.evaluation.generate import format_prompts, prompt_settings
from aggbench.evaluation.options import GenerateOptions
from aggbench.evaluation.score import EvaluationError

SOURCE = (
    "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{{}}.<|im_end|>\n"
    "<|im_start|>user\n{input}<|im_end|>\n"
    "<|im_start|>assistant\n",
    "{output}",
    "\n\n",
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from helpers.tiny_models import tiny_model_for_tests

    return AutoTokenizer.from_pretrained(tiny_model_for_tests(tmp_path_factory.mktemp("tok")))


@pytest.mark.parametrize("bench", ["math500", "aime24", "olympiadbench"])
def test_the_7b_math_prompt_is_the_sources_template(bench, shared_data, tokenizer):
    spec = load_benchmark_spec(bench)
    records = load_benchmark(bench, data_dir=shared_data, limit=5)
    settings = prompt_settings(spec, GenerateOptions(prompt_format="qwen25-math-cot"))
    assert settings == {"prompt_format": "qwen25-math-cot", "system_prompt": None, "chat_template": False}
    texts, ids = format_prompts(spec, records, tokenizer, settings)
    for rec, text, got in zip(records, texts, ids, strict=True):
        # the source's parse_question returns question.strip() (Qwen2.5-Math evaluation/parser.py)
        assert text == SOURCE[0].format(input=rec["prompt"].strip())
        assert text.count("Please reason step by step") == 1  # the instruction once, in the system turn
        assert got == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert any("{" in rec["prompt"] for rec in records) or bench != "math500"  # LaTeX braces kept as they are
    if bench == "olympiadbench":  # its third problem starts with a newline: the strip is exercised
        assert any(rec["prompt"] != rec["prompt"].strip() for rec in records)


def test_the_format_does_not_apply_to_code_and_livecodebench_has_its_own_system_prompt():
    spec = load_benchmark_spec("livecodebench")
    settings = prompt_settings(spec, GenerateOptions(prompt_format="qwen25-math-cot"))
    # lcb_runner's CodeQwenInstruct system turn (lcb_runner/prompts/code_generation.py @ 28fef95e)
    assert settings["system_prompt"] == "You are a helpful assistant." and settings["chat_template"] is True
    assert "prompt_format" not in settings
    assert spec.version == 4


# lcb_runner/prompts/code_generation.py at LiveCodeBench/LiveCodeBench commit
# 28fef95ea8c9f7a547c8329f2cd3d32b92c1fa24, as Python literals: PromptConstants.SYSTEM_MESSAGE_CODEQWEN,
# the two FORMATTING constants, and get_codeqwen_question_template_answer; format_prompt_generation
# sends f"{SYSTEM_MESSAGE_CODEQWEN}\n\n" + that for LMStyle.CodeQwenInstruct (lm_styles.py gives it to
# the Qwen2.5 and Qwen3 models).
LCB_SYSTEM = "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user"
LCB_STARTER = (
    "You will use the following starter code to write the solution to the problem and enclose your "
    "code within delimiters."
)
LCB_STDIN = (
    "Read the inputs from stdin solve the problem and write the answer to stdout (do not directly test "
    "on the sample inputs). Enclose your code within delimiters as follows. Ensure that when the python "
    "program runs, it reads the inputs, runs the algorithm and writes output to STDOUT."
)


def lcb_codeqwen_question(question: str, starter_code: str) -> str:
    prompt = (
        "You will be given a question (problem specification) and will generate a correct Python program "
        "that matches the specification and passes all tests. You will NOT return anything except for "
        "the program.\n\n"
    )
    prompt += f"Question: {question}\n\n"
    if starter_code:
        prompt += f"{LCB_STARTER}\n"
        prompt += f"```python\n{starter_code}\n```\n\n<|im_end|>\n"
    else:
        prompt += f"{LCB_STDIN}\n"
        prompt += "```python\n# YOUR CODE HERE\n```\n\n<|im_end|>\n"
    prompt += "<|im_start|>assistant\n"
    return prompt


@pytest.fixture(scope="module")
def lcb_records(shared_data):
    records = load_benchmark("livecodebench", data_dir=shared_data)
    with_starter = [r for r in records if r.get("starter_code")][:3]
    stdin = [r for r in records if not r.get("starter_code")][:3]
    assert len(with_starter) == 3 and len(stdin) == 3  # both kinds of problem are covered
    return with_starter + stdin


def test_the_7b_livecodebench_prompt_is_lcb_runners_codeqwen_prompt(lcb_records, tokenizer):
    """Issue 28, review finding: the system turn was CodeQwenInstruct's and the question QwQ's; now
    both are CodeQwenInstruct's, and the 7B's raw format renders lcb_runner's string byte for byte."""
    spec = load_benchmark_spec("livecodebench")
    options = GenerateOptions(prompt_format=("qwen25-math-cot", "lcb-codeqwen"))
    settings = prompt_settings(spec, options)  # the first format written for the code grader
    assert settings == {"prompt_format": "lcb-codeqwen", "system_prompt": None, "chat_template": False}
    texts, ids = format_prompts(spec, lcb_records, tokenizer, settings)
    for rec, text, got in zip(lcb_records, texts, ids, strict=True):
        assert text == f"{LCB_SYSTEM}\n\n" + lcb_codeqwen_question(
            rec["prompt"], rec.get("starter_code") or ""
        )
        assert got == tokenizer(text, add_special_tokens=False)["input_ids"]
    # the math benchmarks keep their own format from the same list
    math = prompt_settings(load_benchmark_spec("math500"), options)
    assert math["prompt_format"] == "qwen25-math-cot"


def test_through_a_chat_template_the_user_turn_is_codeqwens_question(lcb_records):
    """Qwen3 (no raw format, its chat template's non-thinking turn): the user turn is the same
    question prompt, the system turn the same sentence."""
    spec = load_benchmark_spec("livecodebench")
    for rec in lcb_records:
        source = lcb_codeqwen_question(rec["prompt"], rec.get("starter_code") or "")
        assert spec.render_prompt(rec) == source.removesuffix("<|im_end|>\n<|im_start|>assistant\n")
    assert prompt_settings(spec, GenerateOptions())["system_prompt"] == LCB_SYSTEM.split("\n")[
        1
    ].removesuffix("<|im_end|>")


def test_an_unknown_format_names_the_valid_ones():
    with pytest.raises(
        EvaluationError, match="--prompt-format: unknown prompt format 'qwen-cot'.*qwen25-math-cot"
    ):
        GenerateOptions(prompt_format="qwen-cot")


def test_generate_records_and_uses_the_format(tiny_model, tmp_path, monkeypatch, shared_data):
    from click.testing import CliRunner

    from aggbench.cli import main

    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(shared_data))
    out = tmp_path / "gen"
    args = ["generate", "--checkpoint", str(tiny_model), "--benchmarks", "math500", "--out", str(out)]
    args += ["--limit", "2", "--n", "1", "--max-tokens", "2", "--prompt-format", "qwen25-math-cot"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    records = load_benchmark("math500", data_dir=shared_data, limit=2)
    rows = [json.loads(line) for line in (out / "math500.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == [SOURCE[0].format(input=rec["prompt"]) for rec in records]
    info = json.loads((out / "generation.json").read_text())
    assert info["options"]["prompt_format"] == ["qwen25-math-cot"]
    assert info["benchmarks"]["math500"]["prompt"]["prompt_format"] == "qwen25-math-cot"
