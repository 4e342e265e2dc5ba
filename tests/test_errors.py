"""One base class for bad input: every bad-input error of the package derives from
``aggbench.errors.InputError`` and keeps its builtin base; the command line prints one as one line
with exit status 1, and anything else ends with its traceback.

The package's exception classes are found by scanning the source, so a new one must be listed
here, by name: as bad input (with its builtin base) or as internal (with the reason it is not bad
input). Listed by name, not module, so moving a class moves no line here.
"""

from __future__ import annotations

import ast
import builtins
import functools
import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aggbench.errors import InputError

SRC = Path(__file__).resolve().parents[1] / "src" / "aggbench"

# class: the builtin base it keeps (existing `except ValueError` callers still catch it)
INPUT_ERRORS: dict[str, type[Exception]] = {
    "ConfigError": ValueError,
    "RegistryError": ValueError,
    "ModelDirError": ValueError,
    "DeviceError": ValueError,
    "GradingError": ValueError,
    "GridError": ValueError,
    "DataError": ValueError,
    "SpecError": ValueError,
    "DataUnavailableError": RuntimeError,
    "FetchedDataError": RuntimeError,
    "EvaluationError": ValueError,
    "EvalPlusError": ValueError,
    "BatchInputError": ValueError,
    "AdapterConfigError": ValueError,
    "RunLockedError": RuntimeError,
    "LockUnsupportedError": OSError,
    "WalltimeTooShortError": RuntimeError,
    "CheckpointError": ValueError,
    "DiskFullError": OSError,
    "PowerError": ValueError,
    "ShapeError": ValueError,
    "ResolvedUnreadable": ValueError,
}
INTERNAL: dict[str, str] = {  # class: why it is not bad input
    "AggregationInputError": "the rule API's argument check: its tensors come from the trainer, an "
    "adapter or a plugin, so under the command line it means a bug",
    "GradingTimeout": "control flow inside the math grader's deadline",
    "InputTimeout": "control flow inside the sandboxed child",
    "Terminated": "SIGTERM as a SystemExit (exit status 143) inside the trainer's run status (train/run_status.py)",
    "WalltimeStop": "the trainer stopping itself before its job's walltime, at a checkpoint (a Terminated: "
    "train/walltime.py); a rerun resumes",
}


def _is_exception_name(name: str) -> bool:
    builtin = getattr(builtins, name, None)
    return name.endswith(("Error", "Exception")) or (
        isinstance(builtin, type) and issubclass(builtin, BaseException)
    )


def exception_classes(src: Path = SRC) -> dict[str, str]:
    """{class: its module} for every class in ``src`` named like an error or deriving, by name, from
    an exception class (a builtin one, one named like an error, or one found here); the base,
    :class:`InputError`, left out."""
    classes: list[tuple[str, str, list[str]]] = []
    for path in sorted(src.rglob("*.py")):
        module = ".".join(path.relative_to(src.parent).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and f"{module}.{node.name}" != "aggbench.errors.InputError":
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                classes.append((node.name, module, bases))
    found: dict[str, str] = {}
    while new := [
        (name, module)
        for name, module, bases in classes
        if (name, module) not in found.items()
        and (name.endswith("Error") or any(_is_exception_name(b) or b in found for b in bases))
    ]:
        for name, module in new:
            assert name not in found, f"two exception classes named {name}: in {found[name]} and {module}"
            found[name] = module
    return found


@functools.cache
def _modules() -> dict[str, str]:
    return exception_classes()


def _load(name: str) -> type:
    return getattr(importlib.import_module(_modules()[name]), name)


def test_every_exception_class_is_listed():
    assert set(exception_classes()) == set(INPUT_ERRORS) | set(INTERNAL)


def test_the_scan_finds_a_new_error_class(tmp_path):
    (tmp_path / "aggbench").mkdir()
    (tmp_path / "aggbench" / "new.py").write_text("class NewError(ValueError):\n    pass\n")
    (tmp_path / "aggbench" / "other.py").write_text(
        "class Stop(Exception):\n    pass\n\nclass Plain:\n    pass\n\nclass Sub(Stop):\n    pass\n"
    )
    assert exception_classes(tmp_path / "aggbench") == {
        "NewError": "aggbench.new",
        "Stop": "aggbench.other",
        "Sub": "aggbench.other",
    }


@pytest.mark.parametrize("name", sorted(INPUT_ERRORS))
def test_a_bad_input_error_derives_from_the_base_and_keeps_its_builtin_base(name):
    cls = _load(name)
    assert issubclass(cls, InputError) and issubclass(cls, INPUT_ERRORS[name])


@pytest.mark.parametrize("name", sorted(INTERNAL))
def test_an_internal_error_is_not_bad_input(name):
    assert not issubclass(_load(name), InputError)


# ---------------------------------------------------------------- the command line
_TRAIN_RAISING = textwrap.dedent("""
    import sys

    import aggbench.train.loop
    from aggbench.cli import main
    from aggbench.data.sources import DataUnavailableError
    from aggbench.train.checkpoint import RunLockedError

    def train(*args, **kwargs):
        raise {raise_}

    aggbench.train.loop.train = train
    main(sys.argv[1:])
""")


def _train_raising(tmp_path: Path, raise_: str) -> subprocess.CompletedProcess:
    """`aggbench train` on the smoke grid's first cell, its training raising ``raise_`` (a Python
    expression)."""
    from aggbench.config import dump_config
    from aggbench.grid import cell_train_config, cells, load_experiment

    smoke = load_experiment(SRC.parents[1] / "configs" / "smoke.yaml")
    cell = tmp_path / "cell.yaml"
    dump_config(cell_train_config(smoke, cells(smoke)[0].id), cell)
    script = tmp_path / "train_raising.py"
    script.write_text(_TRAIN_RAISING.format(raise_=raise_))
    args = ["train", "--config", str(cell), "--out", str(tmp_path / "run"), "--quiet"]
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ("RunLockedError", "run directory r is being trained by pid 7 on n; wait for it or kill it"),
        ("DataUnavailableError", "no copy of x here: set AGGBENCH_DATA_DIR"),
    ],
)
def test_bad_input_through_the_cli_is_one_line_with_exit_status_1(tmp_path, error, message):
    proc = _train_raising(tmp_path, f"{error}({message!r})")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"Error: {message}"]


@pytest.mark.parametrize(
    ("raise_", "last_line"),
    [
        ('RuntimeError("an internal slip")', "RuntimeError: an internal slip"),
        ('KeyError("k")', "KeyError: 'k'"),
    ],
)
def test_an_internal_error_through_the_cli_ends_with_its_traceback(tmp_path, raise_, last_line):
    proc = _train_raising(tmp_path, raise_)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == last_line


def test_the_architecture_doc_names_every_input_error():
    """docs/architecture.md's Errors section says its list is INPUT_ERRORS: it names each class."""
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text()
    section = doc.split("## Errors", 1)[1].split("\n## ", 1)[0]
    missing = [name for name in INPUT_ERRORS if f"`{name}`" not in section]
    assert not missing, f"docs/architecture.md's Errors section does not name {missing}"
