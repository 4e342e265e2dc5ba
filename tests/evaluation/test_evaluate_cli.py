"""`aggbench evaluate` end to end on the tiny model and the built-in test set, with MLflow in a
temporary SQLite store: metrics at the right step, never twice at one step."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from helpers.support import EVAL_KEYS_N4


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> str:
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def raw_history(uri: str, run_dir: Path, key: str) -> list[tuple[int, float]]:
    """Every stored value of ``key`` (not deduplicated), as (step, value)."""
    from mlflow.tracking import MlflowClient

    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    return sorted((m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key))


def evaluate(*args: str) -> None:
    result = CliRunner().invoke(
        main, ["evaluate", *args, "--limit", "4", "--n", "2", "--max-tokens", "8", "--quiet"]
    )
    assert result.exit_code == 0, result.output


def test_evaluate_end_to_end_logs_each_step_once(tiny_model, store, tmp_path):
    from mlflow.tracking import MlflowClient

    from aggbench.tracking import metric_history

    run_dir = tmp_path / "runs" / "tiny-cell"
    out0 = tmp_path / "eval" / "step_0"
    base = ["--benchmarks", "tiny_test", "--tracking-uri", store, "--workers", "1"]
    # step 0: the base model directory, evaluated like any checkpoint
    evaluate(
        "--checkpoint", str(tiny_model), "--out", str(out0), "--step", "0", "--run-dir", str(run_dir), *base
    )
    assert (out0 / "samples" / "tiny_test.jsonl").is_file() and (
        out0 / "samples" / "generation.json"
    ).is_file()
    metrics = json.loads((out0 / "tiny_test.metrics.json").read_text())
    graded = [json.loads(line) for line in (out0 / "tiny_test.jsonl").read_text().splitlines()]
    assert len(graded) == 8 and metrics["n_problems"] == 4 and metrics["n_samples"] == 2
    assert metrics["avg@2"] == pytest.approx(sum(g["correct"] for g in graded) / 8)
    summary = json.loads((out0 / "evaluation.json").read_text())
    assert summary["step"] == 0 and summary["mlflow"]["cell_id"] == "tiny-cell"
    import torch  # what the numbers were computed on (aggbench.environment)

    assert summary["environment"]["packages"]["torch"] == torch.__version__
    assert summary["environment"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    expected = {
        "eval/tiny_test/avg_at_2": metrics["avg@2"],
        "eval/tiny_test/pass_at_1": metrics["pass@1"],
        "eval/tiny_test/pass_at_2": metrics["pass@2"],
        "eval/tiny_test/maj_at_2": metrics["maj@2"],
        "eval/tiny_test/ci_low": metrics["ci_low"],
        "eval/tiny_test/ci_high": metrics["ci_high"],
        "eval/tiny_test/mean_length": metrics["mean_length"],
    }
    for key, value in expected.items():
        assert raw_history(store, run_dir, key) == [(0, pytest.approx(value))], key

    # the same step again: nothing new is stored
    evaluate(
        "--checkpoint", str(tiny_model), "--out", str(out0), "--step", "0", "--run-dir", str(run_dir), *base
    )
    for key in expected:
        assert len(raw_history(store, run_dir, key)) == 1, key
    again = json.loads((out0 / "evaluation.json").read_text())["mlflow"]
    assert again["logged"] == [] and set(again["skipped"]) >= set(expected)

    # a trained checkpoint RUN/checkpoints/step_3: run dir and cell inferred from its path
    ckpt = run_dir / "checkpoints" / "step_3"
    shutil.copytree(tiny_model, ckpt)
    evaluate("--checkpoint", str(ckpt), "--out", str(tmp_path / "eval" / "step_3"), "--step", "3", *base)
    run_id = json.loads((run_dir / "mlflow_run.json").read_text())["run_id"]
    assert sorted(metric_history(MlflowClient(store), run_id, "eval/tiny_test/avg_at_2")) == [0, 3]

    # a step that contradicts the checkpoint's own step is refused
    result = CliRunner().invoke(
        main, ["evaluate", "--checkpoint", str(ckpt), "--out", str(tmp_path / "x"), "--step", "4", *base]
    )
    assert result.exit_code == 1 and "step 3" in result.output


def test_log_eval_metrics_skips_keys_already_at_the_step(store, tmp_path):
    from mlflow.tracking import MlflowClient

    from aggbench.evaluation.mlflow import log_eval_metrics
    from aggbench.tracking import metric_history

    run_dir = tmp_path / "cell-b"
    first = {
        "avg@4": 0.25,
        "pass@1": 0.25,
        "pass@4": 0.5,
        "maj@4": 0.0,
        "metrics": ["avg@4", "pass@1", "pass@4", "maj@4"],
    }
    first |= {"ci_low": 0.1, "ci_high": 0.4, "mean_length": 12.5, "truncation_rate": 0.0, "n_problems": 8}
    res = log_eval_metrics(run_dir, "cell-b", 5, {"math500": first}, tracking_uri=store)
    assert sorted(res["logged"]) == sorted(f"eval/math500/{k}" for k in EVAL_KEYS_N4)
    # a rerun at step 5 with other values (a changed grader, say) keeps the first values; a new
    # benchmark at the same step is still logged
    second = {**first, "avg@4": 0.75}
    lcb = {"avg@1": 0.5, "pass@1": 0.5, "metrics": ["avg@1", "pass@1"], "public_tests_only": True}
    res = log_eval_metrics(
        run_dir, "cell-b", 5, {"math500": second, "livecodebench": lcb}, tracking_uri=store
    )
    assert "eval/math500/avg_at_4" in res["skipped"]
    assert sorted(res["logged"]) == ["eval/livecodebench/avg_at_1", "eval/livecodebench/pass_at_1"]
    client = MlflowClient(store)
    run_id = res["run_id"]
    # percent, as the tables print it (the metrics.json holds 0.25 and 0.5)
    assert [m.value for m in client.get_metric_history(run_id, "eval/math500/avg_at_4")] == [25.0]
    assert metric_history(client, run_id, "eval/livecodebench/pass_at_1") == {5: 50.0}
    assert client.get_run(run_id).data.tags["eval/livecodebench/notes"] == "public tests only"


def test_evaluate_without_run_dir_asks_for_one(model_cli):
    result = model_cli("evaluate", "tiny_test", "--step", "0")
    assert result.exit_code == 1 and "--run-dir" in result.output
