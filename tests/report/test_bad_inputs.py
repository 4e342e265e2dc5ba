"""`aggbench report --metric` with a name the tables cannot hold is refused, listing the valid
forms, before the config or MLflow is read."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from aggbench.cli.report import report_command
from aggbench.report.collect import check_metric_name


@pytest.mark.parametrize("metric", ["foo@3", "avg@0", "pass@", "avg@N", "pass@k", "avg", "maj@1.5", " avg@n"])
def test_report_refuses_an_unknown_metric_before_any_work(tmp_path, monkeypatch, metric):
    import aggbench.grid

    monkeypatch.setattr(aggbench.grid, "load_experiment", lambda *a, **k: pytest.fail("config was read"))
    config = tmp_path / "grid.yaml"
    config.write_text("experiment: x\n")
    result = CliRunner().invoke(report_command, ["--config", str(config), "--metric", metric])
    assert result.exit_code == 2, result.output
    assert f"unknown metric {metric!r}; use avg@n, maj@n or pass@n" in result.output
    assert "pass@K with a number K (e.g. pass@1)" in result.output
    assert not (tmp_path / "tables").exists()


@pytest.mark.parametrize("metric", ["avg@n", "maj@n", "pass@n", "pass@1", "avg@4", "maj@16"])
def test_the_valid_forms_pass(metric):
    assert check_metric_name(metric) == metric


def test_collect_refuses_an_unknown_metric():
    from aggbench.report.collect import collect

    with pytest.raises(ValueError, match="unknown metric 'foo@3'"):
        collect({"benchmarks": ["tiny_test"], "experiment": "x"}, client=None, metric="foo@3")
