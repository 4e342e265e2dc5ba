"""HumanEval+/MBPP+ (EvalPlus) as optional benchmarks: loading through evalplus, grading in the sandbox.

The data here is SYNTHETIC: a few HumanEval-style problems in the evalplus schema, written by the
tests and loaded through evalplus's own loader via HUMANEVAL_OVERRIDE_PATH (no network here). The
expected outputs come from evalplus's get_groundtruth (cache redirected to a temporary directory),
and the verdicts are checked against evalplus's own untrusted_check on the same code.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from aggbench.data import DataError, DataUnavailableError, SpecError, load_benchmark, load_benchmark_spec

SYNTHETIC = [
    {
        "task_id": "Synthetic/0",
        "prompt": 'def add(a: int, b: int) -> int:\n    """Return a + b (synthetic test problem)."""\n',
        "entry_point": "add",
        "canonical_solution": "    return a + b\n",
        "contract": "",
        "base_input": [[1, 2], [3, 4]],
        "plus_input": [[-1, 1], [10**20, 1], [0, 0]],
        "atol": 0,
    },
    {
        "task_id": "Synthetic/1",
        "prompt": 'def unique_sorted(xs: list) -> list:\n    """Sorted distinct elements (synthetic)."""\n',
        "entry_point": "unique_sorted",
        "canonical_solution": "    return sorted(set(xs))\n",
        "contract": "",
        "base_input": [[[3, 1, 2]], [[5]]],  # no duplicates: sorted(xs) passes these
        "plus_input": [[[2, 2, 1]], [[]], [[4, 4, 4]]],
        "atol": 0,
    },
    {
        "task_id": "Synthetic/2",
        "prompt": 'def span(xs: list) -> tuple:\n    """(min, max) and the mean, as a tuple (synthetic)."""\n',
        "entry_point": "span",
        "canonical_solution": "    return (min(xs), max(xs), sum(xs) / len(xs))\n",
        "contract": "",
        "base_input": [[[1.0, 2.0, 4.0]]],
        "plus_input": [[[0.1, 0.2, 0.3]], [[1e-3, 7.0]]],
        "atol": 0,
    },
]

RIGHT = {
    "Synthetic/0": "def add(a, b):\n    return a + b\n",
    "Synthetic/1": "def unique_sorted(xs):\n    return sorted(set(xs))\n",
    "Synthetic/2": "import statistics\n\ndef span(xs):\n    return (min(xs), max(xs), statistics.fmean(xs))\n",
}
BASE_ONLY = "def unique_sorted(xs):\n    return sorted(xs)\n"  # wrong only where plus has duplicates
LIST_NOT_TUPLE = "def span(xs):\n    return [min(xs), max(xs), sum(xs) / len(xs)]\n"
LOOP = "def add(a, b):\n    while True:\n        pass\n"
STUBBORN = (  # swallows evalplus's per-input timeout: only the sandbox's wall clock stops it
    "def add(a, b):\n    n = 0\n    while True:\n        try:\n            while True:\n                n += 1\n"
    "        except BaseException:\n            n = 0\n"
)
WRONG_THEN_STUBBORN = "def add(a, b):\n    if a == 1:\n        return 0\n" + STUBBORN.split(":\n", 1)[1]
WITH_TEST_CODE = (
    RIGHT["Synthetic/0"] + "\nassert add(1, 1) == 3  # a wrong top-level check: sanitize drops it\n"
)


def fenced(code: str) -> str:
    return f"Here is the solution:\n```python\n{code}```\nDone."


@pytest.fixture
def humaneval_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The synthetic problems as an evalplus JSONL, named by HUMANEVAL_OVERRIDE_PATH; evalplus's
    cache (ground truth) redirected to tmp_path."""
    path = tmp_path / "SyntheticHumanEvalPlus.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in SYNTHETIC))
    monkeypatch.setenv("HUMANEVAL_OVERRIDE_PATH", str(path))
    pytest.importorskip("evalplus")
    import evalplus.evaluate

    from aggbench.grading import evalplus_grader

    monkeypatch.setattr(evalplus.evaluate, "CACHE_DIR", str(tmp_path / "evalplus-cache"))
    monkeypatch.setattr(evalplus_grader, "_GROUND_TRUTH", {})
    return path


