"""Run model-written Python in a separate, contained process.

Layers, outermost first. Each is probed once; one the kernel refuses is recorded as False in
``SandboxResult.layers`` (the kernel's message in ``notes``) and logged once, never per sample.

1. Linux namespaces through util-linux ``unshare`` (Python 3.11 has no ``os.unshare``): PID (when
   the sandbox's first process exits, the kernel kills every process left in it, ``setsid``'d
   daemons included, and ``kill(-1)`` reaches only the sandbox), network (a down loopback and
   nothing else), IPC, UTS, and mount with its own ``/proc`` and fresh tmpfs over ``/tmp``,
   ``/var/tmp`` and ``/dev/shm`` (scratch files, and writes to ``/tmp/...``, vanish with it). Root
   creates them directly; a normal user inside a new user namespace.
2. An unprivileged identity: as root the code drops to ``drop_uid`` (default 65534, ``nobody``)
   with no groups; always it loses every capability (bounding set too) and gets
   ``no_new_privs``. Python directories the dropped uid cannot read (a pyenv under a 0700
   ``/root``) are bind-mounted read-only into the private ``/tmp`` so imports keep working.
3. rlimits: CPU seconds, address space, file size, processes (on top of what the uid already
   runs: RLIMIT_NPROC counts them all), open files, no core files.
4. Wall-clock timeouts: the runner kills the test's process after ``timeout_s`` and then every
   other process of the sandbox (``kill(-1)`` as the namespace's init, or, with no PID namespace,
   as a child subreaper that every orphan re-parents to); this process kills the whole process
   group if the runner itself stalls, and scans /proc for the run's token when there is no PID
   namespace.
5. evalplus's ``reliability_guard`` inside the child, after the harness's own set-up.

The environment is scrubbed (no variable of this process reaches the code); stdout beyond
``max_output_bytes`` ends the test (``error_kind="output_limit"``), stderr is truncated, so a
1 GB print never reaches this process's memory. Reads of world-readable files are allowed.

Layout: ``this process -> unshare -> runner (pid 1, trusted) -> one forked child per test``. The
runner imports and sets up once, so a test costs a fork, not an interpreter start; expected
outputs never enter the sandbox (the code could find them in its own memory), so comparison and
the decision to stop at the first failure happen here, on the per-test records the runner streams.
The runner and the child are in :mod:`.sandbox_runner`, the probing of the namespaces in
:mod:`.sandbox_probe`.

A run: :func:`run_tests` takes a :class:`CaseSpec` (what is tested: the code, its cases, the
limits of each case) and a :class:`RunnerSpec` (how it runs: the layers, the identity, the other
limits, the interpreter), writes the runner's spec, and :func:`launch` starts the runner.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if __package__:
    from aggbench.grading import sandbox_probe, sandbox_runner
else:  # loaded from its file outside the package (e.g. by a bare interpreter running as another user)
    import importlib.util

    def _sibling(name: str) -> Any:
        where = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py")
        spec = importlib.util.spec_from_file_location(name, where)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module

    sandbox_probe, sandbox_runner = _sibling("sandbox_probe"), _sibling("sandbox_runner")

if TYPE_CHECKING:
    import subprocess

log = logging.getLogger(__name__)
_stop_then_kill = sandbox_runner._stop_then_kill

ERROR_KINDS = (
    "syntax_error",
    "runtime_error",
    "timeout",
    "memory",
    "output_limit",
    "killed",
    "sandbox_error",
)
TOKEN_VAR = "AGGBENCH_SANDBOX_RUN"


@dataclass
class SandboxResult:
    """What one test run did. ``error_kind`` is None when the code ran to its end."""

    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    killed_by_signal: int | None
    error_kind: str | None
    layers: dict[str, bool]
    output_truncated: bool = False
    outputs: list[dict] | None = None  # harness "evalplus": {"out": i, "value"|"error"} per input run
    result_json: str | None = None  # call mode: JSON of the returned value
    exception: str | None = None  # e.g. "ZeroDivisionError: division by zero"
    elapsed_s: float = 0.0
    run_id: str = ""
    notes: dict[str, str] = field(default_factory=dict)  # why a layer is off


Case = str | Sequence[str] | Mapping[str, Sequence]


@dataclass(frozen=True)
class CaseSpec:
    """What is tested: ``code``, run once per case of ``cases`` in order, each case under
    ``timeout_s`` (wall clock; CPU seconds too) and ``memory_mb`` (address space).

    Script mode (``call_method`` None): each case is the stdin text and the code runs as
    ``__main__``. Call mode: each case is a list of JSON literals; after the code runs,
    ``Solution().<call_method>(*args)`` is called and the JSON of its value (a top-level tuple
    becomes a list, as in LiveCodeBench) comes back in ``result_json``. ``harness="evalplus"``
    (needs ``call_method``, the function name): each case is ``{"inputs": [args tuple, ...],
    "time_limits": [seconds, ...]}``; the code runs once as evalplus runs it and the function is
    called on every input in order, each value coming back in ``outputs`` (see
    :mod:`.sandbox_calls`); ``timeout_s`` bounds the whole case. Expected outputs are no part of
    it: they never enter the sandbox.
    """

    code: str
    cases: Sequence[Case]
    timeout_s: float
    memory_mb: int
    call_method: str | None = None
    harness: str = "lcb"


@dataclass(frozen=True)
class RunnerSpec:
    """How the code is run: the layers of the module docstring and the limits beyond time and
    memory. The defaults are the whole sandbox.

    ``max_output_bytes``: stdout beyond it ends the test (``output_limit``); ``max_stderr_bytes``:
    stderr beyond it is cut; ``max_procs``: processes on top of what the uid already runs;
    ``max_file_mb``, ``max_open_files``; ``tmpfs_mb``: the size of the private /tmp. ``drop_uid``
    applies only when this process is root; ``drop_uid=None`` as root leaves the code uid 0
    without capabilities, which still owns root's files: for debugging only.
    ``namespaces=False``/``guard=False`` switch those layers off. ``python``: the runner's
    interpreter [this one]. ``preload``: modules imported before the guard when installed
    (LiveCodeBench's harness has numpy imported, so `import numpy` works there; after the guard
    numpy cannot import itself). ``startup_slack_s``: the runner's start-up time allowed before
    its first record is due.
    """

    max_output_bytes: int = 16 << 20
    max_stderr_bytes: int = 64 << 10
    max_procs: int = 64
    max_file_mb: int = 16
    max_open_files: int = 256
    tmpfs_mb: int = 64
    drop_uid: int | None = 65534
    namespaces: bool = True
    guard: bool = True
    python: str | None = None
    preload: Sequence[str] = ("numpy",)
    startup_slack_s: float = 15.0


DEFAULT_RUNNER = RunnerSpec()


# ------------------------------------------------------------------- refused layers, /proc scans
_warned: set[str] = set()


def _warn_once(layers: Mapping[str, bool], reasons: Mapping[str, str]) -> None:
    for name, ok in layers.items():
        if not ok and name not in _warned:
            _warned.add(name)
            why = reasons.get(name)
            log.warning("sandbox layer %r is unavailable here%s", name, f": {why}" if why else "")


def _tasks_of_uid(uid: int) -> int:
    """Threads the uid runs now, machine-wide."""
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.stat(f"/proc/{name}").st_uid == uid:
                    with open(f"/proc/{name}/status") as fh:
                        total += next((int(ln.split()[1]) for ln in fh if ln.startswith("Threads:")), 1)
            except (OSError, ValueError):
                continue
    return total


def _token_holders(token: str) -> set[int]:
    needle, found = f"{TOKEN_VAR}={token}".encode(), set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read():
                    found.add(int(name))
    return found


# ------------------------------------------------------------------------------- the parent
def run_sandboxed(
    code: str,
    *,
    stdin: str = "",
    timeout_s: float,
    memory_mb: int,
    call_method: str | None = None,
    call_args_json: Sequence[str] = (),
    runner: RunnerSpec = DEFAULT_RUNNER,
) -> SandboxResult:
    """Run ``code`` once: on ``stdin`` (script mode) or, with ``call_method``, on one call of its
    arguments ``call_args_json``; ``runner`` as for :func:`run_tests`."""
    one = list(call_args_json) if call_method else stdin
    return run_tests(CaseSpec(code, [one], timeout_s, memory_mb, call_method=call_method), runner)[0]


def run_tests(
    case: CaseSpec,
    runner: RunnerSpec = DEFAULT_RUNNER,
    *,
    on_result: Callable[[int, SandboxResult], bool] | None = None,
) -> list[SandboxResult]:
    """Run the cases of ``case`` in order in one sandbox set up as ``runner`` says, a fresh forked
    process per case (see :class:`CaseSpec` for the modes). ``on_result(i, result)`` returning
    False stops the run (the rest is not executed), so results can be shorter than ``case.cases``;
    a runner that dies or stalls adds one last result saying so (``notes["sandbox"]``).
    """
    import shutil
    import tempfile
    import uuid

    run_id = uuid.uuid4().hex
    flags, ns_layers, ns_errors = sandbox_probe.probe_namespaces() if runner.namespaces else ([], {}, {})
    target_uid = runner.drop_uid if (os.geteuid() == 0 and runner.drop_uid is not None) else os.geteuid()
    workdir = tempfile.mkdtemp(prefix="aggbench-sbx-")
    results: list[SandboxResult] = []
    proc = None
    try:
        scratch = os.path.join(workdir, "work")  # the cwd when there is no private /tmp
        os.mkdir(scratch, 0o700)
        if target_uid != os.geteuid():
            os.chmod(workdir, 0o711)
            os.chown(scratch, target_uid, target_uid)
        cases = _write_cases(case, workdir)
        spec = _runner_input(case, runner, cases, scratch, target_uid, ns_layers)
        proc, meta_r = launch(spec, workdir, run_id, flags, runner.python)
        header, runner_out, outcome = _stream(proc, meta_r, case, runner.startup_slack_s, results,
                                              ns_layers, ns_errors, run_id, on_result)  # fmt: skip
    finally:
        if proc is not None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if not ns_layers.get("pidns"):
                _stop_then_kill(lambda: _token_holders(run_id))
        shutil.rmtree(workdir, ignore_errors=True)
    if outcome in ("stalled", "ended"):  # the runner died or stalled before finishing
        stalled = outcome == "stalled"
        why = "the runner stalled past its deadline" if stalled else "the runner ended early"
        layers = {**ns_layers, **header.get("layers", {})}
        results.append(SandboxResult("", runner_out[-4000:], proc.returncode if proc else None, stalled, None,
                                     "timeout" if stalled else "sandbox_error", layers, run_id=run_id,
                                     notes={"sandbox": why}))  # fmt: skip
    if runner.namespaces and runner.guard and results:
        _warn_once(results[0].layers, results[0].notes)
    return results


def _write_cases(case: CaseSpec, workdir: str) -> list[dict]:
    """The cases as the runner reads them: stdin texts written to files in ``workdir``, call
    arguments checked to be JSON literals, evalplus inputs packed beside their time limits.
    ValueError for a harness or a case that cannot run."""
    harness, call_method = case.harness, case.call_method
    if harness not in ("lcb", "evalplus") or (harness == "evalplus" and not call_method):
        raise ValueError(f"harness must be 'lcb' or 'evalplus' (with call_method), not {harness!r}")
    spec_cases = []
    for i, one in enumerate(case.cases):
        if harness == "evalplus":
            from aggbench.grading.sandbox_calls import pack

            inputs, limits = one["inputs"], [float(t) for t in one["time_limits"]]  # type: ignore[index]
            if len(inputs) != len(limits):
                raise ValueError(f"case {i}: {len(inputs)} inputs but {len(limits)} time_limits")
            spec_cases.append({"stdin_path": None, "args_json": [], "inputs": [pack(list(a)) for a in inputs],
                               "time_limits": limits})  # fmt: skip
            continue
        if call_method is not None:
            for j, arg in enumerate(one):
                try:
                    json.loads(arg)
                except ValueError as exc:
                    raise ValueError(
                        f"case {i}, argument {j}: not a JSON literal ({exc}): {arg[:80]!r}"
                    ) from None
            spec_cases.append({"stdin_path": None, "args_json": list(one)})
        else:
            path = os.path.join(workdir, f"stdin_{i}.txt")
            with open(path, "w") as fh:
                fh.write(one)  # type: ignore[arg-type]
            spec_cases.append({"stdin_path": path, "args_json": []})
    return spec_cases


def _runner_input(
    case: CaseSpec,
    runner: RunnerSpec,
    cases: list[dict],
    scratch: str,
    uid: int,
    ns_layers: Mapping[str, bool],
) -> dict[str, Any]:
    """The runner's spec (JSON): the case, its limits and the layers to set up, for code run as ``uid``."""
    return {
        "code": case.code,
        "call_method": case.call_method,
        "cases": cases,
        "timeout_s": case.timeout_s,
        "memory_bytes": int(case.memory_mb) << 20,
        "max_output_bytes": runner.max_output_bytes,
        "max_stderr_bytes": runner.max_stderr_bytes,
        "max_file_bytes": int(runner.max_file_mb) << 20,
        "max_open_files": runner.max_open_files,
        "max_procs": runner.max_procs + (0 if ns_layers.get("userns") else _tasks_of_uid(uid)),
        "drop_uid": uid if uid != os.geteuid() else None,
        "mountns": bool(ns_layers.get("mountns")),
        "pidns": bool(ns_layers.get("pidns")),
        "tmpfs_mb": runner.tmpfs_mb,
        "scratch": scratch,
        # the guard's SOURCE travels in the spec: the runner may not see the file (the venv can
        # live under /tmp, which the mount namespace replaces with a private tmpfs)
        "guard_source": sandbox_probe.evalplus_guard_source() if runner.guard else None,
        "preload": list(runner.preload),
        "harness": case.harness,
    }


