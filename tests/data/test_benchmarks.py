"""Benchmark specs (configs/benchmarks) and their loaders, against the real offline files.

The offline files live in ../shared/data (never copied into the project); expected counts and
quirks below are the ones documented in its PROVENANCE.md.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import warnings
import zlib
from pathlib import Path

import pytest

from aggbench.data import (
    DataError,
    DataUnavailableError,
    SpecError,
    list_benchmarks,
    load_benchmark,
    load_benchmark_spec,
)
from aggbench.data.rows import decode_lcb_tests

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {"math500", "aime24", "aime25", "olympiadbench", "minerva", "livecodebench", "tiny_test"}
MATH_COUNTS = {"math500": 500, "aime24": 30, "aime25": 30, "olympiadbench": 675, "minerva": 272}


@pytest.fixture
def data_env(shared_data: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """AGGBENCH_DATA_DIR pointed at ../shared/data (tests/conftest.py's shared_data)."""
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(shared_data))
    return shared_data


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _nows(text: str) -> str:
    return "".join(text.split())


def _write_yaml(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _unpinned(tmp_path: Path, name: str) -> Path:
    """The repository's spec without its offline_sha256 pin: for tests that feed it made-up rows."""
    text = (REPO / f"configs/benchmarks/{name}.yaml").read_text()
    lines = [line for line in text.splitlines(keepends=True) if not line.startswith("offline_sha256:")]
    assert len(lines) == len(text.splitlines()) - 1, f"{name}.yaml pins no offline_sha256"
    (tmp_path / "specs").mkdir(exist_ok=True)
    return _write_yaml(tmp_path / "specs", name, "".join(lines))


# ----------------------------------------------------------------------------- specs


def test_every_benchmark_yaml_validates() -> None:
    assert set(list_benchmarks()) >= EXPECTED
    for name in EXPECTED:
        spec = load_benchmark_spec(name)
        assert spec.name == name
        assert spec.source_path == REPO / "configs" / "benchmarks" / f"{name}.yaml"
        # every online source is pinned: a hub commit, or a URL with the file's sha256
        assert spec.hub is None or spec.hub.pinned, name
        assert spec.url is None or len(spec.url.sha256) == 64, name


def test_unknown_benchmark_name_lists_names_and_suggests() -> None:
    with pytest.raises(SpecError) as err:
        load_benchmark_spec("math50")
    msg = str(err.value)
    assert "Did you mean 'math500'?" in msg
    for name in EXPECTED:
        assert name in msg


def test_unknown_yaml_keys_are_named_with_allowed_keys(tmp_path: Path) -> None:
    text = (REPO / "configs/benchmarks/math500.yaml").read_text()
    text = text.replace("temperature: 0.6", "temprature: 0.6").replace("prompt_template:", "promt_template:")
    with pytest.raises(SpecError) as err:
        load_benchmark_spec(_write_yaml(tmp_path, "math500", text))
    msg = str(err.value)
    assert "unknown key 'sampling.temprature'. Did you mean 'temperature'?" in msg
    assert "Allowed keys under 'sampling': max_tokens, n, temperature, top_k, top_p" in msg
    assert "unknown key 'promt_template'. Did you mean 'prompt_template'?" in msg
    assert "sampling.temperature: Field required" in msg
    assert str(tmp_path / "math500.yaml") in msg


def test_a_sampling_seed_is_refused_not_ignored(tmp_path: Path) -> None:
    """Generation is seeded by `--seed` / the evaluation's seeds (docs/evaluation.md), never by the
    benchmark YAML: a `sampling.seed` there would read as seeding and do nothing, so it is unknown."""
    text = (REPO / "configs/benchmarks/math500.yaml").read_text()
    text = text.replace("temperature: 0.6", "temperature: 0.6, seed: 7")
    assert "seed: 7" in text
    with pytest.raises(SpecError, match=r"unknown key 'sampling\.seed'"):
        load_benchmark_spec(_write_yaml(tmp_path, "math500", text))


def test_a_spec_that_is_not_utf8_is_a_spec_error_naming_the_file(tmp_path: Path) -> None:
    text = (REPO / "configs/benchmarks/math500.yaml").read_text().replace("MATH-500", "MATH-500 (problèmes)")
    path = tmp_path / "math500.yaml"
    path.write_bytes(text.encode("latin-1"))  # an editor's Latin-1 save
    with pytest.raises(
        SpecError,
        match=r"math500.yaml: not UTF-8 text \(byte 0xe8 at byte \d+ of the file\); save it as UTF-8",
    ):
        load_benchmark_spec(path)


def test_metric_k_above_n_and_missing_answer_field_rejected(tmp_path: Path) -> None:
    text = (REPO / "configs/benchmarks/math500.yaml").read_text().replace("maj@4]", "maj@8]")
    with pytest.raises(SpecError, match=r"metric 'maj@8' needs k <= sampling.n \(4\)"):
        load_benchmark_spec(_write_yaml(tmp_path, "a", text))
    text = (REPO / "configs/benchmarks/math500.yaml").read_text().replace("  answer: answer\n", "")
    with pytest.raises(SpecError, match="fields.answer is required for grader 'math'"):
        load_benchmark_spec(_write_yaml(tmp_path, "b", text))


def test_benchmark_dir_env_adds_user_benchmarks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (REPO / "configs/benchmarks/aime25.yaml").read_text().replace("name: aime25", "name: mine")
    _write_yaml(tmp_path, "mine", text)
    monkeypatch.setenv("AGGBENCH_BENCHMARK_DIR", str(tmp_path))
    assert "mine" in list_benchmarks()
    assert load_benchmark_spec("mine").source_path == tmp_path / "mine.yaml"
    _write_yaml(tmp_path, "other", text)  # name inside does not match the file name
    with pytest.raises(SpecError, match="name 'mine' does not match the file name 'other'"):
        load_benchmark_spec("other")


# ----------------------------------------------------------------------------- math benchmarks


@pytest.mark.parametrize("name", sorted(MATH_COUNTS))
def test_math_benchmark_rows(name: str, data_env: Path) -> None:
    records = load_benchmark(name)
    assert len(records) == MATH_COUNTS[name]
    assert records.source == str(data_env / load_benchmark_spec(name).offline_file)
    assert len({r["id"] for r in records}) == len(records)
    for r in records:
        assert r["prompt"].strip()
        answers = r["answer"] if isinstance(r["answer"], list) else [r["answer"]]
        assert answers and all(a.strip() for a in answers)
    assert not records.public_tests_only and records.notes == []


def test_math500_fields_and_prompt(data_env: Path) -> None:
    spec = load_benchmark_spec("math500")
    first = load_benchmark(spec, limit=3)
    assert len(first) == 3
    assert first[0]["id"] == "test/precalculus/807.json"
    assert first[0]["answer"] == r"\left( 3, \frac{\pi}{2} \right)"
    assert first[0]["meta"] == {"subject": "Precalculus", "level": 2}
    text = spec.render_prompt(first[0])
    assert (
        text
        == first[0]["prompt"] + "\nPlease reason step by step, and put your final answer within \\boxed{}."
    )
    assert spec.render_messages(first[0]) == [{"role": "user", "content": text}]


def test_render_prompt_substitutes_once() -> None:
    spec = load_benchmark_spec("livecodebench")
    record = {"prompt": "echo {starter_code} and {prompt}", "starter_code": ""}
    out = spec.render_prompt(record)
    # placeholders inside the problem text itself are left alone
    assert "Question: echo {starter_code} and {prompt}\n\nRead the inputs from stdin" in out


def test_aime24_zero_padded_answers_become_integers(data_env: Path) -> None:
    raw = {str(r["id"]): r["answer"] for r in _rows(data_env / "aime24/test.jsonl")}
    padded = {k: v for k, v in raw.items() if v.startswith("0")}
    assert len(padded) == 7  # "025", "073", "023", "045", "033", "080", "055"
    records = {r["id"]: r["answer"] for r in load_benchmark("aime24")}
    assert records["60"] == "204"
    for rid, value in padded.items():
        assert records[rid] == value.lstrip("0")
    assert all(a.isdigit() and not a.startswith("0") for a in records.values())


def test_aime25_numbered_ids_and_answers(data_env: Path) -> None:
    records = load_benchmark("aime25")
    assert [r["id"] for r in records[:2]] == ["aime25-0", "aime25-1"]
    assert records[0]["answer"] == "70"  # 2025 I #1 (MathArena answers.csv)


def test_minerva_answer_is_the_box_of_the_solution(data_env: Path) -> None:
    raw = _rows(data_env / "minerva/test.jsonl")
    records = load_benchmark("minerva")
    assert len(records) == len(raw) == 272
    for rec, row in zip(records, raw, strict=True):
        assert rec["id"] == str(row["idx"])
        # the box's content, trimmed (one box ends in a newline before its closing brace)
        assert _nows("\\boxed{" + rec["answer"] + "}") in _nows(row["solution"])
    assert records[0]["answer"] == "1.6"  # "\boxed{1.6} \mathrm{~cm}": the unit is outside the box


def test_olympiadbench_list_answers_and_grading_options(data_env: Path) -> None:
    records = load_benchmark("olympiadbench")
    assert all(isinstance(r["answer"], list) and len(r["answer"]) == 1 for r in records)
    assert sum(r["answer"][0].startswith("$") for r in records) > 0  # the $...$ wrapping is kept
    assert all(set(r["grading"]) == {"is_multiple_answer", "unit", "error", "answer_type"} for r in records)
    assert sum(r["grading"]["is_multiple_answer"] for r in records) == 94
    assert [r["grading"]["error"] for r in records if r["grading"]["error"]] == ["1e-1"]
    assert sum(r["grading"]["unit"] is not None for r in records) == 675 - 667


# ----------------------------------------------------------------------------- LiveCodeBench


def test_livecodebench_public_tests_parsed_and_flagged(data_env: Path) -> None:
    records = load_benchmark("livecodebench")
    assert len(records) == 279
    assert records.public_tests_only and records.notes == ["public tests only"]
    assert all(r["public_tests_only"] for r in records)
    kinds = [{t["testtype"] for t in r["tests"]} for r in records]
    assert sum(k == {"stdin"} for k in kinds) == 175
    assert sum(k == {"functional"} for k in kinds) == 104
    assert all(1 <= len(r["tests"]) <= 6 for r in records)
    for r in records:
        assert bool(r["starter_code"]) == (r["func_name"] is not None)
    by_id = {r["id"]: r for r in records}
    assert by_id["3517"]["func_name"] == "shortestDistanceAfterQueries"
    assert by_id["3517"]["tests"][0] == {
        "input": "5\n[[2, 4], [0, 2], [0, 4]]",
        "output": "[3, 2, 1]",
        "testtype": "functional",
    }
    assert by_id["abc365_b"]["tests"][0] == {"input": "4\n8 2 5 1\n", "output": "3\n", "testtype": "stdin"}


def test_livecodebench_prompt_is_the_qwq_prompts_in_codeqwen_style(data_env: Path) -> None:
    """The offline QwQ prompts file, real lcb_runner output of its QwQ style, differs from the
    CodeQwenInstruct question prompt (livecodebench.yaml v3) by one sentence only (lcb_runner
    prompts/code_generation.py @ 28fef95e: get_qwen_qwq_ vs get_codeqwen_question_template_answer)."""
    spec = load_benchmark_spec("livecodebench")
    records = load_benchmark(spec)
    qwq = _rows(data_env / "livecodebench/qwq_livecodebench_v5_prompts.jsonl")
    assert [r["id"] for r in records] == [q["question_id"] for q in qwq]
    head = "and passes all tests."
    codeqwen = [
        q["prompt"].replace(head, head + " You will NOT return anything except for the program.", 1)
        for q in qwq
    ]
    assert all(q["prompt"].count(head) >= 1 for q in qwq)
    assert all(spec.render_prompt(r) == c for r, c in zip(records, codeqwen, strict=True))


def test_livecodebench_date_window(data_env: Path) -> None:
    # contest_date counts in the QwQ file by month: 2024-08: 66, 09: 47, 10: 53, 11: 57, 12: 49, 2025-01: 7
    spec = load_benchmark_spec("livecodebench")
    early = load_benchmark(spec.with_date_window("2024-08-01", "2024-10-01"))
    assert len(early) == 66 + 47
    assert all("2024-08-01" <= r["date"] < "2024-10-01" for r in early)
    late = load_benchmark(spec.with_date_window("2024-10-01", None))
    assert len(late) == 53 + 57 + 49 + 7
    assert len(load_benchmark(spec.with_date_window("2025-01-01", "2025-02-01"))) == 7
    with pytest.raises(Exception, match="must be before end"):
        spec.with_date_window("2025-01-01", "2024-01-01")


def test_lcb_hub_row_adapter_decodes_private_tests_safely() -> None:
    from aggbench.data.rows import _adapt_livecodebench

    private = [{"input": "1\n", "output": "2\n", "testtype": "stdin"}]
    encoded = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private)))).decode()
    row = {
        "question_content": "Add one.",
        "starter_code": "",
        "public_test_cases": json.dumps([{"input": "0\n", "output": "1\n", "testtype": "stdin"}]),
        "private_test_cases": encoded,
        "question_id": "abc999_a",
        "contest_date": "2024-09-01T00:00:00",
        "metadata": "{}",
    }
    adapted = _adapt_livecodebench(row)
    assert [t["input"] for t in adapted["tests"]] == ["0\n", "1\n"]
    assert adapted["_public_tests_only"] is False
    assert _adapt_livecodebench({**row, "private_test_cases": ""})["_public_tests_only"] is True
    evil = base64.b64encode(zlib.compress(pickle.dumps(os.getcwd))).decode()  # pickles a global
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        decode_lcb_tests(evil)


