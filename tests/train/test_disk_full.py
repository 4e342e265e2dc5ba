"""Training into a full disk (issue 26, item 4): one line naming the file being written and the step a
rerun resumes from, no partial checkpoint left on the full disk, the failure in the run files, the
MLflow run FAILED; after space is freed the rerun resumes from the last checkpoint and finishes.

Two ways: a real 45 MB tmpfs (mounted where this process may: root, as in CI) with `aggbench train`
as a user runs it, and, everywhere, the checkpoint's ``torch.save`` patched to raise ENOSPC.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from aggbench import layout
from aggbench.train import checkpoint
from aggbench.train.loop import train
from helpers.trainer_support import train_config, write_cell


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    from helpers.tiny_models import tiny_model_for_tests

    return tiny_model_for_tests(tmp_path_factory.mktemp("disk-full-model"))


def _status(uri: str, cell: str) -> str:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("test")
    (run,) = client.search_runs([exp.experiment_id], f"tags.`aggbench.cell_id` = '{cell}'")
    return run.info.status


def _no_partials(run: Path) -> None:
    root = layout.checkpoints_root(run)
    assert not [d.name for d in root.iterdir() if ".tmp-" in d.name] if root.is_dir() else True


def test_a_full_disk_while_checkpointing_is_one_line_and_a_failed_run(
    tmp_path, model, tiny_train_data, monkeypatch
):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cell = write_cell(tmp_path / "cell.yaml", model, tiny_train_data, steps=4, every=2, tracking_uri=uri)
    run = tmp_path / "run"
    real_save = checkpoint.torch.save

    def full_at_step_4(obj, path, *args, **kwargs):
        if "step_4.tmp-" in str(path):
            Path(path).write_bytes(b"partial")  # what a full disk leaves: a part of the file
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", full_at_step_4)
    cfg = train_config(cell)
    with pytest.raises(checkpoint.DiskFullError) as err:
        train(cfg, run, quiet=True)
    message = str(err.value)
    assert message.startswith("no space left on device while writing ") and "\n" not in message
    assert "step_4.tmp-" in message and message.endswith(
        "trainer_state.pt; free space and rerun: training resumes from step 2"
    )
    _no_partials(run)
    assert layout.complete_steps(run) == [2]  # the previous checkpoint is intact
    assert json.loads(layout.failure_file(run).read_text())["resumes_from"] == 2
    assert _status(uri, cfg.resolved_cell_id) == "FAILED"

    monkeypatch.setattr(checkpoint.torch, "save", real_save)  # space freed
    assert train(cfg, run, quiet=True)["start_step"] == 2
    assert not layout.failure_file(run).exists()
    assert _status(uri, cfg.resolved_cell_id) == "FINISHED"


@pytest.fixture
def small_disk(tmp_path):
    """A 45 MB tmpfs: room for the model and one checkpoint (~32 MB with the optimizer state), not two."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=45m", "tmpfs", str(mnt)], check=True, capture_output=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here ({exc}); the patched-write test above covers the code path")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True)


def test_training_into_a_real_full_filesystem(small_disk, model, tiny_train_data, tmp_path):
    uri = f"sqlite:///{small_disk / 'mlflow.db'}"
    cell = write_cell(tmp_path / "cell.yaml", model, tiny_train_data, steps=6, every=2, tracking_uri=uri)
    run = small_disk / "run"
    cmd = [sys.executable, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(run), "--quiet"]
    env = {k: v for k, v in os.environ.items() if k != "AGGBENCH_FAULT"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert errors[0].startswith("Error: no space left on device while writing "), errors[0]
    resumes = layout.complete_steps(run)[-1] if layout.complete_steps(run) else 0
    assert errors[0].endswith(f"; free space and rerun: training resumes from step {resumes}"), errors[0]
    _no_partials(run)
    assert _status(uri, "tiny__tiny__balanced__s0") == "FAILED"
    subprocess.run(["mount", "-o", "remount,size=400m", str(small_disk)], check=True)  # space freed
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"steps {resumes} -> 6" in again.stdout
    assert _status(uri, "tiny__tiny__balanced__s0") == "FINISHED"
