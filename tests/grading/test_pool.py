"""GradingPool: order, reuse, deadlines, crashes, errors, and speed for training rewards.

The workers must import a task's function, and pytest's importlib mode gives test modules names
nothing else can import, so most tasks here are ``eval`` of a small expression: the expression
decides whether the task sleeps, raises or kills its worker.
"""

from __future__ import annotations

import time

import pytest

from aggbench.grading.math import MathVerdict, grade_math_batch
from aggbench.grading.pool import GradingPool, default_failure

SLEEP = "__import__('time').sleep({}) or {}"  # sleep, then return a value
CRASH = "__import__('os')._exit(3)"  # a worker dying without a word (segfault, OOM killer)


def uneven(i: int) -> str:
    return SLEEP.format(0.002 * (i % 3), 2 * i)  # uneven durations: workers finish out of order


@pytest.fixture(scope="module")
def pool():
    with GradingPool(workers=2, timeout_s=2.0) as p:
        yield p


def test_results_come_back_in_input_order(pool):
    assert pool.map(eval, [uneven(i) for i in range(300)]) == [2 * i for i in range(300)]


def test_small_chunks_keep_the_order_too():
    with GradingPool(workers=2, timeout_s=5.0, chunk_size=3, preload=()) as p:
        assert p.map(eval, [uneven(i) for i in range(50)]) == [2 * i for i in range(50)]


def test_workers_are_reused_across_calls(pool):
    pids = pool.pids
    pool.map(eval, [uneven(i) for i in range(20)])
    pool.map(eval, [uneven(i) for i in range(20)])
    assert pool.pids == pids
    assert pool.map(eval, []) == []


def test_progress_counts_every_item_once(pool):
    seen: list[int] = []
    pool.map(eval, [uneven(i) for i in range(40)] + ["1 / 0"], progress=seen.append)
    assert sum(seen) == 41
    assert all(k > 0 for k in seen)


def test_fn_by_module_and_name(pool):
    assert pool.map("operator:neg", [1, 2, 3]) == [-1, -2, -3]
    bad = pool.map("operator:no_such_function", [1, 2])
    assert all(r["correct"] is False for r in bad)
    assert all(
        r["reason"].startswith("error: cannot load the task in the worker: AttributeError") for r in bad
    )


def test_a_task_past_its_deadline_fails_and_its_worker_is_replaced(pool):
    pids = set(pool.pids)
    replaced = pool.replaced
    t0 = time.monotonic()
    out = pool.map(eval, [SLEEP.format(t, t) for t in (0.0, 0.01, 60.0, 0.0, 0.02)])
    elapsed = time.monotonic() - t0
    assert out[2] == default_failure("timeout") == {"correct": False, "extracted": None, "reason": "timeout"}
    assert [out[i] for i in (0, 1, 3, 4)] == [0.0, 0.01, 0.0, 0.02]
    assert elapsed < 10, elapsed  # the 60 s task was cut at ~2 s
    assert pool.replaced == replaced + 1
    assert len(set(pool.pids) - pids) == 1
    assert pool.map(eval, ["1 + 1", "2 + 2"]) == [2, 4]  # the pool still works


def test_per_item_deadlines(pool):
    out = pool.map(eval, [SLEEP.format(0.5, 1), SLEEP.format(0.5, 2)], timeouts=[0.2, 5.0])
    assert out == [default_failure("timeout"), 2]
    with pytest.raises(ValueError, match="timeouts has 1 entries for 2 items"):
        pool.map(eval, ["0", "0"], timeouts=[1.0])


def test_a_crashed_worker_is_replaced_and_the_rest_of_its_chunk_still_runs():
    with GradingPool(workers=2, timeout_s=5.0, chunk_size=4, preload=()) as p:
        items = [str(i) if i not in (2, 7) else CRASH for i in range(10)]
        out = p.map(eval, items)
        assert out[2] == out[7] == default_failure("worker_crashed")
        assert [out[i] for i in range(10) if i not in (2, 7)] == [0, 1, 3, 4, 5, 6, 8, 9]
        assert p.replaced == 2
        assert p.map(eval, ["3"]) == [3]