# ----------------------------------------------------------------------------- errors and sources


def test_malformed_jsonl_names_file_line_and_field(tmp_path: Path) -> None:
    good = {"problem": "1+1?", "answer": "2", "unique_id": "a", "subject": "s", "level": 1}
    target = tmp_path / "math500" / "test.jsonl"
    target.parent.mkdir()
    lines = [json.dumps(good), "", "{not json"]
    target.write_text("\n".join(lines) + "\n")
    spec = _unpinned(tmp_path, "math500")  # made-up rows: the real file's pin would refuse them first
    with pytest.raises(DataError) as err:
        load_benchmark(spec, data_dir=tmp_path)
    assert (err.value.where, err.value.line, err.value.field) == (str(target), 3, None)
    assert f"{target}:3:" in str(err.value) and "invalid JSON" in str(err.value)

    missing = {k: v for k, v in good.items() if k != "answer"}
    target.write_text(json.dumps(good) + "\n" + json.dumps(missing) + "\n")
    with pytest.raises(DataError, match=rf"{target}:2: field 'answer': missing"):
        load_benchmark(spec, data_dir=tmp_path)

    target.write_text(json.dumps({**good, "answer": {"x": 1}}) + "\n")
    with pytest.raises(DataError, match=rf"{target}:1: field 'answer': expected text, got dict"):
        load_benchmark(spec, data_dir=tmp_path)


