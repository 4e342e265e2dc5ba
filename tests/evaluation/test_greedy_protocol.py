"""The greedy n=1 evaluation protocol (issue 28, item 4(b); Qwen2.5-Math's protocol beside avg@k).

``--greedy`` makes the generate job decode every problem once at temperature 0 with the model it has
already loaded; the greedy rows must be exactly what a separate ``--n 1 --temperature 0`` run gives,
and the sampled rows exactly what a run without ``--greedy`` gives (the second protocol perturbs
nothing). Scored and logged, its accuracy is the MLflow metric ``eval/{benchmark}/greedy_at_1``.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest

from aggbench.evaluation.generate import generate_benchmarks
from aggbench.evaluation.options import GenerateOptions, greedy_options, workflow_args
from helpers.jsonl import read_jsonl

BENCHES = ["tiny_test", "math500"]
FIELDS = ("id", "sample", "prompt", "response", "length", "finish_reason", "answer")


@pytest.fixture
def options(shared_data):
    return GenerateOptions(limit=3, n=2, max_tokens=8, data_dir=str(shared_data), progress=False)


def _rows(path):
    return [{k: r.get(k) for k in FIELDS} for r in read_jsonl(path)]


def test_greedy_rows_equal_a_separate_greedy_run_and_leave_the_sampled_rows_alone(
    tiny_model, tmp_path, options
):
    both = generate_benchmarks(tiny_model, BENCHES, tmp_path / "both", replace(options, greedy=True))
    generate_benchmarks(tiny_model, BENCHES, tmp_path / "sampled", options)
    generate_benchmarks(tiny_model, BENCHES, tmp_path / "greedy", replace(options, n=1, temperature=0.0))

    assert both["model_loads"] == 1  # one load for both protocols
    assert both["greedy"]["dir"] == "greedy"
    for bench in BENCHES:
        sampled = _rows(tmp_path / "both" / f"{bench}.jsonl")
        assert sampled == _rows(tmp_path / "sampled" / f"{bench}.jsonl")
        assert len(sampled) == 3 * 2
        greedy = _rows(tmp_path / "both" / "greedy" / f"{bench}.jsonl")
        assert greedy == _rows(tmp_path / "greedy" / f"{bench}.jsonl")
        assert [(r["sample"]) for r in greedy] == [0, 0, 0]  # one decode per problem
        meta = both["greedy"]["benchmarks"][bench]
        assert meta["n_samples"] == 1 and meta["decoding"] == "greedy"
        assert meta["sampling"]["temperature"] == 0.0
        # the same prompts and budgets as the sampled protocol: only the decoding differs
        assert meta["prompt"] == both["benchmarks"][bench]["prompt"]
        assert meta["sampling"]["max_tokens"] == both["benchmarks"][bench]["sampling"]["max_tokens"]
    # a run without --greedy writes no greedy folder and no greedy section
    assert not (tmp_path / "sampled" / "greedy").exists()
    assert "greedy" not in json.loads((tmp_path / "sampled" / "generation.json").read_text())


def test_greedy_options_change_only_the_decoding():
    base = GenerateOptions(n=16, temperature=0.6, top_p=0.95, top_k=20, max_tokens=512, greedy=True)
    g = greedy_options(base)
    assert (g.n, g.temperature, g.top_p, g.top_k, g.greedy) == (1, 0.0, None, None, False)
    assert replace(g, n=16, temperature=0.6, top_p=0.95, top_k=20, greedy=True) == base


def test_the_generate_rules_pass_greedy_only_when_the_config_asks():
    evaluation = {"engine": "hf", "batch_size": 64, "greedy": False}
    model = {"evaluation_sampling": {"temperature": 0.7, "top_p": 0.8, "top_k": 20}}
    off = workflow_args(evaluation, model, 0)
    assert "--greedy" not in off and "--no-greedy" not in off  # the command line as before the option
    on = workflow_args({**evaluation, "greedy": True}, model, 0)
    assert on == [*off, "--greedy"]


def test_evaluate_logs_greedy_at_1_beside_avg_at_n(tiny_model, tmp_path, options, monkeypatch):
    from aggbench.evaluation.evaluate import evaluate_checkpoint
    from aggbench.tracking import metric_history
    from helpers.report_fixtures import empty_store

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    store = tmp_path / "mlflow.db"
    shutil.copy(empty_store(), store)
    uri = f"sqlite:///{store}"
    run_dir = tmp_path / "runs" / "cell"
    run_dir.mkdir(parents=True)
    result = evaluate_checkpoint(
        tiny_model,
        BENCHES,
        tmp_path / "eval",
        0,
        options=replace(options, greedy=True),
        run_dir=run_dir,
        cell_id="cell",
        tracking_uri=uri,
    )
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    run_id = result["mlflow"]["run_id"]
    for bench in BENCHES:
        greedy = json.loads((tmp_path / "eval" / "greedy" / f"{bench}.metrics.json").read_text())
        sampled = json.loads((tmp_path / "eval" / f"{bench}.metrics.json").read_text())
        assert greedy["n_samples"] == 1 and sampled["n_samples"] == 2
        # by hand from the graded greedy rows: the fraction correct, one row per problem
        graded = read_jsonl(tmp_path / "eval" / "greedy" / f"{bench}.jsonl")
        assert len(graded) == 3
        assert greedy["avg@1"] == pytest.approx(sum(bool(r["correct"]) for r in graded) / 3)
        assert metric_history(client, run_id, f"eval/{bench}/greedy_at_1") == {
            0: pytest.approx(100 * greedy["avg@1"])
        }
        assert metric_history(client, run_id, f"eval/{bench}/avg_at_2") == {
            0: pytest.approx(100 * sampled["avg@2"])
        }
        assert metric_history(client, run_id, f"eval/{bench}/greedy_mean_length") == {
            0: pytest.approx(greedy["mean_length"])
        }


def test_score_grades_the_greedy_samples_in_the_same_process(tiny_model, tmp_path, options):
    from click.testing import CliRunner

    from aggbench.cli import main

    gen = tmp_path / "gen"
    generate_benchmarks(tiny_model, ["tiny_test"], gen, replace(options, greedy=True))
    out, g_out = tmp_path / "eval" / "tiny_test.jsonl", tmp_path / "eval" / "greedy" / "tiny_test.jsonl"
    args = ["score", "--benchmark", "tiny_test", "--samples", str(gen / "tiny_test.jsonl"), "--out", str(out)]
    res = CliRunner().invoke(
        main, [*args, "--greedy-samples", str(gen / "greedy" / "tiny_test.jsonl"), "--greedy-out", str(g_out)]
    )
    assert res.exit_code == 0, res.output
    sampled = json.loads(out.with_name("tiny_test.metrics.json").read_text())
    greedy = json.loads(g_out.with_name("tiny_test.metrics.json").read_text())
    assert (sampled["n_samples"], greedy["n_samples"]) == (2, 1)
    assert greedy["n_responses"] == 3 and len(read_jsonl(g_out)) == 3
    # the one without the other is refused before anything is graded
    res = CliRunner().invoke(main, [*args[:-1], str(tmp_path / "x.jsonl"), "--greedy-out", str(g_out)])
    assert res.exit_code != 0 and "--greedy-samples and --greedy-out together" in res.output
    assert not (tmp_path / "x.jsonl").exists()
