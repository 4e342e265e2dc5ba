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
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

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
# LiveCodeBench runs every solution after a header of star imports and plain imports of these
# modules (lcb_runner IMPORT_STRING; LeetCode starter code uses `List` without importing it) and
# raises the recursion limit; the same names are bound here, in the same order.
LCB_PLAIN_MODULES = (
    *("string", "re", "datetime", "collections", "heapq", "bisect", "copy", "math", "random"),
    *("statistics", "itertools", "functools", "operator", "io", "sys", "json"),
)
LCB_STAR_MODULES = (*LCB_PLAIN_MODULES, "builtins", "typing")
LCB_RECURSION_LIMIT = 50000
LCB_INT_MAX_STR_DIGITS = 50000
# imported by the runner before any identity drop, so the child never needs to read them
_PRELOAD = (
    *LCB_STAR_MODULES,
    "ctypes",
    "resource",
    "traceback",
    "threading",
    "subprocess",
    "shutil",
    "platform",
)
_NS_FLAGS = {
    "pidns": (["--pid", "--fork", "--kill-child", "--mount-proc"], ["--pid", "--fork", "--kill-child"]),
    "netns": (["--net"],),
    "ipcns": (["--ipc"],),
    "utsns": (["--uts"],),
    "mountns": (["--mount"],),
}


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
    result_json: str | None = None  # call mode: JSON of the returned value
    exception: str | None = None  # e.g. "ZeroDivisionError: division by zero"
    elapsed_s: float = 0.0
    run_id: str = ""
    notes: dict[str, str] = field(default_factory=dict)  # why a layer is off


# ---------------------------------------------------------------------------------- probing
_probe_lock = threading.Lock()
_probe_cache: tuple[list[str], dict[str, bool], dict[str, str]] | None = None
_warned: set[str] = set()


