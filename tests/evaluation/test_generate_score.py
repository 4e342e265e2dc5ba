"""`aggbench generate` and `aggbench score`: files, sampling settings, model loaded once, metrics
checked against hand-computed values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from helpers.jsonl import read_jsonl, write_jsonl


@pytest.fixture
def data_env(monkeypatch, shared_data):
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(shared_data))
    return shared_data


GEN_ARGS = ["--benchmarks", "tiny_test,math500", "--limit", "3", "--n", "2", "--max-tokens", "8"]


def check_generation(out: Path, shared_data: Path) -> dict[str, list[dict]]:
    """The two files are complete and well-formed; returns their rows."""
    from aggbench.data.benchmarks import load_benchmark

    assert sorted(p.name for p in out.iterdir()) == ["generation.json", "math500.jsonl", "tiny_test.jsonl"]
    info = json.loads((out / "generation.json").read_text())
    assert info["model_loads"] == 1
    rows = {}
    for name in ("tiny_test", "math500"):
        records = load_benchmark(name, data_dir=shared_data, limit=3)
        got = read_jsonl(out / f"{name}.jsonl")
        assert [(r["id"], r["sample"]) for r in got] == [(rec["id"], j) for rec in records for j in (0, 1)]
        by_id = {rec["id"]: rec for rec in records}
        for r in got:
            rec = by_id[r["id"]]
            assert r["benchmark"] == name
            assert r["answer"] == rec["answer"]
            assert 1 <= r["length"] <= 8
            assert r["finish_reason"] in ("stop", "length")
            if r["finish_reason"] == "length":  # truncated at --max-tokens
                assert r["length"] == 8
            assert isinstance(r["response"], str)
            # The tiny model's chat template, written out by hand: one user turn + the assistant header.
            user = (
                rec["prompt"]
                if name == "tiny_test"
                else rec["prompt"]
                + "\nPlease reason step by step, and put your final answer within \\boxed{}."
            )
            assert r["prompt"] == f"<|bos|><|user|>{user}<|eos|><|assistant|>"
        meta = info["benchmarks"][name]
        assert meta["n_problems"] == 3 and meta["n_samples"] == 2
        assert meta["generated_tokens"] == sum(r["length"] for r in got)
        rows[name] = got
    # YAML sampling, with the command line's --n and --max-tokens on top
    assert info["benchmarks"]["tiny_test"]["sampling"] == {
        "n": 2,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "max_tokens": 8,
    }
    assert info["benchmarks"]["math500"]["sampling"] == {
        "n": 2,
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 0,
        "max_tokens": 8,
    }
    return rows


def test_generate_two_benchmarks_loads_the_model_once(tiny_model, data_env, tmp_path, monkeypatch):
    import transformers

    calls = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def counting(*args, **kwargs):
        calls.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", counting)
    out = tmp_path / "samples"
    result = CliRunner().invoke(
        main, ["generate", "--checkpoint", str(tiny_model), *GEN_ARGS, "--out", str(out), "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert len(calls) == 1
    check_generation(out, data_env)


def test_generate_in_a_subprocess_is_reproducible(tiny_model, data_env, tmp_path):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        if name == "a":  # the real command line, in its own process
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "aggbench.cli",
                    "generate",
                    "--checkpoint",
                    str(tiny_model),
                    *GEN_ARGS,
                    "--out",
                    str(out),
                ],
                capture_output=True,
                text=True,
                env={**os.environ, "AGGBENCH_DATA_DIR": str(data_env), "OMP_NUM_THREADS": "1"},
                timeout=300,
            )
            assert proc.returncode == 0, proc.stderr
            assert proc.stderr.count("loading model from") == 1
        else:
            result = CliRunner().invoke(
                main, ["generate", "--checkpoint", str(tiny_model), *GEN_ARGS, "--out", str(out), "--quiet"]
            )
            assert result.exit_code == 0, result.output
        outs.append(check_generation(out, data_env))
    # same checkpoint, same seed: the same samples, in another process
    for name in ("tiny_test", "math500"):
        assert [r["response"] for r in outs[0][name]] == [r["response"] for r in outs[1][name]]


def test_temperature_zero_is_greedy_and_copies_the_decode(tiny_model, data_env, tmp_path):
    from aggbench.evaluation.generate import generate_benchmarks
    from aggbench.evaluation.options import GenerateOptions

    opts = GenerateOptions(limit=2, n=3, temperature=0.0, max_tokens=6, progress=False)
    info = generate_benchmarks(tiny_model, ["tiny_test"], tmp_path, opts)
    rows = read_jsonl(tmp_path / "tiny_test.jsonl")
    assert info["benchmarks"]["tiny_test"]["decoding"] == "greedy"
    for p in range(2):
        assert len({r["response"] for r in rows[3 * p : 3 * p + 3]}) == 1
    again = GenerateOptions(limit=2, n=1, temperature=0.0, max_tokens=6, seed=99, progress=False)
    generate_benchmarks(tiny_model, ["tiny_test"], tmp_path / "again", again)
    responses = [r["response"] for r in read_jsonl(tmp_path / "again" / "tiny_test.jsonl")]
    assert responses == [rows[0]["response"], rows[3]["response"]]  # greedy: the seed plays no part


def test_generate_bad_benchmark_fails_before_loading(model_cli, monkeypatch):
    import transformers

    monkeypatch.setattr(
        transformers.AutoModelForCausalLM,
        "from_pretrained",
        lambda *a, **k: pytest.fail("the model must not be loaded"),
    )
    result = model_cli("generate", "tiny_test,nope")
    assert result.exit_code == 1
    assert "nope" in result.output


def test_vllm_engine_names_the_gpu_extra(model_cli):
    try:
        import vllm  # noqa: F401

        pytest.skip("vLLM is installed here")
    except ImportError:
        pass
    result = model_cli("generate", "tiny_test", "--engine", "vllm")
    assert result.exit_code == 1
    assert "gpu" in result.output and "aggbench[gpu]" in result.output


# --------------------------------------------------------------------------- score


def math_samples(shared_data: Path) -> list[dict]:
    """4 MATH-500 problems x 3 samples. Per problem (R = right, W = wrong answer):
    P1 R W R, P2 W(1) W(1) R, P3 W(1) W(2) R, P4 W W W."""
    from aggbench.data.benchmarks import load_benchmark

    recs = load_benchmark("math500", data_dir=shared_data, limit=4)
    plan = [["R", "1", "R"], ["1", "1", "R"], ["1", "2", "R"], ["7", "7", "7"]]
    rows = []
    for rec, answers in zip(recs, plan, strict=True):
        for j, a in enumerate(answers):
            text = rec["answer"] if a == "R" else a
            rows.append(
                {
                    "benchmark": "math500",
                    "id": rec["id"],
                    "sample": j,
                    "prompt": "p",
                    "response": f"Some work... so the answer is $\\boxed{{{text}}}$.",
                    "length": 10 * (len(rows) + 1),
                    "finish_reason": "length" if len(rows) == 5 else "stop",
                    "answer": rec["answer"],
                }
            )
    return rows


def test_score_math_metrics_by_hand(data_env, tmp_path):
    samples = write_jsonl(tmp_path / "math500.jsonl", math_samples(data_env))
    out = tmp_path / "eval" / "math500.jsonl"
    result = CliRunner().invoke(
        main,
        ["score", "--benchmark", "math500", "--samples", str(samples), "--out", str(out), "--workers", "2"],
    )
    assert result.exit_code == 0, result.output
    graded = read_jsonl(out)
    assert [g["correct"] for g in graded] == [True, False, True, False, False, True, False, False, True] + [
        False
    ] * 3
    assert [g["extracted"] for g in graded[3:5]] == ["1", "1"]
    assert graded[4]["reason"] == "not_equivalent"
    m = json.loads((tmp_path / "eval" / "math500.metrics.json").read_text())
    assert m["grader"] == "math" and m["grader_version"] == "2"  # 2: Answer: lines after a box, maj@k pooling
    # per-problem correct counts c = 2, 1, 1, 0 out of n = 3
    assert m["n_problems"] == 4 and m["n_samples"] == 3 and m["n_responses"] == 12
    assert m["metrics"] == ["avg@3", "pass@1", "pass@3", "maj@3"]  # the YAML's @4 metrics need n >= 4
    assert m["avg@3"] == pytest.approx(4 / 12)
    assert m["pass@1"] == pytest.approx(4 / 12)
    assert m["pass@3"] == pytest.approx(3 / 4)
    # majority: P1 the right answer (2 of 3); P2 "1" (2 of 3, wrong); P3 a three-way tie, the first
    # sample ("1", wrong) wins; P4 "7" (wrong)
    assert m["maj@3"] == pytest.approx(1 / 4)
    assert m["mean_length"] == pytest.approx(sum(10 * k for k in range(1, 13)) / 12)
    assert m["truncation_rate"] == pytest.approx(1 / 12)
    assert 0.0 <= m["ci_low"] <= m["avg@3"] <= m["ci_high"] <= 2 / 3  # per-problem scores lie in [0, 2/3]
    assert m["ci_low"] < m["ci_high"]


def test_pass_at_k_of_spec_metrics_by_hand(data_env):
    from aggbench.evaluation.score import compute_metrics

    rows = math_samples(data_env)
    correct = [True, False, True, False, False, True, False, False, True, False, False, False]
    graded = [
        {**r, "correct": c, "extracted": "x" if c else "y", "reason": ""}
        for r, c in zip(rows, correct, strict=True)
    ]
    m = compute_metrics(graded, grader="math", spec_metrics=["pass@2", "avg@2", "pass@4"])
    # pass@2 = 1 - C(n-c, 2) / C(3, 2): P1 (c=2) 1, P2 and P3 (c=1) 1 - 1/3, P4 0
    assert m["pass@2"] == pytest.approx((1 + 2 / 3 + 2 / 3 + 0) / 4)
    # avg@2 uses the first two samples: P1 1/2, P2 0, P3 0, P4 0
    assert m["avg@2"] == pytest.approx(1 / 8)
    assert "pass@4" not in m  # k > n


def test_majority_vote_takes_a_judged_verdict():
    from aggbench.evaluation.score import compute_metrics

    rows = [
        {"id": "p", "sample": 0, "correct": False, "extracted": "5", "reason": "timeout"},
        {"id": "p", "sample": 1, "correct": True, "extracted": "5", "reason": "equivalent"},
        {"id": "p", "sample": 2, "correct": False, "extracted": "6", "reason": "not_equivalent"},
    ]
    m = compute_metrics(rows, grader="math")
    assert m["maj@3"] == 1.0 and m["avg@3"] == pytest.approx(1 / 3)
    assert m["not_judged"] == 1  # the time-out: the harness, not the grader, decided it


def test_majority_vote_pools_equivalent_math_answers():
    """maj@k pools the answers the math grader calls one answer (math-verify, as grading compares a
    response with its gold): "1/2", "0.5" and "\\frac{1}{2}" outvote "3" twice; graders without
    ``same_answer`` (tiny) pool identical strings only; a timed-out sample pools by its string only."""
    from aggbench.evaluation.score import compute_metrics
    from aggbench.grading.math import same_answer

    assert same_answer("0.5", "\\frac{1}{2}") and same_answer("1/2", "0.5") and same_answer("025", "25")
    assert same_answer("x+1", "1+x") and not same_answer("3", "\\frac{1}{2}") and not same_answer("2", "-2")

    def rows(answers, reasons=None):
        reasons = reasons or ["equivalent" if a != "3" else "not_equivalent" for a in answers]
        return [
            {"id": "p", "sample": j, "extracted": a, "correct": a != "3", "reason": r}
            for j, (a, r) in enumerate(zip(answers, reasons, strict=True))
        ]

    answers = ["3", "\\frac{1}{2}", "0.5", "3", "1/2"]
    assert compute_metrics(rows(answers), grader="math")["maj@5"] == 1.0  # 3 pooled vs "3" twice
    assert compute_metrics(rows(answers), grader="tiny")["maj@5"] == 0.0  # as written: "3" wins
    # the time-out's "0.5" stays apart: "3" x2 ties "1/2" + "\\frac{1}{2}" x2, and "3" came first
    timed_out = ["3", "3", "0.5", "1/2", "\\frac{1}{2}"]
    reasons = ["not_equivalent", "not_equivalent", "timeout", "equivalent", "equivalent"]
    assert compute_metrics(rows(timed_out, reasons), grader="math")["maj@5"] == 0.0
    assert compute_metrics(rows(timed_out), grader="math")["maj@5"] == 1.0  # judged: it pools


def test_counts_and_lengths_say_which_responses_they_are_over():
    """An empty answer does not win the vote; the harness's failures are counted (a program's own
    time-out is not one); lengths and truncation are over the responses that were generated."""
    from aggbench.evaluation.score import compute_metrics

    def row(pid, j, extracted, correct, reason, length, finish):
        return {"id": pid, "sample": j, "correct": correct, "extracted": extracted, "reason": reason,
                "length": length, "finish_reason": finish}  # fmt: skip

    rows = [
        row("a", 0, "", False, "empty_answer", 100, "stop"),
        row("a", 1, "", False, "empty_answer", 100, "length"),
        row("a", 2, "7", True, "equivalent", 100, "stop"),
        row("b", 0, None, False, "prompt_too_long", 0, "prompt_too_long"),
        row("b", 1, None, False, "prompt_too_long", 0, "prompt_too_long"),
        row("b", 2, None, False, "prompt_too_long", 0, "prompt_too_long"),
        row("c", 0, "1", False, "worker_crashed", 50, "stop"),
        row("c", 1, "1", False, "error: ValueError: x", 50, "stop"),
        row("c", 2, "2", False, "timeout: test 3/10 failed", 50, "stop"),  # the program's own time-out
        row("d", 0, "x", False, "sandbox_error: test 1/4 failed (the runner ended early)", 10, "stop"),
        row("d", 1, "x", False, "sandbox_error: the run ended before every test ran", 10, "stop"),
        row("d", 2, "y", False, "runtime_error: test 2/4 failed", 10, "stop"),  # the program's own error
    ]
    m = compute_metrics(rows, grader="math")
    assert m["maj@3"] == pytest.approx(1 / 4)  # a: "7" wins over two empty answers
    # c's crash and error, d's two sandbox failures (the sandbox, not the program, ended the run)
    assert m["not_generated"] == 3 and m["not_judged"] == 4
    assert m["mean_length"] == pytest.approx(480 / 9)  # the nine generated responses, not over twelve
    assert m["truncation_rate"] == pytest.approx(1 / 9)


def test_score_uses_each_records_tolerance_and_unit(data_env, tmp_path):
    from aggbench.data.benchmarks import load_benchmark

    rec = next(r for r in load_benchmark("olympiadbench", data_dir=data_env) if r["id"] == "2592")
    assert rec["grading"]["error"] == "1e-1" and rec["grading"]["unit"] == "%"  # gold 4.2, unit %
    rows = [
        {
            "id": rec["id"],
            "sample": j,
            "response": f"\\boxed{{{a}}}",
            "answer": rec["answer"],
            "grading": rec["grading"],
        }
        for j, a in enumerate(["4.25\\%", "4.4", "4.2"])
    ]
    samples = write_jsonl(tmp_path / "s.jsonl", rows)
    result = CliRunner().invoke(
        main,
        [
            "score",
            "--benchmark",
            "olympiadbench",
            "--samples",
            str(samples),
            "--out",
            str(tmp_path / "e.jsonl"),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    graded = read_jsonl(tmp_path / "e.jsonl")
    assert [g["correct"] for g in graded] == [True, False, True]
    assert graded[0]["reason"] == "within_tolerance"  # 0.05 from 4.2 with the unit stripped


LCB_RIGHT = """```python
n = int(input())
a = list(map(int, input().split()))
print(a.index(sorted(a)[-2]) + 1)
```"""
LCB_WRONG = "```python\nprint(1)\n```"


def test_score_code_on_livecodebench_problem_0(data_env, tmp_path):
    from aggbench.data.benchmarks import load_benchmark

    rec = load_benchmark("livecodebench", data_dir=data_env, limit=1)[0]
    assert rec["id"] == "abc365_b"  # "which element is the second largest?", stdin tests
    rows = [
        {
            "benchmark": "livecodebench",
            "id": rec["id"],
            "sample": j,
            "response": f"Here:\n{resp}",
            "length": 30,
            "finish_reason": "stop",
            "tests": rec["tests"],
            "func_name": rec["func_name"],
            "starter_code": rec["starter_code"],
            "public_tests_only": rec["public_tests_only"],
        }
        for j, resp in enumerate([LCB_RIGHT, LCB_WRONG])
    ]
    samples = write_jsonl(tmp_path / "lcb.jsonl", rows)
    out = tmp_path / "lcb_eval.jsonl"
    result = CliRunner().invoke(
        main, ["score", "--benchmark", "livecodebench", "--samples", str(samples), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "public tests only" in result.output
    right, wrong = read_jsonl(out)
    assert right["correct"] and right["error_kind"] is None
    assert [t["passed"] for t in right["test_results"]] == [True] * len(rec["tests"])
    assert not wrong["correct"] and wrong["error_kind"] == "wrong_answer"
    assert wrong["test_results"][0]["passed"] is False  # expected 3, got 1
    assert "tests" not in right and right["n_tests"] == len(rec["tests"])
    m = json.loads((tmp_path / "lcb_eval.metrics.json").read_text())
    assert m["metrics"] == ["avg@2", "pass@1", "pass@2"]  # no maj@k for code
    assert (m["avg@2"], m["pass@1"], m["pass@2"]) == (0.5, 0.5, 1.0)
    assert m["public_tests_only"] is True and m["notes"] == ["public tests only"]


def test_score_rejects_a_line_without_answer(tmp_path):
    samples = write_jsonl(
        tmp_path / "s.jsonl",
        [{"id": "a", "sample": 0, "response": "x", "answer": "1"}, {"id": "b", "sample": 0, "response": "x"}],
    )
    result = CliRunner().invoke(
        main,
        ["score", "--benchmark", "math500", "--samples", str(samples), "--out", str(tmp_path / "o.jsonl")],
    )
    assert result.exit_code == 1
    assert "s.jsonl:2: field 'answer' is missing" in result.output
    assert not (tmp_path / "o.jsonl").exists()
