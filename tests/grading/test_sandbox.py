"""The sandbox contains hostile programs: every attack fails, the verdict says how, nothing leaks.

Each hostile program would print the expected answer "42" only if its attack went unnoticed, so
a breach shows up as a passing verdict as well as in the containment checks (the sentinel file,
the listener, the canaries, leftover processes). The programs mostly reach for ctypes, so they
test the operating-system layers, not just evalplus's in-process guard (which a program can
walk around).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from aggbench.grading import sandbox, sandbox_probe
from aggbench.grading.code import grade_code, grade_many
from aggbench.grading.sandbox import TOKEN_VAR, CaseSpec, RunnerSpec, run_sandboxed, run_tests
from aggbench.grading.sandbox_probe import probe_namespaces

ANSWER = [{"input": "", "output": "42\n", "testtype": "stdin"}]
IS_ROOT = os.geteuid() == 0


def fenced(code: str) -> str:
    return "```python\n" + textwrap.dedent(code).strip() + "\n```"


def sandbox_processes() -> list[int]:
    """Processes anywhere on the machine that belong to some sandbox run."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/environ", "rb") as fh:
                    if f"{TOKEN_VAR}=".encode() in fh.read():
                        found.append(int(name))
            except OSError:
                continue
    return found


@pytest.fixture(scope="module")
def layers() -> dict[str, bool]:
    result = run_sandboxed("print(42)", timeout_s=5, memory_mb=512)
    assert result.stdout == "42\n" and result.error_kind is None, result
    return result.layers


def test_layers_are_reported_and_explained(layers):
    assert all(isinstance(v, bool) for v in layers.values())
    assert {"pidns", "netns", "mountns", "user", "caps_dropped", "no_new_privs", "rlimits", "guard"} <= set(
        layers
    )
    assert layers["user"] and layers["rlimits"] and layers["guard"] and layers["caps_dropped"]
    _, probed, refusals = probe_namespaces()
    for name, ok in probed.items():
        assert ok or refusals.get(name), f"{name} is off without a recorded reason"


def test_a_refused_layer_is_recorded_and_logged_once(monkeypatch, caplog):
    real_which, real_exists = shutil.which, os.path.exists
    monkeypatch.setattr(sandbox_probe, "_probe_cache", None)  # probe again, on a machine without unshare
    monkeypatch.setattr(sandbox, "_warned", set())
    monkeypatch.setattr(
        shutil, "which", lambda name, *a, **k: None if name == "unshare" else real_which(name, *a, **k)
    )
    monkeypatch.setattr(os.path, "exists", lambda p: False if str(p).endswith("/unshare") else real_exists(p))
    with caplog.at_level(logging.WARNING, logger=sandbox.__name__):
        first = run_sandboxed("print(42)", timeout_s=5, memory_mb=256)
        second = run_sandboxed("print(42)", timeout_s=5, memory_mb=256)
    assert first.stdout == second.stdout == "42\n"
    assert first.layers["pidns"] is False and first.layers["netns"] is False
    assert "unshare" in first.notes["pidns"]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("'pidns'" in m for m in messages) == 1, messages  # once, not per run
    assert sum("'netns'" in m for m in messages) == 1, messages


def test_kill_all_safety_interlock(layers):
    """Guard for the kill(-1) tests below: as root with neither a PID namespace nor a uid drop,
    kill(-1) inside the sandbox would reach every process on the machine."""
    if IS_ROOT:
        assert layers["pidns"] or layers["user"]


