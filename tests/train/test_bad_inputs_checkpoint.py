"""A damaged file in the checkpoint being resumed (empty, truncated or overwritten trainer state,
model weights or FSDP shards) is one error naming the file and the fix: delete that step_N (and
resume from an earlier checkpoint, or start again) or train into a new --out. torch's EOFError for
an empty file never reaches click, which reads it as Ctrl-D and prints only 'Aborted!'. (A torn
MLflow marker, ``mlflow_run.json``: tests/test_tracking.py.)"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from aggbench.config import load_train_config
from aggbench.layout import COMPLETE, STATE_FILE, checkpoint_dir
from aggbench.train import parallel
from aggbench.train.checkpoint import SHARDED_DIR, CheckpointError, check_readable, reading
from aggbench.train.loop import train
from helpers.trainer_support import train_config, write_cell


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_train_data) -> tuple[Path, Path]:
    """(cell YAML, run directory) of a 2-step cell trained to its step-1 checkpoint."""
    from helpers.tiny_models import tiny_model_for_tests

    root = tmp_path_factory.mktemp("trained")
    model = tiny_model_for_tests(root)
    cell = write_cell(root / "cell.yaml", model, tiny_train_data, steps=2, every=1)
    run = root / "run"
    train(_cfg(cell), run, until_step=1, quiet=True)
    assert (checkpoint_dir(run, 1) / STATE_FILE).is_file()
    return cell, run


def _cfg(cell: Path):
    return train_config(cell, {"tracking.enabled": False})


def _damage(path: Path, how: str) -> None:
    if how == "empty":
        path.write_bytes(b"")
    elif how == "truncated":
        with open(path, "r+b") as fh:
            fh.truncate(path.stat().st_size // 2)
    elif (
        how == "inside"
    ):  # 4 KB in the middle, every bit flipped: the header and the zip directory still read
        with open(path, "r+b") as fh:
            fh.seek(path.stat().st_size // 2)
            block = fh.read(4096)
            fh.seek(path.stat().st_size // 2)
            fh.write(bytes(b ^ 0xFF for b in block))
    else:  # overwritten at the start
        with open(path, "r+b") as fh:
            fh.write(b"x" * 64)


@pytest.mark.parametrize(
    ("name", "how"),
    [
        (STATE_FILE, "empty"),
        (STATE_FILE, "truncated"),
        (STATE_FILE, "overwritten"),
        ("model.safetensors", "empty"),
        ("model.safetensors", "truncated"),
        ("model.safetensors", "overwritten"),
        ("model.safetensors", "inside"),  # caught only by the checksum (was: trained on wrong weights)
        (STATE_FILE, "inside"),
    ],
)
def test_a_damaged_checkpoint_file_is_named_with_the_fix(tmp_path, trained, name, how):
    cell, src = trained
    run = tmp_path / "run"
    shutil.copytree(src, run)
    step_dir = checkpoint_dir(run, 1)
    _damage(step_dir / name, how)
    with pytest.raises(CheckpointError) as err:
        train(_cfg(cell), run, quiet=True)
    msg = str(err.value)
    assert msg.startswith(f"{step_dir / name} is unreadable ("), msg
    assert msg.endswith(f"; delete {step_dir} to start again from step 0, or train into a new --out")
    assert json.loads((run / "metrics.jsonl").read_text().splitlines()[0])["step"] == 1  # nothing lost


def test_the_checkpoint_records_every_files_sha256_and_evaluation_verifies_it(tmp_path, trained):
    from aggbench.evaluation.generate import require_checkpoint
    from aggbench.files import sha256_file
    from aggbench.modeldir import ModelDirError

    _, src = trained
    run = tmp_path / "run"
    shutil.copytree(src, run)
    step_dir = checkpoint_dir(run, 1)
    recorded = json.loads((step_dir / COMPLETE).read_text())
    files = sorted(f.relative_to(step_dir).as_posix() for f in step_dir.rglob("*") if f.is_file())
    assert recorded["step"] == 1 and sorted(recorded["sha256"]) == [f for f in files if f != COMPLETE]
    assert recorded["sha256"][STATE_FILE] == sha256_file(step_dir / STATE_FILE)
    assert require_checkpoint(step_dir) == step_dir.resolve()  # intact
    (step_dir / STATE_FILE).unlink()  # what retention removes from older steps: allowed
    require_checkpoint(step_dir)
    _damage(step_dir / "model.safetensors", "inside")
    with pytest.raises(ModelDirError) as err:
        require_checkpoint(step_dir)
    msg = str(err.value)
    assert msg.startswith(
        f"--checkpoint {step_dir.resolve()}: model.safetensors changed since the checkpoint was written"
    )
    assert "damaged on disk or in a copy; give a save_pretrained model directory" in msg
    (step_dir / "tokenizer.json").unlink()
    shutil.copy(src / "checkpoints/step_1/model.safetensors", step_dir / "model.safetensors")
    with pytest.raises(
        ModelDirError, match="tokenizer.json missing .it was there when the checkpoint was written"
    ):
        require_checkpoint(step_dir)


def test_a_resume_needs_model_path_only_for_the_kl_reference(tmp_path, trained):
    from aggbench.modeldir import ModelDirError

    cell, src = trained
    run = tmp_path / "run"
    shutil.copytree(src, run)
    gone = tmp_path / "moved-model"
    kl = load_train_config(
        cell, {"tracking.enabled": False, "model.path": str(gone), "algorithm.kl_coef": 0.1}
    )
    with pytest.raises(
        ModelDirError, match=f"^model.path {gone} does not exist; run `aggbench prepare-model"
    ):
        train(kl, run, quiet=True, allow_config_change=True)
    moved = load_train_config(cell, {"tracking.enabled": False, "model.path": str(gone)})
    assert train(moved, run, quiet=True)["end_step"] == 2  # the policy comes from step_1


def test_the_trainer_state_is_read_through_the_error_translation(tmp_path):
    """Past the cheap checks (a file damaged inside its zip), torch's own error is translated too:
    an empty pickle's EOFError must not escape (click would print only 'Aborted!')."""
    run = tmp_path / "run"
    d = checkpoint_dir(run, 3)
    d.mkdir(parents=True)
    (d / STATE_FILE).write_bytes(b"")
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    with pytest.raises(
        CheckpointError, match=r"trainer_state\.pt is unreadable \(EOFError: Ran out of input\)"
    ):
        parallel.Ranks().load(run, 3, model, optimizer)