def test_minerva_solution_without_a_single_box_is_an_error(tmp_path: Path) -> None:
    target = tmp_path / "minerva" / "test.jsonl"
    target.parent.mkdir()
    row = {"problem": "p", "solution": r"$\boxed{1}$ or $\boxed{2}$", "type": "t", "idx": 0}
    target.write_text(json.dumps(row) + "\n")
    with pytest.raises(
        DataError, match=r"test.jsonl:1: field 'solution': expected exactly one \\boxed\{...\}, found 2"
    ):
        load_benchmark(_unpinned(tmp_path, "minerva"), data_dir=tmp_path)


def test_missing_offline_file_without_hub_names_the_env_var(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = (REPO / "configs/benchmarks/aime25.yaml").read_text()
    hubless = text.split("hub:")[0] + "offline_file:" + text.split("offline_file:")[1]
    spec = load_benchmark_spec(_write_yaml(tmp_path, "aime25", hubless))
    assert spec.hub is None
    monkeypatch.delenv("AGGBENCH_DATA_DIR", raising=False)
    with pytest.raises(DataUnavailableError, match=r"AGGBENCH_DATA_DIR is unset.*aime25/aime25_gkv.jsonl"):
        load_benchmark(spec)
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(tmp_path / "empty"))
    with pytest.raises(DataUnavailableError, match="AGGBENCH_DATA_DIR is '.*empty'"):
        load_benchmark(spec)