# ------------------------------------------------------------------------- the hostile batch
@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    """Run every hostile program at once (two at a time) and keep what is needed to check."""
    outside = tmp_path_factory.mktemp("outside")
    sentinel = outside / "sentinel.txt"
    sentinel.write_text("untouched")
    escape = Path("/tmp") / f"aggbench-escape-{uuid.uuid4().hex}"
    secret = f"s3cret-{uuid.uuid4().hex}"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    os.environ["AGGBENCH_TEST_SECRET"] = secret
    programs = {
        "infinite_loop": "while True:\n    pass",
        "sleep_forever": "import time\ntime.sleep(3600)",  # no CPU use: only the wall clock stops it
        "fork_bomb": """
            import ctypes
            libc = ctypes.CDLL(None)
            while True:
                libc.fork()
            """,
        "fork_bomb_os": "import os\nwhile True:\n    os.fork()",
        "memory_bomb": "chunks = []\nwhile True:\n    chunks.append(bytearray(10**8))",
        "huge_output": "import sys\nline = 'x' * 1023 + '\\n'\nfor _ in range(2**20):\n    sys.stdout.write(line)",
        "delete_sentinel": f"""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unlink({str(sentinel).encode()!r}) != 0:
                raise OSError(ctypes.get_errno(), "unlink refused")
            print(42)
            """,
        "overwrite_sentinel": f"""
            import io
            with io.FileIO({str(sentinel)!r}, "w") as fh:
                fh.write(b"owned")
            print(42)
            """,
        "remove_sentinel_os": f"import os\nos.remove({str(sentinel)!r})\nprint(42)",
        "write_tmp": f"""
            import io
            with io.FileIO({str(escape)!r}, "w") as fh:
                fh.write(b"escaped")
            print(41)
            """,
        "read_environment": """
            import os
            seen = [repr(dict(os.environ))]
            for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
                try:
                    with __import__("io").FileIO(f"/proc/{pid}/environ") as fh:
                        seen.append(fh.read().decode(errors="replace"))
                except OSError:
                    pass
            print("\\n".join(seen))
            """,
        "connect_socket": f"""
            import socket
            socket.create_connection(("127.0.0.1", {port}), timeout=2).sendall(b"hello")
            print(42)
            """,
        "exit_silently": "import os\nos._exit(0)",
        "close_pipes_and_hang": "import os, time\nfor fd in (0, 1, 2, 3, 4, 5, 6):\n    try:\n        os.close(fd)\n    except OSError:\n        pass\ntime.sleep(3600)",
        "daemon_outlives_parent": """
            import ctypes, sys, time
            libc = ctypes.CDLL(None)
            if libc.fork() == 0:
                libc.setsid()
                if libc.fork() == 0:  # re-parented away from the program
                    time.sleep(0.5)
                    sys.stdout.write("42\\n")  # would pass if it survived and its output counted
                    sys.stdout.flush()
                    time.sleep(3600)
                libc._exit(0)
            """,
        "recursion_bomb": "def f(n):\n    return f(n + 1)\nf(0)",
        "c_stack_bomb": """
            import sys
            sys.setrecursionlimit(10**9)
            class Deep:
                def __getattr__(self, name):
                    return getattr(self, name)
            Deep().x
            """,
    }
    try:
        start = time.monotonic()
        items = [
            {"response": fenced(code), "tests": ANSWER, "timeout_s": 4, "memory_mb": 512}
            for code in programs.values()
        ]
        verdicts = dict(zip(programs, grade_many(items, max_workers=2), strict=True))
        wall = time.monotonic() - start
        time.sleep(1.0)  # the daemon would have written by now
        try:
            accepted = listener.accept()
            accepted[0].close()
            connected = True
        except BlockingIOError:
            connected = False
        state = {
            "verdicts": verdicts,
            "wall": wall,
            "sentinel": sentinel.read_text() if sentinel.exists() else None,
            "escaped": escape.exists(),
            "connected": connected,
            "leftovers": sandbox_processes(),
            "secret": secret,
        }
    finally:
        os.environ.pop("AGGBENCH_TEST_SECRET", None)
        listener.close()
        escape.unlink(missing_ok=True)
    return state


