"""The package's layering, as data: which part of aggbench may import which.

A part is a top-level module (``grid``) or a subpackage (``train/``). Every import of another part,
at module level or inside a function, must be an edge written in ``ALLOWED``; the direction is
bottom to top (foundations, then the experimental axis, data and grading, then the trainer and the
evaluator, then report and plan, then the command line). ``NO_TORCH`` parts must import with torch
unavailable (report/, grid, plan/ run on a login node or in a CPU job). And no module re-exports
another module's names: a ``from aggbench.X import name`` finds ``name`` defined in X, unless X is a
package's ``__init__`` (the public API of aggregation/, data/, rollout/). Only tracking.py writes to
MLflow (``mlflow_writes``).
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers.support import import_without

SRC = Path(__file__).resolve().parents[1] / "src" / "aggbench"
FOUNDATION = {"registry", "files", "layout", "metric_names", "seeds", "devices", "modeldir", "prompts"}
FOUNDATION |= {"config_errors", "errors", "environment", "golden", "resources"}

ALLOWED: dict[str, set[str]] = {
    **{name: set() for name in FOUNDATION},
    # errors (InputError, imports nothing): the base of every bad-input error, imported where one is defined
    **{name: {"errors"} for name in ("registry", "devices", "config_errors")},
    "graders": {"errors", "registry"},
    # prepare-model builds the tiny model (tiny/ imports nothing of aggbench)
    "modeldir": {"errors", "files", "layout", "tiny/"},  # layout: the COMPLETE marker that carries checksums
    "prompts": {"config_errors"},  # a bad model.stop_tokens is a ConfigError
    "config": {"config_errors", "files", "graders", "layout", "registry"},
    # a run's recorded config: MLflow params and the resume check (split from config)
    "run_config": {"config", "config_errors", "errors", "files", "layout"},
    "tiny/": set(),
    "aggregation/": {"errors", "registry"},
    # layout: where a prepared training file's fetched benchmark copy lies (the holdout split check)
    "data/": {"errors", "files", "graders", "layout", "metric_names", "registry", "tiny/"},
    "tracking": {"environment", "files", "layout", "provenance"},
    # a run's MLflow tags, also written to its run files (the trainer writes, ingest reads them)
    "provenance": {"environment", "files", "layout"},
    "grading/": {"data/", "graders", "metric_names", "tiny/"},  # metric_names: the ledger's count names
    "grid": {
        "aggregation/",
        "config",
        "config_errors",
        "data/",
        "errors",
        "layout",
        "resources",
        "tiny/",
    },  # tiny/: the shared skill phases
    "rollout/": {"seeds"},
    "train/": {
        "aggregation/",
        "config",
        "run_config",
        "data/",
        "files",
        "graders",
        "grading/",
        "layout",
        "modeldir",
        "seeds",
    }
    | {"config_errors", "environment", "errors", "prompts", "registry", "rollout/", "tiny/", "tracking"}
    | {"provenance"},
    "evaluation/": {"data/", "devices", "files", "graders", "grading/", "modeldir", "prompts", "rollout/"}
    | {"environment", "errors", "layout", "metric_names", "registry", "seeds", "tiny/", "tracking"},
    # other trainers' loss modes as weights (aggbench audit): the rules and explain's batch
    # config_errors: a bad config's YAML problem; errors: its not-UTF-8 one
    "audit/": {"aggregation/", "config_errors", "errors", "registry"},
    # adapters for other trainers: the rules, nothing of aggbench's trainer; the monitors read the
    # other trainers' modes (audit/) and may log to MLflow through tracking's public API
    "integrations/": {"aggregation/", "audit/", "errors", "tracking"},
    "report/": {"config", "data/", "files", "grid", "layout", "metric_names", "provenance", "tracking"}
    | {"run_config"}  # ingest: a rebuilt run gets the params its trainer gives it
    | {"aggregation/"}  # explain_render: the explain batch's types, for annotations only (no torch)
    | {"tiny/"},  # lab_v2: the built-in task's answer styles (tiny/task imports no torch)
    "plan/": {"data/", "errors", "grid", "layout", "resources", "rollout/", "tiny/"},  # errors: PowerError
    "cli/": {"*"},
}
NO_TORCH = (
    {
        "registry",
        "environment",
        "golden",
        "files",
        "graders",
        "config",
        "run_config",
        "resources",
        "config_errors",
        "errors",
        "prompts",
        "modeldir",
        "tracking",
        "provenance",
        "grid",
        "data/",
    }
    | {"grading/"}
    | {
        "report/",
        "plan/",
    }
)
PUBLIC_INITS = {"aggbench.aggregation", "aggbench.audit", "aggbench.data", "aggbench.rollout", "aggbench.cli"}


def part_of(module: str, src: Path = SRC) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "aggbench"
    return parts[1] + "/" if (src / parts[1]).is_dir() else parts[1]


def module_name(path: Path, src: Path = SRC) -> str:
    rel = path.relative_to(src.parent).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__")


def imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append(node.module)
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
    return out


def violations(src: Path, allowed: dict[str, set[str]]) -> list[str]:
    bad = []
    for path in sorted(src.rglob("*.py")):
        module = module_name(path, src)
        part = part_of(module, src)
        for target in imports(path):
            if not target.startswith("aggbench.") or part == "aggbench":
                continue
            other = part_of(target, src)
            if other in (part, "aggbench"):
                continue
            ok = allowed.get(part, set())
            if "*" not in ok and other not in ok:
                bad.append(f"{module} imports {target}: {part} -> {other} is not an allowed edge")
    return bad


def test_every_part_is_in_the_table():
    parts = {part_of(module_name(p)) for p in SRC.rglob("*.py")} - {"aggbench"}
    assert parts == set(ALLOWED), f"new or removed parts: {sorted(parts ^ set(ALLOWED))}"


def test_imports_follow_the_allowed_edges():
    assert violations(SRC, ALLOWED) == []


def test_train_never_imports_evaluation_or_report():
    assert not ALLOWED["train/"] & {"evaluation/", "report/", "plan/", "cli/"}
    assert not ALLOWED["report/"] & {"train/", "cli/"} and not ALLOWED["grid"] & {"train/", "report/"}


def test_a_forbidden_edge_is_caught(tmp_path):
    """The checker itself: a report module importing the trainer is reported."""
    src = tmp_path / "aggbench"
    (src / "report").mkdir(parents=True)
    (src / "train").mkdir()
    for f in ("__init__.py", "report/__init__.py", "train/__init__.py", "train/loop.py"):
        (src / f).write_text("")
    (src / "report" / "tables.py").write_text("def f():\n    from aggbench.train.loop import train\n")
    found = violations(src, {"report/": {"files"}, "train/": set()})
    assert found == [
        "aggbench.report.tables imports aggbench.train.loop: report/ -> train/ is not an allowed edge"
    ]


def test_torch_free_parts_import_without_torch(tmp_path):
    modules = sorted(
        module_name(p)
        for p in SRC.rglob("*.py")
        if part_of(module_name(p)) in NO_TORCH and p.name != "__main__.py"
    )
    proc = import_without(tmp_path, "torch", modules)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.strip()) == len(modules) >= 30, proc.stdout


def _defined(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_no_module_re_exports_another_modules_names():
    repo = SRC.parents[1]
    files = [*SRC.rglob("*.py"), *(repo / "tests").rglob("*.py"), *(repo / "benchmarks").rglob("*.py")]
    defined: dict[str, set[str]] = {}
    bad = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            mod = node.module
            if not mod.startswith("aggbench.") or mod in PUBLIC_INITS:
                continue
            target = SRC.parent.joinpath(*mod.split("."))
            home = target / "__init__.py" if target.is_dir() else target.with_suffix(".py")
            if not home.exists():
                continue
            names = defined.setdefault(mod, _defined(home))
            for alias in node.names:
                submodule = (target / f"{alias.name}.py").exists() or (
                    target / alias.name / "__init__.py"
                ).exists()
                if alias.name not in names and not submodule:
                    bad.append(f"{path.relative_to(repo)}: {alias.name} is not defined in {mod}")
    assert bad == []


# --------------------------------------------------------------------------- MLflow writes

# The write API of MLflow, outside tracking.py: (1) importing mlflow at all, except
# ``from mlflow.exceptions import ...`` (errors to catch): the package is the fluent API
# (mlflow.log_metric, start_run, set_tags, log_table, ...), and its client and entities exist to
# write (a reader takes the client of ``tracking.init_store`` or ``MlflowRun.client``); (2) naming
# any MlflowClient method named for a writing verb (log_batch, set_terminated, update_run,
# log_artifact, ...), called or handed to a retry, on whatever object: that is how a client handed
# out for reading would write; (3) importing tracking's private names (its retry).
WRITE_VERBS = {"log", "set", "create", "update", "delete", "restore", "rename", "register", "link"}
WRITE_VERBS |= {"unlink", "finalize", "copy", "start", "end", "add", "remove", "detach", "refresh"}
WRITE_VERBS |= {"transition"}
READ_ONLY_MLFLOW = {"mlflow.exceptions"}


def mlflow_write_methods() -> set[str]:
    """MlflowClient's methods that write to the store (reads: get_, search_, list_, load_, download_)."""
    from mlflow.tracking import MlflowClient

    return {n for n in dir(MlflowClient) if n.split("_", 1)[0] in WRITE_VERBS}


