"""Bad input to ``aggbench train`` fails with one line naming the file, line or field and the fix,
before a model loads (and, where it can be checked up front, before the run directory exists):
the training dataset (missing, empty, a bad row), model.path (missing, not a model, empty weights),
an unknown aggregation rule; a damaged checkpoint of the run being resumed is named with its
fix, never torch's EOFError (which click reads as Ctrl-D: a bare 'Aborted!'); rollouts and the
MLflow marker are written atomically."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aggbench.data.jsonl import DataError
from aggbench.modeldir import ModelDirError
from aggbench.registry import RegistryError
from aggbench.train.loop import train
from helpers.trainer_support import cell_config, write_cell

GOOD = '{"id": "a", "prompt": "p", "answer": "1"}\n'


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """An untrained tiny model (about a second): these tests never need one that learns."""
    from helpers.tiny_models import tiny_model_for_tests

    return tiny_model_for_tests(tmp_path_factory.mktemp("tiny-model"))


def _cfg(tmp_path: Path, model: Path, data: Path, **overrides):
    over = {"tracking.enabled": False, **overrides}
    return cell_config(tmp_path / "cell.yaml", model, data, steps=2, every=1, overrides=over)


def _cli(cell: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(out), "--quiet"]
    return subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=300)


# ---------------------------------------------------------------- D3: the training dataset


def test_a_missing_dataset_is_named_before_the_model_and_no_run_directory_is_made(tmp_path):
    data = tmp_path / "nodata.jsonl"
    out = tmp_path / "run"
    with pytest.raises(DataError) as err:
        train(_cfg(tmp_path, tmp_path / "no-model", data), out)  # the data error comes first
    msg = str(err.value)
    assert msg.startswith(f"{data}: does not exist (dataset.path)")
    assert f"aggbench prepare-data tiny --out {data}" in msg
    assert not out.exists()


def test_an_empty_dataset_is_refused_before_the_model_loads(tmp_path):
    data = tmp_path / "empty.jsonl"
    data.write_text("\n")
    out = tmp_path / "run"
    with pytest.raises(DataError, match=r"empty\.jsonl: no records") as err:
        train(_cfg(tmp_path, tmp_path / "no-model", data), out)
    assert "prepare-data" in str(err.value)
    assert not out.exists()


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ('{"id": "b", "prompt": 3, "answer": "1"}', "field 'prompt': expected a string, got int 3"),
        ('{"id": "b", "prompt": null, "answer": "1"}', "field 'prompt': is null"),
        ('{"id": "b", "prompt": "  ", "answer": "1"}', "field 'prompt': is empty"),
        ('{"id": "b", "prompt": "q"}', "field 'answer': missing"),
        ('{"id": "b", "prompt": "q", "answer": null}', "field 'answer': is null"),
        ('{"id": "b", "prompt": "q", "answer": {"x": 1}}', "field 'answer': expected a string or a list"),
        ('{"id": "b", "prompt": "q", "answer": []}', "field 'answer': is an empty list"),
        ('{"id": "b", "prompt": "q", "answer": ["1", 2]}', "field 'answer': expected a list of non-empty"),
    ],
    ids=["prompt-int", "prompt-null", "prompt-blank", "answer-missing", "answer-null", "answer-dict",
         "answer-empty-list", "answer-list-int"],
)  # fmt: skip
def test_a_bad_row_is_named_by_file_line_and_field_before_the_model_loads(tmp_path, row, expected):
    data = tmp_path / "data.jsonl"
    data.write_text(GOOD + row + "\n")
    with pytest.raises(DataError) as err:
        train(_cfg(tmp_path, tmp_path / "no-model", data), tmp_path / "run")
    assert str(err.value).startswith(f"{data}:2: {expected}"), str(err.value)
    assert not (tmp_path / "run").exists()


def test_list_answers_and_ids_of_any_kind_are_accepted(tmp_path):
    from aggbench.data.training import read_training_records

    data = tmp_path / "data.jsonl"
    data.write_text(GOOD + '{"id": 7, "prompt": "q", "answer": ["1", "one"]}\n')
    assert [r["answer"] for r in read_training_records(data)] == ["1", ["1", "one"]]


def test_cli_names_a_missing_dataset_without_a_traceback(tmp_path):
    data = tmp_path / "nodata.jsonl"
    cell = write_cell(tmp_path / "cell.yaml", tmp_path / "no-model", data, steps=1, every=1)
    proc = _cli(cell, tmp_path / "run")
    assert proc.returncode == 1
    assert f"Error: {data}: does not exist (dataset.path)" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# ---------------------------------------------------------------- D4: model.path


def test_a_missing_model_path_is_named_before_the_run_directory_exists(tmp_path, tiny_train_data):
    model, out = tmp_path / "nomodel", tmp_path / "run"
    with pytest.raises(ModelDirError) as err:
        train(_cfg(tmp_path, model, tiny_train_data), out)
    assert str(err.value).startswith(f"model.path {model} does not exist; run `aggbench prepare-model")
    assert not out.exists()


def test_a_directory_without_config_is_not_a_model(tmp_path, tiny_train_data):
    model = tmp_path / "emptymodel"
    model.mkdir()
    with pytest.raises(ModelDirError, match=r"is not a model directory \(no config\.json\)"):
        train(_cfg(tmp_path, model, tiny_train_data), tmp_path / "run")


@pytest.mark.parametrize("size", [0, 5000], ids=["empty", "truncated"])
def test_a_cut_weights_file_in_model_path_is_named(tmp_path, tiny_model, tiny_train_data, size):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    with open(model / "model.safetensors", "r+b") as fh:
        fh.truncate(size)
    with pytest.raises(ModelDirError) as err:
        train(_cfg(tmp_path, model, tiny_train_data), tmp_path / "run")
    assert str(err.value).startswith(f"model.path {model}: model.safetensors is unreadable (")
    assert not (tmp_path / "run").exists()


def test_a_model_path_that_does_not_load_is_one_error_naming_it(tmp_path, tiny_model, tiny_train_data):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "tokenizer.json").write_text('{"version": ')  # cut short
    with pytest.raises(ModelDirError, match=f"cannot load model.path {model}"):
        train(_cfg(tmp_path, model, tiny_train_data), tmp_path / "run")


# ---------------------------------------------------------------- minor: nothing left behind


def test_an_unknown_rule_fails_before_the_run_directory_is_made(tmp_path, tiny_model, tiny_train_data):
    out = tmp_path / "run"
    cfg = _cfg(tmp_path, tiny_model, tiny_train_data, **{"aggregation.name": "nosuch"})
    with pytest.raises(RegistryError, match="nosuch"):
        train(cfg, out)
    assert not out.exists()  # not a directory holding only .lock


def test_a_failed_call_leaves_an_existing_run_directory_as_it_was(tmp_path, tiny_model, tiny_train_data):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    cfg = _cfg(tmp_path, tiny_model, tiny_train_data, **{"aggregation.name": "nosuch"})
    with pytest.raises(RegistryError):
        train(cfg, out)
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]


# ---------------------------------------------------------------- D15: atomic writes


def test_rollouts_are_written_whole_or_not_at_all(tmp_path):
    from aggbench.train.step_log import save_rollouts

    path = tmp_path / "rollouts" / "step_1.jsonl"
    path.parent.mkdir()
    path.write_text('{"old": 1}\n')
    rows = [{"group": 0, "x": 1}, {"group": 1, "x": object()}]  # the second row fails mid-write
    with pytest.raises(TypeError):
        save_rollouts(tmp_path, 1, rows, 4)
    assert path.read_text() == '{"old": 1}\n'
    assert [p.name for p in path.parent.iterdir()] == ["step_1.jsonl"]  # no temporary file left
    save_rollouts(tmp_path, 1, [{"group": 0, "x": 1}], 4)
    assert json.loads(path.read_text()) == {"group": 0, "x": 1}