@pytest.mark.parametrize(
    ("program", "kinds"),
    [
        ("infinite_loop", {"timeout"}),
        ("sleep_forever", {"timeout"}),
        ("fork_bomb", {"timeout"}),
        ("fork_bomb_os", {"runtime_error"}),  # the guard's os.fork = None
        ("memory_bomb", {"memory"}),
        ("huge_output", {"output_limit"}),
        ("delete_sentinel", {"runtime_error"}),
        ("overwrite_sentinel", {"runtime_error"}),
        ("remove_sentinel_os", {"runtime_error"}),
        ("write_tmp", {"wrong_answer", "runtime_error"}),  # private /tmp: the write lands inside
        ("read_environment", {"wrong_answer"}),
        ("connect_socket", {"runtime_error"}),
        ("exit_silently", {"wrong_answer"}),
        ("close_pipes_and_hang", {"timeout"}),
        ("daemon_outlives_parent", {"wrong_answer"}),
        ("recursion_bomb", {"runtime_error"}),
        ("c_stack_bomb", {"killed", "runtime_error", "memory"}),  # SIGSEGV on the C stack, usually
    ],
)
def test_hostile_program_fails_with_the_right_kind(hostile, layers, program, kinds):
    if program == "connect_socket" and not layers.get("netns"):
        pytest.skip("no network namespace on this machine: the sandbox cannot cut the network")
    verdict = hostile["verdicts"][program]
    assert not verdict["correct"], verdict
    assert verdict["tests"][0]["error_kind"] in kinds, verdict["reason"]


def test_hostile_batch_is_contained(hostile, layers):
    assert hostile["wall"] < 120, "the batch of 4-second programs took far too long"
    assert hostile["sentinel"] == "untouched"
    assert not hostile["leftovers"], "sandbox processes outlived their run"
    assert hostile["secret"] not in json.dumps(hostile["verdicts"])
    assert not hostile["verdicts"]["read_environment"]["tests"][0]["detail"].count(hostile["secret"])
    if layers.get("netns"):
        assert not hostile["connected"], "a sandboxed program reached a local port"
    if layers.get("private_tmp"):
        assert not hostile["escaped"], "a write to /tmp escaped the sandbox"
    output_test = hostile["verdicts"]["huge_output"]["tests"][0]
    assert output_test["elapsed_s"] < 30


def test_huge_output_never_reaches_the_parent_whole():
    result = run_sandboxed("import os\nblock = b'y' * (1 << 20)\nwhile True:\n    os.write(1, block)", timeout_s=5,
                           memory_mb=256, runner=RunnerSpec(max_output_bytes=1 << 20))  # fmt: skip
    assert result.error_kind == "output_limit" and result.output_truncated
    assert len(result.stdout) <= 1 << 20


def test_stderr_is_truncated_without_failing_the_run():
    result = run_sandboxed("import sys\nsys.stderr.write('e' * 200000)\nprint(42)", timeout_s=5, memory_mb=256,
                           runner=RunnerSpec(max_stderr_bytes=1000))  # fmt: skip
    assert result.error_kind is None and result.stdout == "42\n"
    assert result.stderr.startswith("e" * 1000) and result.stderr.endswith("[stderr truncated]")
    assert len(result.stderr) < 1100


def test_environment_is_scrubbed(monkeypatch):
    monkeypatch.setenv("AGGBENCH_PARENT_ONLY", "visible?")
    result = run_sandboxed("import os\nprint(sorted(os.environ))", timeout_s=5, memory_mb=256)
    names = set(eval(result.stdout))  # a list literal printed by the program
    assert "AGGBENCH_PARENT_ONLY" not in names
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", TOKEN_VAR,
                     "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"}  # fmt: skip


def test_each_test_case_gets_a_fresh_process_and_an_empty_directory():
    code = "import os\nprint(sorted(os.listdir('.')), os.getpid())\nopen_ = __import__('io').FileIO('mark', 'w')\n"
    results = run_tests(CaseSpec(code, ["", ""], timeout_s=5, memory_mb=256))
    assert [r.error_kind for r in results] == [None, None]
    listings = [r.stdout.split("]")[0] for r in results]
    assert all("mark" not in listing for listing in listings)  # the first case's file is gone


