"""`aggbench grid check` ends with OK or the problems (issue 24, item 5).

Config faults are errors (exit 1, last line NOT OK); a null tracking_uri on a cluster, benchmarks
without fetched data and models without a prepared directory are warnings, so the paper's config
passes as shipped (it is checked so in CI). Each warning disappears when its cause is fixed.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from aggbench.cli import main
from aggbench.data.fetch import fetch_benchmarks

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path, source: str, **over) -> Path:
    exp = yaml.safe_load((REPO / "configs" / source).read_text())
    exp["results_dir"] = str(tmp_path / "results")
    exp.update(over)
    path = tmp_path / source
    path.write_text(yaml.safe_dump(exp))
    return path


def _check(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, ["grid", "check", *args], env=env or {"MLFLOW_TRACKING_URI": None})


def test_the_paper_config_passes_with_the_three_warnings_a_first_cluster_run_needs(tmp_path):
    cfg = _config(tmp_path, "paper.yaml")
    res = _check("--config", str(cfg))
    assert res.exit_code == 0, res.output
    lines = res.output.strip().splitlines()
    assert lines[0] == f"{cfg}: 12 cells, 1096 jobs (1077 submitted, 19 local)"
    assert lines[-1] == f"OK: {cfg} is a valid grid (3 warnings above)"
    warnings = [line for line in lines if line.startswith("warning: ")]
    assert len(warnings) == 3
    assert "tracking_uri is null" in warnings[0] and "tracking_uri: http://LOGIN-NODE:5000" in warnings[0]
    assert f"one SQLite file, {tmp_path / 'results' / 'mlflow.db'}, on a" in warnings[0]  # its results_dir
    assert "--allowed-hosts" in warnings[0]
    assert warnings[1].startswith(
        "warning: benchmarks math500, aime24, aime25, olympiadbench, minerva, livecodebench, dapo17k_val, "
        "polaris_val, livecodebench_val:"
    )
    assert f"aggbench data fetch --config {cfg}" in warnings[1]
    assert warnings[2].startswith("warning: models qwen2.5-math-7b, qwen3-1.7b: no prepared directory")


def test_each_warning_goes_when_its_cause_is_fixed(tmp_path, shared_data):
    cfg = _config(tmp_path, "smoke.yaml", benchmarks=["aime24", "tiny_test"])
    res = _check("--config", str(cfg), "--profile", "slurm", "--format", "json")
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert got["ok"] is True and got["jobs"]["fetch_benchmarks"] == 1
    assert [w.split(" ", 1)[0] for w in got["warnings"]] == ["tracking_uri", "benchmarks", "models"]
    assert got["warnings"][1].startswith("benchmarks aime24:")  # tiny_test is built in: nothing to fetch

    # the smoke grid asks for no GPU: without --profile it is not a cluster run
    local = json.loads(_check("--config", str(cfg), "--format", "json").output)["warnings"]
    assert [w.split(" ", 1)[0] for w in local] == ["benchmarks", "models"]

    fetch_benchmarks(
        ["aime24"], tmp_path / "results/data/benchmarks", data_dir=shared_data, echo=lambda _l: None
    )
    (tmp_path / "results/models/tiny").mkdir(parents=True)
    served = _check(
        "--config", str(cfg), "--profile", "slurm", env={"MLFLOW_TRACKING_URI": "http://login:5000"}
    )
    assert served.exit_code == 0 and "\nwarning: " not in served.output, served.output
    assert served.output.strip().splitlines()[-1] == f"OK: {cfg} is a valid grid"
    with_uri = _config(
        tmp_path, "smoke.yaml", benchmarks=["aime24", "tiny_test"], tracking_uri="http://login:5000"
    )
    assert "\nwarning: " not in _check("--config", str(with_uri), "--profile", "slurm").output


def test_a_config_fault_is_an_error_and_the_last_line_says_not_ok(tmp_path):
    cfg = _config(tmp_path, "smoke.yaml", benchmarks=["math5000"])
    res = _check("--config", str(cfg))
    assert res.exit_code == 1
    lines = res.output.strip().splitlines()
    assert "benchmarks: unknown benchmark 'math5000'" in res.output and "Traceback" not in res.output
    assert lines[-1] == f"NOT OK: {cfg} has the problems above; fix them and check again"


def test_a_slurm_key_set_for_one_model_only_is_a_warning_naming_the_others(tmp_path):
    """Snakemake declares a resource for the whole rule once any job has it, so the other models'
    jobs would go without it, the profile's default-resources value included: a warning naming
    them, gone once the key is set config-wide."""
    exp = yaml.safe_load((REPO / "configs" / "paper.yaml").read_text())
    exp["models"]["qwen2.5-math-7b"]["resources"]["train"]["slurm_partition"] = "gpu"
    cfg = _config(tmp_path, "paper.yaml", models=exp["models"])
    warnings = json.loads(_check("--config", str(cfg), "--format", "json").output)["warnings"]
    [partial] = [w for w in warnings if w.startswith("resources: ")]
    assert partial.startswith(
        "resources: train.slurm_partition is set for qwen2.5-math-7b but not for qwen3-1.7b nor under "
        "resources.train: their train jobs are submitted without it"
    ), partial
    exp["resources"]["train"] = {"slurm_partition": "gpu"}
    cfg = _config(tmp_path, "paper.yaml", models=exp["models"], resources=exp["resources"])
    warnings = json.loads(_check("--config", str(cfg), "--format", "json").output)["warnings"]
    assert not [w for w in warnings if w.startswith("resources: ")], warnings
