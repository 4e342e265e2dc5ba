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
        assert text == SOURCE[0].format(input=rec["prompt"])
        assert text.count("Please reason step by step") == 1  # the instruction once, in the system turn
        assert got == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert any("{" in rec["prompt"] for rec in records) or bench != "math500"  # LaTeX braces kept as they are


def test_the_format_does_not_apply_to_code_and_livecodebench_has_its_own_system_prompt():
    spec = load_benchmark_spec("livecodebench")
    settings = prompt_settings(spec, GenerateOptions(prompt_format="qwen25-math-cot"))
    # lcb_runner's CodeQwenInstruct system turn (lcb_runner/prompts/code_generation.py @ 28fef95e)
    assert settings["system_prompt"] == "You are a helpful assistant." and settings["chat_template"] is True
    assert "prompt_format" not in settings
    assert spec.version == 2


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
    assert info["options"]["prompt_format"] == "qwen25-math-cot"
    assert info["benchmarks"]["math500"]["prompt"]["prompt_format"] == "qwen25-math-cot"
