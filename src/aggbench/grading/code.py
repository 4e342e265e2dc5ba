"""Grade code answers against tests, LiveCodeBench style, in the sandbox of :mod:`.sandbox`.

Two kinds of test, as in LiveCodeBench:

- ``stdin`` (AtCoder): the program reads the input on stdin; its stdout must match the expected
  output line by line after stripping whitespace. Tokens that differ must both be numbers: two
  integers must be equal, otherwise they must agree within ``rel_tol``/``abs_tol`` (1e-6).
  LiveCodeBench itself compares such tokens as exact ``Decimal`` values, so here ``0.5`` and
  ``0.5000001`` match where LiveCodeBench says no; pass ``rel_tol=abs_tol=0`` for its rule.
- ``functional`` (LeetCode): ``input`` holds the arguments as JSON literals, one per line;
  ``Solution().<func_name>(*args)`` must return a value ``==`` the JSON-decoded ``output`` (a
  returned tuple counts as a list, as in LiveCodeBench).

A sample is correct only when every test passes; tests run in order in one sandbox and the run
stops at the first failure (``reason`` says so). Error kinds: ``no_code``, ``syntax_error``,
``runtime_error``, ``wrong_answer``, ``timeout``, ``memory``, ``output_limit``, ``killed``
(a signal such as SIGSEGV), ``sandbox_error``.
"""

from __future__ import annotations

import base64
import io
import json
import math
import pickle
import re
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from aggbench.grading.sandbox import DEFAULT_RUNNER, CaseSpec, RunnerSpec, SandboxResult, run_batch, run_tests

_FENCE = re.compile(r"^```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)^[ \t]*```", re.DOTALL | re.MULTILINE)
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_INTEGER = re.compile(r"[+-]?\d+")
_DEF_SELF = re.compile(r"def\s+(\w+)\s*\(\s*self\b")
_PYTHON_TAGS = {"", "python", "python3", "py", "py3"}


def extract_code(response: str) -> str | None:
    """The last complete fenced code block (a Python or untagged one if there is any), else None.

    An unclosed trailing fence (a truncated response) is ignored, so the previous complete block
    is graded instead of a fragment.
    """
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(response)]
    python_blocks = [code for tag, code in blocks if tag in _PYTHON_TAGS]
    chosen = python_blocks or [code for _, code in blocks]
    if not chosen or not chosen[-1].strip():
        return None
    return chosen[-1]


def func_name_from_starter(starter_code: str | None) -> str | None:
    """``name`` of the first ``def name(self`` in LeetCode starter code, else None."""
    match = _DEF_SELF.search(starter_code or "")
    return match.group(1) if match else None


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _tokens_match(got: str, want: str, rel_tol: float, abs_tol: float) -> bool:
    if got == want:
        return True
    if not (_NUMBER.fullmatch(got) and _NUMBER.fullmatch(want)):
        return False
    if _INTEGER.fullmatch(got) and _INTEGER.fullmatch(want):
        return int(got) == int(want)  # exact: floats would let 10**18+1 equal 10**18
    return math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=abs_tol)


def compare_stdout(got: str, want: str, *, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> bool:
    """Line-wise, whitespace-stripped equality; differing numeric tokens within tolerance."""
    got_lines, want_lines = _lines(got), _lines(want)
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines, strict=True):
        if g == w:
            continue
        g_tokens, w_tokens = g.split(), w.split()
        if len(g_tokens) != len(w_tokens):
            return False
        if not all(_tokens_match(a, b, rel_tol, abs_tol) for a, b in zip(g_tokens, w_tokens, strict=True)):
            return False
    return True


def compare_call(result_json: str | None, expected_json: str) -> bool:
    """The returned value (as JSON) ``==`` the expected JSON literal."""
    if result_json is None:
        return False
    return json.loads(result_json) == json.loads(expected_json)


def call_args(test_input: str) -> list[str]:
    """A functional test's ``input``: one JSON literal per non-blank line."""
    return [line for line in test_input.split("\n") if line.strip()]


def _test_mode(tests: Sequence[Mapping[str, Any]]) -> str:
    kinds = {t.get("testtype", "stdin") for t in tests}
    if len(kinds) != 1 or not kinds <= {"stdin", "functional"}:
        raise ValueError(f"tests must all have testtype 'stdin' or all 'functional'; got {sorted(kinds)}")
    return kinds.pop()