def test_the_fix_names_an_earlier_resumable_checkpoint(tmp_path):
    from safetensors.torch import save_file

    run = tmp_path / "run"
    for step in (1, 2):
        d = checkpoint_dir(run, step)
        d.mkdir(parents=True)
        (d / COMPLETE).write_text(f"{step}\n")
        save_file({"w": torch.zeros(3)}, str(d / "model.safetensors"))
        torch.save({"step": step}, d / STATE_FILE)
    check_readable(run, 2)  # intact
    (checkpoint_dir(run, 2) / STATE_FILE).write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"delete .*step_2 to resume from step 1, or train into a new"):
        check_readable(run, 2)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_damaged_fsdp_shards_are_named(tmp_path):
    """The sharded path (torch.distributed.checkpoint, one process here): an empty .metadata is
    caught by the cheap checks, a truncated shard by the translation of dcp.load's error."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file

    run = tmp_path / "run"
    d = checkpoint_dir(run, 1)
    d.mkdir(parents=True)
    save_file({"w": torch.zeros(3)}, str(d / "model.safetensors"))
    torch.save({"step": 1}, d / STATE_FILE)
    dcp.save({"w": torch.ones(4)}, checkpoint_id=d / SHARDED_DIR)
    check_readable(run, 1)
    (shard,) = (d / SHARDED_DIR).glob("*.distcp")
    _damage(shard, "truncated")
    with (
        pytest.raises(CheckpointError, match=r"sharded is unreadable \(RuntimeError: PytorchStreamReader"),
        reading(run, 1, d / SHARDED_DIR),
    ):
        dcp.load({"w": torch.zeros(4)}, checkpoint_id=d / SHARDED_DIR)
    (d / SHARDED_DIR / ".metadata").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"\.metadata is unreadable \(empty file\)"):
        check_readable(run, 1)


def test_errors_that_are_not_about_the_file_pass_through(tmp_path):
    for exc in (torch.OutOfMemoryError("CUDA out of memory"), KeyboardInterrupt(), TypeError("bug")):
        with pytest.raises(type(exc)), reading(tmp_path, 1, tmp_path / STATE_FILE):
            raise exc


def test_cli_names_an_empty_trainer_state_instead_of_aborted(tmp_path, trained):
    cell, src = trained
    run = tmp_path / "run"
    shutil.copytree(src, run)
    state = checkpoint_dir(run, 1) / STATE_FILE
    state.write_bytes(b"")
    cmd = [sys.executable, "-m", "aggbench.cli", "train", "--config", str(cell), "--out", str(run), "--quiet"]
    proc = subprocess.run(
        [*cmd, "--set", "tracking.enabled=false"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1
    assert "Aborted!" not in proc.stderr
    assert f"Error: {state} is unreadable (empty file); delete" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_resume_shares_the_checkpoint_hashing_between_ranks(tmp_path, trained, monkeypatch):
    """Each rank hashes every world-th file of step_N and rank 0's gathered verdict goes to all:
    rank 1 of 2 reads only its half for the checksums (every rank read every shard before: ~1 TB
    per 7B segment by a reviewer's count), its later check before loading hashes nothing, and a
    mismatch another rank found raises here too."""
    from aggbench import modeldir
    from aggbench.train.checkpoint import verify_checksums
    from aggbench.train.parallel import Ranks

    _, src = trained
    run = tmp_path / "run"
    shutil.copytree(src, run)
    step_dir = checkpoint_dir(run, 1)
    recorded = sorted(json.loads((step_dir / COMPLETE).read_text())["sha256"])
    hashed: list[str] = []
    real = modeldir.sha256_file
    monkeypatch.setattr(modeldir, "sha256_file", lambda p: hashed.append(Path(p).name) or real(p))

    class SecondOfTwo(Ranks):  # the collectives as rank 1 of 2 sees them, rank 0's verdict given
        def __init__(self, verdict):
            self.rank, self.world, self.verdict, self.sent = 1, 2, verdict, []

        def gather_to_main(self, obj):
            self.sent.append(obj)
            return None

        def broadcast(self, obj):
            return self.verdict

    rank1 = SecondOfTwo(None)
    verify_checksums(run, 1, rank1)
    check_readable(run, 1)  # opening()'s check on this rank: verified already
    assert sorted(hashed) == sorted(Path(r).name for r in recorded[1::2]) and rank1.sent == [None]
    hashed.clear()
    _damage(step_dir / "model.safetensors", "inside")  # (its mtime changes: the cache no longer holds)
    bad = (step_dir / "model.safetensors", "changed since the checkpoint was written")
    with pytest.raises(CheckpointError, match=r"model\.safetensors is unreadable \(changed since"):
        verify_checksums(run, 1, SecondOfTwo(bad))
    with pytest.raises(CheckpointError, match=r"model\.safetensors is unreadable \(changed since"):
        verify_checksums(run, 1, Ranks())  # one process hashes every file
    assert "model.safetensors" in hashed
