"""A run directory is one experiment: `aggbench train` refuses to resume it with a config that
changes training, naming the changed field, and continues when told; a resume under another
version of the run's rule is refused naming both; a bad training data file is refused by file, line
and field before a model loads. (Which changes a resume refuses: tests/test_config.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aggbench.config import load_train_config
from aggbench.config_errors import ConfigError
from helpers.trainer_support import metrics_rows, write_cell


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


def test_resume_on_other_training_records_is_refused_and_a_moved_file_is_not(
    tmp_path, tiny_sft_model, tiny_train_data
):
    """The prompt cursor a checkpoint saves is a position in the training records, so a resume on
    other records (a new datasets.X.limit, another data directory) would train prompts the seed never
    chose: refused naming both files and counts, nothing trained; the same records at a moved path
    resume (dataset.path may move); --allow-config-change continues on purpose and records since when."""
    import json

    from aggbench import layout
    from aggbench.data.training import read_training_records
    from aggbench.files import relative_to_file
    from aggbench.run_config import data_changes, data_fingerprint
    from aggbench.train.loop import train

    cell = write_cell(tmp_path / "cell.yaml", tiny_sft_model, tiny_train_data, steps=3, every=1)
    base = {"tracking.enabled": False, "device": "cpu"}
    out = tmp_path / "run"
    train(load_train_config(cell, base), out, until_step=1, quiet=True)
    first = json.loads(layout.data_record_file(out).read_text())
    digest = data_fingerprint(read_training_records(tiny_train_data))
    where = relative_to_file(tiny_train_data, layout.data_record_file(out))  # as every run file records
    assert first == {"records": [{"sha256": digest, "n_records": 256, "path": where, "since_step": 0}]}
    lines = tiny_train_data.read_text().splitlines(keepends=True)
    fewer, moved = tmp_path / "fewer.jsonl", tmp_path / "moved.jsonl"
    fewer.write_text("".join(lines[:-1]))
    moved.write_text("".join(lines))
    with pytest.raises(ConfigError) as err:
        train(load_train_config(cell, {**base, "dataset.path": str(fewer)}), out, quiet=True)
    msg = str(err.value)
    assert f"trained on 256 records of {tiny_train_data}" in msg and f"255 records of {fewer}" in msg
    assert "--allow-config-change" in msg and [r["step"] for r in metrics_rows(out)] == [1]
    train(load_train_config(cell, {**base, "dataset.path": str(moved)}), out, until_step=2, quiet=True)
    assert json.loads(layout.data_record_file(out).read_text()) == first  # same records: unchanged
    changed = load_train_config(cell, {**base, "dataset.path": str(fewer)})
    train(changed, out, quiet=True, allow_config_change=True)
    assert [r["step"] for r in metrics_rows(out)] == [1, 2, 3]
    now = json.loads(layout.data_record_file(out).read_text())["records"]
    assert now[0] == first["records"][0] and len(now) == 2  # the first set is kept
    assert (now[1]["n_records"], (out / now[1]["path"]).resolve(), now[1]["since_step"]) == (
        255,
        fewer.resolve(),
        2,
    )
    assert data_changes(out) == [f"from step 2: 255 records of {fewer} (sha256 {now[1]['sha256'][:12]})"]


def test_resume_after_a_plugin_rules_file_changed_is_refused(tmp_path, tiny_sft_model, tiny_train_data):
    """A plugin's rule is pinned by its file's sha256 in aggregation.json: an edit between two
    segments (a reviewer's case: the live file on a shared filesystem, the version unchanged) is
    refused naming both hashes and the fixes; --allow-config-change resumes on purpose."""
    import json

    import yaml

    from aggbench import layout
    from aggbench.aggregation.contract import RULES
    from aggbench.train.loop import train

    plugin = tmp_path / "pinned_rule.py"
    plugin.write_text(
        "from aggbench.aggregation import get_rule, register_rule\n\n\n"
        '@register_rule("test_pinned_rule")\n'
        "def test_pinned_rule(mask, advantages, group_ids):\n"
        '    return get_rule("token").fn(mask, advantages, group_ids)\n'
    )
    cell = write_cell(
        tmp_path / "cell.yaml", tiny_sft_model, tiny_train_data, rule="test_pinned_rule", steps=3, every=1
    )
    cell.write_text(yaml.safe_dump({**yaml.safe_load(cell.read_text()), "plugins": [str(plugin)]}))
    out = tmp_path / "run"
    try:
        cfg = load_train_config(cell, {"tracking.enabled": False, "device": "cpu"})
        train(cfg, out, until_step=1, quiet=True)
        stored = json.loads(layout.rule_file(out).read_text())
        assert stored["source_file"] == str(plugin) and len(stored["source_sha256"]) == 16
        was = stored["source_sha256"]
        plugin.write_text(plugin.read_text() + "# edited between segments\n")
        with pytest.raises(
            ConfigError, match=r"pinned_rule\.py at sha256 [0-9a-f]{16}; that plugin's file .* is now"
        ):
            train(cfg, out, quiet=True)
        assert train(cfg, out, until_step=2, quiet=True, allow_config_change=True)["end_step"] == 2
        # the edited file is pinned from then on: the next segment resumes without the flag, and
        # the record says since when the run trains it
        assert train(cfg, out, quiet=True)["end_step"] == 3
        stored = json.loads(layout.rule_file(out).read_text())
        assert stored["source_sha256"] != was and [
            c["resumed_at_step"] for c in stored["source_changes"]
        ] == [1]
        assert (
            stored["source_changes"][0]["from"] == was
            and stored["source_changes"][0]["to"] == stored["source_sha256"]
        )
    finally:
        RULES.remove("test_pinned_rule")
