"""The fetch_benchmarks rule keeps its lock across reruns: Snakemake deletes a job's outputs before
it runs it again, so without ``update()`` every rerun (a benchmark added to the grid changes the
rule's params) fetched everything anew and locked whatever it read, and a changed copy of an
already-locked benchmark went through unchecked. With it, the rerun checks each fetched file
against the lock it recorded first."""

from __future__ import annotations

import json
import os

import pytest

pytestmark = pytest.mark.timeout(600)


def test_a_rerun_checks_the_fetched_files_against_the_kept_lock(wf, tmp_path, shared_data):
    results = tmp_path / "results"
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "AGGBENCH_DATA_DIR": str(shared_data)}
    lock = results / "data" / "benchmarks" / "lock.json"

    def fetch(benchmarks: list[str], check: bool = True):
        config = wf.small_config(tmp_path / "grid.yaml", results, {"benchmarks": benchmarks})
        args = ["-s", str(wf.SNAKEFILE), str(lock), "--cores", "1", "--configfile", str(config)]
        return wf.run(args, cwd=work, env=env, check=check)

    fetch(["tiny_test", "aime24"])
    first = json.loads(lock.read_text())
    assert "aime24" in json.dumps(first), first
    [copy] = [p for p in (results / "data" / "benchmarks").rglob("*aime24*") if p.is_file()]
    copy.write_text(copy.read_text().replace("Find", "Fnd", 1))  # the fetched copy changed since

    proc = fetch(["tiny_test", "aime24", "aime25"], check=False)  # the rule's params changed: a rerun
    out = proc.stdout + proc.stderr
    log = (results / "logs" / "fetch_benchmarks.log").read_text()
    assert proc.returncode != 0, out
    assert "aime24" in log and "sha256" in log, log  # refused against the lock, naming it
    assert lock.is_file() and json.loads(lock.read_text()) == first  # the lock kept, unchanged