def _try_unshare(cmd: list[str]) -> str | None:
    """None when ``unshare FLAGS true`` works, else the kernel's refusal as unshare printed it."""
    import shutil
    import subprocess

    try:
        proc = subprocess.run(
            [*cmd, shutil.which("true") or "/bin/true"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit status {proc.returncode}")


def probe_namespaces() -> tuple[list[str], dict[str, bool], dict[str, str]]:
    """(unshare command prefix, layers, refusals) for this machine and user; cached per process."""
    import shutil

    global _probe_cache
    with _probe_lock:
        if _probe_cache is not None:
            return _probe_cache
        layers = dict.fromkeys(_NS_FLAGS, False)
        errors: dict[str, str] = {}
        unshare = shutil.which("unshare") or next(
            (p for p in ("/usr/bin/unshare",) if os.path.exists(p)), None
        )
        base = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
        chosen: list[str] = []
        if base:
            layers["userns"] = False
        if unshare is None:
            errors = dict.fromkeys(layers, "the util-linux `unshare` binary is not on PATH")
        elif base and (err := _try_unshare([unshare, *base])) is not None:
            errors = dict.fromkeys(layers, f"user namespace refused: {err}")
        else:
            if base:
                layers["userns"] = True
            for name, options in _NS_FLAGS.items():
                for opt in options:
                    if (err := _try_unshare([unshare, *base, *opt])) is None:
                        layers[name] = True
                        chosen += opt
                        errors.pop(name, None)
                        break
                    errors[name] = err
            if "--mount-proc" in chosen and "--mount" in chosen:
                chosen.remove("--mount")
            if chosen and (err := _try_unshare([unshare, *base, *chosen])) is not None:
                errors = dict.fromkeys(layers, f"each namespace alone works, together they fail: {err}")
                layers, chosen = dict.fromkeys(layers, False), []
            if base and not chosen:  # a user namespace alone isolates nothing: not used
                layers["userns"] = False
                errors.setdefault("userns", "no other namespace could be created inside it")
        _probe_cache = ([unshare, *base, *chosen] if chosen else [], layers, errors)
        return _probe_cache


def _warn_once(layers: Mapping[str, bool], reasons: Mapping[str, str]) -> None:
    for name, ok in layers.items():
        if not ok and name not in _warned:
            _warned.add(name)
            why = reasons.get(name)
            log.warning("sandbox layer %r is unavailable here%s", name, f": {why}" if why else "")


def _evalplus_guard_source() -> str | None:
    path = _evalplus_guard_path()
    if path is None:
        return None
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _evalplus_guard_path() -> str | None:
    """evalplus/eval/utils.py, located without importing evalplus.eval (that pulls numpy, ~0.2 s)."""
    import importlib.util

    spec = importlib.util.find_spec("evalplus")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        if os.path.isfile(path := os.path.join(loc, "eval", "utils.py")):
            return path
    return None


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


def _stop_then_kill(find: Callable[[], set[int]], rounds: int = 200) -> set[int]:
    """SIGSTOP what ``find`` returns until it returns nothing new, then SIGKILL it all.

    Killing one by one loses to a fork bomb (each round its survivors refill the process
    limit); a stopped process cannot fork, so the stop sweeps converge.
    """
    stopped: set[int] = set()
    for _ in range(rounds):
        new = find() - stopped
        if not new:
            break
        for pid in new:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGSTOP)
        stopped |= new
    for pid in stopped | find():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return stopped


def _token_holders(token: str) -> set[int]:
    needle, found = f"{TOKEN_VAR}={token}".encode(), set()
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            with contextlib.suppress(OSError), open(f"/proc/{name}/environ", "rb") as fh:
                if needle in fh.read():
                    found.add(int(name))
    return found


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError), open(f"/proc/{name}/stat") as fh:
                children.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(name))
    found, todo = set(), [root]
    while todo:
        for kid in children.get(todo.pop(), ()):
            if kid not in found:
                found.add(kid)
                todo.append(kid)
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
    **options: Any,
) -> SandboxResult:
    """Run ``code`` once: on ``stdin`` (script mode) or, with ``call_method``, on one call.

    ``options``: any keyword of :func:`run_tests` (limits, ``drop_uid``, ``namespaces``, ...).
    """
    case = list(call_args_json) if call_method else stdin
    return run_tests(
        code, [case], timeout_s=timeout_s, memory_mb=memory_mb, call_method=call_method, **options
    )[0]


