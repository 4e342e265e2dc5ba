# Shared by every rule file: the grid (from aggbench.grid, the one place that expands it), the
# paths of everything the workflow writes, each rule's resources, and the environment of jobs.
# The config is already validated when this file is included (see the Snakefile).

import functools
import hashlib
import json
import os
import shlex
import sys
from pathlib import Path

import yaml

from aggbench import grid, layout
from aggbench.evaluation.options import workflow_args
from aggbench.resources import RESOURCE_FALLBACK
from aggbench.resources import resource as resolve_resource

R = str(grid.results_dir(config)).rstrip("/") or "."  # every output lives under here
CELLS = {c.id: c for c in grid.cells(config)}
MODELS = list(config["models"])
BENCHMARKS = list(config["benchmarks"])
CHECKPOINT_STEPS = {m: grid.checkpoint_steps(config, m) for m in MODELS}  # train segments end here
EVAL_STEPS = {m: grid.eval_steps(config, m) for m in MODELS}  # ... and these are evaluated
EVAL = config["evaluation"]
BASE_EVAL = bool(EVAL.get("base_model", True))
# the greedy n=1 protocol beside the sampled one: written by the same generate and grade jobs
GREEDY = bool(EVAL.get("greedy", False))
# what `aggbench report` writes under {R}/tables/ (plus plots/, declared as a directory), and the
# greedy protocol's tables under {R}/tables/greedy/
# (selected.*: the tables whose checkpoints are chosen on a held-out split, with evaluation.selection)
SELECTED = ("selected",) if grid.selection(config) else ()
TABLES = [f"{t}.{ext}" for t in ("peak", "last", *SELECTED) for ext in ("md", "csv", "tex")] + ["values.csv"]
# evaluation.extra_seeds: every evaluated checkpoint sampled again under each (eval_seed_K/ beside its
# evaluation), for the report's variance decomposition (tables/variance.{md,csv})
EXTRA_SEEDS = [int(k) for k in EVAL.get("extra_seeds") or []]


# No '/' in any wildcard; cell and model names may hold '.' (qwen2.5-math-7b__dapo17k__token__s0).
wildcard_constraints:
    cell=r"[A-Za-z0-9_.-]+",
    model=r"[A-Za-z0-9_.-]+",
    dataset=r"[A-Za-z0-9_-]+",
    bench=r"[A-Za-z0-9_-]+",
    step=r"\d+",
    k=r"\d+",
    eseed=r"\d+",
    key=r"[A-Za-z0-9_.-]+",


# ---------------------------------------------------------------- job environment
def _plugin_roots():
    """Folders the plugins were imported from: a job's Python must find them wherever it runs.

    A console script (`aggbench ...`) has its own bin/ on sys.path, not its working directory, and a
    SLURM job may start elsewhere, so the folders are put on the jobs' PYTHONPATH explicitly.
    """
    roots = []
    for spec in config.get("plugins", []):
        if spec.endswith(".py"):
            continue  # loaded by file path, no sys.path needed
        loaded = sys.modules.get(spec)
        where = getattr(loaded, "__file__", None)
        if not where:
            continue
        root = Path(where).resolve().parent
        if Path(where).name == "__init__.py":
            root = root.parent
        for _ in spec.split(".")[1:]:
            root = root.parent
        roots.append(str(root))
    return roots


def _pythonpath():
    dirs = [str(Path(workflow.basedir).resolve()), os.getcwd(), *_plugin_roots()]
    return ":".join(dict.fromkeys(dirs))


def _plugins_env():
    """`AGGBENCH_PLUGINS=...` for the config's plugins: every `aggbench` command imports them first
    (aggbench.cli), so a plugin grader a benchmark YAML names works in every job. Set empty without
    plugins: a value in the user's shell (verl's docs suggest one) must not reach the jobs."""
    return f" AGGBENCH_PLUGINS={shlex.quote(','.join(config.get('plugins', [])))}"