def mlflow_writes(src: Path, methods: set[str]) -> list[str]:
    """Every use of MLflow's write API (the comment above) in a module of ``src`` but tracking."""
    bad = []
    for path in sorted(src.rglob("*.py")):
        module = module_name(path, src)
        if module == "aggbench.tracking":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            where = f"{module}:{getattr(node, 'lineno', '')}"
            if isinstance(node, ast.Import):
                bad += [f"{where} imports {a.name}" for a in node.names if a.name.split(".")[0] == "mlflow"]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module.split(".")[0] == "mlflow" and node.module not in READ_ONLY_MLFLOW:
                    bad.append(f"{where} imports from {node.module}")
                elif node.module == "aggbench.tracking":
                    bad += [
                        f"{where} imports tracking's private {a.name}" for a in node.names if a.name[0] == "_"
                    ]
            elif isinstance(node, ast.Attribute) and node.attr in methods:
                bad.append(f"{where} uses .{node.attr}, an MLflow write")
    return bad


def test_only_tracking_writes_to_mlflow():
    methods = mlflow_write_methods()
    assert {"log_batch", "log_artifact", "log_table", "set_terminated", "update_run", "create_run"} <= methods
    assert mlflow_writes(SRC, methods) == []


def test_an_mlflow_write_outside_tracking_is_caught(tmp_path):
    """The checker itself: each kind of write outside tracking.py is reported, reads and tracking's
    public API are not, and tracking.py may do anything."""
    src = tmp_path / "aggbench"
    (src / "report").mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "report" / "__init__.py").write_text("")
    (src / "tracking.py").write_text("import mlflow\n\ndef f(client):\n    client.log_batch('r')\n")
    (src / "report" / "summary.py").write_text(
        "from aggbench.tracking import MlflowRun, _retry\n"
        "\n"
        "def f(client, run):\n"
        "    _retry(client.log_artifact, run.run_id, 'p')\n"
        "    run.client.log_table(run.run_id, None, 't.json')\n"
    )
    (src / "report" / "ingest.py").write_text(
        "import mlflow.exceptions\n"
        "from mlflow.exceptions import MlflowException\n"
        "from aggbench.tracking import MlflowRun, metric_history\n"
        "\n"
        "def g(run, client):\n"
        "    from mlflow.entities import Metric\n"
        "    run.set_tags({}), run.log_params({}), run.sync([]), client.get_run('r'), client.search_runs([])\n"
    )
    assert mlflow_writes(src, mlflow_write_methods()) == [
        "aggbench.report.ingest:1 imports mlflow.exceptions",
        "aggbench.report.ingest:6 imports from mlflow.entities",
        "aggbench.report.summary:1 imports tracking's private _retry",
        "aggbench.report.summary:4 uses .log_artifact, an MLflow write",
        "aggbench.report.summary:5 uses .log_table, an MLflow write",
    ]