def _short(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-n // 2 :]


def grade_code(
    response: str,
    tests: Sequence[Mapping[str, Any]],
    func_name: str | None = None,
    *,
    starter_code: str | None = None,
    timeout_s: float = 6.0,
    memory_mb: int = 2048,
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-6,
    runner: RunnerSpec = DEFAULT_RUNNER,
) -> dict:
    """Grade one response; see the module docstring.

    ``tests``: ``{"input", "output", "testtype"}`` dicts. ``func_name`` (functional tests) is
    taken from ``starter_code`` when not given. ``timeout_s`` and ``memory_mb`` hold per test;
    ``runner``: how the sandbox runs (:class:`~aggbench.grading.sandbox.RunnerSpec`). Returns
    ``{"correct", "extracted", "reason", "tests": [{"passed", "error_kind", "detail", "elapsed_s"},
    ...] (the tests that ran), "n_tests", "layers"}``.
    """
    if not tests:
        raise ValueError("grade_code needs at least one test")
    mode = _test_mode(tests)
    if mode == "functional":
        func_name = func_name or func_name_from_starter(starter_code)
        if not func_name:
            raise ValueError("functional tests need func_name= or a starter_code with `def name(self, ...)`")
    code = extract_code(response)
    verdict: dict[str, Any] = {
        "correct": False,
        "extracted": code,
        "tests": [],
        "n_tests": len(tests),
        "layers": {},
    }
    if code is None:
        return {**verdict, "reason": "no_code: the response has no complete fenced code block"}
    per_test: list[dict] = verdict["tests"]

    def check(i: int, result: SandboxResult) -> bool:
        want = tests[i]["output"]
        kind = result.error_kind
        detail = result.exception or (result.stderr.strip().splitlines() or [""])[-1]
        if kind is None:
            if mode == "functional":
                ok = compare_call(result.result_json, want)
                got = result.result_json or ""
            else:
                ok = compare_stdout(result.stdout, want, rel_tol=rel_tol, abs_tol=abs_tol)
                got = result.stdout
            kind = None if ok else "wrong_answer"
            detail = "" if ok else f"expected {_short(want.strip())!r}, got {_short(got.strip())!r}"
        per_test.append(
            {"passed": kind is None, "error_kind": kind, "detail": detail, "elapsed_s": result.elapsed_s}
        )
        return kind is None

    cases = [call_args(t["input"]) for t in tests] if mode == "functional" else [t["input"] for t in tests]
    call_method = func_name if mode == "functional" else None
    results = run_tests(
        CaseSpec(code, cases, timeout_s, memory_mb, call_method=call_method), runner, on_result=check
    )
    if len(per_test) < len(results):  # the sandbox itself failed (not judged by check)
        last = results[-1]
        per_test.append({"passed": False, "error_kind": last.error_kind, "detail": last.notes.get("sandbox", ""),
                         "elapsed_s": last.elapsed_s})  # fmt: skip
    verdict["layers"] = results[0].layers if results else {}
    failed = next((i for i, t in enumerate(per_test) if not t["passed"]), None)
    if failed is None and len(per_test) == len(tests):
        return {**verdict, "correct": True, "reason": f"passed all {len(tests)} tests"}
    if failed is None:
        return {**verdict, "reason": "sandbox_error: the run ended before every test ran"}
    t = per_test[failed]
    reason = f"{t['error_kind']}: test {failed + 1}/{len(tests)} failed"
    if t["detail"]:
        reason += f" ({_short(t['detail'])})"
    if failed + 1 < len(tests):
        reason += f"; stopped at the first failure, {len(tests) - failed - 1} tests not run"
    return {**verdict, "reason": reason}


def grade_code_item(item: Mapping[str, Any]) -> dict:
    """Pool entry point: ``grade_code(**item)`` (keys: response, tests, func_name, ...)."""
    return grade_code(**item)


def grade_many(items: Sequence[Mapping[str, Any]], *, max_workers: int | None = None) -> list[dict]:
    """:func:`grade_code` for many items (dicts of its arguments), ``max_workers`` sandboxes at once."""
    return run_batch(items, max_workers=max_workers, fn=grade_code)


# ------------------------------------------------------------------------------ LiveCodeBench data
def _check_tests(tests: Any, where: str) -> list[dict]:
    if isinstance(tests, str):
        tests = json.loads(tests)
    if not isinstance(tests, list) or not tests:
        raise ValueError(f"{where}: `tests` must be a non-empty list of {{input, output, testtype}}")
    for j, t in enumerate(tests):
        if not (isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)):
            raise ValueError(
                f"{where}: test {j} must be a dict with string `input` and `output`; got {t!r:.120}"
            )
    return tests