def test_unreachable_hub_names_the_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    datasets_config = pytest.importorskip("datasets.config")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets_config, "HF_HUB_OFFLINE", True)
    with (
        pytest.warns(UserWarning, match="not found under the offline data dir; trying the hub"),
        pytest.raises(DataUnavailableError) as err,
    ):
        load_benchmark("math500", data_dir=tmp_path)
    msg = str(err.value)
    assert "HuggingFaceH4/MATH-500@ff5b20257d8185524591543f8ff5993951537bb8" in msg
    assert "set $AGGBENCH_DATA_DIR to a directory holding math500/test.jsonl" in msg


def test_tiny_test_uses_make_task_test_split(monkeypatch: pytest.MonkeyPatch) -> None:
    # a stub with make_task's signature stands in for the real task (checked by tests/tiny)
    calls = []

    def make_task(seed: int, n_train: int, n_test: int):
        calls.append((seed, n_train, n_test))
        train = [{"id": f"tr{i}", "prompt": f"{i}+1=", "answer": i + 1} for i in range(n_train)]
        test = [{"id": f"te{i}", "prompt": f"{i}+2=", "answer": i + 2} for i in range(n_test)]
        return train, test

    monkeypatch.setattr("aggbench.data.rows.make_task", make_task)
    spec = load_benchmark_spec("tiny_test")
    records = load_benchmark(spec)
    assert calls == [(0, 512, 64)]
    assert len(records) == 64 and records.source == "builtin:tiny"
    assert records[1] == {"id": "te1", "prompt": "1+2=", "answer": "3"}
    assert spec.render_prompt(records[1]) == "1+2="
    assert spec.use_chat_template  # the tiny model ships a chat template and its warm start used it