def launch(
    spec: Mapping[str, Any], workdir: str, run_id: str, flags: Sequence[str], python: str | None
) -> tuple[subprocess.Popen, int]:
    """Start the runner on ``spec`` (written to ``workdir``/spec.json) behind the ``unshare``
    prefix ``flags``, in ``workdir``, in a new session, with a scrubbed environment that carries
    the run's token. Returns (the runner's process, the read end of the pipe of its records)."""
    import subprocess

    spec_path = os.path.join(workdir, "spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        **dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1"),
        "HOME": "/tmp" if spec["mountns"] else spec["scratch"],
        "TMPDIR": "/tmp" if spec["mountns"] else spec["scratch"],
        TOKEN_VAR: run_id,
    }
    meta_r, meta_w = os.pipe()
    here = os.path.abspath(sandbox_runner.__file__)
    cmd = [*flags, python or sys.executable, "-I", "-B", here, "--runner", spec_path, str(meta_w)]
    try:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            cwd=workdir, pass_fds=(meta_w,), start_new_session=True,
        )  # fmt: skip
    except BaseException:
        os.close(meta_r)
        raise
    finally:
        os.close(meta_w)
    return proc, meta_r


def _stream(proc, meta_r, case, slack, results, ns_layers, ns_errors, run_id, on_result):
    """Turn the runner's per-test records into results: "done", "stopped", "stalled" or "ended"."""
    n_cases, timeout_s = len(case.cases), case.timeout_s
    out_fd = proc.stdout.fileno()
    bufs = {meta_r: bytearray(), out_fd: bytearray()}
    header: dict[str, Any] = {}
    deadline = time.monotonic() + slack + timeout_s + 5
    outcome, scan_from = "ended", 0
    with contextlib.ExitStack() as stack:
        stack.callback(os.close, meta_r)
        stack.callback(proc.stdout.close)
        open_fds = {meta_r, out_fd}
        while open_fds:
            if len(results) == n_cases:
                outcome = "done"
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome = "stalled"
                break
            ready, _, _ = select.select(list(open_fds), [], [], remaining)
            for fd in ready:
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    open_fds.discard(fd)
                elif fd == out_fd:  # the runner's own messages (tracebacks); the tests' go in records
                    bufs[fd] = (bufs[fd] + chunk)[-65536:]
                else:
                    bufs[fd] += chunk
            while (end := bufs[meta_r].find(b"\n", scan_from)) >= 0:
                record = json.loads(bytes(bufs[meta_r][:end]))
                del bufs[meta_r][: end + 1]
                scan_from = 0
                if "layers" in record and "i" not in record:
                    header = record
                    continue
                result = _to_result(record, case, {**ns_layers, **header.get("layers", {})},
                                    {**ns_errors, **header.get("errors", {})}, run_id)  # fmt: skip
                results.append(result)
                deadline = time.monotonic() + timeout_s + 10  # the runner's own clean-up takes some
                if on_result is not None and not on_result(len(results) - 1, result):
                    return header, bufs[out_fd].decode(errors="replace"), "stopped"
            scan_from = len(bufs[meta_r])
    return header, bufs[out_fd].decode(errors="replace"), outcome