def test_call_mode_returns_the_value_as_json():
    code = (
        "class Solution:\n    def f(self, xs: List[int], k: int):\n        return (sorted(xs)[:k], {'k': k})"
    )
    result = run_sandboxed(
        code, call_method="f", call_args_json=["[3, 1, 2]", "2"], timeout_s=5, memory_mb=256
    )
    assert result.error_kind is None
    assert json.loads(result.result_json) == [[1, 2], {"k": 2}]


def test_stop_callback_ends_the_run_early():
    seen = []
    results = run_tests(CaseSpec("print(input())", ["a\n", "b\n", "c\n"], timeout_s=5, memory_mb=256),
                        on_result=lambda i, r: seen.append(r.stdout) or False)  # fmt: skip
    assert seen == ["a\n"] and len(results) == 1


# ------------------------------------------------------------------------- killing the parent
@pytest.fixture
def canaries():
    """Processes outside the sandbox that kill(-1) from inside must not reach."""
    procs = {"same_uid": subprocess.Popen(["sleep", "60"])}
    if IS_ROOT:  # one running as the sandbox's own uid: only a PID namespace protects it
        procs["sandbox_uid"] = subprocess.Popen(["sleep", "60"], user=65534, group=65534, extra_groups=[])
    yield procs
    for proc in procs.values():
        proc.kill()
        proc.wait()


def test_killing_the_parent_and_everything_fails(layers, canaries):
    if not (layers.get("pidns") or (IS_ROOT and layers.get("user"))):
        pytest.skip("neither a PID namespace nor a uid drop: kill(-1) would reach this test run")
    programs = [
        "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint(42)",
        """
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        libc.kill(os.getppid(), 9)
        print("parent", os.getppid())
        """,
        """
        import ctypes, os, sys
        # interlock: never as root outside a fresh PID namespace, whatever the layers say
        if os.getuid() == 0 and os.getpid() > 3:
            sys.exit(3)
        libc = ctypes.CDLL(None, use_errno=True)
        print("kill(-1):", libc.kill(-1, 9), ctypes.get_errno())
        """,
    ]
    for code in programs:  # one at a time: without a PID namespace they could hit each other
        verdict = grade_code(fenced(code), ANSWER, timeout_s=5)
        assert not verdict["correct"], verdict
        assert verdict["tests"][0]["error_kind"] in {"runtime_error", "wrong_answer"}, verdict["reason"]
    assert canaries["same_uid"].poll() is None
    if "sandbox_uid" in canaries and layers.get("pidns"):
        assert canaries["sandbox_uid"].poll() is None
    assert run_sandboxed("print(42)", timeout_s=5, memory_mb=256).stdout == "42\n"  # still works


# ------------------------------------------------------------------------- fallbacks
@pytest.mark.skipif(not IS_ROOT, reason="the no-namespace fallback is tested as root (uid drop)")
def test_without_namespaces_the_fallback_still_contains_bombs_and_daemons():
    programs = {
        "fork_bomb": "import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()",
        "daemon": """
            import ctypes, time
            libc = ctypes.CDLL(None)
            if libc.fork() == 0:
                libc.setsid()
                while True:
                    pass
            print(41)
            """,
    }
    jobs = [
        {"code": textwrap.dedent(c), "timeout_s": 2, "memory_mb": 256, "runner": RunnerSpec(namespaces=False)}
        for c in programs.values()
    ]
    before = sandbox._tasks_of_uid(65534)  # e.g. a daemon that runs as nobody anyway
    start = time.monotonic()
    fork_bomb, daemon = sandbox.run_batch(jobs, max_workers=2)
    assert time.monotonic() - start < 30
    assert fork_bomb.error_kind == "timeout"
    assert daemon.error_kind is None and daemon.stdout == "41\n"
    assert "pidns" not in fork_bomb.layers and daemon.layers["user"]
    assert not sandbox_processes()
    assert sandbox._tasks_of_uid(65534) <= before


