"""Bad configs, options and plugins fail with one clean line naming the file, field or option and
the fix (no traceback), before anything is loaded: the experiment config, `train --set`, devices
and engines this machine lacks, plugins that fail on import, `prepare-data` inputs and SLURM
resource keys. The cell config's own checks are in tests/test_config.py, `prepare-model`'s in
tests/cli/test_prepare_model.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import yaml

from aggbench.config import load_train_config
from aggbench.config_errors import ConfigError
from aggbench.grid import GridError, load_experiment
from aggbench.registry import RegistryError, load_plugins
from helpers.cli_support import clean_error as _clean
from helpers.cli_support import cli as _cli
from helpers.trainer_support import bare_cell

REPO = Path(__file__).resolve().parents[2]
SMOKE = REPO / "configs" / "smoke.yaml"


def _train(tmp_path: Path, *sets: str, cell: Path | None = None):
    args = ["train", "--config", cell or bare_cell(tmp_path), "--out", tmp_path / "run", "--quiet"]
    for s in sets:
        args += ["--set", s]
    return _cli(args)


# ---------------------------------------------------------------- D1: experiment config YAML


def test_invalid_yaml_experiment_config_names_file_and_line(tmp_path):
    bad = tmp_path / "grid.yaml"
    bad.write_text("experiment: x\nseeds: [0\nbenchmarks: [tiny_test]\n")
    with pytest.raises(GridError, match=r"grid.yaml is not valid YAML: .*line 2, column 8"):
        load_experiment(bad)
    _clean(_cli(["grid", "check", "--config", bad]), "grid.yaml is not valid YAML", "line 2")
    _clean(_cli(["plan", bad]), "is not valid YAML")
    lst = tmp_path / "list.yaml"
    lst.write_text("- 1\n")
    _clean(_cli(["grid", "check", "--config", lst]), "must hold a mapping")


# ---------------------------------------------------------------- D2: train --set


def test_set_through_a_non_section_is_named(tmp_path):
    out = _clean(_train(tmp_path, "algorithm.lr.x=1"), "--set algorithm.lr.x=1: algorithm.lr is a number")
    assert "not a section" in out
    with pytest.raises(ConfigError, match="algorithm.betas is a list, not a section"):
        load_train_config(bare_cell(tmp_path), {"algorithm.betas.0": 0.5})


def test_set_with_invalid_yaml_value_is_named(tmp_path):
    _clean(_train(tmp_path, "algorithm.lr=[1"), "algorithm.lr=[1: value is not valid YAML", "--set")


# ---------------------------------------------------------------- D6: devices and engines


def test_check_device_refuses_what_this_machine_lacks():
    import torch

    from aggbench.devices import DeviceError, check_device

    for ok in (None, "auto", "cpu"):
        check_device(ok, "--device")
    with pytest.raises(DeviceError, match=r"--device='gpu' is not a device; use cpu, cuda"):
        check_device("gpu", "--device")
    with pytest.raises(DeviceError, match="--device='cuda:99' but"):
        check_device("cuda:99", "--device")
    with pytest.raises(DeviceError, match="not 'meta'"):
        check_device("meta", "--device")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceError, match="CUDA is not available on this machine"):
            check_device("cuda", "device")


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is not None and __import__("torch").cuda.is_available(),
    reason="this machine has CUDA",
)
def test_train_device_cuda_without_cuda_fails_before_loading(tmp_path):
    # model.path does not exist: the device is refused before anything looks at it
    _clean(_train(tmp_path, "device=cuda"), "device='cuda' but CUDA is not available", "use cpu or auto")
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_train_vllm_engine_without_vllm_fails_before_loading(tmp_path):
    _clean(_train(tmp_path, "rollout.engine=vllm"), "rollout.engine=vllm", "pip install 'aggbench[gpu]'")
    assert not (tmp_path / "run").exists()


def test_train_vllm_import_failure_is_a_clean_error(tmp_path, monkeypatch):
    """vLLM installed but failing to import (a CUDA mismatch): the engine's hint, not a traceback."""
    import types

    import aggbench.train.loop
    from aggbench.rollout.vllm import GPU_EXTRA_HINT

    def broken(*args, **kwargs):
        try:
            raise ImportError("libcudart.so.12: cannot open shared object file")
        except ImportError as exc:
            raise ImportError(GPU_EXTRA_HINT) from exc

    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setattr(aggbench.train.loop, "train", broken)
    _clean(_train(tmp_path, "rollout.engine=vllm", "device=cpu"), "aggbench[gpu]", "libcudart.so.12")


# ---------------------------------------------------------------- D7: prepare-data


