"""aggbench.environment: what a run records about its software and CPU."""

from __future__ import annotations

import json

from aggbench import environment


def test_the_hash_changes_with_any_version_and_not_with_order():
    a = {"torch": "2.13.0+cpu", "numpy": "2.4.6", "six": "1.17.0"}
    b = dict(reversed(list(a.items())))
    assert environment.environment_sha256(a) == environment.environment_sha256(b)
    assert environment.environment_sha256(a) != environment.environment_sha256({**a, "six": "1.16.0"})
    assert environment.environment_sha256(a) != environment.environment_sha256({**a, "extra": "1"})


def test_describe_names_the_numeric_packages_present_and_the_cpu():
    dists = {"torch": "2.13.0+cpu", "math-verify": "0.9.0", "latex2sympy2-extended": "1.10.2", "six": "1"}
    env = environment.describe(dists)
    assert env["packages"] == {
        "torch": "2.13.0+cpu",
        "math-verify": "0.9.0",
        "latex2sympy2_extended": "1.10.2",
    }
    assert env["environment_sha256"] == environment.environment_sha256(dists)
    assert env["cpu_model"] and env["cpu_capability"] in {
        "DEFAULT",
        "AVX2",
        "AVX512",
        "ZVECTOR",
        "VSX",
        "SVE256",
    }


def test_this_venv_is_described_with_its_real_versions():
    import numpy
    import torch

    env = environment.describe()
    assert env["packages"]["torch"] == torch.__version__ and env["packages"]["numpy"] == numpy.__version__
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert len(environment.installed()) > 50


def test_tags_and_the_file_carry_the_description(tmp_path):
    env = environment.describe({"torch": "2.13.0", "numpy": "2.4.6"})
    tags = environment.tags(env)
    assert tags["env.torch"] == "2.13.0" and tags["env.numpy"] == "2.4.6"
    assert tags["env.sha256"] == env["environment_sha256"] and tags["env.cpu_model"] == env["cpu_model"]
    path = environment.write(tmp_path / "run" / "environment.json", env)
    assert json.loads(path.read_text()) == env
