"""A run directory is one experiment: resuming it with a config that changes training is refused,
naming each changed field (location, logging, checkpoint, length and memory-knob changes are
allowed); a bad
training data file is refused by file, line and field before a model loads."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aggbench.config import TrainConfig, check_resume, dump_config, load_train_config
from aggbench.config_errors import ConfigError
from helpers.trainer_support import cell_config, metrics_rows, write_cell


def _cfg(tmp_path: Path, name: str = "cell.yaml", **algorithm):
    return cell_config(tmp_path / name, tmp_path / "model", tmp_path / "data.jsonl", **algorithm)


def test_unchanged_and_mutable_changes_resume(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = _cfg(tmp_path)
    dump_config(cfg, run / "config.resolved.yaml")
    check_resume(run, cfg)  # identical
    moved = cfg.model_copy(deep=True)
    moved.model.path = "/elsewhere/model"
    moved.tracking.tracking_uri = "http://mlflow:5000"
    moved.algorithm.total_steps = 40
    moved.checkpoint.every = 7
    moved.threads = 4
    check_resume(run, moved)
    # the memory knobs a resume after an out-of-memory crash turns
    smaller = cfg.model_copy(deep=True)
    smaller.algorithm.micro_batch_size = 1
    smaller.distributed.activation_checkpointing = not cfg.distributed.activation_checkpointing
    smaller.rollout.gpu_memory_utilization = 0.3
    assert (smaller.algorithm.micro_batch_size, smaller.rollout.gpu_memory_utilization) != (
        cfg.algorithm.micro_batch_size,
        cfg.rollout.gpu_memory_utilization,
    )
    check_resume(run, smaller)


def test_changed_training_fields_are_refused_by_name(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = _cfg(tmp_path)
    dump_config(cfg, run / "config.resolved.yaml")
    changed = cfg.model_copy(deep=True)
    changed.algorithm.lr = 1e-3
    changed.aggregation.name = "token"
    with pytest.raises(ConfigError) as err:
        check_resume(run, changed)
    msg = str(err.value)
    assert "algorithm.lr: 0.0003 -> 0.001" in msg
    assert "aggregation.name: 'balanced' -> 'token'" in msg
    assert "--allow-config-change" in msg and "new --out" in msg
    changed_lines, advice = msg.split("\nFix: ")
    assert "total_steps" not in changed_lines
    assert "algorithm.micro_batch_size" in advice.split("These may change on a resume: ")[1]
    check_resume(run, changed, allow_change=True)  # deliberate continuation


def test_a_run_without_stored_config_has_nothing_to_guard(tmp_path):
    check_resume(tmp_path, _cfg(tmp_path, lr=5.0))


def _train(cell: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(out), "--quiet"]
    return subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=600)


def test_cli_refuses_a_changed_resume_and_continues_when_told(tmp_path, tiny_sft_model, tiny_train_data):
    cell = write_cell(tmp_path / "cell.yaml", tiny_sft_model, tiny_train_data, steps=2, every=1)
    out = tmp_path / "run"
    first = _train(cell, out, "--until-step", "1")
    assert first.returncode == 0, first.stderr[-2000:]
    bad = _train(cell, out, "--set", "algorithm.lr=0.01")
    assert bad.returncode != 0
    assert "algorithm.lr: 0.0003 -> 0.01" in bad.stderr, bad.stderr[-2000:]
    assert [r["step"] for r in metrics_rows(out)] == [1]  # nothing trained, nothing lost
    stored = yaml.safe_load((out / "config.resolved.yaml").read_text())
    assert stored["algorithm"]["lr"] == pytest.approx(3e-4)  # the refusal did not overwrite it
    ok = _train(cell, out, "--set", "algorithm.lr=0.01", "--allow-config-change")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert [r["step"] for r in metrics_rows(out)] == [1, 2]


def test_fields_added_since_the_run_started_count_at_their_defaults(tmp_path):
    """A run stored before a config field existed resumes when the field is at its default."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = _cfg(tmp_path)
    stored = cfg.model_dump(mode="json")
    stored.pop("distributed")
    stored["rollout"].pop("seeding")
    (run / "config.resolved.yaml").write_text(yaml.safe_dump(stored))
    check_resume(run, cfg)
    changed = cfg.model_copy(deep=True)
    changed.rollout.seeding = "prompt"
    with pytest.raises(ConfigError, match="rollout.seeding"):
        check_resume(run, changed)