# Every job's shell starts with ENV: `aggbench` is the one installed beside the Python running
# Snakemake (a venv need not be activated), and plugins must import wherever the job runs.
ENV = (
    f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH "
    f"PYTHONPATH={shlex.quote(_pythonpath())}${{PYTHONPATH:+:$PYTHONPATH}}{_plugins_env()};"
)
# Every non-local job also runs offline: compute nodes often are, and the local rules
# prepare_model, prepare_data and fetch_benchmarks fetched everything from the hub beforehand.
JOB_ENV = f"{ENV} export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1;"
# The tiny model's warm start trains on torch CPU threads, and its weights depend on their number
# (torch splits reductions by thread: 1 and 2 threads differ after 4 steps), so the prepare rules
# export this number, not {threads}: Snakemake lowers {threads} to --cores, and `--cores 1` would
# otherwise train other models than the smoke DAG's golden outputs. 2 threads: 1.8x one on 2 cores.
WARM_START_THREADS = 2


# ---------------------------------------------------------------- resources
# Resolved by aggbench.resources.resource (model override > config > RESOURCE_FALLBACK; grade's
# cpus: evaluation.workers), the same function `aggbench plan` costs the grid with.
# The base model's jobs use the resources of their run-side twins.
RESOURCE_SECTION = {"generate_base": "generate", "grade_base": "grade"}


def _resource_value(rule_name, model, key):
    return resolve_resource(config, RESOURCE_SECTION.get(rule_name, rule_name), model, key)


def _resource_keys(rule_name):
    section = RESOURCE_SECTION.get(rule_name, rule_name)
    keys = set(RESOURCE_FALLBACK) | set(config.get("resources", {}).get(section, {}))
    for m in MODELS:
        keys |= set((config["models"][m].get("resources") or {}).get(section, {}))
    return sorted(keys)


def model_of_cell(wildcards):
    try:
        return CELLS[wildcards.cell].model
    except KeyError:
        raise ValueError(f"cell {wildcards.cell!r} is not in this grid (cells: {', '.join(CELLS)})") from None


def model_of_wildcard(wildcards):
    return wildcards.model


def rule_threads(rule_name, model_of=None):
    """threads: = the rule's `cpus` (a SLURM job's --cpus-per-task; capped by --cores locally)."""
    return lambda wildcards: int(_resource_value(rule_name, model_of(wildcards) if model_of else None, "cpus"))


def rule_resources(rule_name, model_of=None):
    """resources: of a rule, per job: config["resources"][rule], overridden per model.

    `gpus` becomes the SLURM plugin's `gpu` (dropped when 0), `cpus` becomes `cpus_per_task` (and
    threads:, see rule_threads); every other key (slurm_partition, slurm_account, constraint,
    slurm_extra, qos, ...) passes through to the executor unchanged. A job on several GPUs also
    gets `nodes: 1` unless the config sets `nodes`: its processes are one node's (`torchrun
    --standalone`, vLLM's tensor parallelism), and without it SLURM may split `--gpus` over nodes.
    """
    out = {}
    keys = _resource_keys(rule_name)
    if "nodes" not in keys:

        def one_node(wildcards):
            gpus = _resource_value(rule_name, model_of(wildcards) if model_of else None, "gpus")
            return 1 if gpus and int(gpus) > 1 else None

        out["nodes"] = one_node
    for key in keys:
        name = {"gpus": "gpu", "cpus": "cpus_per_task"}.get(key, key)

        def value(wildcards, key=key):
            v = _resource_value(rule_name, model_of(wildcards) if model_of else None, key)
            if key == "gpus":
                return int(v) if v else None
            return v

        out[name] = value
    return out


# ---------------------------------------------------------------- paths
# Every run-file path comes from aggbench.layout (names may be wildcards such as "{cell}").
def run_dir(cell):
    return str(layout.run_dir(R, cell))


def base_dir(model):
    return str(layout.base_dir(R, model))


def segment_marker(cell, step):
    return str(layout.segment_marker(layout.run_dir(R, cell), step))