def test_tiny_test_with_the_real_task() -> None:
    from aggbench.tiny.task import make_task

    records = load_benchmark("tiny_test")
    _, test = make_task(0, 512, 64)
    assert len(records) == 64
    assert [r["id"] for r in records] == [t["id"] for t in test]
    assert all(
        r["prompt"] == t["prompt"] and r["answer"] == t["answer"] for r, t in zip(records, test, strict=True)
    )


# ----------------------------------------------------------------------------- hub path (stubbed)


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch):
    """Stands in for ``datasets.load_dataset``: returns in-memory Datasets, records each call."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.delenv("AGGBENCH_DATA_DIR", raising=False)
    calls: list[tuple] = []
    tables: dict = {}

    def load_dataset(path, name=None, *, revision=None, split=None, data_files=None):
        calls.append((path, name, revision, split, data_files))
        return datasets.Dataset.from_list(tables[name if data_files is None else path])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    # hub metadata: a branch resolves to this commit (no network in tests)
    monkeypatch.setattr("aggbench.data.rows.resolve_revision", lambda hub: "a" * 40)
    return calls, tables


def test_hub_configs_are_concatenated_at_the_pinned_revision(fake_hub) -> None:
    calls, tables = fake_hub
    # 15 problems per config, as the real ones (the spec's expected_rows is 30)
    tables["AIME2025-I"] = [{"question": "q1", "answer": "070", "extra": 1}] * 15
    tables["AIME2025-II"] = [{"question": "q2", "answer": "5", "extra": 2}] * 15
    pin = "a6ad95f611d72cf628a80b58bd0432ef6638f958"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a pinned revision loads without the unpinned warning
        records = load_benchmark("aime25")
    assert calls == [
        ("opencompass/AIME2025", "AIME2025-I", pin, "test", None),
        ("opencompass/AIME2025", "AIME2025-II", pin, "test", None),
    ]
    assert len(records) == 30
    assert [(r["id"], r["prompt"], r["answer"]) for r in (records[0], records[15])] == [
        ("aime25-0", "q1", "70"),
        ("aime25-15", "q2", "5"),
    ]
    assert records.source == f"hf://datasets/opencompass/AIME2025@{pin}"


def test_unpinned_hub_revision_warns_and_names_todays_commit(fake_hub, tmp_path: Path) -> None:
    calls, tables = fake_hub
    tables[None] = [{"problem": "p", "solution": "so \\boxed{3}"}]
    # a user's spec on a branch (every shipped spec is pinned)
    text = (REPO / "configs" / "benchmarks" / "minerva.yaml").read_text()
    url_block = text[text.index("url:\n") : text.index("offline_file:")]
    hub = "hub:\n  id: knoveleng/Minerva-Math\n  revision: main\n  split: train\n  fields:\n"
    hub += "    id: null\n    prompt: problem\n    solution: solution\n"
    text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("expected_rows:"))
    spec = _write_yaml(tmp_path, "minerva", text.replace(url_block, hub))
    with pytest.warns(UserWarning, match="'main' of knoveleng/Minerva-Math is not a pinned commit") as rec:
        records = load_benchmark(spec)
    # the warning names today's commit so the user pins it in one edit
    assert any(f"put `revision: {'a' * 40}` in its spec" in str(w.message) for w in rec)
    assert calls[0][2] == "main" and records[0]["answer"] == "3"


def test_hub_livecodebench_reads_raw_files_with_private_tests(fake_hub) -> None:
    calls, tables = fake_hub
    private = base64.b64encode(
        zlib.compress(pickle.dumps(json.dumps([{"input": "2", "output": "3", "testtype": "functional"}])))
    ).decode()

    def row(qid: str, date: str) -> dict:
        return {
            "question_title": "t",
            "question_content": f"Problem {qid}",
            "platform": "leetcode",
            "question_id": qid,
            "contest_id": "weekly-contest-400",
            "contest_date": date,
            "starter_code": "class Solution:\n    def addOne(self, x: int) -> int:\n        ",
            "difficulty": "easy",
            "public_test_cases": json.dumps([{"input": "1", "output": "2", "testtype": "functional"}]),
            "private_test_cases": private,
            "metadata": json.dumps({"func_name": "addOne"}),
        }

    tables["json"] = [row("in", "2024-09-01T00:00:00"), row("before", "2024-07-31T23:00:00")]
    records = load_benchmark("livecodebench")
    assert calls == [
        (
            "json",
            None,
            None,
            "test",
            {
                "test": [  # release_v5's whole set: the window's rows are not all in test4/test5
                    f"hf://datasets/livecodebench/code_generation_lite@6b6b0322bc247161eebd8aee058237dc21566d21/{f}"
                    for f in ("test.jsonl", "test2.jsonl", "test3.jsonl", "test4.jsonl", "test5.jsonl")
                ]
            },
        )
    ]
    assert [r["id"] for r in records] == ["in"]  # the July row is outside the 2024-08-01 window
    (rec,) = records
    assert rec["func_name"] == "addOne" and rec["meta"] == {
        "contest_id": "weekly-contest-400",
        "difficulty": "easy",
    }
    assert [t["input"] for t in rec["tests"]] == ["1", "2"]  # public + decoded private
    assert rec["public_tests_only"] is False and records.notes == []
