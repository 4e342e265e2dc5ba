"""The ``toy`` fixture of the holdout tests (tests/helpers/holdout_toy.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.holdout_toy import toy_rows, write_specs


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = write_specs(tmp_path, rows=toy_rows())
    monkeypatch.setenv("AGGBENCH_DATASET_DIR", str(root / "datasets"))
    monkeypatch.setenv("AGGBENCH_BENCHMARK_DIR", str(root / "benchmarks"))
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(root / "data"))
    return root
