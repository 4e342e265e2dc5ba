"""The MLflow UI opens aggbench's experiment on its runs: what the installed UI reads for that.

The landing view of MLflow 3.17's UI follows a ``workflowType`` (``genai`` opens the GenAI overview,
``machine_learning`` the runs), read from the URL's ``workflowType`` parameter, else the browser's
localStorage key ``mlflow.workflowType`` (default ``genai``); the experiment tag
``mlflow.experimentKind`` is read only where a feature flag is off (in 3.17 it is on). These tests
read the installed frontend bundle, so an MLflow upgrade that changes any of this fails them.
"""

import re
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import mlflow
import pytest

from aggbench.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, UI_QUERY, MlflowRun, ui_url

JS = Path(mlflow.__file__).parent / "server" / "js" / "build" / "static" / "js"


@pytest.fixture(scope="module")
def bundle() -> str:
    files = sorted(JS.glob("*.js"))
    assert files, f"no MLflow frontend bundle under {JS}: the UI checks below cannot be made"
    return "\n".join(f.read_text(errors="replace") for f in files)


def test_the_bundle_reads_the_workflow_type_from_the_url(bundle):
    """The URL parameter ``workflowType`` chooses the view, and ``machine_learning`` is its value."""
    key, value = UI_QUERY.split("=")
    assert f'e.MACHINE_LEARNING="{value}"' in bundle
    assert re.search(rf'\.get\("{key}"\);return \w+===\w+\.GENAI\|\|\w+===\w+\.MACHINE_LEARNING\?', bundle)
    assert 'key:"mlflow.workflowType"' in bundle  # the stored choice the URL overrides
    assert 'e.GENAI="genai"' in bundle and "initialValue:c" in bundle


def test_the_experiment_kind_tag_value_is_the_ui_enum(bundle):
    """The tag aggbench sets names the UI's own "Machine learning" kind (read where the flag is off)."""
    assert f'"{EXPERIMENT_KIND_TAG}"' in bundle
    assert f'CUSTOM_MODEL_DEVELOPMENT="{EXPERIMENT_KIND}"' in bundle


def test_the_ui_url_opens_the_experiment_on_its_runs(tmp_path):
    """``ui_url`` for the experiment aggbench creates carries the landing view and the run filter."""
    run = MlflowRun(f"sqlite:///{tmp_path / 'm.db'}", "exp", "c1", None)
    exp = run.client.get_experiment(run.experiment_id)
    assert exp.tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    url = ui_url("http://127.0.0.1:5000/", run.experiment_id, "params.aggregation = 'token'")
    fragment = urlparse(urlparse(url).fragment)
    assert fragment.path == f"/experiments/{run.experiment_id}/runs"
    query = parse_qs(fragment.query)
    assert query["workflowType"] == ["machine_learning"]
    assert query["searchFilter"] == ["params.aggregation = 'token'"]


def test_ingest_and_report_print_the_address_that_opens_the_runs(tmp_path):
    """The last line of `aggbench ingest` and of `aggbench report` is the `mlflow ui` command and the
    ui_url of the grid's own experiment (its id read from the store, not assumed)."""
    from click.testing import CliRunner

    from aggbench.cli.report import ingest_command, report_command
    from aggbench.grid import load_experiment
    from aggbench.report.ingest import tracking_uri
    from helpers import report_fixtures as rf

    config = rf.make_grid(tmp_path)
    uri = tracking_uri(load_experiment(config))
    runner = CliRunner()
    ingested = runner.invoke(ingest_command, ["--config", str(config), "--quiet"], catch_exceptions=False)
    reported = runner.invoke(
        report_command,
        ["--config", str(config), "--out", str(tmp_path / "t"), "--no-plots"],
        catch_exceptions=False,
    )
    experiment_id = mlflow.MlflowClient(tracking_uri=uri).get_experiment_by_name("synth").experiment_id
    want = f"MLflow UI: mlflow ui --backend-store-uri {uri}  then open " + ui_url(
        "http://127.0.0.1:5000", experiment_id
    )
    for res in (ingested, reported):
        assert res.exit_code == 0, res.output
        assert res.stdout.strip().splitlines()[-1] == want
    assert want.endswith(f"/#/experiments/{experiment_id}/runs?{UI_QUERY}")