def _python_for(uid: int) -> str | None:
    """A Python interpreter the given uid can run (the test venv's may sit under a 0700 /root).

    Checked through a shell, the way the sandbox starts it: setpriv itself manages to exec a
    binary the uid cannot reach by path (which then falls back to another standard library).
    """
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        check = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "/bin/sh", "-c",
                 'exec "$0" -c "import json, ctypes, selectors"', candidate or "/nonexistent"]  # fmt: skip
        if candidate and subprocess.run(check, capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(
    not IS_ROOT or not shutil.which("setpriv"), reason="needs root and setpriv to become a normal user"
)
def test_as_a_normal_user_hostile_code_is_contained():
    python = _python_for(65534)
    if python is None:
        pytest.skip("no Python interpreter that uid 65534 may run with its standard library")
    home = Path(tempfile.mkdtemp(prefix="aggbench-normal-user-"))  # pytest's tmp_path is root-only
    os.chown(home, 65534, 65534)
    try:
        _contained_as_normal_user(python, home)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _contained_as_normal_user(python: str, home: Path) -> None:
    sentinel = home / "sentinel.txt"
    sentinel.write_text("untouched")
    os.chown(sentinel, 65534, 65534)  # owned by the harness user: only the sandbox protects it
    # the sandbox's two files, copied where uid 65534 can read them (a checkout may sit under a
    # 0700 directory such as mktemp -d's)
    for name in ("sandbox.py", "sandbox_probe.py", "sandbox_runner.py"):
        copy = home / name
        shutil.copyfile(Path(sandbox.__file__).with_name(name), copy)
        os.chown(copy, 65534, 65534)
    script = home / "as_user.py"
    script.write_text(
        textwrap.dedent(f"""
        import importlib.util, json, sys
        spec = importlib.util.spec_from_file_location("sbx", {str(home / "sandbox.py")!r})
        sbx = importlib.util.module_from_spec(spec)
        sys.modules["sbx"] = sbx
        spec.loader.exec_module(sbx)
        programs = {{
            "unlink": "import ctypes\\nl = ctypes.CDLL(None, use_errno=True)\\nprint(l.unlink({str(sentinel).encode()!r}))",
            "umount": "import ctypes\\nl = ctypes.CDLL(None, use_errno=True)\\nprint(l.umount2(b'/tmp', 2))",
            "fork_bomb": "import ctypes\\nl = ctypes.CDLL(None)\\nwhile True:\\n    l.fork()",
        }}
        out = {{"probe": sbx.sandbox_probe.probe_namespaces()[1:]}}
        for name, code in programs.items():
            r = sbx.run_sandboxed(code, timeout_s=2, memory_mb=256, runner=sbx.RunnerSpec(preload=()))
            out[name] = [r.error_kind, r.stdout.strip(), r.layers]
        print(json.dumps(out))
        """)
    )
    proc = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", python, str(script)],
                          capture_output=True, text=True, timeout=120, cwd=home)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    probed, refusals = out["probe"]
    if not probed.get("userns"):
        pytest.skip(f"no user namespaces for normal users here: {refusals}")
    assert out["unlink"][:2] == [None, "-1"]  # the private /tmp hides the file
    assert out["umount"][:2] == [None, "-1"]  # no capabilities left to undo the private /tmp
    assert out["fork_bomb"][0] == "timeout"
    assert out["unlink"][2]["caps_dropped"] and out["unlink"][2]["pidns"]
    assert sentinel.read_text() == "untouched"
    assert not sandbox_processes()


def test_no_sandbox_process_survives_this_module():
    time.sleep(0.2)
    leftovers = sandbox_processes()
    for pid in leftovers:  # do not let a failure here leak into the rest of the suite
        os.kill(pid, signal.SIGKILL)
    assert not leftovers
