"""Project-wide fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.support import shared_data_dir


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not path.is_dir():
        pytest.fail(f"offline benchmark data not found at {path}; set AGGBENCH_SHARED_DATA")
    return path


@pytest.fixture(scope="session")
def tiny_sft_model(tmp_path_factory) -> Path:
    """A briefly warm-started tiny model (answers in the task's format, so GRPO groups have reward
    variance), built once per test session."""
    from helpers.tiny_models import tiny_model_for_tests

    return tiny_model_for_tests(tmp_path_factory.mktemp("tiny-sft"), sft_steps=40, batch_size=32)


@pytest.fixture(scope="session")
def tiny_train_data(tmp_path_factory) -> Path:
    """The built-in task's train split as canonical JSONL."""
    import json

    from aggbench.tiny.task import make_task

    train, _ = make_task(0, 256, 16)
    path = tmp_path_factory.mktemp("tiny-data") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in train))
    return path