# ------------------------------------------------------------------------------------ specs


def test_specs_validate_as_optional_evalplus_benchmarks() -> None:
    for name, dataset in (("humaneval_plus", "humaneval"), ("mbpp_plus", "mbpp")):
        spec = load_benchmark_spec(name)
        assert spec.grader.name == "evalplus" and spec.optional
        assert spec.evalplus is not None and spec.evalplus.dataset == dataset
        assert spec.evalplus.version.startswith("v")
        assert "```python" not in spec.render_prompt({"prompt": "def f(): ..."})  # evalplus's plain fence
        assert "markdown code block" in spec.render_prompt({"prompt": "def f(): ..."})
    paper = (Path(__file__).resolve().parents[2] / "configs" / "paper.yaml").read_text()
    assert "humaneval_plus" not in paper and "mbpp_plus" not in paper


def test_unknown_grader_suggests_and_evalplus_needs_its_source(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "configs/benchmarks/humaneval_plus.yaml").read_text()
    bad = tmp_path / "humaneval_plus.yaml"
    bad.write_text(text.replace("name: evalplus", "name: evalpls"))
    with pytest.raises(SpecError, match=r"grader\.name: unknown value 'evalpls'\. Did you mean 'evalplus'\?"):
        load_benchmark_spec(bad)
    bad.write_text(text.replace("evalplus: {dataset: humaneval, version: v0.1.10}\n", ""))
    with pytest.raises(SpecError, match="grader 'evalplus' and an `evalplus:` source"):
        load_benchmark_spec(bad)
    bad.write_text(text.replace("dataset: humaneval", "dataset: humaneva"))
    with pytest.raises(SpecError, match="Did you mean 'humaneval'"):
        load_benchmark_spec(bad)


# ------------------------------------------------------------------------------------ loading


def test_records_come_through_evalplus_loader(humaneval_file: Path) -> None:
    import hashlib

    import evalplus.data.humaneval as ep_humaneval

    before = ep_humaneval.HUMANEVAL_OVERRIDE_PATH
    records = load_benchmark("humaneval_plus")
    assert [r["id"] for r in records] == [p["task_id"] for p in SYNTHETIC]
    first = records[0]
    assert first["prompt"] == SYNTHETIC[0]["prompt"].strip()
    assert first["entry_point"] == "add" and first["evalplus_dataset"] == "humaneval"
    assert (first["n_base"], first["n_plus"]) == (2, 3)
    assert first["evalplus_hash"] == hashlib.md5(humaneval_file.read_bytes()).hexdigest()
    assert str(humaneval_file) in records.source
    assert before == ep_humaneval.HUMANEVAL_OVERRIDE_PATH  # evalplus's module state is restored
    assert len(load_benchmark("humaneval_plus", limit=2)) == 2


def test_offline_without_data_names_the_override_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("evalplus")
    import evalplus.data.humaneval as ep_humaneval

    monkeypatch.delenv("HUMANEVAL_OVERRIDE_PATH", raising=False)

    def offline(url: str, path: str) -> None:  # what wget does without a network, without waiting for it
        raise OSError(f"<urlopen error [Errno -3] Temporary failure in name resolution> ({url})")

    monkeypatch.setattr(ep_humaneval, "make_cache", offline)
    with pytest.raises(DataUnavailableError, match="set HUMANEVAL_OVERRIDE_PATH to a local copy"):
        load_benchmark("humaneval_plus")
    monkeypatch.setenv("HUMANEVAL_OVERRIDE_PATH", str(tmp_path / "missing.jsonl"))
    with pytest.raises(
        DataUnavailableError, match=r"HUMANEVAL_OVERRIDE_PATH=.*missing\.jsonl' is not a file"
    ):
        load_benchmark("humaneval_plus")
    incomplete = tmp_path / "incomplete.jsonl"
    incomplete.write_text(json.dumps({k: v for k, v in SYNTHETIC[0].items() if k != "plus_input"}) + "\n")
    monkeypatch.setenv("HUMANEVAL_OVERRIDE_PATH", str(incomplete))
    with pytest.raises(DataError, match="not an evalplus humaneval file: plus_input not found"):
        load_benchmark("humaneval_plus")