def load_lcb_public(path: str | Path, *, prompts_path: str | Path | None = None) -> list[dict]:
    """Canonical records from the rllm LiveCodeBench file (``problem, starter_code, tests``).

    Each record: ``{id, prompt (the problem text, CRLF -> LF), starter_code, tests, func_name
    (functional only, from the starter code), testtype}``. With ``prompts_path`` (the QwQ file
    that lists the same problems in the same order) the ids become LiveCodeBench question ids and
    ``contest_date`` and ``lcb_prompt`` (the full instruction prompt) are added; alignment is
    checked (same count; a functional problem's ``def`` name appears in its QwQ prompt).
    """
    path = Path(path)
    records = []
    with path.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            where = f"{path}:{line_no}"
            tests = _check_tests(row.get("tests"), where)
            testtype = _test_mode(tests)
            starter = row.get("starter_code") or ""
            func_name = func_name_from_starter(starter) if testtype == "functional" else None
            if testtype == "functional" and not func_name:
                raise ValueError(f"{where}: functional problem without `def name(self` in starter_code")
            records.append({
                "id": f"lcb-{len(records):04d}",
                "prompt": row["problem"].replace("\r\n", "\n"),
                "starter_code": starter,
                "tests": tests,
                "func_name": func_name,
                "testtype": testtype,
            })  # fmt: skip
    if prompts_path is not None:
        with Path(prompts_path).open(encoding="utf-8") as fh:
            prompts = [json.loads(line) for line in fh if line.strip()]
        if len(prompts) != len(records):
            raise ValueError(
                f"{prompts_path} has {len(prompts)} rows, {path} has {len(records)}: not the same problems"
            )
        for i, (rec, meta) in enumerate(zip(records, prompts, strict=True)):
            if rec["func_name"] and f"def {rec['func_name']}" not in meta["prompt"]:
                raise ValueError(
                    f"{prompts_path} row {i}: `def {rec['func_name']}` not in its prompt; misaligned"
                )
            rec.update(
                id=meta["question_id"], contest_date=meta.get("contest_date"), lcb_prompt=meta["prompt"]
            )
    return records


class _NoGlobalsUnpickler(pickle.Unpickler):
    """Unpickles plain containers, strings and numbers only: every class/function is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only plain data is allowed")


def decode_private_tests(blob: str, *, max_bytes: int = 1 << 30) -> list[dict]:
    """LiveCodeBench hub ``private_test_cases``: JSON, or base64(zlib(pickle(JSON string or list))).

    Never ``pickle.loads``: the unpickler refuses every global, so a crafted row cannot run code;
    the decompressed size is capped at ``max_bytes``.
    """
    text = blob.strip()
    if text.startswith("["):
        return _check_tests(json.loads(text), "private_test_cases")
    raw = base64.b64decode(text.encode("ascii"))
    inflater = zlib.decompressobj()
    data = inflater.decompress(raw, max_bytes)
    if inflater.unconsumed_tail:
        raise ValueError(f"private_test_cases inflate to more than {max_bytes} bytes; raise max_bytes")
    obj = _NoGlobalsUnpickler(io.BytesIO(data)).load()
    if isinstance(obj, bytes):
        obj = obj.decode("utf-8")
    return _check_tests(json.loads(obj) if isinstance(obj, str) else obj, "private_test_cases")


def lcb_hub_record(row: Mapping[str, Any]) -> dict:
    """A LiveCodeBench hub row (``livecodebench/code_generation_lite``) as a canonical record."""
    metadata = row.get("metadata") or "{}"
    metadata = json.loads(metadata) if isinstance(metadata, str) else dict(metadata)
    tests = _check_tests(row["public_test_cases"], f"{row.get('question_id')}: public_test_cases")
    if row.get("private_test_cases"):
        tests = tests + decode_private_tests(row["private_test_cases"])
    testtype = _test_mode(tests)
    starter = row.get("starter_code") or ""
    func_name = metadata.get("func_name") or func_name_from_starter(starter)
    return {
        "id": row["question_id"],
        "prompt": row["question_content"].replace("\r\n", "\n"),
        "starter_code": starter,
        "tests": tests,
        "func_name": func_name if testtype == "functional" else None,
        "testtype": testtype,
        "contest_date": row.get("contest_date"),
        "platform": row.get("platform"),
    }