def test_prepare_data_errors_are_clean(tmp_path):
    out = tmp_path / "d" / "x.jsonl"
    _clean(_cli(["prepare-data", "tinyy", "--out", out]), "unknown training dataset 'tinyy'", "'tiny'")
    typo = tmp_path / "spec.yaml"
    typo.write_text("name: foo\nbuiltin: {name: tiny, split: train}\ngradr: tiny\n")
    _clean(_cli(["prepare-data", typo, "--out", out]), "gradr", "Did you mean 'grader'")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: foo\nsource: [\n")
    _clean(_cli(["prepare-data", broken, "--out", out]), "broken.yaml", "YAML")
    blocker = tmp_path / "file"
    blocker.write_text("")
    _clean(_cli(["prepare-data", "tiny", "--out", blocker / "x.jsonl", "--limit", "2"]), "cannot write --out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken.yaml", "file", "spec.yaml"]


# ---------------------------------------------------------------- D9: plugins failing on import


def _bad_plugins(tmp_path: Path) -> dict[str, Path]:
    files = {
        "missing": "import numpyy_no_such_module\n",
        "syntax": "x = 1\ndef f(:\n",
        "raises": "\n\nraise RuntimeError('boom')\n",
    }
    out = {}
    for name, text in files.items():
        out[name] = tmp_path / f"badplug_{name}.py"
        out[name].write_text(text)
    return out


def test_plugin_failing_on_import_is_a_registry_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    bad = _bad_plugins(tmp_path)
    with pytest.raises(RegistryError) as err:
        load_plugins([str(bad["missing"])])
    assert str(err.value) == (
        f"plugin {bad['missing']} failed to import: ModuleNotFoundError: No module named "
        "'numpyy_no_such_module' (badplug_missing.py:1)"
    )
    with pytest.raises(RegistryError, match=r"SyntaxError: .*\(badplug_syntax.py:2\)"):
        load_plugins(["badplug_syntax.py"])
    with pytest.raises(RegistryError, match=r"RuntimeError: boom \(badplug_raises.py:3\)"):
        load_plugins(["badplug_raises.py"])
    assert not any(m.startswith("aggbench_plugin_badplug") for m in sys.modules)
    # a dotted module that is found but fails inside
    with pytest.raises(RegistryError, match=r"plugin badplug_missing failed to import: ModuleNotFound"):
        load_plugins(["badplug_missing"], search_paths=[tmp_path])
    sys.modules.pop("badplug_missing", None)


def test_plugin_failing_on_import_is_clean_in_rules_explain_and_train(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = str(_bad_plugins(tmp_path)["missing"])
    msg = "failed to import: ModuleNotFoundError: No module named 'numpyy_no_such_module'"
    _clean(_cli(["rules", "--plugin", bad]), msg, "--plugin")
    _clean(_cli(["explain", "--plugin", bad, "--lengths", "1,2", "--rewards", "1,0"]), msg)
    _clean(_train(tmp_path, f"plugins=[{bad}]", "device=cpu"), msg)


# ---------------------------------------------------------------- D13: config typos


def _smoke(tmp_path: Path, edit) -> Path:
    exp = yaml.safe_load(SMOKE.read_text())
    edit(exp)
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def test_resource_key_near_misses_are_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)

    def typos(exp):
        exp["resources"]["train"] = {"cpu": 1, "mem": 3000, "time": 30, "slurm_partition": "gpu"}
        exp["resources"]["grade"] = {"cpus": 1, "memory": 100, "runtim": 5, "gpu": 1}
        model = next(iter(exp["models"].values()))
        model["resources"] = {"generate": {"cpus_per_task": 2, "qos": "high"}}

    with pytest.raises(GridError) as err:
        load_experiment(_smoke(tmp_path, typos))
    msg = str(err.value)
    for bad, want in [
        ("resources.train.cpu", "cpus"),
        ("resources.train.mem", "mem_mb"),
        ("resources.train.time", "runtime"),
        ("resources.grade.memory", "mem_mb"),
        ("resources.grade.runtim", "runtime"),
        ("resources.grade.gpu", "gpus"),
        ("generate.cpus_per_task", "cpus"),
    ]:
        assert f"{bad}: did you mean {want!r}?" in msg, msg
    assert "slurm_partition" not in msg.split("other keys")[0] and "qos:" not in msg


def test_any_slurm_key_passes_and_a_per_model_rule_typo_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    keys = {
        "cpus": 2,
        "gpus": 1,
        "mem_mb": 1000,
        "runtime": 10,
        "slurm_partition": "p",
        "slurm_account": "a",
        "constraint": "c",
        "qos": "q",
        "slurm_extra": "--x",
        "gpu_model": "h100",
        "mem_mb_per_cpu": 100,
    }

    def ok(exp):
        exp["resources"]["train"] = dict(keys)
        next(iter(exp["models"].values()))["resources"] = {"train": dict(keys)}

    load_experiment(_smoke(tmp_path, ok))

    def rule_typo(exp):
        next(iter(exp["models"].values()))["resources"] = {"trian": {"cpus": 1}}

    with pytest.raises(GridError, match=r"resources: unknown key\(s\) 'trian'"):
        load_experiment(_smoke(tmp_path, rule_typo))
