"""The MLflow server command docs/workflow.md gives for a cluster, run for real (mlflow from the
locked environment): the compute nodes address it by the login node's name, and MLflow 3.x answers
HTTP 403 ("Invalid Host header") to any host name but localhost's and private IPs' unless the
server is started with ``--allowed-hosts``. The documented command accepts that name; the same
command without the option refuses it (the control: what a user without it would hit)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

requests = pytest.importorskip("requests")

REPO = Path(__file__).resolve().parents[2]
LOGIN_NODE = "login-node.example.org"


def _documented_command() -> str:
    text = (REPO / "docs" / "workflow.md").read_text()
    (cmd,) = re.findall(r"`(mlflow server [^`]*--allowed-hosts[^`]*)`", text)  # the cluster step's
    return cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _search(port: int, host: str) -> int:
    url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/search?max_results=1"
    return requests.get(url, headers={"Host": host}, timeout=30).status_code


def _start(cmd: str, tmp_path: Path) -> tuple[subprocess.Popen, int, Path]:
    """Start ``cmd`` (the documented one, rewritten to tmp_path and a free port): (process, port, log)."""
    port = _free_port()
    (tmp_path / "results").mkdir(parents=True, exist_ok=True)
    cmd = cmd.replace("$PWD", str(tmp_path)).replace("--port 5000", f"--port {port}")
    cmd = cmd.replace("LOGIN-NODE:5000", f"{LOGIN_NODE}:{port}")
    args = shlex.split(cmd)
    args[0] = str(Path(sys.executable).with_name("mlflow"))
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            args, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, port, log


def _wait_healthy(proc: subprocess.Popen, port: int, log: Path) -> None:
    deadline = time.monotonic() + 180  # a startup limit, not a performance check
    while True:
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"mlflow server did not answer /health:\n{log.read_text()[-3000:]}")
        time.sleep(0.5)


def _stop(proc) -> None:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_documented_server_accepts_the_login_nodes_name_and_without_allowed_hosts_refuses_it(tmp_path):
    cmd = _documented_command()
    assert "--allowed-hosts" in cmd and "LOGIN-NODE:5000" in cmd, cmd
    without = re.sub(r' --allowed-hosts "[^"]*"', "", cmd)
    assert without != cmd and "--allowed-hosts" not in without
    servers = [_start(cmd, tmp_path / "documented"), _start(without, tmp_path / "without")]  # side by side
    try:
        for server in servers:
            _wait_healthy(*server)
        (_, port, _), (_, bare, _) = servers
        assert _search(port, f"{LOGIN_NODE}:{port}") == 200
        assert _search(port, f"localhost:{port}") == 200  # `mlflow ui`-style use on the login node
        assert _search(port, f"127.0.0.1:{port}") == 200
        assert _search(port, f"elsewhere.example.org:{port}") == 403  # still not open to every name
        assert _search(bare, f"{LOGIN_NODE}:{bare}") == 403  # what a server without the option says
        assert _search(bare, f"127.0.0.1:{bare}") == 200
    finally:
        for proc, _, _ in servers:
            _stop(proc)
