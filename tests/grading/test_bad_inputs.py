"""`aggbench grade` on bad input: malformed code tests are refused before grading (naming the test
and the key), an empty input is an error that leaves an existing output alone, and bytes that are
not UTF-8 are named by file and line (every loader reads JSONL through ``iter_jsonl``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from aggbench.cli import main
from helpers.jsonl import write_jsonl

TEST = {"input": "1\n", "output": "1\n", "testtype": "stdin"}


def grade(task: str, src: Path, out: Path):
    return CliRunner().invoke(main, ["grade", "--grader", task, "--input", str(src), "--output", str(out)])


@pytest.fixture
def no_grading(monkeypatch):
    """Starting a grading pool fails the test: bad lines must be refused before it."""
    import aggbench.grading.batch

    def never(*args, **kwargs):
        pytest.fail("grading started before the lines were checked")

    monkeypatch.setattr(aggbench.grading.batch, "grading_pool", never)


@pytest.mark.parametrize(
    ("tests", "says"),
    [
        ([{"inpt": "1", "output": "1", "testtype": "stdin"}], "field 'tests[0]': missing 'input'"),
        ([TEST, {"input": "1", "testtype": "stdin"}], "field 'tests[1]': missing 'output'"),
        ([{**TEST, "testtype": "stdinn"}], "field 'tests[0]': unknown testtype 'stdinn'; use 'stdin' or 'functional'"),
        ([{**TEST, "testtype": None}], "field 'tests[0]': unknown testtype None"),
        ([{**TEST, "input": 3}], "field 'tests[0]': 'input' must be a string, got int"),
        ([{**TEST, "output": None}], "field 'tests[0]': 'output' must be a string, got null"),
        ([TEST, "1 2"], "field 'tests[1]': expected an object {input, output, testtype}, got str"),
        (json.dumps([{"inpt": "1", "output": "1"}]), "field 'tests[0]': missing 'input'"),  # a JSON string
        ([TEST, {**TEST, "testtype": "functional"}], "field 'tests': mixes testtypes 'functional' and 'stdin'"),
    ],
)  # fmt: skip
def test_malformed_code_tests_are_refused_before_grading(tmp_path, no_grading, tests, says):
    src = write_jsonl(
        tmp_path / "in.jsonl", [{"response": "x", "tests": [TEST]}, {"response": "x", "tests": tests}]
    )
    result = grade("code", src, tmp_path / "out.jsonl")
    assert result.exit_code == 1, result.output
    assert f"Error: {src}:2: {says}" in result.output, result.output
    assert not (tmp_path / "out.jsonl").exists()


def test_a_test_without_testtype_is_stdin(tmp_path):
    from aggbench.grading.rows import check_row

    check_row(tmp_path / "x.jsonl", 1, {"response": "x", "tests": [{"input": "1", "output": "1"}]}, "code")


def test_the_livecodebench_records_pass_the_checks(shared_data):
    """The offline LiveCodeBench file (tests as stored) and its canonical records pass unchanged."""
    from aggbench.data.benchmarks import load_benchmark
    from aggbench.grading.rows import check_row

    path = shared_data / "livecodebench" / "lcb_v5_2408_2501_public_tests_rllm.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    for lineno, line in enumerate(lines, 1):
        check_row(path, lineno, {**json.loads(line), "response": ""}, "code")
    records = load_benchmark("livecodebench", data_dir=shared_data)
    assert len(records) == len(lines) == 279
    for i, rec in enumerate(records):
        check_row("records", i + 1, {**rec, "response": ""}, "code")


@pytest.mark.parametrize("content", ["", "\n  \n\n"])
def test_an_empty_input_is_an_error_and_the_output_is_left_alone(tmp_path, no_grading, content):
    src = tmp_path / "empty.jsonl"
    src.write_text(content)
    out = write_jsonl(tmp_path / "out.jsonl", ['{"old": true}'])
    result = grade("math", src, out)
    assert result.exit_code == 1, result.output
    assert f"Error: {src}: no samples in the file" in result.output
    assert out.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "out.jsonl"]


def test_a_utf16_input_is_named_not_utf8(tmp_path):
    src = tmp_path / "m_bin.jsonl"
    src.write_bytes('{"response": "x", "answer": "1"}\n'.encode("utf-16"))  # starts with \xff\xfe
    result = grade("math", src, tmp_path / "out.jsonl")
    assert result.exit_code == 1, result.output
    assert (
        f"Error: {src}:1: not UTF-8 text (byte 0xff at byte 1 of the line; it looks like UTF-16, which Windows PowerShell's `>` writes)"
        in result.output
    )
    assert "save it as UTF-8" in result.output


def test_a_latin1_byte_far_into_the_file_names_its_line(tmp_path):
    """The text reader decodes ahead in chunks; the error still names the line the byte is on."""
    from aggbench.data.jsonl import DataError, iter_jsonl

    good = json.dumps({"response": "x" * 50, "answer": "1"}).encode() + b"\n"
    src = tmp_path / "in.jsonl"
    src.write_bytes(good * 700 + b'{"response": "caf\xe9", "answer": "1"}\n' + good * 10)
    seen = []
    with pytest.raises(
        DataError, match=r"in\.jsonl:701: not UTF-8 text \(byte 0xe9 at byte 18 of the line\)"
    ):
        for lineno, _ in iter_jsonl(src):
            seen.append(lineno)
    assert seen == list(range(1, len(seen) + 1)) and len(seen) <= 700