@pytest.mark.parametrize(("old", "new"), [(True, "prompt"), (False, "call")])
def test_a_run_stored_with_the_old_seed_key_resumes_under_its_translation(tmp_path, old, new):
    """rollout.seed_per_prompt (0.1.0) became rollout.seeding: a stored run keeps its meaning."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = _cfg(tmp_path)
    stored = cfg.model_dump(mode="json")
    stored["rollout"].pop("seeding")
    stored["rollout"]["seed_per_prompt"] = old
    (run / "config.resolved.yaml").write_text(yaml.safe_dump(stored))
    cfg.rollout.seeding = new
    check_resume(run, cfg)
    cfg.rollout.seeding = "call" if new == "prompt" else "prompt"
    with pytest.raises(ConfigError, match="rollout.seeding"):
        check_resume(run, cfg)


def test_old_seed_key_that_contradicts_the_new_one_is_refused(tmp_path):
    data = _cfg(tmp_path).model_dump(mode="json")
    data["rollout"].pop("seeding")
    data["rollout"].update(seed_per_prompt=True, seeding="engine")
    with pytest.raises(ValueError, match="drop rollout.seed_per_prompt"):
        TrainConfig.model_validate(data)


def test_cli_names_the_bad_line_of_the_training_data_before_loading_a_model(tmp_path):
    data = tmp_path / "data.jsonl"
    data.write_text('{"id": "a", "prompt": "p", "answer": "1"}\n{"id": "b", "prompt": "q"}\n')
    # the model path does not exist: the data error must come first
    cell = write_cell(tmp_path / "cell.yaml", tmp_path / "no-model", data, steps=1, every=1)
    proc = _train(cell, tmp_path / "run")
    assert proc.returncode != 0
    assert f"{data}:2: field 'answer': missing" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def _one_step(tmp_path, tiny_sft_model, tiny_train_data, rule):
    from aggbench.train.loop import train

    cell = write_cell(tmp_path / f"{rule}.yaml", tiny_sft_model, tiny_train_data, rule=rule, steps=2, every=1)
    cfg = load_train_config(cell, {"tracking.enabled": False, "device": "cpu"})
    out = tmp_path / f"run-{rule}"
    train(cfg, out, until_step=1, quiet=True)
    return cfg, out


def test_resume_under_another_rule_version_is_refused_naming_both(tmp_path, tiny_sft_model, tiny_train_data):
    """balanced changed meaning in version 2 (variant proportional): a cell trained under version 1
    is never resumed under it."""
    import json

    from aggbench import layout
    from aggbench.train.loop import train

    cfg, out = _one_step(tmp_path, tiny_sft_model, tiny_train_data, "balanced")
    stored = json.loads(layout.rule_file(out).read_text())
    assert (stored["rule"], stored["version"], stored["variant"]) == ("balanced", "2", "proportional")
    stored["version"] = "1"
    layout.rule_file(out).write_text(json.dumps(stored))
    with pytest.raises(ConfigError, match=r"'balanced' version 1; this aggbench's 'balanced' is version 2"):
        train(cfg, out, quiet=True)
    layout.rule_file(out).unlink()  # a run from before the file existed: version 1 of every rule
    with pytest.raises(ConfigError, match="version 1"):
        train(cfg, out, quiet=True)
    # a rule whose version did not change resumes as before
    cfg_t, out_t = _one_step(tmp_path, tiny_sft_model, tiny_train_data, "token")
    layout.rule_file(out_t).unlink()
    assert train(cfg_t, out_t, quiet=True)["end_step"] == 2