def restart_stamp(cell, k, step):
    return str(layout.restart_stamp(layout.run_dir(R, cell), k, step))


def checkpoint_of(cell, step):
    return str(layout.checkpoint_dir(layout.run_dir(R, cell), step))


def samples_of(run, step):
    return str(layout.samples_dir(run, step))


def eval_of(run, step, bench, greedy=False):
    """(graded samples, metrics) of one benchmark at one step of a run or base directory; greedy:
    the greedy protocol's."""
    metrics = layout.eval_metrics_file(run, step, bench)
    if greedy:
        metrics = layout.greedy_dir(metrics.parent) / metrics.name
    return str(metrics.with_name(f"{bench}.jsonl")), str(metrics)


def eval_seed_files(run, step, bench, eseed):
    """(graded samples, metrics) of one benchmark at one step under an extra evaluation seed."""
    graded = layout.graded_file(run, step, bench, eseed)
    return str(graded), str(graded.with_name(layout.eval_metrics_file(run, step, bench).name))


def grade_files(run, step, bench):
    """The grade rule's outputs: graded samples and metrics, and the greedy protocol's when on."""
    out = dict(zip(("graded", "metrics"), eval_of(run, step, bench)))
    if GREEDY:
        out.update(zip(("greedy_graded", "greedy_metrics"), eval_of(run, step, bench, greedy=True)))
    return out


def cell_config(cell):
    return str(layout.cell_config(layout.run_dir(R, cell)))


def model_dir(model):
    return str(layout.model_dir(R, model))


def skill_phase_dir(key):
    return str(layout.skill_phase_dir(R, key))


@functools.cache
def skill_phases():
    """key -> the tiny models whose warm starts share that skill phase (the knob-free first half),
    for keys two or more models share: it runs once (rule prepare_skill_phase), and each of them
    continues from it with the weights its own warm start would give (tests/tiny/test_skill_phase.py)."""
    from aggbench.tiny.lab import shared_skill_phases

    return shared_skill_phases(config["models"])


def skill_phase_of(model):
    """The key of the skill phase ``model`` shares with other models of the grid, or None."""
    return next((key for key, names in skill_phases().items() if model in names), None)


def skill_phase_args(key):
    """`aggbench prepare-model` options of a shared skill phase: the steps and the task fields that
    enter it (gap, spread and worked_fraction do not)."""
    m = config["models"][skill_phases()[key][0]]
    args = ["--sft-steps", str(m["sft_steps"])] if m.get("sft_steps") is not None else []
    if (m.get("task") or {}).get("verbosity") is not None:
        args += ["--verbosity", str(m["task"]["verbosity"])]
    return " ".join(args)


def data_file(dataset):
    return str(layout.data_file(R, dataset))


def benchmark_data():
    return str(layout.benchmark_data_dir(R))


def benchmark_lock():
    return str(layout.benchmark_lock(R))


def train_markers():
    return [segment_marker(c.id, s) for c in CELLS.values() for s in CHECKPOINT_STEPS[c.model]]


def grade_outputs():
    out = [
        eval_of(run_dir(c.id), s, b)[1] for c in CELLS.values() for s in EVAL_STEPS[c.model] for b in BENCHMARKS
    ]
    if BASE_EVAL:
        out += [eval_of(base_dir(m), 0, b)[1] for m in MODELS for b in BENCHMARKS]
    return out + extra_seed_outputs()


def extra_seed_outputs():
    """Every graded file of evaluation.extra_seeds (cells only: the variance is over training seeds)."""
    return [
        f
        for c in CELLS.values()
        for s in EVAL_STEPS[c.model]
        for b in BENCHMARKS
        for k in EXTRA_SEEDS
        for f in eval_seed_files(run_dir(c.id), s, b, k)
    ]


def report_outputs():
    out = [str(layout.tables_dir(R) / name) for name in TABLES]
    if GREEDY:
        out += [str(layout.greedy_dir(layout.tables_dir(R)) / name) for name in TABLES]
    if EXTRA_SEEDS:
        out += [str(layout.tables_dir(R) / f"variance.{ext}") for ext in ("md", "csv")]
    return out


