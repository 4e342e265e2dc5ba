"""What this machine lets the sandbox (:mod:`.sandbox`) build: the Linux namespaces util-linux
``unshare`` can create here for this user, probed once per process, and evalplus's
``reliability_guard``, read from its source file.

Standard library only, and no import of aggbench: :mod:`.sandbox` may be loaded from its file
outside the package, and loads this file beside it then.
"""

from __future__ import annotations

import os
import threading

_NS_FLAGS = {
    "pidns": (["--pid", "--fork", "--kill-child", "--mount-proc"], ["--pid", "--fork", "--kill-child"]),
    "netns": (["--net"],),
    "ipcns": (["--ipc"],),
    "utsns": (["--uts"],),
    "mountns": (["--mount"],),
}
_probe_lock = threading.Lock()
_probe_cache: tuple[list[str], dict[str, bool], dict[str, str]] | None = None


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


def evalplus_guard_source() -> str | None:
    """The source of evalplus's ``reliability_guard`` module, or None without evalplus."""
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
