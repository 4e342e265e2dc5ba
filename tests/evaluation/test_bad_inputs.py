"""`aggbench generate` / `crosscheck` on bad input: a checkpoint that is not a loadable model
directory, a device that does not exist here. Each fails with one line naming what is wrong and
the fix, before the model (or anything else) is loaded."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench.cli import main


def invoke(*argv: str):
    return CliRunner().invoke(main, [str(a) for a in argv])


def assert_one_clean_error(result, *says: str) -> None:
    """Exit status 1 from a click error (no traceback) whose message holds ``says``."""
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception  # not an uncaught error
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, result.output
    for text in says:
        assert text in errors[0], errors[0]


def broken_copy(tiny_model: Path, tmp_path: Path, how: str) -> Path:
    """A copy of the tiny model broken in one way."""
    ck = tmp_path / f"ck_{how}"
    shutil.copytree(tiny_model, ck)
    if how == "no_config":
        (ck / "config.json").unlink()
    elif how == "bad_config":
        (ck / "config.json").write_text('{"model_type": "llama",\n')
    elif how == "empty_weights":
        (ck / "model.safetensors").write_bytes(b"")
    return ck


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("no_config", ["is not a model directory (no config.json)", "prepare-model"]),
        ("bad_config", ["config.json is not valid JSON", "prepare-model"]),
        ("empty_weights", ["cannot load checkpoint", "weights file unreadable"]),
    ],
)
def test_generate_on_a_broken_checkpoint_is_one_line(tiny_model, tmp_path, how, says):
    ck = broken_copy(tiny_model, tmp_path, how)
    result = invoke("generate", "--checkpoint", ck, "--benchmarks", "tiny_test", "--out", tmp_path / "o",
                    "--limit", "1", "--n", "1", "--max-tokens", "2", "--device", "cpu")  # fmt: skip
    assert_one_clean_error(result, str(ck), *says)
    assert not (tmp_path / "o").exists()


def test_generate_benchmarks_on_a_missing_directory_names_it(tmp_path):
    from aggbench.evaluation.generate import generate_benchmarks
    from aggbench.modeldir import ModelDirError

    with pytest.raises(ModelDirError, match=r"--checkpoint .*nope does not exist; give a save_pretrained"):
        generate_benchmarks(tmp_path / "nope", ["tiny_test"], tmp_path / "o")


def test_crosscheck_on_a_broken_checkpoint_is_one_line(tiny_model, tmp_path):
    ck = broken_copy(tiny_model, tmp_path, "bad_config")
    result = invoke("crosscheck", "--checkpoint", ck, "--out", tmp_path / "o", "--benchmarks", "math500")
    assert_one_clean_error(result, str(ck), "config.json is not valid JSON")


@pytest.fixture
def no_cuda_no_loading(monkeypatch):
    """A machine without CUDA, where loading a model or a benchmark fails the test."""
    import torch
    import transformers

    import aggbench.data.benchmarks

    def never(*args, **kwargs):
        pytest.fail("nothing may be loaded before the device is checked")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", never)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", never)
    monkeypatch.setattr(aggbench.data.benchmarks, "load_benchmark", never)


@pytest.mark.parametrize(
    ("device", "says"),
    [
        ("cuda:7", "--device='cuda:7' but CUDA is not available on this machine"),
        ("cuda", "--device='cuda' but CUDA is not available on this machine"),
        ("gpu", "--device='gpu' is not a device; use cpu, cuda, cuda:N or auto"),
    ],
)
def test_generate_checks_the_device_before_loading_anything(
    tiny_model, tmp_path, no_cuda_no_loading, device, says
):
    result = invoke("generate", "--checkpoint", tiny_model, "--benchmarks", "tiny_test",
                    "--out", tmp_path / "o", "--device", device)  # fmt: skip
    assert_one_clean_error(result, says)


def test_a_cuda_index_beyond_the_devices_is_refused(monkeypatch):
    import torch

    from aggbench.devices import DeviceError, check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_device("cuda:1")
    check_device("auto")
    check_device(None)
    check_device("cpu")
    with pytest.raises(
        DeviceError, match=r"cuda:7' but this machine has 2 CUDA device\(s\): cuda:0 .. cuda:1"
    ):
        check_device("cuda:7")


def test_crosscheck_checks_the_device_before_loading_anything(tiny_model, tmp_path, no_cuda_no_loading):
    result = invoke("crosscheck", "--checkpoint", tiny_model, "--out", tmp_path / "o", "--device", "gpu")
    assert_one_clean_error(result, "--device='gpu' is not a device")


def test_generation_json_records_auto_as_the_resolved_device(tiny_model, tmp_path, shared_data, monkeypatch):
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(shared_data))
    result = invoke("generate", "--checkpoint", tiny_model, "--benchmarks", "tiny_test", "--out", tmp_path,
                    "--limit", "1", "--n", "1", "--max-tokens", "2", "--device", "auto", "--quiet")  # fmt: skip
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "generation.json").read_text())
    assert info["device"] in ("cpu", "cuda")


def test_max_context_caps_budgets_and_counts_prompts_that_do_not_fit(model_cli, tmp_path):
    """issue 13 item 5: generation never runs past the model's context; what did not fit is counted.
    Every tiny_test prompt is 58 tokens: a context of 64 leaves 6 new tokens, one of 58 none."""
    import json

    from aggbench.evaluation.context import response_budgets

    assert response_budgets([10, 30, 40, 50], 16, 48) == [16, 16, 8, 0]
    assert response_budgets([10, 500], 16, None) == [16, 16]
    common = ("--limit", "6", "--n", "2", "--max-tokens", "12", "--temperature", "1.0")
    result = model_cli("generate", "tiny_test", *common, "--max-context", "64")
    assert result.exit_code == 0, result.output
    info = json.loads((tmp_path / "generation.json").read_text())
    bench = info["benchmarks"]["tiny_test"]
    rows = [json.loads(line) for line in (tmp_path / "tiny_test.jsonl").read_text().splitlines()]
    assert bench["context"] == {"max_context": 64, "prompts_over_context": 0, "responses_capped": 6}
    assert len(rows) == 12 and all(0 < r["length"] <= 6 for r in rows) and bench["not_generated"] == 0
    assert any(r["finish_reason"] == "length" and r["length"] == 6 for r in rows)  # the cap, reached
    assert all(r["context_capped"] for r in rows)  # each row says its budget was cut (score counts them)
    result = model_cli("generate", "tiny_test", *common, "--max-context", "58")
    assert result.exit_code == 0, result.output
    bench = json.loads((tmp_path / "generation.json").read_text())["benchmarks"]["tiny_test"]
    rows = [json.loads(line) for line in (tmp_path / "tiny_test.jsonl").read_text().splitlines()]
    assert bench["context"]["prompts_over_context"] == 6 and bench["not_generated"] == 12
    assert {(r["finish_reason"], r["response"], r["length"]) for r in rows} == {("prompt_too_long", "", 0)}
