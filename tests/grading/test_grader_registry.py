"""A new grader is one registered function (aggbench.graders): a user's plugin registers it, a
benchmark YAML names it, and spec validation, record building, `score` and the training reward all
use it without any other module being edited."""

from __future__ import annotations

import json
import os

import pytest

from aggbench.data import SpecError, load_benchmark, load_benchmark_spec
from aggbench.evaluation.score import score_benchmark
from aggbench.graders import GRADERS, get_grader, grader_names
from aggbench.registry import load_plugins
from aggbench.train.rewards import RewardFn

PLUGIN = '''
from aggbench.graders import register_grader


def rewards(responses, answers, pool):
    return [float(r.endswith(str(a))) for r, a in zip(responses, answers)]


@register_grader("toy_suffix", record="answer", reward=rewards)
def toy_suffix(rows, *, workers=None, timeout_s=None, progress=False):
    """Right when the response ends with the answer."""
    out = []
    for r in rows:
        ok = r["response"].endswith(str(r["answer"]))
        out.append({"correct": ok, "extracted": r["response"][-len(str(r["answer"])):], "reason": "suffix"})
    return out
'''

BENCHMARK = """
name: toy_bench
version: 1
description: the built-in task's test split, graded by a plugin's grader
builtin: {name: tiny, split: test, seed: 0, n_train: 16, n_test: 6}
grader: {name: toy_suffix}
sampling: {n: 2, temperature: 1.0, top_p: 1.0, max_tokens: 16}
metrics: [avg@2, pass@2, maj@2]
"""


@pytest.fixture
def toy_grader(tmp_path):
    plugin = tmp_path / "toy_grader_plugin.py"
    plugin.write_text(PLUGIN)
    load_plugins([str(plugin)])
    yield get_grader("toy_suffix")
    GRADERS._entries.pop("toy_suffix", None)  # other tests see the built-ins only


def test_builtin_graders_are_registered_in_order():
    assert grader_names() == ["tiny", "math", "dapo", "code", "evalplus"]
    assert grader_names(rewards=True) == ["tiny", "math", "dapo"]
    assert get_grader("code").programs and get_grader("code").record == "tests"


def test_a_registered_grader_is_usable_from_a_benchmark_yaml(toy_grader, tmp_path):
    spec_path = tmp_path / "toy_bench.yaml"
    spec_path.write_text(BENCHMARK)
    spec = load_benchmark_spec(spec_path)
    assert spec.grader.name == "toy_suffix"
    records = load_benchmark(spec)
    assert len(records) == 6 and all("answer" in r for r in records)

    samples = tmp_path / "samples.jsonl"
    rows = []
    for i, r in enumerate(records):  # problem i: sample 0 right for even i, sample 1 always wrong
        for s in range(2):
            right = s == 0 and i % 2 == 0
            response = f"so it is {r['answer']}" if right else "no idea"
            rows.append({"id": r["id"], "sample": s, "response": response, "answer": r["answer"]})
    samples.write_text("".join(json.dumps(x) + "\n" for x in rows))
    metrics = score_benchmark(str(spec_path), samples, tmp_path / "eval.jsonl")
    assert metrics["grader"] == "toy_suffix" and metrics["grader_version"] == "1"  # register_grader's default
    assert metrics["avg@2"] == pytest.approx(3 / 12)  # 3 right samples of 12
    assert metrics["pass@2"] == pytest.approx(3 / 6)
    assert "maj@2" in metrics  # an answer grader, not programs: majority vote applies
    graded = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [g["reason"] for g in graded] == ["suffix"] * 12


def test_an_unknown_grader_is_refused_naming_the_registered_ones(toy_grader, tmp_path):
    spec_path = tmp_path / "bad.yaml"
    spec_path.write_text(BENCHMARK.replace("toy_suffix", "toy_sufix"))
    with pytest.raises(
        SpecError, match=r"grader\.name: unknown value 'toy_sufix'\. Did you mean 'toy_suffix'\?"
    ):
        load_benchmark_spec(spec_path)


def test_a_grader_with_a_reward_can_reward_training(toy_grader, tmp_path):
    from aggbench.config import DatasetConfig

    assert "toy_suffix" in grader_names(rewards=True)
    assert RewardFn("toy_suffix")(["x = 4", "x = 5"], [4, 4]) == [1.0, 0.0]
    assert DatasetConfig(path="d.jsonl", grader="toy_suffix").grader == "toy_suffix"
    with pytest.raises(ValueError, match="grader 'code' cannot reward training"):
        DatasetConfig(path="d.jsonl", grader="code")


