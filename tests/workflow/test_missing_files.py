"""Issue 26, item 5: a missing file makes the DAG redo exactly what is missing, and a retrain stays
segment by segment.

Each test works on a copy of the session's smoke run (conftest.py's ``smoke_run``), deletes what a
user on a cluster deletes, and asks Snakemake what it would do (and, where the redo is short, does
it). Before: "Nothing to be done" for each of the three deletions, while the tables still described
the deleted files; and a targeted marker retrained steps 0 -> 12 in ONE segment.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from aggbench import layout
from helpers.smoke_dag import SMOKE_MARKS

pytestmark = SMOKE_MARKS

CELL = "tiny__tiny__token__s0"
TIME_KEYS = ("time", "time/", "tokens_per_s")  # wall-clock fields: the only ones a rerun may change


@pytest.fixture
def copy(smoke_run, tmp_path) -> Path:
    """A copy of the smoke results (the shared run itself is never changed)."""
    results, _, _ = smoke_run
    out = tmp_path / "results"
    shutil.copytree(results, out, symlinks=True)
    return out


def _dry(wf, results: Path) -> tuple[dict[str, int], list[dict], str]:
    proc = wf.run(["-n", "--config", f"results_dir={results}"])
    text = proc.stdout + proc.stderr
    return wf.job_counts(text), wf.jobs(text), text


def _snapshot(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_a_deleted_store_is_rebuilt_from_the_run_files_by_the_report_alone(wf, smoke_run, copy):
    results, _, _ = smoke_run
    (copy / "mlflow.db").unlink()
    counts, _, text = _dry(wf, copy)
    assert counts == {"report": 1, "all": 1}, text[-3000:]
    assert "Missing output files: " in text and "mlflow.db" in text
    original = _snapshot(results)
    wf.run(["--cores", "2", "--config", f"results_dir={copy}"])
    # the copy's experiment.yaml names the original results_dir: the report still wrote only the copy
    assert _snapshot(results) == original
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{copy / 'mlflow.db'}")
    (exp,) = [e for e in client.search_experiments() if e.name == "smoke"]
    (run,) = client.search_runs([exp.experiment_id], f"tags.`aggbench.cell_id` = '{CELL}'")
    history = client.get_metric_history(run.info.run_id, "loss/pg")
    assert sorted(m.step for m in history) == list(range(1, 13))
    assert run.info.status == "FINISHED"
    counts, _, text = _dry(wf, copy)
    assert "Nothing to be done" in text, text[-2000:]


def test_a_report_that_misses_a_declared_table_fails_and_keeps_the_store(wf, copy, tmp_path):
    """A table the rule declares but the report does not write fails the report job in its command,
    and the store survives. Provoked as it happened on lab v2 (issue 27's note): the config asks for
    evaluation.extra_seeds, so the rule declares tables/variance.*, while experiment.yaml (which
    `aggbench report` reads) predates it: the copy has no .snakemake metadata, so Snakemake does not
    rewrite it. Before the check, the report exited 0, Snakemake raised MissingOutputException and
    deleted every output, the update()-declared MLflow store included."""
    store = copy / "mlflow.db"
    before = hashlib.sha256(store.read_bytes()).hexdigest()
    config = wf.write_config(
        tmp_path / "extra.yaml", {"results_dir": str(copy), "evaluation": {"extra_seeds": [1]}}
    )
    proc = wf.run(["--cores", "2", "--configfile", str(config)], check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Error in rule report" in text, text[-3000:]
    assert "MissingOutputException" not in text, text[-3000:]
    log = (copy / "logs" / "report.log").read_text()
    assert (
        "aggbench report did not write " in log
        and "variance.md" in log
        and "--forcerun experiment_config" in log
    )
    assert store.is_file() and hashlib.sha256(store.read_bytes()).hexdigest() == before


def test_a_deleted_evaluation_is_graded_again_and_nothing_else(wf, copy):
    shutil.rmtree(layout.eval_dir(layout.run_dir(copy, CELL), 8))
    counts, jobs, text = _dry(wf, copy)
    assert counts == {"grade": 1, "report": 1, "all": 1}, text[-3000:]
    (grade,) = [j for j in jobs if j["rule"] == "grade"]
    assert grade["wildcards"] == {"cell": CELL, "step": "8", "bench": "tiny_test"}


def test_a_deleted_segment_is_retrained_segment_by_segment_with_the_same_values(wf, smoke_run, copy):
    """Segment 12's marker and checkpoint deleted (as the unreadable-checkpoint error advises): the
    trainer restarts from step 0 (retention kept trainer state in step 12 only), so segments 4 and 8
    are trained again too, each in its own job, then 12; on CPU the values equal the first attempt's."""
    results, _, _ = smoke_run
    run = layout.run_dir(copy, CELL)
    layout.segment_marker(run, 12).unlink()
    shutil.rmtree(layout.checkpoint_dir(run, 12))
    counts, jobs, text = _dry(wf, copy)
    train = [j["wildcards"] for j in jobs if j["rule"] == "train"]
    assert sorted(int(w["step"]) for w in train) == [4, 8, 12] and {w["cell"] for w in train} == {CELL}
    assert counts == {"restart": 1, "train": 3, "generate": 3, "grade": 3, "report": 1, "all": 1}, text[
        -3000:
    ]
    # do the retrain (the segments only: the evaluations are the ones just counted)
    wf.run(["--cores", "2", str(layout.segment_marker(run, 12)), "--config", f"results_dir={copy}"])
    logs = {s: (copy / "logs" / "train" / CELL / f"step_{s}.log").read_text() for s in (4, 8, 12)}
    for start, end in ((0, 4), (4, 8), (8, 12)):
        assert f"{CELL}: steps {start} -> {end}" in logs[end], logs[end][-1500:]
    assert layout.restart_stamps(run) == [(1, 0)]

    def values(path: Path) -> list[dict]:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in rows]

    before = values(layout.metrics_file(layout.run_dir(results, CELL)))
    assert values(layout.metrics_file(run)) == before and len(before) == 12
    # each marker records the checkpoint its segment left (COMPLETE: every file's sha256), so an
    # evaluation reruns when, and only when, the checkpoint changed (Snakemake skips a newer input
    # whose checksum it recorded: an empty marker hid a retrained checkpoint from it)
    for step in (4, 8, 12):
        complete = (layout.checkpoint_dir(run, step) / layout.COMPLETE).read_text()
        assert layout.segment_marker(run, step).read_text() == complete and '"sha256"' in complete
    # the retrained segments do not run again (the stamp stays their input, older than their markers)
    counts, _, text = _dry(wf, copy)
    assert not {"restart", "train"} & set(counts), text[-3000:]
