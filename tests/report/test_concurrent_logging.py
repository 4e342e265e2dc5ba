"""Four jobs log to the default embedded SQLite store at once: every metric is stored exactly once.

Each job is its own process (as cluster jobs are), syncs a different cell (20 training steps of
~60 metrics, one transaction per step, then 4 evaluations x 2 benchmarks) and they start together
on a store that does not exist yet, so they also race to create and migrate it. A second round of
the same four jobs must add nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aggbench.report.ingest import Source, find_runs, verify_source
from aggbench.tracking import init_store
from helpers import report_fixtures as rf  # noqa: E402

STEPS = 20
EVAL_AT = (5, 10, 15, 20)
N_JOBS = 4


def _write_cells(results: Path) -> list[str]:
    ids = []
    for j in range(N_JOBS):
        cid = f"tiny__tiny__r{j}__s0"
        evals = {b: {s: round(0.1 * j + 0.01 * s, 4) for s in EVAL_AT} for b in rf.BENCHES}
        rf.write_run(results / "runs" / cid, j, STEPS, list(EVAL_AT), evals, rule_index=j)
        ids.append(cid)
    return ids


def _wait(sync_dir: Path, pattern: str, n: int, procs: list, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while len(list(sync_dir.glob(pattern))) < n:
        assert time.monotonic() < deadline, f"timed out waiting for {pattern}"
        if any(p.poll() is not None for p in procs):
            outs = [p.communicate() for p in procs]
            pytest.fail("a job died:\n" + "\n".join(err[-3000:] for _, err in outs))
        time.sleep(0.05)


class Jobs:
    """N_JOBS worker processes, one per cell, that sync their cell once per start signal."""

    def __init__(self, uri: str, results: Path, ids: list[str], sync_dir: Path) -> None:
        sync_dir.mkdir()
        self.sync_dir, self.ids = sync_dir, ids
        worker = str(Path(rf.__file__).resolve())
        self.procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    worker,
                    "worker",
                    uri,
                    "conc",
                    cid,
                    str(results / "runs" / cid),
                    str(sync_dir),
                    "2",
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for cid in ids
        ]
        _wait(sync_dir, "ready-*", len(ids), self.procs)  # every job has imported mlflow

    def start(self, r: int) -> None:
        (self.sync_dir / f"go-{r}").touch()
        _wait(self.sync_dir, f"done-{r}-*", len(self.ids), self.procs)

    def finish(self) -> list[list[dict]]:
        """Each job's printed results, per round."""
        outs = [p.communicate(timeout=60) for p in self.procs]
        for p, (_, err) in zip(self.procs, outs, strict=True):
            assert p.returncode == 0, err[-3000:]
        per_job = [[json.loads(line) for line in out.splitlines() if line.startswith("{")] for out, _ in outs]
        return [list(r) for r in zip(*per_job, strict=True)]

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()


@pytest.mark.slow
def test_four_jobs_log_every_metric_exactly_once(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    results = tmp_path / "results"
    ids = _write_cells(results)
    uri = f"sqlite:///{results / 'mlflow.db'}"
    assert not (results / "mlflow.db").exists()

    jobs = Jobs(uri, results, ids, tmp_path / "sync")
    try:
        jobs.start(1)
        jobs.start(2)  # the same four jobs again, together: idempotent under contention too
        first, second = jobs.finish()
    finally:
        jobs.kill()
    assert sorted(r["cell_id"] for r in first) == ids
    assert all(r["steps"] == STEPS for r in first)
    assert all(r["eval_values"] == len(EVAL_AT) * len(rf.BENCHES) * 9 for r in first)

    client = init_store(uri)
    runs, dupes = find_runs(client, "conc")
    assert sorted(runs) == ids and dupes == {}
    train_keys = set(rf.metrics_row(0, 1)) - {"step", "time"}
    assert len(train_keys) >= 55
    counts = {}
    for cid, run in runs.items():
        keys = set(run.data.metrics)
        eval_keys = {k for k in keys if k.startswith("eval/")}
        assert keys - eval_keys == train_keys | {"train/step"}
        assert len(eval_keys) == 9 * len(rf.BENCHES)
        counts[cid] = rf.raw_counts(client, run.info.run_id, keys)
        for k in train_keys | {"train/step"}:
            assert counts[cid][k] == list(range(1, STEPS + 1)), (cid, k)
        for k in eval_keys:
            assert counts[cid][k] == list(EVAL_AT), (cid, k)
        # and the values are the files' values
        src = Source(cid, results / "runs" / cid, "cell", {}, STEPS)
        assert verify_source(src, client, run) == []

    assert all(r["steps"] == 0 and r["eval_values"] == 0 for r in second)
    runs2, _ = find_runs(client, "conc")
    assert {cid: rf.raw_counts(client, r.info.run_id, r.data.metrics) for cid, r in runs2.items()} == counts