def _to_result(rec: dict, case: CaseSpec, layers: dict, reasons: dict, run_id: str) -> SandboxResult:
    status, sig, code = rec.get("status"), rec.get("signal"), rec.get("exit_code")
    layers = {**layers, **rec.get("layers", {})}
    kind: str | None
    if rec.get("overflow"):
        kind = "output_limit"
    elif rec.get("timed_out") or sig == signal.SIGXCPU:
        kind = "timeout"
    elif not rec.get("layers"):  # the child died in set-up, before the code ran
        kind = "sandbox_error"
    elif status and status.get("kind") in (
        "syntax_error",
        "runtime_error",
        "memory",
        "output_limit",
        "timeout",
    ):
        kind = status["kind"]
    elif sig is not None:
        kind = "killed"
    elif status is None and code != 0:
        kind = "runtime_error"
    elif case.call_method and (status is None or (case.harness == "lcb" and status.get("value") is None)):
        kind = "runtime_error"  # exited (os._exit, exit()) before returning a value
    else:
        kind = None
    return SandboxResult(
        stdout=rec.get("stdout", ""),
        stderr=rec.get("stderr", ""),
        returncode=code,
        timed_out=bool(rec.get("timed_out")),
        killed_by_signal=sig,
        error_kind=kind,
        layers=layers,
        output_truncated=bool(rec.get("overflow")),
        result_json=(status or {}).get("value"),
        outputs=rec.get("outputs") if case.harness == "evalplus" else None,
        exception=(status or {}).get("exception"),
        elapsed_s=rec.get("elapsed", 0.0),
        run_id=run_id,
        notes={k: v for k, v in reasons.items() if not layers.get(k, True)},
    )


def run_batch(
    jobs: Sequence[Mapping[str, Any]],
    *,
    max_workers: int | None = None,
    fn: Callable[..., Any] = run_sandboxed,
) -> list[Any]:
    """``fn(**job)`` for every job (default :func:`run_sandboxed`), ``max_workers`` at a time."""
    from concurrent.futures import ThreadPoolExecutor

    workers = max(1, min(max_workers or os.cpu_count() or 1, len(jobs) or 1))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sandbox") as pool:
        return list(pool.map(lambda job: fn(**job), jobs))
