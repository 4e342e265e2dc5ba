"""Grade HumanEval+ / MBPP+ samples as EvalPlus (0.3.1) does, the code run in aggbench's sandbox.

A sample is correct iff its code passes the base inputs AND the plus inputs; the verdict reports
the two separately (``base`` and ``plus``: status pass | fail | timeout, inputs passed, the first
failure). What comes from evalplus itself:

- the problems: :func:`aggbench.data.evalplus_source.load_problems` (evalplus's loaders);
- the expected outputs and the canonical solution's timings: ``evalplus.evaluate.get_groundtruth``
  (it runs the canonical solutions in this process, as evalplus does: dataset code, trusted;
  cached by evalplus under its cache directory, keyed by the data file's md5);
- the code: the response's last fenced block, then ``evalplus.sanitize.sanitize`` with the entry
  point (keeps the imports and the definitions the entry point needs, drops top-level test code);
- the comparison: :func:`outputs_match` is ``evalplus.eval.unsafe_execute``'s check, line by line
  (it is inline code there, not a function), with evalplus's special oracles and ``is_floats``
  imported from evalplus;
- the time limits: per input ``max(min_time_limit, gt_time_limit_factor * canonical time)``
  (evalplus defaults 1 s and 4x), per input set ``min($EVALPLUS_TIMEOUT_PER_TASK or 60, sum) + 2``.

What differs: the code runs in :mod:`.sandbox` (namespaces, rlimits, unprivileged uid, evalplus's
reliability guard) through its ``evalplus`` harness (:mod:`.sandbox_calls`), and the expected
outputs never enter it: the function's return values are carried out and compared here, so a
value the codec cannot carry (an instance of the code's own class, a numpy array) fails the input.
The child stops at the first input that raises or times out (evalplus's default ``fast_check``);
a wrong value does not stop it (only this side knows), which changes timings, never the verdict.
Memory per run: ``memory_mb`` (4096, evalplus's default 4 GiB). evalplus sanitizes the whole raw
response (it parses every span of lines: O(lines^2) parses); here only the extracted block, and a block over
``SANITIZE_MAX_LINES`` lines is run unsanitized (``sanitized: false`` in the verdict).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aggbench.graders import GradingError
from aggbench.grading.code import extract_code
from aggbench.grading.sandbox import CaseSpec, RunnerSpec, run_batch, run_tests
from aggbench.grading.sandbox_calls import unpack

SANITIZE_MAX_LINES = 300  # evalplus.sanitize parses O(lines^2) spans: ~0.7 s at 200 lines, ~4.6 s at 400 here
MIN_TIME_LIMIT = 1.0  # evalplus.config.DEFAULT_MIN_TIME_LIMIT
GT_TIME_LIMIT_FACTOR = 4.0  # evalplus.config.DEFAULT_GT_TIME_LIMIT_FACTOR
_GROUND_TRUTH: dict[tuple[str, str], tuple[dict, dict]] = {}  # (dataset, md5) -> (problems, expected)
# every input's value comes back on the status pipe, whose limit follows max_output_bytes
EVALPLUS_RUNNER = RunnerSpec(max_output_bytes=64 << 20)


class EvalPlusError(GradingError):
    """Samples that cannot be graded against the evalplus data found here (the message says why)."""


def outputs_match(
    dataset: str, entry_point: str, inp: Sequence, out: Any, exp: Any, atol: float
) -> tuple[bool, float]:
    """(does ``out`` pass for input ``inp``, the atol for the following inputs).

    evalplus 0.3.1 ``unsafe_execute``'s check. Its quirk is kept: once an expected value is a
    float (or a list of floats) with ``atol == 0``, atol becomes 1e-6 for the rest of the inputs.
    """
    import numpy as np
    from evalplus.eval import is_floats
    from evalplus.eval._special_oracle import (
        MBPP_OUTPUT_NOT_NONE_TASKS,
        MBPP_OUTPUT_SET_EQ_TASKS,
        _digit_distance_nums,
        _poly,
        _surface_Area,
    )

    try:
        exact_match = out == exp
        if dataset == "mbpp":
            if entry_point == "are_equivalent":  # Mbpp/164
                exact_match = True
            elif entry_point == "sum_div":  # Mbpp/295
                exact_match = exact_match or out == 0
            elif entry_point == "surface_Area":  # Mbpp/581
                exact_match = exact_match or abs(out - _surface_Area(*inp)) <= atol
            elif entry_point == "digit_distance_nums":  # Mbpp/558
                exact_match = exact_match or out == _digit_distance_nums(*inp)
            elif entry_point in MBPP_OUTPUT_SET_EQ_TASKS:
                exact_match = set(out) == set(exp)
            elif entry_point in MBPP_OUTPUT_NOT_NONE_TASKS:
                exact_match = out == exp if isinstance(out, bool) else exp == (out is not None)
        if dataset == "humaneval" and entry_point == "find_zero":
            return bool(abs(_poly(*inp, out)) <= atol), atol
        if atol == 0 and is_floats(exp):
            atol = 1e-6
        if not exact_match and atol != 0:
            if type(out) is not type(exp) or (isinstance(exp, list | tuple) and len(out) != len(exp)):
                return False, atol
            return bool(np.allclose(out, exp, rtol=1e-07, atol=atol)), atol
        return bool(exact_match), atol
    except Exception:  # noqa: BLE001 - evalplus counts any error in the check as a failed input
        return False, atol


def time_limits(ref_time: Sequence[float], min_time_limit: float, factor: float) -> list[float]:
    """Per-input limits, as ``evalplus.eval.untrusted_check``."""
    return [max(min_time_limit, factor * t) for t in ref_time]


def _short(text: str, n: int = 200) -> str:
    return text if len(text) <= n else text[: n // 2] + " ... " + text[-n // 2 :]


def check_inputs(
    code: str,
    entry_point: str,
    dataset: str,
    inputs: Sequence[Sequence],
    expected: Sequence[Any],
    ref_time: Sequence[float],
    atol: float,
    *,
    memory_mb: int = 4096,
    min_time_limit: float = MIN_TIME_LIMIT,
    gt_time_limit_factor: float = GT_TIME_LIMIT_FACTOR,
    runner: RunnerSpec = EVALPLUS_RUNNER,
) -> dict[str, Any]:
    """Run one input set (base or plus) in one sandbox and compare every output.

    Returns ``{"status": pass|fail|timeout, "n_inputs", "n_passed" (before the first failure),
    "error_kind" (None, wrong_answer, timeout, runtime_error, ...), "detail", "elapsed_s",
    "layers"}``. ``runner``: how the sandbox runs [:data:`EVALPLUS_RUNNER`: the defaults, with a
    64 MiB output limit].
    """
    limits = time_limits(ref_time, min_time_limit, gt_time_limit_factor)
    total = min(float(os.environ.get("EVALPLUS_TIMEOUT_PER_TASK", 60)), sum(limits)) + 2.0
    cases = [{"inputs": inputs, "time_limits": limits}]
    results = run_tests(
        CaseSpec(code, cases, total, memory_mb, call_method=entry_point, harness="evalplus"), runner
    )
    run = results[0]
    passed, kind, detail = 0, None, ""
    for i, record in enumerate(run.outputs or []):
        if record.get("out") != i or i >= len(inputs):
            kind, detail = "sandbox_error", f"output record {i} is out of order"
            break
        if "error" in record:
            kind, detail = str(record["error"]), run.exception or ""
            break
        try:
            out = unpack(record["value"])
        except (KeyError, TypeError, ValueError, RecursionError) as exc:
            kind, detail = "runtime_error", f"input {i}: unreadable output ({exc})"
            break
        ok, atol = outputs_match(dataset, entry_point, inputs[i], out, expected[i], atol)
        if not ok:
            kind = "wrong_answer"
            detail = f"input {i}: expected {_short(repr(expected[i]))}, got {_short(repr(out))}"
            break
        passed += 1
    status = "pass" if kind is None else "fail"
    if kind is None and passed < len(inputs):  # the run ended before every input was answered
        kind = run.error_kind or "sandbox_error"
        detail = run.exception or run.notes.get("sandbox") or (run.stderr.strip().splitlines() or [""])[-1]
        status = "timeout" if run.timed_out else "fail"  # evalplus: TIMEOUT when its process never ended
    return {
        "status": status,
        "n_inputs": len(inputs),
        "n_passed": passed,
        "error_kind": kind,
        "detail": _short(detail, 400),
        "elapsed_s": round(run.elapsed_s, 3),
        "layers": run.layers,
    }


def sanitize_code(code: str, entry_point: str) -> tuple[str, bool]:
    """(evalplus.sanitize.sanitize(code, entry_point), True), or (code, False) for a long block."""
    if code.count("\n") >= SANITIZE_MAX_LINES:
        return code, False
    from evalplus.sanitize import sanitize

    return sanitize(code, entrypoint=entry_point), True


def grade_evalplus(
    response: str, problem: Mapping[str, Any], expected: Mapping[str, Any], dataset: str, **options: Any
) -> dict[str, Any]:
    """Grade one response to ``problem`` (an evalplus problem) against its ``expected`` outputs
    (``get_groundtruth``'s entry: base, plus, base_time, plus_time).

    ``options`` go to :func:`check_inputs` (memory_mb, time limits, ``runner``). Returns
    ``{"correct", "extracted" (the code run), "sanitized", "reason", "error_kind", "base",
    "plus", "layers"}``; ``base``/``plus`` as :func:`check_inputs` returns them (less layers).
    """
    block = extract_code(response)
    verdict: dict[str, Any] = {"correct": False, "extracted": block, "sanitized": False, "base": None,
                               "plus": None, "layers": {}}  # fmt: skip
    if block is None:
        return {
            **verdict,
            "error_kind": "no_code",
            "reason": "no_code: the response has no complete fenced code block",
        }
    entry_point = problem["entry_point"]
    code, verdict["sanitized"] = sanitize_code(block, entry_point)
    verdict["extracted"] = code
    for part in ("base", "plus"):
        result = check_inputs(code, entry_point, dataset, problem[f"{part}_input"], expected[part],
                              expected[f"{part}_time"], problem["atol"], **options)  # fmt: skip
        layers = result.pop("layers")
        verdict["layers"] = verdict["layers"] or layers
        verdict[part] = result
    base, plus = verdict["base"], verdict["plus"]
    verdict["correct"] = base["status"] == plus["status"] == "pass"
    if verdict["correct"]:
        verdict.update(
            error_kind=None, reason=f"passed {base['n_inputs']} base and {plus['n_inputs']} plus inputs"
        )
        return verdict
    part, failed = ("base", base) if base["status"] != "pass" else ("plus", plus)
    verdict["error_kind"] = failed["error_kind"]
    verdict["reason"] = (
        f"{failed['error_kind']}: {part} input {failed['n_passed'] + 1}/{failed['n_inputs']} failed"
        f" (base {base['status']}, plus {plus['status']})"
        + (f": {failed['detail']}" if failed["detail"] else "")
    )
    return verdict


def ground_truth(dataset: str, version: str = "default") -> tuple[dict, dict, str, str]:
    """(problems, expected outputs by task id, data md5, where the data came from).

    The expected outputs are computed once per process and data file (and cached by evalplus).
    """
    from evalplus.eval._special_oracle import MBPP_OUTPUT_NOT_NONE_TASKS
    from evalplus.evaluate import get_groundtruth

    from aggbench.data.evalplus_source import load_problems

    problems, digest, where = load_problems(dataset, version)
    if (dataset, digest) not in _GROUND_TRUTH:
        not_none = MBPP_OUTPUT_NOT_NONE_TASKS if dataset == "mbpp" else []
        with contextlib.redirect_stdout(sys.stderr):  # evalplus prints its progress
            expected = get_groundtruth(problems, digest, not_none)
        _GROUND_TRUTH[(dataset, digest)] = (problems, expected)
    return *_GROUND_TRUTH[(dataset, digest)], digest, where


def grade_rows(
    rows: Sequence[Mapping[str, Any]], *, workers: int | None = None, **options: Any
) -> list[dict[str, Any]]:
    """Verdicts for sample rows (``id``, ``response``, ``evalplus_dataset``, ``evalplus_version``,
    ``evalplus_hash``), in order.

    The data is loaded and the ground truth computed (or read from evalplus's cache) once per
    dataset; a sample generated from other data (another md5) is an error. Samples are graded
    ``workers`` at a time (threads, each driving its own sandboxes).
    """
    from aggbench.data.evalplus_source import OVERRIDE_ENV

    loaded: dict[tuple[str, str], tuple[dict, dict, str, str]] = {}
    jobs = []
    for n, row in enumerate(rows, start=1):
        dataset = row.get("evalplus_dataset")
        if dataset not in ("humaneval", "mbpp"):
            raise EvalPlusError(
                f"sample {n}: evalplus_dataset must be 'humaneval' or 'mbpp', got {dataset!r}"
            )
        key = (dataset, str(row.get("evalplus_version") or "default"))
        if key not in loaded:
            loaded[key] = ground_truth(*key)
        problems, expected, digest, where = loaded[key]
        if row.get("evalplus_hash") not in (None, digest):
            raise EvalPlusError(
                f"sample {n} was generated from {dataset} data with md5 {row['evalplus_hash']}, but the "
                f"data found now ({where}) has md5 {digest}; point {OVERRIDE_ENV[dataset]} at the same file"
            )
        if row["id"] not in problems:
            raise EvalPlusError(f"sample {n}: task {row['id']!r} is not in the {dataset} data at {where}")
        jobs.append({"response": row["response"], "problem": problems[row["id"]],
                     "expected": expected[row["id"]], "dataset": dataset, **options})  # fmt: skip
    return run_batch(jobs, max_workers=workers, fn=grade_evalplus)
