"""aggbench.config, the cell's typed config: a cell YAML is read with `train --set` overrides and
every bad value named by field, file and fix; the resolved config is flattened to MLflow params and
dumped atomically; and a resume is checked against the stored one: a change that alters training
is refused naming each changed field, while location, logging, checkpoint, length and memory-knob
changes are allowed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from aggbench.config import TrainConfig, dump_config, load_train_config
from aggbench.config_errors import ConfigError
from aggbench.run_config import PARAM_VALUE_LIMIT, check_resume, flat_config
from helpers.trainer_support import bare_cell, cell_config, train_config, write_cell

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "configs" / "smoke.yaml"


def _cfg(tmp_path: Path, name: str = "cell.yaml", **algorithm):
    return cell_config(tmp_path / name, tmp_path / "model", tmp_path / "data.jsonl", **algorithm)


# ---------------------------------------------------------------- reading a cell config


def test_grid_config_given_to_train_points_to_grid_cell(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_train_config(SMOKE)
    msg = str(err.value)
    assert "experiment (grid) config" in msg and "aggbench grid cell --config" in msg
    assert "unknown key" not in msg


def test_config_errors_name_the_field(tmp_path):
    cell = write_cell(tmp_path / "cell.yaml", tmp_path / "model", tmp_path / "data.jsonl")
    text = cell.read_text().replace("micro_batch_size", "micro_batch_sise")
    cell.write_text(text)
    with pytest.raises(
        ConfigError, match=r"algorithm.micro_batch_sise: unknown key; allowed keys here: .*micro_batch_size"
    ):
        load_train_config(cell)
    with pytest.raises(ConfigError, match=r"algorithm.total_steps"):
        load_train_config(
            write_cell(tmp_path / "c2.yaml", tmp_path / "model", tmp_path / "data.jsonl", steps=0)
        )


def test_a_cell_or_experiment_config_that_is_not_utf8_says_where_and_the_fix(tmp_path):
    """Both are read by config_errors.read_yaml_mapping: an editor's Latin-1 save names the byte."""
    from aggbench.grid import GridError, load_experiment

    cell = write_cell(tmp_path / "cell.yaml", tmp_path / "model", tmp_path / "data.jsonl")
    cell.write_bytes(cell.read_bytes() + "# réglages\n".encode("latin-1"))
    with pytest.raises(
        ConfigError, match=r"config file .*cell.yaml: not UTF-8 text \(byte 0xe9 at byte \d+ of "
    ):
        load_train_config(cell)
    exp = tmp_path / "exp.yaml"
    exp.write_text(SMOKE.read_text(), encoding="utf-16")
    with pytest.raises(
        GridError, match=r"exp.yaml: not UTF-8 text \(byte 0xff at byte 1 .*it looks like UTF-16"
    ):
        load_experiment(exp)