def run_tests(
    code: str,
    cases: Sequence[str | Sequence[str]],
    *,
    timeout_s: float,
    memory_mb: int,
    call_method: str | None = None,
    on_result: Callable[[int, SandboxResult], bool] | None = None,
    max_output_bytes: int = 16 << 20,
    max_stderr_bytes: int = 64 << 10,
    max_procs: int = 64,
    max_file_mb: int = 16,
    max_open_files: int = 256,
    tmpfs_mb: int = 64,
    drop_uid: int | None = 65534,
    namespaces: bool = True,
    guard: bool = True,
    python: str | None = None,
    preload: Sequence[str] = ("numpy",),
    startup_slack_s: float = 15.0,
) -> list[SandboxResult]:
    """Run ``code`` once per case, in order, in one sandbox; a fresh forked process per case.

    Script mode: each case is the stdin text and the code runs as ``__main__``. Call mode
    (``call_method`` set): each case is a list of JSON literals; after the code runs,
    ``Solution().<call_method>(*args)`` is called and the JSON of its value (a top-level tuple
    becomes a list, as in LiveCodeBench) comes back in ``result_json``. ``timeout_s`` and
    ``memory_mb`` hold per case. ``on_result(i, result)`` returning False stops the run (the
    rest is not executed), so results can be shorter than ``cases``. ``drop_uid`` applies only
    when this process is root; ``namespaces=False``/``guard=False`` switch those layers off.
    ``preload``: modules imported before the guard when installed (LiveCodeBench's harness has
    numpy imported, so `import numpy` works there; after the guard numpy cannot import itself).
    ``drop_uid=None`` as root leaves the code uid 0 without capabilities, which still owns
    root's files: for debugging only.
    """
    import shutil
    import subprocess
    import tempfile
    import uuid

    run_id = uuid.uuid4().hex
    flags, ns_layers, ns_errors = probe_namespaces() if namespaces else ([], {}, {})
    target_uid = drop_uid if (os.geteuid() == 0 and drop_uid is not None) else os.geteuid()
    workdir = tempfile.mkdtemp(prefix="aggbench-sbx-")
    results: list[SandboxResult] = []
    proc = None
    try:
        scratch = os.path.join(workdir, "work")  # the cwd when there is no private /tmp
        os.mkdir(scratch, 0o700)
        if target_uid != os.geteuid():
            os.chmod(workdir, 0o711)
            os.chown(scratch, target_uid, target_uid)
        spec_cases = []
        for i, case in enumerate(cases):
            if call_method is not None:
                for j, arg in enumerate(case):
                    try:
                        json.loads(arg)
                    except ValueError as exc:
                        raise ValueError(
                            f"case {i}, argument {j}: not a JSON literal ({exc}): {arg[:80]!r}"
                        ) from None
            if call_method is None:
                path = os.path.join(workdir, f"stdin_{i}.txt")
                with open(path, "w") as fh:
                    fh.write(case)
                spec_cases.append({"stdin_path": path, "args_json": []})
            else:
                spec_cases.append({"stdin_path": None, "args_json": list(case)})
        spec = {
            "code": code,
            "call_method": call_method,
            "cases": spec_cases,
            "timeout_s": timeout_s,
            "memory_bytes": int(memory_mb) << 20,
            "max_output_bytes": max_output_bytes,
            "max_stderr_bytes": max_stderr_bytes,
            "max_file_bytes": int(max_file_mb) << 20,
            "max_open_files": max_open_files,
            "max_procs": max_procs + (0 if ns_layers.get("userns") else _tasks_of_uid(target_uid)),
            "drop_uid": target_uid if target_uid != os.geteuid() else None,
            "mountns": bool(ns_layers.get("mountns")),
            "pidns": bool(ns_layers.get("pidns")),
            "tmpfs_mb": tmpfs_mb,
            "scratch": scratch,
            # the guard's SOURCE travels in the spec: the runner may not see the file (the venv can
            # live under /tmp, which the mount namespace replaces with a private tmpfs)
            "guard_source": _evalplus_guard_source() if guard else None,
            "preload": list(preload),
        }
        spec_path = os.path.join(workdir, "spec.json")
        with open(spec_path, "w") as fh:
            json.dump(spec, fh)
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            **dict.fromkeys(("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "1"),
            "HOME": "/tmp" if spec["mountns"] else scratch,
            "TMPDIR": "/tmp" if spec["mountns"] else scratch,
            TOKEN_VAR: run_id,
        }
        meta_r, meta_w = os.pipe()
        here = os.path.abspath(__file__)
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
        header, runner_out, outcome = _stream(proc, meta_r, len(cases), timeout_s, startup_slack_s, spec, results,
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
    if namespaces and guard and results:
        _warn_once(results[0].layers, results[0].notes)
    return results


def _stream(proc, meta_r, n_cases, timeout_s, slack, spec, results, ns_layers, ns_errors, run_id, on_result):
    """Turn the runner's per-test records into results: "done", "stopped", "stalled" or "ended"."""
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
                result = _to_result(record, spec, {**ns_layers, **header.get("layers", {})},
                                    {**ns_errors, **header.get("errors", {})}, run_id)  # fmt: skip
                results.append(result)
                deadline = time.monotonic() + timeout_s + 10  # the runner's own clean-up takes some
                if on_result is not None and not on_result(len(results) - 1, result):
                    return header, bufs[out_fd].decode(errors="replace"), "stopped"
            scan_from = len(bufs[meta_r])
    return header, bufs[out_fd].decode(errors="replace"), outcome


def _to_result(rec: dict, spec: dict, layers: dict, reasons: dict, run_id: str) -> SandboxResult:
    status, sig, code = rec.get("status"), rec.get("signal"), rec.get("exit_code")
    layers = {**layers, **rec.get("layers", {})}
    kind: str | None
    if rec.get("overflow"):
        kind = "output_limit"
    elif rec.get("timed_out") or sig == signal.SIGXCPU:
        kind = "timeout"
    elif not rec.get("layers"):  # the child died in set-up, before the code ran
        kind = "sandbox_error"
    elif status and status.get("kind") in ("syntax_error", "runtime_error", "memory", "output_limit"):
        kind = status["kind"]
    elif sig is not None:
        kind = "killed"
    elif status is None and code != 0:
        kind = "runtime_error"
    elif spec["call_method"] and (status is None or status.get("value") is None):
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


# ------------------------------------------------------------------------------- the runner
# Below runs in the sandbox's own interpreter (`python -I sandbox.py --runner SPEC FD`).
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_REMOUNT, _MS_BIND, _MS_REC, _MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18  # fmt: skip
_PR_SET_NO_NEW_PRIVS, _PR_CAPBSET_DROP, _PR_SET_CHILD_SUBREAPER = 38, 24, 36
_SYS_DIR = "/tmp/.aggbench-sys"


def _mount(
    libc, src: str | None, target: str, fstype: str | None, flags: int, data: str | None
) -> str | None:
    import ctypes

    args = [s.encode() if s is not None else None for s in (src, target, fstype)]
    if libc.mount(*args, ctypes.c_ulong(flags), data.encode() if data else None) != 0:
        return f"mount {target}: {os.strerror(ctypes.get_errno())}"
    return None


def _readable_by(path: str, uid: int) -> bool:
    """Can ``uid`` (no groups, no capabilities) traverse to and list ``path``? Mode bits only."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(1, len(parts) + 1):
        st = os.stat(os.sep.join(parts[:i]) or os.sep)
        bits = (st.st_mode >> 6) & 7 if st.st_uid == uid else st.st_mode & 7
        if not bits & 1 or (i == len(parts) and not bits & 4):
            return False
    return True


def _private_dirs(libc, spec: dict, errors: dict) -> tuple[bool, bool]:
    """tmpfs over /tmp, /var/tmp, /dev/shm; sys.path dirs the uid cannot read bound into /tmp.

    Returns (/tmp is the private tmpfs, every step worked).
    """
    err = _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, None)
    tmp_mounted = False
    for target, size in (("/tmp", spec["tmpfs_mb"]), ("/var/tmp", 8), ("/dev/shm", 8)):
        if err is None and os.path.isdir(target):
            err = _mount(libc, "tmpfs", target, "tmpfs", _MS_NOSUID | _MS_NODEV, f"size={size}m,mode=1777")
            tmp_mounted = tmp_mounted or (target == "/tmp" and err is None)
    uid = spec["drop_uid"]
    for i, entry in enumerate(list(sys.path)):
        if err is not None or uid is None or not os.path.isdir(entry) or _readable_by(entry, uid):
            continue
        target = f"{_SYS_DIR}/{i}"
        os.makedirs(target, exist_ok=True)
        for d in (_SYS_DIR, target):
            os.chmod(d, 0o755)
        ro = _MS_BIND | _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID | _MS_NODEV
        err = _mount(libc, entry, target, None, _MS_BIND | _MS_REC, None) or _mount(
            libc, None, target, None, ro, None
        )
        if err is None:
            sys.path[i] = target
            for module in list(sys.modules.values()):  # packages already imported from there
                paths = getattr(module, "__path__", None)
                if isinstance(paths, list):
                    paths[:] = [target + p[len(entry) :] if p == entry or p.startswith(entry + os.sep) else p
                                for p in paths]  # fmt: skip
    if err:
        errors["private_tmp"] = err
    return tmp_mounted, err is None


def _drop_identity(libc, spec: dict) -> dict[str, bool]:
    """In the child: the unprivileged uid (as root), no capabilities at all, no_new_privs."""
    import ctypes

    for cap in range(64):  # the bounding set first: dropping from it needs CAP_SETPCAP
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            break
    if (uid := spec["drop_uid"]) is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [(n, ctypes.c_uint32) for n in ("effective", "permitted", "inheritable")]

    libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)())  # for uid 0 in a user namespace
    nnp = libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
    with open("/proc/self/status") as fh:
        caps = [int(ln.split()[1], 16) for ln in fh if ln.startswith(("CapEff", "CapPrm"))]
    uid = os.getuid()
    with open("/proc/self/uid_map") as fh:  # uid 0 inside a user namespace is not root outside
        rows = [tuple(map(int, ln.split())) for ln in fh]
    kuid = next((outer + uid - inner for inner, outer, n in rows if inner <= uid < inner + n), uid)
    return {"user": kuid != 0, "caps_dropped": len(caps) == 2 and not any(caps), "no_new_privs": nnp}


def _set_limits(spec: dict) -> None:
    import resource

    cpu = int(math.ceil(spec["timeout_s"])) + 1
    for lim, soft, hard in (
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, spec["memory_bytes"], spec["memory_bytes"]),
        (resource.RLIMIT_DATA, spec["memory_bytes"], spec["memory_bytes"]),
        (resource.RLIMIT_FSIZE, spec["max_file_bytes"], spec["max_file_bytes"]),
        (resource.RLIMIT_NPROC, spec["max_procs"], spec["max_procs"]),
        (resource.RLIMIT_NOFILE, spec["max_open_files"], spec["max_open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    ):
        old_hard = resource.getrlimit(lim)[1]
        if old_hard != resource.RLIM_INFINITY:  # an unprivileged process cannot raise a hard limit
            soft, hard = min(soft, old_hard), min(hard, old_hard)
        resource.setrlimit(lim, (soft, hard))


def _load_guard(source: str | None):
    """evalplus's reliability_guard from the source of evalplus/eval/utils.py (stdlib imports only;
    the package's __init__ imports numpy, so the module is executed on its own)."""
    import types

    if not source:
        return None
    module = types.ModuleType("_evalplus_eval_utils")
    exec(compile(source, "evalplus/eval/utils.py", "exec"), module.__dict__)  # noqa: S102
    return module.reliability_guard


def _apply_guard(reliability_guard) -> None:
    import builtins

    real_open = builtins.open
    # No memory argument: RLIMIT_AS/DATA are set already, and the guard would also set
    # RLIMIT_STACK to the whole budget, after which each new thread reserves that much.
    reliability_guard(None)

    # exit(): LiveCodeBench keeps it and ends the program on SystemExit; here it ends only the
    # sandboxed process. open(): LiveCodeBench answers open() with the test input (competitive
    # code reads `open(0)`); the guard removes open, and we give back the standard streams only.
    def _exit(code=None):
        raise SystemExit(code)

    def _open(file, mode="r", *args, **kwargs):
        fd = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}.get(file, file)
        if fd in (0, 1, 2):
            return real_open(fd, mode, *args, **{**kwargs, "closefd": False})
        raise PermissionError(f"open({file!r}) is disabled in the sandbox")

    builtins.exit = builtins.quit = _exit
    builtins.open = _open


def _numpy_to_python(obj: Any) -> Any:
    """json.dumps hook: numpy values compare equal to Python ones under LiveCodeBench's ==."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def _child(spec: dict, case: dict, status_w: int, reliability_guard) -> None:
    """Run the code on one case; the last line on status_w is a JSON status. Never returns."""
    import builtins
    import threading
    import traceback

    write, exit_now, dumps = os.write, os._exit, json.dumps

    def report(status: dict, code: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        data = b"\n" + dumps(status).encode() + b"\n"
        with contextlib.suppress(OSError):
            while data:
                data = data[write(status_w, data) :]
        exit_now(code)

    try:
        compiled = compile(spec["code"], "<solution>", "exec")
    except (SyntaxError, ValueError) as exc:
        report({"kind": "syntax_error", "exception": f"{type(exc).__name__}: {exc}"[:2000]}, 1)
    args = [json.loads(a) for a in case["args_json"]]
    sys.setrecursionlimit(LCB_RECURSION_LIMIT)
    with contextlib.suppress(AttributeError):
        sys.set_int_max_str_digits(LCB_INT_MAX_STR_DIGITS)
    if reliability_guard is not None:
        _apply_guard(reliability_guard)
    namespace: dict[str, Any] = {}
    for name in LCB_STAR_MODULES:
        module = sys.modules[name]
        public = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
        namespace.update({n: getattr(module, n) for n in public if hasattr(module, n)})
    namespace.update({name: sys.modules[name] for name in LCB_PLAIN_MODULES})
    namespace.update(
        __name__="__main__" if spec["call_method"] is None else "solution", __builtins__=builtins
    )
    try:
        exec(compiled, namespace)
        if spec["call_method"] is not None:
            if "Solution" not in namespace:
                raise NameError("the code defines no class Solution")
            value = getattr(namespace["Solution"](), spec["call_method"])(*args)
            if isinstance(value, tuple):  # as LiveCodeBench: a tuple is accepted for a list
                value = list(value)
            try:
                text = dumps(value, default=_numpy_to_python)
            except (TypeError, ValueError) as exc:
                report({"kind": "runtime_error", "exception": f"unserializable result: {exc}"}, 1)
            if len(text) > spec["max_output_bytes"]:
                report({"kind": "output_limit", "exception": "returned value too large"}, 1)
            report({"kind": "ok", "value": text}, 0)
        for thread in threading.enumerate():  # `threading.Thread(target=main).start()` idiom
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join()
        report({"kind": "ok"}, 0)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        report({"kind": "exit", "code": code}, code & 0xFF)
    except BaseException as exc:  # noqa: BLE001 - every failure of the code is reported
        with contextlib.suppress(Exception):
            traceback.print_exception(exc, file=sys.stderr)
        kind = "memory" if isinstance(exc, MemoryError) else "runtime_error"
        report({"kind": kind, "exception": f"{type(exc).__name__}: {exc}"[:2000]}, 1)


def _kill_rest(libc) -> None:
    """Kill and reap every process of the sandbox but this one."""
    if os.getpid() == 1:  # init of our own PID namespace: kill(-1) reaches exactly the sandbox
        libc.kill(-1, signal.SIGKILL)
    else:  # without one, every descendant (orphans re-parent to us: we are a child subreaper)
        _stop_then_kill(lambda: _descendants(os.getpid()))
    deadline = time.monotonic() + 2.0
    while time.monotonic() < deadline:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            return
        time.sleep(0.002)


def _run_case(libc, spec: dict, case: dict, stdin_fd: int, cwd: str, meta_fd: int, reliability_guard) -> dict:
    """Fork the child for one case, feed it, watch it, kill what is left; the per-test record."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    st_r, st_w = os.pipe()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            for src, dst in ((stdin_fd, 0), (out_w, 1), (err_w, 2)):
                os.dup2(src, dst)
            for fd in (stdin_fd, out_w, err_w, out_r, err_r, st_r, meta_fd):
                os.close(fd)
            layers = _drop_identity(libc, spec)
            os.chdir(cwd)
            _set_limits(spec)
            os.write(st_w, json.dumps({"layers": {**layers, "rlimits": True}}).encode() + b"\n")
        except BaseException as exc:  # noqa: BLE001
            os.write(2, f"sandbox set-up failed: {exc!r}\n".encode())
            os._exit(120)
        _child(spec, case, st_w, reliability_guard)
    for fd in (stdin_fd, out_w, err_w, st_w):
        os.close(fd)
    caps = {
        out_r: spec["max_output_bytes"],
        err_r: spec["max_stderr_bytes"],
        st_r: spec["max_output_bytes"] + 65536,
    }
    bufs = {fd: bytearray() for fd in caps}
    open_fds, wstatus, timed_out, overflow, ended = set(caps), None, False, False, None
    deadline = start + spec["timeout_s"]
    while True:  # until the child is gone and its pipes are drained (or stay open 2 s after)
        now = time.monotonic()
        if wstatus is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                wstatus, ended = st, now
                _kill_rest(libc)  # daemons it left would hold the pipes open
            elif now >= deadline:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
        elif not open_fds or now - ended > 2.0:
            break
        if not open_fds:  # it closed all three (and may still run)
            time.sleep(0.02)
            continue
        ready, _, _ = select.select(list(open_fds), [], [], 0.02 if wstatus is None else 0.1)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
                continue
            room = caps[fd] - len(bufs[fd])
            bufs[fd] += chunk[: max(room, 0)]
            if room < len(chunk) and fd != err_r and wstatus is None and not overflow:
                overflow = True
                os.kill(pid, signal.SIGKILL)
    _kill_rest(libc)
    for fd in caps:
        os.close(fd)
    lines = [ln for ln in bytes(bufs[st_r]).split(b"\n") if ln.strip()]
    first = _json_or_none(lines[0]) if lines else None
    status = _json_or_none(lines[-1]) if len(lines) > 1 else None
    stderr = bufs[err_r].decode(errors="replace")
    return {
        "stdout": bufs[out_r].decode(errors="replace"),
        "stderr": stderr + ("\n[stderr truncated]" if len(bufs[err_r]) >= caps[err_r] else ""),
        "exit_code": os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus) else None,
        "signal": os.WTERMSIG(wstatus) if os.WIFSIGNALED(wstatus) else None,
        "timed_out": timed_out,
        "overflow": overflow,
        "elapsed": time.monotonic() - start,
        "layers": first.get("layers", {}) if isinstance(first, dict) else {},
        "status": status if isinstance(status, dict) and "kind" in status else None,
    }


