"""The smoke DAG's run that tests/workflow shares (conftest.py's session fixture ``smoke_run``)."""

from __future__ import annotations

import pytest

SMOKE_TIMEOUT_S = 40 * 60  # a hang, not a slow machine (benchmarks/smoke_dag.py measures the time)
# pyproject's 600 s per-test timeout would cut the shared run short: the modules that use it mark
# themselves with this (the fixture's run has its own timeout)
SMOKE_MARKS = [pytest.mark.slow, pytest.mark.timeout(SMOKE_TIMEOUT_S + 300)]