def test_eval_steps_beyond_the_run_are_refused(tmp_path):
    cell = bare_cell(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_train_config(cell, {"checkpoint.eval_steps": [2, 99]})
    msg = str(err.value)
    assert "checkpoint.eval_steps: 99 not in the run's steps 1..4 (algorithm.total_steps)" in msg
    assert "(top level)" not in msg and "Value error" not in msg
    with pytest.raises(ConfigError, match="checkpoint.eval_steps: 0 not in"):
        load_train_config(cell, {"checkpoint.eval_steps": [0]})
    assert load_train_config(cell, {"checkpoint.eval_steps": [2, 4]}).checkpoint.eval_steps == [2, 4]


@pytest.mark.parametrize("value", [1.0, 1.5, -0.1])
def test_clip_low_outside_0_1_is_refused(tmp_path, value):
    with pytest.raises(ConfigError, match="algorithm.clip_low"):
        load_train_config(bare_cell(tmp_path), {"algorithm.clip_low": value})


def test_clip_low_inside_0_1_is_accepted(tmp_path):
    for value in (0.0, 0.2, 0.99):
        assert (
            load_train_config(bare_cell(tmp_path), {"algorithm.clip_low": value}).algorithm.clip_low == value
        )


def test_old_seed_key_that_contradicts_the_new_one_is_refused(tmp_path):
    data = _cfg(tmp_path).model_dump(mode="json")
    data["rollout"].pop("seeding")
    data["rollout"].update(seed_per_prompt=True, seeding="engine")
    with pytest.raises(ValueError, match="drop rollout.seed_per_prompt"):
        TrainConfig.model_validate(data)


# ---------------------------------------------------------------- MLflow params


def test_flat_config_names_values_and_limit():
    cell = {
        "model": {"path": "/models/tiny"},
        "dataset": {"path": "/data/train.jsonl"},
        "aggregation": {"name": "balanced_batch", "rule": "balanced", "params": {"scope": "batch"}},
        "tracking": {"tracking_uri": None, "experiment": "params"},
    }
    cfg = train_config(cell, {"algorithm.lr": 3e-4, "model.system_prompt": "x" * (PARAM_VALUE_LIMIT + 50)})
    flat = flat_config(cfg)
    assert flat["aggregation"] == "balanced_batch" and "aggregation.name" not in flat
    assert flat["aggregation.rule"] == "balanced" and flat["aggregation.params.scope"] == "batch"
    assert flat["algorithm.lr"] == "0.0003" and flat["sampling.temperature"] == "1.0"
    assert flat["algorithm.betas"] == "[0.9, 0.999]" and flat["model.stop_tokens"] == "[]"
    assert flat["algorithm.dual_clip"] == "null" and flat["algorithm.dynamic_sampling"] == "false"
    assert flat["algorithm.overlong.buffer"] == "0" and flat["dataset.prompt_template"] == "{prompt}"
    assert flat["model.system_prompt"] == "x" * PARAM_VALUE_LIMIT
    assert all(isinstance(v, str) for v in flat.values()) and list(flat) == sorted(flat)


# ---------------------------------------------------------------- the stored resolved config


def test_dump_config_is_atomic(tmp_path, monkeypatch):
    cfg = load_train_config(bare_cell(tmp_path))
    target = tmp_path / "config.resolved.yaml"
    target.write_text("old: content\n")

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", crash)  # the write fails before the file is complete
    with pytest.raises(OSError):
        dump_config(cfg, target)
    assert target.read_text() == "old: content\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".config")] == []
    monkeypatch.undo()
    dump_config(cfg, target)
    assert yaml.safe_load(target.read_text())["model"]["name"] == "tiny"


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("algorithm: {lr: [0.1\n", "not valid YAML"),
        ("- 1\n", "not a mapping"),
        ("", "empty"),
        (b"\xff\xfe", "UnicodeDecodeError"),
    ],
)
def test_unreadable_stored_config_is_a_config_error(tmp_path, text, cause):
    cfg = load_train_config(bare_cell(tmp_path))
    run = tmp_path / "run"
    run.mkdir()
    stored = run / "config.resolved.yaml"
    if isinstance(text, bytes):
        stored.write_bytes(text)
    else:
        stored.write_text(text)
    with pytest.raises(ConfigError) as err:
        check_resume(run, cfg)
    msg = str(err.value)
    assert f"{stored} is unreadable ({cause}" in msg
    assert "--allow-config-change" in msg and "delete that file" in msg and "new --out" in msg
    check_resume(run, cfg, allow_change=True)


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


def test_resume_data_check_reads_what_was_recorded(tmp_path, caplog):
    """run_config.check_resume_data against data.json: no record (a run from before it existed) or a
    torn one is not a refusal, and record_data writes it again, saying that nothing recorded the
    steps before; the same records pass; others are refused unless allowed, and then kept beside
    the first set (run_config.data_changes, which the report flags)."""
    from aggbench import layout
    from aggbench.run_config import check_resume_data, data_changes, data_history, record_data

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"id": str(i), "prompt": f"p{i}", "answer": str(i)} for i in range(4)]
    check_resume_data(run, "a.jsonl", rows)  # nothing recorded
    layout.data_record_file(run).write_text('{"reco')
    check_resume_data(run, "a.jsonl", rows)  # torn: not a record
    with caplog.at_level("WARNING", logger="aggbench.run_config"):
        record_data(run, "a.jsonl", rows, 3)
    assert "records what this run trained on before step 3" in caplog.text
    assert [h["since_step"] for h in data_history(run)] == [3]
    check_resume_data(run, "b.jsonl", [dict(r) for r in rows])  # equal records elsewhere
    with pytest.raises(ConfigError, match=r"trained on 4 records of a\.jsonl .* 3 records of a\.jsonl"):
        check_resume_data(run, "a.jsonl", rows[:3])
    with pytest.raises(ConfigError, match="move the cell's run directory away"):
        record_data(run, "a.jsonl", rows[::-1], 5)  # the order is what the cursor indexes
    assert data_changes(run) == []
    record_data(run, "c.jsonl", rows[:3], 5, allow_change=True)
    assert [(h["path"], h["since_step"]) for h in data_history(run)] == [("a.jsonl", 3), ("c.jsonl", 5)]
    assert data_changes(run)[0].startswith("from step 5: 3 records of c.jsonl (sha256 ")
    record_data(run, "d.jsonl", rows[:2], 0)  # trained again from the start: one set
    assert [(h["path"], h["since_step"]) for h in data_history(run)] == [("d.jsonl", 0)]
    assert data_changes(run) == []


def test_a_flat_data_record_is_read_as_a_one_set_history(tmp_path):
    """data.json written as one flat record (before the history was kept) still guards a resume."""
    from aggbench import layout
    from aggbench.run_config import check_resume_data, data_fingerprint, data_history

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"id": "1", "prompt": "p", "answer": "1"}]
    flat = {"sha256": data_fingerprint(rows), "n_records": 1, "path": "a.jsonl", "since_step": 0}
    layout.data_record_file(run).write_text(json.dumps(flat))
    assert data_history(run) == [flat]
    with pytest.raises(ConfigError, match=r"trained on 1 records of a\.jsonl"):
        check_resume_data(run, "a.jsonl", rows + rows)