def _empty_dir(path: str) -> None:
    import shutil

    for entry in os.listdir(path):
        full = os.path.join(path, entry)
        if full != _SYS_DIR:
            with contextlib.suppress(OSError):
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full)
                else:
                    os.unlink(full)


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        return None


def _send(fd: int, obj: dict) -> None:
    data = json.dumps(obj).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


def _runner_main(spec_path: str, meta_fd: int) -> None:
    """The sandbox's first process: set up once, run every case in a fresh child, report each."""
    import ctypes

    with open(spec_path) as fh:
        spec = json.load(fh)
    libc = ctypes.CDLL(None, use_errno=True)
    layers: dict[str, bool] = {}
    errors: dict[str, str] = {}
    # the test inputs live under the real /tmp, which the private tmpfs is about to hide
    stdin_fds = [os.open(c["stdin_path"] or os.devnull, os.O_RDONLY) for c in spec["cases"]]
    tmp_mounted = False
    if spec["mountns"]:
        tmp_mounted, layers["private_tmp"] = _private_dirs(libc, spec, errors)
    cwd = "/tmp" if tmp_mounted else spec["scratch"]
    for name in _PRELOAD:
        __import__(name)  # imported here, inherited by every child
    for name in spec["preload"]:
        with contextlib.suppress(Exception):
            __import__(name)
    reliability_guard = None
    if spec["guard_source"] is not None:
        try:
            reliability_guard = _load_guard(spec["guard_source"])
        except Exception as exc:  # noqa: BLE001
            errors["guard"] = f"loading evalplus's reliability_guard failed: {exc!r}"
        layers["guard"] = reliability_guard is not None
    if not spec["pidns"]:
        libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    _send(meta_fd, {"layers": layers, "errors": errors})
    for i, case in enumerate(spec["cases"]):
        if i:
            _empty_dir(cwd)  # each test starts from an empty working directory (all its writers are dead)
        _send(meta_fd, {"i": i, **_run_case(libc, spec, case, stdin_fds[i], cwd, meta_fd, reliability_guard)})
    os._exit(0)


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--runner":
    _runner_main(sys.argv[2], int(sys.argv[3]))