# ------------------------------------------------------------------------------------ grading


def _grade(response: str, task_id: str, **options):
    from aggbench.grading.evalplus_grader import grade_evalplus, ground_truth

    problems, expected, _, _ = ground_truth("humaneval")
    return grade_evalplus(response, problems[task_id], expected[task_id], "humaneval", **options)


def test_correct_solutions_pass_base_and_plus(humaneval_file: Path) -> None:
    for task_id, code in RIGHT.items():
        verdict = _grade(fenced(code), task_id)
        assert verdict["correct"], verdict
        assert verdict["base"]["status"] == verdict["plus"]["status"] == "pass"
        problem = next(p for p in SYNTHETIC if p["task_id"] == task_id)
        assert verdict["plus"]["n_passed"] == len(problem["plus_input"])
        assert verdict["layers"]["guard"] and verdict["layers"]["rlimits"]
    cache = humaneval_file.parent / "evalplus-cache"
    assert list(cache.glob("*.pkl")), "the expected outputs were not computed by evalplus's get_groundtruth"


def test_base_pass_plus_fail_is_wrong(humaneval_file: Path) -> None:
    verdict = _grade(fenced(BASE_ONLY), "Synthetic/1")
    assert not verdict["correct"]
    assert verdict["base"]["status"] == "pass" and verdict["base"]["n_passed"] == 2
    assert verdict["plus"]["status"] == "fail" and verdict["plus"]["error_kind"] == "wrong_answer"
    assert verdict["plus"]["n_passed"] == 0 and "expected [1, 2], got [1, 2, 2]" in verdict["plus"]["detail"]
    assert verdict["reason"].startswith("wrong_answer: plus input 1/3 failed (base pass, plus fail)")


def test_types_and_sanitizing_follow_evalplus(humaneval_file: Path) -> None:
    wrong_type = _grade(
        fenced(LIST_NOT_TUPLE), "Synthetic/2"
    )  # evalplus: [..] != (..), and type(out) must match
    assert wrong_type["base"]["status"] == "fail" and wrong_type["base"]["error_kind"] == "wrong_answer"
    sanitized = _grade(fenced(WITH_TEST_CODE), "Synthetic/0")
    assert sanitized["correct"] and sanitized["sanitized"] and "assert" not in sanitized["extracted"]
    assert _grade("no code at all", "Synthetic/0")["error_kind"] == "no_code"
    broken = _grade(fenced("def add(a, b)\n    return a + b\n"), "Synthetic/0")
    assert not broken["correct"] and broken["base"]["status"] == "fail"


def test_hostile_loops_fail_within_bounded_time(humaneval_file: Path) -> None:
    start = time.monotonic()
    verdict = _grade(fenced(LOOP), "Synthetic/0", min_time_limit=0.5)
    assert time.monotonic() - start < 15
    assert not verdict["correct"] and verdict["base"]["error_kind"] == "timeout"
    assert verdict["base"]["status"] == "fail"  # evalplus: a per-input timeout is a failed input
    start = time.monotonic()
    verdict = _grade(fenced(STUBBORN), "Synthetic/0", min_time_limit=0.3)
    assert time.monotonic() - start < 20  # two sets, each killed at min(60, sum of limits) + 2 s
    assert verdict["base"]["status"] == verdict["plus"]["status"] == "timeout"
    assert verdict["base"]["error_kind"] == "timeout" and not verdict["correct"]


def test_verdicts_agree_with_evalplus_untrusted_check(humaneval_file: Path) -> None:
    """Our sandboxed verdict per input set equals evalplus's own (run in its own child process)."""
    from evalplus.eval import untrusted_check

    from aggbench.grading.evalplus_grader import check_inputs, ground_truth

    problems, expected, _, _ = ground_truth("humaneval")
    cases = [(tid, code) for tid, code in RIGHT.items()]
    cases += [("Synthetic/1", BASE_ONLY), ("Synthetic/2", LIST_NOT_TUPLE), ("Synthetic/0", LOOP)]
    cases += [
        ("Synthetic/0", "def add(a, b):\n    return 1 / 0\n"),
        ("Synthetic/0", "def plus(a, b):\n    return a\n"),
        ("Synthetic/0", WRONG_THEN_STUBBORN),  # base: wrong at input 0 (fail); plus: hangs (timeout)
    ]
    for task_id, code in cases:
        problem, truth = problems[task_id], expected[task_id]
        for part in ("base", "plus"):
            args = (
                problem[f"{part}_input"],
                problem["entry_point"],
                truth[part],
                problem["atol"],
                truth[f"{part}_time"],
            )
            theirs, _ = untrusted_check("humaneval", code, *args, fast_check=True, min_time_limit=0.3)
            ours = check_inputs(code, problem["entry_point"], "humaneval", problem[f"{part}_input"], truth[part],
                                truth[f"{part}_time"], problem["atol"], min_time_limit=0.3)  # fmt: skip
            assert ours["status"] == theirs, (task_id, part, code, ours)


