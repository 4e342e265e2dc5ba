"""aggbench.tracking on its own: MlflowRun's params in batches, the experiment's kind tag, the
``mlflow_run.json`` marker, and tables replaced rather than appended to. Real MLflow, SQLite stores
under tmp. (The trainer's use of it: tests/train/test_mlflow_run.py and test_crash_resume.py;
ingest's: tests/report/.)"""

from __future__ import annotations

import json
import shutil

import pytest
from mlflow.entities import Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from aggbench.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, MlflowRun, log_table
from helpers import report_fixtures as rf


@pytest.fixture
def uri(tmp_path) -> str:
    """A migrated, empty SQLite store (a copy: MLflow's migrations take seconds)."""
    shutil.copy(rf.empty_store(), tmp_path / "mlflow.db")
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


# --------------------------------------------------------------------------- params and experiment


def test_more_params_than_one_batch_are_all_logged(uri, monkeypatch):
    run = MlflowRun(uri, "batches", "many", None)
    store = run.client._tracking_client.store
    # the store takes at most 100 params per log_batch (MLflow's client splits larger calls too)
    with pytest.raises(MlflowException, match="at most 100 params"):
        store.log_batch(run.run_id, metrics=[], params=[Param(f"p{i}", "v") for i in range(101)], tags=[])
    sizes = []
    real = store.log_batch

    def recording(run_id, metrics, params, tags):  # the real store, calls recorded
        sizes.append(len(params))
        return real(run_id, metrics=metrics, params=params, tags=tags)

    monkeypatch.setattr(store, "log_batch", recording)
    params = {f"section.key_{i:03d}": str(i) for i in range(250)}
    assert run.log_params(params) == 250
    assert sizes == [100, 100, 50]
    assert run.client.get_run(run.run_id).data.params == params
    assert run.log_params(params) == 0 and sizes == [100, 100, 50]  # already there: nothing sent
    assert run.param_conflicts(params) == []
    assert run.param_conflicts({**params, "section.key_007": "x"}) == ["section.key_007: '7' -> 'x'"]


def test_experiment_is_tagged_for_the_runs_view(uri):
    client = MlflowClient(tracking_uri=uri)
    MlflowRun(uri, "fresh", "a", None)
    assert client.get_experiment_by_name("fresh").tags[EXPERIMENT_KIND_TAG] == "custom_model_development"
    assert EXPERIMENT_KIND == "custom_model_development"
    old = client.create_experiment("older")  # made without the tag (an earlier aggbench, by hand)
    assert EXPERIMENT_KIND_TAG not in client.get_experiment(old).tags
    MlflowRun(uri, "older", "a", None)
    assert client.get_experiment(old).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "finetuning"})
    MlflowRun(uri, "chosen", "a", None)
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "finetuning"  # a user's choice stays


# --------------------------------------------------------------------------- the run marker


def test_a_torn_mlflow_marker_is_ignored_and_written_again_whole(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    first = MlflowRun(uri, "test", "cell-a", run_dir)
    marker = run_dir / "mlflow_run.json"
    marker.write_text('{"tracking_uri": "sqlite:///')  # what a crash mid-write left before
    again = MlflowRun(uri, "test", "cell-a", run_dir)
    assert again.run_id == first.run_id  # found by its tag
    # the store relative to the marker: a copied results directory finds its own store's run
    assert json.loads(marker.read_text()) == {"store": "../mlflow.db", "run_id": first.run_id}
    assert sorted(p.name for p in run_dir.iterdir()) == ["mlflow_run.json"]  # no temporary file


def test_the_mlflow_marker_is_never_left_torn(tmp_path):
    """A write that fails part-way (here: the file size limit, as on a full disk) leaves no marker,
    instead of a torn one."""
    import resource
    import signal

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_dir = tmp_path / "run"
    tracker = MlflowRun(uri, "test", "cell-a", run_dir)
    marker = run_dir / "mlflow_run.json"
    marker.unlink()
    found = tracker.client.search_runs([tracker.experiment_id])
    tracker.client.search_runs = lambda *a, **k: found  # no database I/O under the limit below
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20, hard))
    try:
        with pytest.raises(OSError):
            tracker._find_or_create()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)
    assert not marker.exists()
    assert list(run_dir.iterdir()) == []


# --------------------------------------------------------------------------- artifacts


def test_a_logged_table_is_replaced_where_old_artifacts_stay(tmp_path, monkeypatch):
    """A remote artifact store cannot be emptied first: logging a table again overwrites it
    (MLflow's log_table alone would append the rows to the old ones)."""
    import pandas as pd

    shutil.copy(rf.empty_store(), tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # load_table searches the default store
    run = MlflowRun(uri, "tables", "summary", None)
    first = pd.DataFrame({"row": ["a", "b"], "mean": [1.5, None]})
    log_table(run.client, run.run_id, first, "tables/t.json")
    log_table(run.client, run.run_id, pd.DataFrame({"row": ["c"], "mean": [2.0]}), "tables/t.json")
    got = run.client.load_table(run.experiment_id, "tables/t.json", [run.run_id])
    assert got["row"].tolist() == ["c"] and got["mean"].tolist() == [2.0]


# --------------------------------------------------------------------------- metrics.jsonl and SIGTERM


def test_a_torn_last_metrics_line_is_left_out_with_a_warning_that_names_it(tmp_path, caplog):
    from aggbench.tracking import MetricsLog

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.4}\n{"step": 3, "lo')
    with caplog.at_level("WARNING", logger="aggbench.tracking"):
        rows = MetricsLog(path).read()
    assert [r["step"] for r in rows] == [1, 2]
    (record,) = caplog.records
    assert f"{path}:3: the last line is torn" in record.getMessage()
    assert '\'{"step": 3, "lo\'' in record.getMessage()
    path.write_text('{"step": 1}\n{"step": 2, "lo\n{"step": 3}\n')  # not the last line: an error
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not valid JSON"):
        MetricsLog(path).read()


def test_sigterm_raises_terminated_inside_run_status_without_a_run_too():
    """Untracked training (run=None) ends on SIGTERM through the same exception, so its cleanup and
    its log line run and the exit status is 143; the handler is the previous one afterwards."""
    import os
    import signal
    import time

    from aggbench.train.run_status import Terminated, run_status

    reached = []
    before = signal.signal(signal.SIGTERM, lambda *_: reached.append("outer"))  # what old code left in place
    try:
        with pytest.raises(Terminated) as err, run_status(None, "FINISHED"):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler's exception interrupts it
        assert err.value.code == 128 + signal.SIGTERM and not reached
        assert signal.getsignal(signal.SIGTERM) is not before  # the test's handler is back in place
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
        assert reached == ["outer"]
    finally:
        signal.signal(signal.SIGTERM, before)
