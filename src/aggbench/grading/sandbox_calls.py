"""Calling one function on many inputs inside the sandbox, as EvalPlus does, and carrying values.

Used by :mod:`aggbench.grading.evalplus_grader` through ``run_tests(CaseSpec(..., harness="evalplus"))``.
The runner (:mod:`.sandbox_runner`) loads this file by path (standard library only, no aggbench
import) and its forked child calls :func:`call_each`: the code is executed in an empty namespace,
then ``entry_point(*inp)`` is called on every input in order, each under its own time limit, with
the code's prints swallowed and stdin unreadable, as in ``evalplus.eval.unsafe_execute`` (0.3.1).
One line per input goes out on the status pipe, ``{"out": i, "value": PACKED}`` or ``{"out": i,
"error": KIND}``; the run stops at the first input that raises or times out. Expected outputs never
enter the sandbox: the harness compares the carried values with evalplus's rule outside.

Values cross the process boundary as JSON with tags (:func:`pack` / :func:`unpack`), so that the
types evalplus's ``out == expected`` distinguishes survive: tuple vs list, set, frozenset, dicts
with non-string keys, complex, bytes, integers of any size, inf and nan. Nothing is unpickled.
"""

from __future__ import annotations

import contextlib
import io
import signal
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

TAG = "__aggbench_value__"
_BIG_INT_BITS = 8192  # beyond this, an int travels as hex (decimal conversion of huge ints is capped)
_CONTAINERS: dict[str, Callable[[list], Any]] = {"tuple": tuple, "set": set, "frozenset": frozenset}


def pack(value: Any) -> Any:
    """A JSON-ready form of ``value``; TypeError for a type that cannot be carried (e.g. a class)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value) if value.bit_length() <= _BIG_INT_BITS else {TAG: "int", "v": hex(value)}
    if isinstance(value, float):
        return float(value)
    if isinstance(value, list):
        return [pack(v) for v in value]
    for name, kind in _CONTAINERS.items():
        if isinstance(value, kind):
            return {TAG: name, "v": [pack(v) for v in value]}
    if isinstance(value, dict):
        return {TAG: "dict", "v": [[pack(k), pack(v)] for k, v in value.items()]}
    if isinstance(value, complex):
        return {TAG: "complex", "v": [value.real, value.imag]}
    if isinstance(value, bytes | bytearray):
        return {TAG: "bytes", "v": bytes(value).hex()}
    if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a numpy scalar
        return pack(value.item())
    raise TypeError(f"a {type(value).__name__} cannot be carried out of the sandbox")


def unpack(obj: Any) -> Any:
    """The value :func:`pack` packed; ValueError for a malformed packed value."""
    if isinstance(obj, list):
        return [unpack(v) for v in obj]
    if not isinstance(obj, dict):
        return obj
    kind, items = obj.get(TAG), obj.get("v")
    if kind in _CONTAINERS and isinstance(items, list):
        return _CONTAINERS[kind](unpack(v) for v in items)
    if kind == "dict" and isinstance(items, list) and all(isinstance(p, list) and len(p) == 2 for p in items):
        return {unpack(k): unpack(v) for k, v in items}
    if kind == "complex" and isinstance(items, list) and len(items) == 2:
        return complex(*items)
    if kind == "bytes" and isinstance(items, str):
        return bytes.fromhex(items)
    if kind == "int" and isinstance(items, str):
        return int(items, 16)
    raise ValueError(f"not a packed value: {str(obj)[:80]}")


class InputTimeout(Exception):
    """Raised inside the code when one input's time limit passes (evalplus's TimeoutException)."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """As ``evalplus.eval.utils.time_limit``: SIGALRM after ``seconds`` raises :class:`InputTimeout`."""

    def handler(signum: int, frame: Any) -> None:
        raise InputTimeout("Timed out!")

    signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.signal(signal.SIGALRM, handler)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


class _WriteOnly(io.StringIO):
    def read(self, *args: Any, **kwargs: Any) -> str:
        raise OSError("stdin is not readable here")

    readline = read

    def readable(self) -> bool:
        return False


@contextlib.contextmanager
def swallow_io() -> Iterator[None]:
    """As ``evalplus.eval.utils.swallow_io``: prints go nowhere, reading stdin raises."""
    stream, stdin = _WriteOnly(), sys.stdin
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
        sys.stdin = stream
        try:
            yield
        finally:
            sys.stdin = stdin


def call_each(
    compiled: Any, entry_point: str, case: Mapping[str, Any], namespace: dict, send: Callable[[dict], None]
) -> tuple[dict, int]:
    """Run the code, then ``entry_point(*inp)`` per input; one line per input through ``send``.

    Returns the final status and exit code for the child. An exception while running the code
    itself (or a missing entry point) propagates to the child's own handler.
    """
    with swallow_io():
        exec(compiled, namespace)  # noqa: S102 - this is the sandboxed child
    if not callable(namespace.get(entry_point)):
        raise NameError(f"the code defines no function {entry_point!r}")
    fn = namespace[entry_point]
    for i, (packed, limit) in enumerate(zip(case["inputs"], case["time_limits"], strict=True)):
        args = unpack(packed)
        try:
            with time_limit(limit), swallow_io():
                out = fn(*args)
        except InputTimeout:
            send({"out": i, "error": "timeout"})
            return {"kind": "timeout", "exception": f"input {i}: over its time limit of {limit:.3g} s"}, 1
        except BaseException as exc:  # noqa: BLE001 - every failure of the code is reported
            kind = "memory" if isinstance(exc, MemoryError) else "runtime_error"
            send({"out": i, "error": kind})
            return {"kind": kind, "exception": f"input {i}: {type(exc).__name__}: {exc}"[:2000]}, 1
        try:
            send({"out": i, "value": pack(out)})
        except (TypeError, ValueError, RecursionError) as exc:
            return {"kind": "runtime_error", "exception": f"input {i}: output not carried: {exc}"[:2000]}, 1
    return {"kind": "ok"}, 0