def test_outputs_match_is_evalplus_rule() -> None:
    pytest.importorskip("evalplus")
    from aggbench.grading.evalplus_grader import outputs_match

    assert outputs_match("humaneval", "f", [], 0.1 + 0.2, 0.3, 0) == (True, 1e-6)  # float: atol 0 -> 1e-6
    assert outputs_match("humaneval", "f", [], 0.31, 0.3, 0)[0] is False
    assert outputs_match("humaneval", "f", [], 3, 3.0000001, 1e-6) == (False, 1e-6)  # int vs float type
    assert outputs_match("humaneval", "f", [], [1, 2], (1, 2), 0)[0] is False
    assert outputs_match("mbpp", "similar_elements", [], [2, 1], [1, 2], 0)[0] is True  # set-equality oracle
    assert outputs_match("mbpp", "check_str", [], "anything", True, 0)[0] is True  # output-not-None oracle
    assert (
        outputs_match("humaneval", "find_zero", [[-6, 11, -6, 1]], 1.0, 999.0, 1e-6)[0] is True
    )  # root check


def test_values_cross_the_sandbox_boundary_intact() -> None:
    from aggbench.grading.sandbox_calls import pack, unpack

    value = [(1, 2), {3, 4}, frozenset({5}), {(1, "a"): [None, True]}, 2**9000, -0.5, 1 + 2j, b"\x00x",
             float("inf"), "s", {"k": (1,)}]  # fmt: skip
    back = unpack(json.loads(json.dumps(pack(value))))
    assert back == value and [type(v) for v in back] == [type(v) for v in value]
    with pytest.raises(TypeError, match="cannot be carried"):
        pack(object())


def test_scoring_reports_base_and_plus_per_sample(humaneval_file: Path, tmp_path: Path) -> None:
    from aggbench.evaluation.generate import record_fields
    from aggbench.evaluation.score import score_benchmark

    spec = load_benchmark_spec("humaneval_plus")
    records = {r["id"]: r for r in load_benchmark(spec)}
    answers = {"Synthetic/0": [RIGHT["Synthetic/0"], LOOP], "Synthetic/1": [BASE_ONLY, RIGHT["Synthetic/1"]],
               "Synthetic/2": [LIST_NOT_TUPLE, LIST_NOT_TUPLE]}  # fmt: skip
    rows = [{"benchmark": spec.name, "id": tid, "sample": k, "response": fenced(code), **record_fields(spec, records[tid])}
            for tid, codes in answers.items() for k, code in enumerate(codes)]  # fmt: skip
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = score_benchmark("humaneval_plus", samples, tmp_path / "eval.jsonl", workers=2, n_boot=10)
    graded = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert [g["correct"] for g in graded] == [True, False, False, True, False, False]
    assert [(g["base"]["status"], g["plus"]["status"]) for g in graded[2:4]] == [
        ("pass", "fail"),
        ("pass", "pass"),
    ]
    assert metrics["avg@2"] == pytest.approx(2 / 6) and metrics["pass@2"] == pytest.approx(2 / 3)
    assert "maj@2" not in metrics["metrics"] and metrics["sandbox_layers"]["guard"]
    stale = [{**r, "evalplus_hash": "0" * 32} for r in rows[:1]]
    samples.write_text(json.dumps(stale[0]) + "\n")
    with pytest.raises(ValueError, match="HUMANEVAL_OVERRIDE_PATH at the same file"):
        score_benchmark("humaneval_plus", samples, tmp_path / "eval2.jsonl")
