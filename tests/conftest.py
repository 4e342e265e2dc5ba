"""Project-wide fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest

from support import shared_data_dir


@pytest.fixture(scope="session")
def shared_data() -> Path:
    path = shared_data_dir()
    if not path.is_dir():
        pytest.fail(f"offline benchmark data not found at {path}; set AGGBENCH_SHARED_DATA")
    return path
