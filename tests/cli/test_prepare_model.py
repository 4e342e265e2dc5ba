"""`aggbench prepare-model NAME --out DIR` (aggbench.cli.prepare_model over
aggbench.modeldir.prepare_model): the built-in tiny model is built, warm-started and probed, a local
directory copied, a hub model downloaded atomically (offline: one error with the fix); the request
is recorded in aggbench_model.json, so the same request again does nothing and another one is
refused without --force; the tiny task's knobs and config.json overrides are recorded; a NAME that
is nothing is refused before anything is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from aggbench.evaluation.context import model_context
from aggbench.modeldir import MARKER
from aggbench.tiny.task import TaskConfig
from helpers.cli_support import clean_error, cli
from helpers.tiny_models import tiny_model_for_tests


@pytest.fixture(scope="module")
def untrained(tmp_path_factory) -> Path:
    return tiny_model_for_tests(tmp_path_factory.mktemp("tiny"))


def _load(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


def _run(args: list[str]):
    """`aggbench prepare-model ARGS`; an exception escapes (a bug fails the test as itself)."""
    return CliRunner().invoke(main, ["prepare-model", *args], catch_exceptions=False)


def _prepare(out: Path, *extra: str):
    """The untrained tiny model into ``out`` (no warm start, no probe: quick), plus ``extra``."""
    args = ["prepare-model", "tiny", "--out", str(out), "--sft-steps", "0", "--probe-prompts", "0", "--quiet"]
    return CliRunner().invoke(main, [*args, *extra])


# ---------------------------------------------------------------- the tiny model, a copy, a hub model


def test_prepare_model_tiny_end_to_end(tmp_path):
    out = tmp_path / "models" / "tiny"
    args = ["tiny", "--out", str(out), "--sft-steps", "5", "--probe-prompts", "2", "--seed", "3"]
    result = _run([*args, "--quiet"])
    assert result.exit_code == 0, result.output
    model, tok = _load(out)
    assert tok.decode(tok.encode("1) a>b", add_special_tokens=False)) == "1) a>b"
    marker = json.loads((out / "aggbench_model.json").read_text())
    assert marker["name"] == "tiny" and marker["seed"] == 3 and marker["sft_steps"] == 5
    assert marker["probe"]["n_responses"] == 16
    assert 0.0 <= marker["sampled_accuracy"] <= 1.0
    assert [p.name for p in out.parent.iterdir()] == ["tiny"]  # no temporary directory left

    # the same request again: nothing to do
    mtime = (out / "aggbench_model.json").stat().st_mtime_ns
    again = _run(args)
    assert again.exit_code == 0 and "already prepared" in again.output
    assert (out / "aggbench_model.json").stat().st_mtime_ns == mtime

    # a different request into the same directory: refused, with the way out
    other = _run(["tiny", "--out", str(out), "--sft-steps", "5", "--seed", "4", "--quiet"])
    assert other.exit_code != 0
    assert "seed: 3 -> 4" in other.output and "--force" in other.output


def test_prepare_model_refuses_a_foreign_directory(tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_text("{}")
    result = _run(["tiny", "--out", str(out), "--sft-steps", "0", "--probe-prompts", "0", "--quiet"])
    assert result.exit_code != 0 and "aggbench_model.json" in result.output and "--force" in result.output
    forced = _run(
        ["tiny", "--out", str(out), "--sft-steps", "0", "--probe-prompts", "0", "--quiet", "--force"]
    )
    assert forced.exit_code == 0, forced.output
    assert (out / "aggbench_model.json").is_file() and (out / "tokenizer.json").is_file()


def test_prepare_model_hub_download_is_atomic(tmp_path, monkeypatch):
    import huggingface_hub

    calls = []

    def fake_download(repo_id, revision, local_dir):
        calls.append((repo_id, revision, Path(local_dir)))
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / "config.json").write_text("{}")
        assert not (tmp_path / "qwen").exists()  # nothing at the final path while downloading

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    result = _run(["Org/Model-1B", "--revision", "abc123", "--out", str(tmp_path / "qwen"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert calls[0][:2] == ("Org/Model-1B", "abc123")
    assert calls[0][2].name.startswith("qwen.tmp-")
    marker = json.loads((tmp_path / "qwen" / "aggbench_model.json").read_text())
    assert marker["name"] == "Org/Model-1B" and marker["revision"] == "abc123"

    def broken_download(repo_id, revision, local_dir):
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        (Path(local_dir) / "half.safetensors").write_text("x")
        raise ConnectionError("connection reset")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", broken_download)
    result = _run(["Org/Other", "--out", str(tmp_path / "other"), "--quiet"])
    assert result.exit_code != 0 and "unreachable" in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qwen"]  # the half download is gone


def test_prepare_model_offline_hub_error_is_actionable(tmp_path):
    # the real huggingface_hub code path, offline: no network is attempted
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "aggbench.cli",
            "prepare-model",
            "Org/Some-Model",
            "--out",
            str(tmp_path / "m"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode != 0
    assert "hub is unreachable" in proc.stderr and "hf download Org/Some-Model" in proc.stderr
    assert "aggbench prepare-model SOME_DIR" in proc.stderr
    assert not (tmp_path / "m").exists()


def test_prepare_model_copies_a_local_directory(tmp_path, untrained):
    result = _run([str(untrained), "--out", str(tmp_path / "copy"), "--quiet"])
    assert result.exit_code == 0, result.output
    model, _ = _load(tmp_path / "copy")
    assert json.loads((tmp_path / "copy" / "aggbench_model.json").read_text())["source"] == str(
        untrained.resolve()
    )
    assert model.config.hidden_size == 256


# ---------------------------------------------------------------- what the record holds


def test_prepare_model_records_the_knobs_and_old_directories_still_match(tmp_path):
    def prepare(out, *extra):
        args = [
            "prepare-model",
            "tiny",
            "--out",
            str(out),
            "--sft-steps",
            "1",
            "--probe-prompts",
            "1",
            "--quiet",
        ]
        return CliRunner().invoke(main, [*args, *extra], catch_exceptions=False)

    lab = tmp_path / "neg-high"
    assert prepare(lab, "--gap", "negative", "--spread", "high").exit_code == 0
    marker = json.loads((lab / "aggbench_model.json").read_text())
    assert marker["task"]["gap"] == "negative" and marker["task"]["spread"] == "high"
    assert marker["max_response_tokens"] == TaskConfig(gap="negative", spread="high").max_response_tokens()
    other = prepare(lab, "--gap", "negative")
    assert other.exit_code != 0 and "spread" in other.output and "--force" in other.output
    # the default task records no knobs: a directory prepared before they existed matches
    default = tmp_path / "default"
    assert prepare(default).exit_code == 0
    assert "gap" not in json.loads((default / "aggbench_model.json").read_text())["task"]
    mtime = (default / "aggbench_model.json").stat().st_mtime_ns
    assert prepare(default, "--gap", "positive", "--spread", "low").exit_code == 0  # nothing to do
    assert (default / "aggbench_model.json").stat().st_mtime_ns == mtime
    bad = CliRunner().invoke(main, ["prepare-model", "tiny", "--out", str(tmp_path / "x"), "--gap", "longer"])
    assert bad.exit_code != 0 and "'positive', 'negative'" in bad.output


def test_prepare_model_writes_records_and_guards_the_override(tmp_path):
    out = tmp_path / "m"
    res = _prepare(out, "--config-override", "max_position_embeddings=1024")
    assert res.exit_code == 0, res.output
    assert json.loads((out / "config.json").read_text())["max_position_embeddings"] == 1024
    record = json.loads((out / MARKER).read_text())
    assert record["config_overrides"] == {"max_position_embeddings": 1024}
    assert record["config_replaced"] == {"max_position_embeddings": 512}
    assert model_context(out) == 1024  # what `aggbench generate` caps budgets with
    # the same request again is a no-op; a different one (or none) is refused, naming the field
    assert _prepare(out, "--config-override", "max_position_embeddings=1024").exit_code == 0
    for extra in ([], ["--config-override", "max_position_embeddings=2048"]):
        res = _prepare(out, *extra)
        assert res.exit_code != 0 and "config_overrides" in res.output and "--force" in res.output
    # a key the config lacks would change nothing: refused with the closest real field
    res = _prepare(tmp_path / "typo", "--config-override", "max_position_embedding=1024")
    assert res.exit_code != 0
    assert "'max_position_embedding'" in res.output and "Did you mean 'max_position_embeddings'" in res.output
    assert not (tmp_path / "typo").exists()  # nothing half-prepared left behind


# ---------------------------------------------------------------- NAME that is nothing


def test_prepare_model_refuses_a_name_that_is_nothing(tmp_path):
    out = tmp_path / "m"
    clean_error(
        cli(["prepare-model", "./no_such_dir_here", "--out", out]),
        "NAME './no_such_dir_here' is not 'tiny', not an existing directory, and not a valid hub id",
    )
    assert not out.exists()


def test_prepare_model_refuses_a_local_directory_without_config_json(tmp_path):
    src = tmp_path / "notamodel"
    src.mkdir()
    (src / "readme").write_text("x")
    out = tmp_path / "m"
    clean_error(cli(["prepare-model", src, "--out", out]), "not a model directory (no config.json)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notamodel"]  # no marker, no temporary dir