def test_a_cell_config_names_a_plugin_grader_as_its_reward(tmp_path):
    """`aggbench train` reads the cell config with the plugins it lists already imported."""
    from aggbench.config import load_train_config

    plugin = tmp_path / "toy_reward_plugin.py"
    plugin.write_text(PLUGIN.replace("toy_suffix", "toy_reward"))
    cell = tmp_path / "cell.yaml"
    cell.write_text(
        f"plugins: [{plugin}]\nmodel: {{name: tiny, path: {tmp_path}}}\n"
        f"dataset: {{name: toy, path: {tmp_path / 'train.jsonl'}, grader: toy_reward}}\n"
    )
    try:
        assert load_train_config(cell).dataset.grader == "toy_reward"
    finally:
        GRADERS._entries.pop("toy_reward", None)


def test_grader_entries_and_pool_tasks_resolve_their_functions_alike():
    """One resolver for a grader entry's "module:function" strings and a GradingPool task's."""
    from aggbench.graders import GraderSpec, resolve_target
    from aggbench.grading.math import grade_math_item
    from aggbench.grading.pool import GradingPool

    assert resolve_target("aggbench.grading.math:grade_math_item") is grade_math_item
    assert resolve_target(len) is len
    with pytest.raises(ValueError, match="module:function"):
        GraderSpec("broken", record="answer", grade="aggbench.grading.math").grade_fn()
    with GradingPool(workers=1, timeout_s=30.0) as pool:
        [verdict] = pool.map("aggbench.grading.math:grade_math_item", [("\\boxed{2}", "2", None, None, None)])
    assert verdict.correct


def test_every_command_imports_the_plugins_the_environment_names(tmp_path):
    """The workflow's jobs run `aggbench score` / `generate` / `data fetch`, which read the benchmark
    YAML (its grader checked then) without a --plugin option: AGGBENCH_PLUGINS, which the workflow
    sets from the config's plugins, is imported before any command. A separate process: the
    registry here stays the built-ins'."""
    import subprocess
    import sys
    from pathlib import Path

    plugin = tmp_path / "toy_grader_plugin.py"
    plugin.write_text(PLUGIN)
    spec_path = tmp_path / "toy_bench.yaml"
    spec_path.write_text(BENCHMARK)
    records = load_benchmark(_spec_with_builtin_grader(tmp_path))
    rows = [
        {"id": r["id"], "sample": s, "response": f"so {r['answer']}", "answer": r["answer"]}
        for r in records
        for s in range(2)
    ]
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(x) + "\n" for x in rows))
    aggbench = str(Path(sys.executable).with_name("aggbench"))
    cmd = [aggbench, "score", "--benchmark", str(spec_path), "--samples", str(samples), "--out",
           str(tmp_path / "eval.jsonl"), "--quiet"]  # fmt: skip

    def run(plugins: str | None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "AGGBENCH_PLUGINS"}
        env |= {"AGGBENCH_PLUGINS": plugins} if plugins is not None else {}
        return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    without = run(None)
    assert without.returncode != 0 and "unknown value 'toy_suffix'" in without.stderr, without.stderr
    ok = run("toy_grader_plugin.py")  # relative to the working directory, as the config gives it
    assert ok.returncode == 0, ok.stderr
    metrics = json.loads((tmp_path / "eval.metrics.json").read_text())
    assert metrics["grader"] == "toy_suffix" and metrics["avg@2"] == 1.0
    broken = run("no_such_plugin")
    assert broken.returncode == 1 and "AGGBENCH_PLUGINS=no_such_plugin: plugin module 'no_such_plugin'" in (
        broken.stderr
    ), broken.stderr
    assert "Traceback" not in broken.stderr


def _spec_with_builtin_grader(tmp_path):
    """The toy benchmark's records (the same builtin split) read with a built-in grader."""
    path = tmp_path / "toy_bench_tiny.yaml"
    path.write_text(BENCHMARK.replace("toy_suffix", "tiny"))
    return load_benchmark_spec(path)


def test_register_grader_takes_same_answer_and_version():
    """A plugin grader can pool maj@k answers and version itself, as the built-in math grader does."""
    from aggbench.graders import GRADERS, get_grader, register_grader

    @register_grader("toy_versioned", same_answer=lambda a, b: a.lower() == b.lower(), version="3")
    def toy_versioned(rows, *, workers=None, timeout_s=None, progress=False):
        return [{"correct": True, "extracted": r["response"], "reason": "toy"} for r in rows]

    try:
        spec = get_grader("toy_versioned")
        assert spec.version == "3" and spec.same_answer_fn()("A", "a")
        assert get_grader("math").version == "2" and get_grader("tiny").version == "1"
    finally:
        GRADERS.remove("toy_versioned")