def test_an_exception_in_fn_is_a_failure_not_a_crash(pool):
    pids = pool.pids
    out = pool.map(eval, ["1 / 2", "1 / 0", "1 / 4"])
    assert out[0] == 0.5 and out[2] == 0.25
    assert out[1]["correct"] is False
    assert out[1]["reason"].startswith("error: ZeroDivisionError")
    assert pool.pids == pids


def test_custom_failure_values(pool):
    out = pool.map(eval, ["1 / 0"], failure=lambda reason: ("failed", reason))
    assert out[0][0] == "failed" and "ZeroDivisionError" in out[0][1]


def test_an_interrupted_map_does_not_leak_into_the_next():
    with GradingPool(workers=1, timeout_s=5.0, chunk_size=50, preload=()) as p:

        def boom(reason: str):
            raise KeyboardInterrupt  # e.g. Ctrl-C while map() waits

        with pytest.raises(KeyboardInterrupt):
            p.map(eval, ["1 / 0"] + [SLEEP.format(0.01, 1)] * 49, failure=boom)
        assert p.map(eval, ["5 * 2", "6 * 2"]) == [10, 12]


def test_closed_pool_and_bad_arguments():
    p = GradingPool(workers=1, timeout_s=1.0, preload=())
    p.close()
    p.close()  # idempotent
    with pytest.raises(RuntimeError, match="after close"):
        p.map(eval, ["1"])
    with pytest.raises(ValueError, match="workers"):
        GradingPool(workers=0)
    with pytest.raises(ValueError, match="fork"):
        GradingPool(workers=1, context="fork")
    with pytest.raises(ValueError, match="timeout_s"):
        GradingPool(workers=1, timeout_s=0)


def test_a_worker_that_cannot_start_is_reported():
    with (
        pytest.raises(RuntimeError, match="before it was ready"),
        GradingPool(workers=1, timeout_s=1.0, preload=("aggbench.no_such_module",)) as p,
    ):
        p.map(eval, ["1"])


def test_a_function_the_worker_cannot_import_fails_its_items_clearly(pool):
    """A function defined in this test module: the worker cannot import it (importlib mode)."""
    pids = pool.pids
    out = pool.map(uneven, [1, 2])
    if out == [uneven(1), uneven(2)]:
        pytest.skip(
            "the worker could import this test module (pytest is not in --import-mode=importlib, "
            "as pyproject.toml sets), so there is no unimportable function to test with"
        )
    assert all(r["reason"].startswith("error: cannot load the task in the worker") for r in out)
    assert pool.pids == pids
    with pytest.raises(TypeError, match="module-level function"):
        pool.map(lambda x: x, [1])


def test_64_short_responses_grade_well_under_a_second_on_a_warm_pool():
    """Training rewards: one GRPO step's responses, graded between two optimiser steps."""
    golds = ["25", "\\frac{1}{2}", "3\\sqrt{2}", "(1,2)"] * 16
    answers = ["25", "0.5", "\\sqrt{18}", "(1, 2)", "24", "\\frac{1}{3}", "3\\sqrt{3}", "(2,1)"] * 8
    responses = [f"Let me think step by step. 2+2=4. So the answer is \\boxed{{{a}}}." for a in answers]
    with GradingPool(workers=2, timeout_s=10.0) as p:
        first = grade_math_batch(responses, golds, pool=p)  # warm: imports done, answers parsed
        best = float("inf")
        for _ in range(3):
            t0 = time.monotonic()
            again = grade_math_batch(responses, golds, pool=p)
            best = min(best, time.monotonic() - t0)
    assert again == first
    assert [v.correct for v in first[:8]] == [True] * 4 + [False] * 4
    assert all(isinstance(v, MathVerdict) for v in first)
    print(f"\n64 responses on a warm 2-worker pool: {best * 1000:.0f} ms")
    assert best < 1.0