def local_store():
    """The MLflow store's SQLite file when it is one (the embedded default, results/mlflow.db, or a
    sqlite:/// tracking_uri), else None (a tracking server: not a file of this workflow)."""
    uri = config.get("tracking_uri") or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return str(layout.mlflow_db(R))
    return uri[len("sqlite:///") :] if uri.startswith("sqlite:///") else None


def kept_files():
    """The default target: the report, and, once a report was made, every file it was built from
    that has gone missing.

    Snakemake regenerates a missing input of a job only when that job reruns, and a missing input
    does not make a finished report rerun: without this, deleting an evaluation, a segment marker
    (with its checkpoint) or the store gave "Nothing to be done" while the tables still described
    them. Watched: segment markers, graded samples and metrics, and the store. Before the first
    report (its outputs missing) the report's own inputs already bring everything, so nothing is
    added and a fresh grid's printout stays short; after it, only the missing files are listed."""
    if not any(Path(f).exists() for f in report_outputs()):
        return report_outputs()
    watched = train_markers()
    for c in CELLS.values():
        for s in EVAL_STEPS[c.model]:
            watched += [f for b in BENCHMARKS for f in grade_files(run_dir(c.id), s, b).values()]
    if BASE_EVAL:
        watched += [f for m in MODELS for b in BENCHMARKS for f in grade_files(base_dir(m), 0, b).values()]
    watched += extra_seed_outputs()
    store = local_store()
    watched += [store] if store else []
    return report_outputs() + [f for f in watched if not Path(f).exists()]


def report_plots():
    return str(layout.tables_dir(R) / "plots")


# ---------------------------------------------------------------- arguments
def prepare_model_args(model):
    m = config["models"][model]
    args = [m["source"]]
    if m["source"] == "tiny":
        if m.get("sft_steps") is not None:
            args += ["--sft-steps", str(m["sft_steps"])]
        for key, value in sorted((m.get("task") or {}).items()):
            args += [f"--{key.replace('_', '-')}", str(value)]
        if skill_phase_of(model):
            args += ["--skill-from", skill_phase_dir(skill_phase_of(model))]
    elif m.get("revision") and not m.get("path"):
        args += ["--revision", m["revision"]]
    for key, value in sorted(m.get("config_overrides", {}).items()):
        args += ["--config-override", f"{key}={json.dumps(value)}"]
    return " ".join(shlex.quote(a) for a in args)


def generate_args(model):
    """Sampling options of `aggbench generate` (a change re-generates: they are params), from the
    options' one declaration (aggbench.evaluation.options: WORKFLOW says which config key feeds each).

    vLLM spans the generate job's GPUs with tensor parallelism (resources.generate.gpus, per model).
    """
    return _generate_args(model, EVAL)


def _generate_args(model, evaluation, extra=()):
    gpus = int(_resource_value("generate", model, "gpus") or 0)
    args = workflow_args(evaluation, config["models"][model], gpus)
    return " ".join(shlex.quote(a) for a in [*args, *extra])


def eval_seed_args(model, eseed):
    """generate_args without the greedy protocol (deterministic: sampled once is enough), and the
    evaluation seed (the evaluation's own is --seed 0)."""
    return _generate_args(model, {**EVAL, "greedy": False}, ["--seed", str(eseed)])


def cell_signature(cell):
    """Hash of a cell's resolved training config: cell.yaml is rewritten when it changes.

    The `plugins` list is left out: adding a user's plugin (and its cells) must not rewrite, and so
    re-run, the cells that do not use it.
    """
    cfg = grid.cell_train_config(config, cell).model_dump(mode="json")
    cfg.pop("plugins", None)
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def experiment_json():
    """The validated config (with --config overrides and schema defaults) as the report reads it."""
    return json.dumps(config, sort_keys=True, default=str)


def write_text_atomic(path, text):
    """Write to a temporary name beside `path`, then rename: a killed job leaves no half file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
