"""The generate options' one declaration (aggbench.evaluation.options): the generate rules' arguments
built from it, and the import the Snakefile makes on a login node."""

from __future__ import annotations

from aggbench.evaluation.options import workflow_args
from helpers.support import import_without


def test_workflow_args_pass_every_config_key_in_the_rules_order():
    evaluation = {"engine": "vllm", "batch_size": 32, "limit": 5, "n": 2, "max_tokens": 100, "workers": 4}
    model = {
        "max_context": 4096,
        "system_prompt": "Think; it's fine",
        "enable_thinking": False,
        "chat_template": False,
        "stop_tokens": ["<|im_end|>", "<|endoftext|>"],
    }
    assert workflow_args(evaluation, model, gpus=2) == [
        "--engine", "vllm", "--batch-size", "32", "--tensor-parallel-size", "2",
        "--limit", "5", "--n", "2", "--max-tokens", "100", "--max-context", "4096",
        "--system-prompt", "Think; it's fine", "--no-enable-thinking", "--no-chat-template",
        "--stop-token", "<|im_end|>", "--stop-token", "<|endoftext|>",
    ]  # fmt: skip


def test_workflow_args_leave_out_what_the_benchmark_or_checkpoint_decides():
    """Nulls, an empty system prompt, chat_template true (the benchmark's use_chat_template), no stop
    tokens, and tensor parallelism for hf or one GPU: only the engine and the batch size remain."""
    evaluation = {"engine": "hf", "batch_size": 64, "limit": None, "n": None, "max_tokens": None}
    model = {"system_prompt": "", "enable_thinking": None, "chat_template": True, "stop_tokens": []}
    assert workflow_args(evaluation, model, gpus=2) == ["--engine", "hf", "--batch-size", "64"]
    vllm = {**evaluation, "engine": "vllm"}
    assert workflow_args(vllm, {"enable_thinking": True}, gpus=1) == [
        "--engine", "vllm", "--batch-size", "64", "--enable-thinking"
    ]  # fmt: skip


def test_the_declaration_imports_without_torch_or_click(tmp_path):
    """The Snakefile imports it on a login node: the standard library only."""
    for blocked in ("torch", "click"):
        (tmp_path / blocked).mkdir()
        proc = import_without(tmp_path / blocked, blocked, ["aggbench.evaluation.options"])
        assert proc.returncode == 0, proc.stderr[-3000:]
