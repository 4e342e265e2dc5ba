"""Where every run file lives under ``results_dir``: the one statement of the layout.

    {results}/models/{model}/                           prepared model (prepare_model)
    {results}/data/{dataset}.jsonl                      canonical training set (prepare_data)
    {data file stem}.filter.json                        rows prepare-data --fit-to dropped (too long)
    {results}/experiment.yaml                           the effective experiment config
    {results}/runs/{cell}/cell.yaml                     the cell's training config
    {results}/runs/{cell}/config.resolved.yaml          the trainer's resolved config
    {results}/runs/{cell}/prompt_filter.json            prompts the trainer dropped (too long)
    {results}/runs/{cell}/metrics.jsonl                 one row per finished step (source of truth)
    {results}/runs/{cell}/mlflow_run.json               which MLflow run holds the cell
    {results}/runs/{cell}/environment.json              package versions, CPU (aggbench.environment)
    {results}/runs/{cell}/failure.json                  a segment that stopped on a full disk
    {results}/runs/{cell}/tags.json                     the MLflow tags the trainer gives the run
                                                        (commit, versions, config hash, rule identity)
    {results}/runs/{cell}/checkpoints/step_{N}/COMPLETE a committed checkpoint (written last)
    {results}/runs/{cell}/segments/step_{N}.done        the train segment that ends at N finished
                                                        (holds checkpoint N's COMPLETE record)
    {results}/runs/{cell}/segments/restart_{K}_from_step_{S}.stamp  the K-th retrain, from step S (the
                                                        segments after S retrained one by one: restart_step)
    {results}/runs/{cell}/samples/step_{N}/{bench}.jsonl
    {results}/runs/{cell}/eval/step_{N}/{bench}.jsonl (+ .metrics.json)
    {results}/runs/{cell}/{samples,eval}/step_{N}/greedy/...  the greedy n=1 protocol (evaluation.greedy)
    {results}/base/{model}/...                          the base model's samples/ and eval/ at step 0
    {results}/tables/                                   the report

The trainer, the evaluator, the ingest and the Snakemake rules (workflow/rules/*.smk, with
``{cell}``-style wildcards as names) all build paths here. Torch-free and import-free, so reading
run files never loads a model library.
"""

from __future__ import annotations

import re
from pathlib import Path

RUNS, BASE, CHECKPOINTS = "runs", "base", "checkpoints"
COMPLETE = "COMPLETE"  # written last inside a checkpoint directory
STATE_FILE = "trainer_state.pt"  # a checkpoint a run can resume from holds it (retention drops it)
# The greedy n=1 protocol's samples and grades (evaluation.greedy): a subfolder of the step's own
GREEDY = "greedy"
METRICS_SUFFIX = ".metrics.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


def cell_id(model: str, dataset: str, aggregation: str, seed: int) -> str:
    """A grid cell's id, which names its run directory: ``model__dataset__aggregation__s<seed>``."""
    return f"{model}__{dataset}__{aggregation}__s{seed}"


def step_name(step: int | str) -> str:
    return f"step_{step}"


def step_of(name: str) -> int | None:
    """``step_12`` -> 12; any other name -> None."""
    m = _STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def model_dir(results: str | Path, model: str) -> Path:
    return Path(results) / "models" / model


def skill_phase_dir(results: str | Path, key: str) -> Path:
    """A tiny warm start's first half, shared by the grid's models that have it in common
    (``aggbench.tiny.lab.prepare_skill_phase``; ``key``: ``skill_phase_key``)."""
    return Path(results) / "warm_starts" / key


def data_file(results: str | Path, dataset: str) -> Path:
    return Path(results) / "data" / f"{dataset}.jsonl"


def benchmark_data_dir(results: str | Path) -> Path:
    """The fetched benchmark data (:mod:`aggbench.data.fetch`): records and their lock.json."""
    return Path(results) / "data" / "benchmarks"


def benchmark_lock(results: str | Path) -> Path:
    return benchmark_data_dir(results) / "lock.json"


def data_filter_file(data: str | Path) -> Path:
    """Beside a prepared data file: the rows ``prepare-data --fit-to`` dropped as too long."""
    return Path(data).with_suffix(".filter.json")


def prompt_filter_file(run: str | Path) -> Path:
    """In a run directory: the records of ``dataset.path`` the trainer dropped as too long."""
    return Path(run) / "prompt_filter.json"


def run_dir(results: str | Path, cell: str) -> Path:
    return Path(results) / RUNS / cell


def base_dir(results: str | Path, model: str) -> Path:
    return Path(results) / BASE / model


def is_base_dir(run: str | Path) -> bool:
    """Whether ``run`` is a base model's directory ``results/base/<model>`` (``base_dir``)."""
    return Path(run).resolve().parent.name == BASE


def mlflow_db(results: str | Path) -> Path:
    """The embedded MLflow store of a results directory (SQLite; used when no tracking_uri is set)."""
    return Path(results) / "mlflow.db"


def tables_dir(results: str | Path) -> Path:
    return Path(results) / "tables"


def cell_config(run: str | Path) -> Path:
    return Path(run) / "cell.yaml"


def resolved_config_file(run: str | Path) -> Path:
    """The trainer's resolved config of a run (rewritten on each start; resumes compare against it)."""
    return Path(run) / "config.resolved.yaml"


def experiment_file(results: str | Path) -> Path:
    """The effective experiment config of a results directory (Snakemake's experiment_config rule)."""
    return Path(results) / "experiment.yaml"


def data_record_file(run: str | Path) -> Path:
    """The training records a run directory reads its prompts from: their sha256, count and file,
    and the step since which (``run_config.record_data``); a resume on other records is refused."""
    return Path(run) / "data.json"


def rule_file(run: str | Path) -> Path:
    """The aggregation rule (instance, rule, version, parameters) a run directory was trained with."""
    return Path(run) / "aggregation.json"


def metrics_file(run: str | Path) -> Path:
    return Path(run) / "metrics.jsonl"


def environment_file(run: str | Path) -> Path:
    """What a run (or a base model's evaluation) ran on: ``aggbench.environment.describe()``."""
    return Path(run) / "environment.json"


def failure_file(run: str | Path) -> Path:
    """Why a cell's last training segment failed (a full disk), until a segment starts again."""
    return Path(run) / "failure.json"


def tags_file(run: str | Path) -> Path:
    """The MLflow tags of a cell's run as its trainer set them (provenance a rebuilt store reads)."""
    return Path(run) / "tags.json"


def mlflow_marker(run: str | Path) -> Path:
    return Path(run) / "mlflow_run.json"


def checkpoints_root(run: str | Path) -> Path:
    return Path(run) / CHECKPOINTS


def checkpoint_dir(run: str | Path, step: int | str) -> Path:
    return checkpoints_root(run) / step_name(step)


def segment_marker(run: str | Path, step: int | str) -> Path:
    return Path(run) / "segments" / f"{step_name(step)}.done"


def samples_dir(run: str | Path, step: int | str) -> Path:
    return Path(run) / "samples" / step_name(step)


def eval_root(run: str | Path) -> Path:
    return Path(run) / "eval"


def eval_dir(run: str | Path, step: int | str) -> Path:
    return eval_root(run) / step_name(step)


def eval_metrics_file(run: str | Path, step: int | str, bench: str) -> Path:
    return eval_dir(run, step) / f"{bench}{METRICS_SUFFIX}"


def greedy_dir(step_dir: str | Path) -> Path:
    """The greedy protocol's folder inside a step's samples or eval folder."""
    return Path(step_dir) / GREEDY


def eval_seed_dir(step_dir: str | Path, seed: int | str) -> Path:
    """The folder of one extra evaluation seed (``evaluation.extra_seeds``) inside a step's samples
    or eval folder: the same checkpoint sampled again, for the variance decomposition."""
    return Path(step_dir) / f"eval_seed_{seed}"


def graded_file(run: str | Path, step: int | str, bench: str, eval_seed: int | str | None = None) -> Path:
    """The graded samples of one benchmark at one step (beside its metrics file): the evaluation's
    own (``eval_seed`` None), or the one under an extra evaluation seed."""
    metrics = eval_metrics_file(run, step, bench)
    folder = metrics.parent if eval_seed is None else eval_seed_dir(metrics.parent, eval_seed)
    return folder / f"{bench}.jsonl"


def complete_steps(run: str | Path) -> list[int]:
    """Steps with a committed checkpoint (``checkpoints/step_N/COMPLETE``), ascending."""
    root = checkpoints_root(run)
    if not root.is_dir():
        return []
    return sorted(
        step for d in root.iterdir() if (step := step_of(d.name)) is not None and (d / COMPLETE).exists()
    )


def latest_resumable(run: str | Path) -> int | None:
    """The latest complete checkpoint that holds trainer state, or None (start from step 0)."""
    for step in reversed(complete_steps(run)):
        if (checkpoint_dir(run, step) / STATE_FILE).exists():
            return step
    return None


def restart_stamp(run: str | Path, k: int | str, step: int | str) -> Path:
    """The file the ``k``-th retrain (from checkpoint ``step``) creates (workflow/rules/train.smk, rule
    restart). Numbered: a second retrain from the same step is a new file, newer than the markers."""
    return Path(run) / "segments" / f"restart_{k}_from_{step_name(step)}.stamp"


def restart_stamps(run: str | Path) -> list[tuple[int, int]]:
    """(k, step) of the retrains recorded in ``run`` (their stamps), in order."""
    found = Path(run).glob("segments/restart_*_from_step_*.stamp")
    pattern = re.compile(r"restart_(\d+)_from_step_(\d+)\.stamp")
    return sorted((int(m.group(1)), int(m.group(2))) for p in found if (m := pattern.fullmatch(p.name)))


def restart_step(run: str | Path, segment_ends: list[int]) -> int | None:
    """The step a retrain of ``run`` starts from when it would discard finished segments, else None.

    ``segment_ends``: the run's checkpoint steps, where its train segments end. The first segment
    whose marker is missing trains from the latest resumable checkpoint; when that is earlier than
    the segment's own start (its checkpoint was deleted, and retention had already dropped the
    trainer state of the earlier ones), the finished segments after that checkpoint describe an
    attempt the retrain discards, so they must be trained again, one by one (a segment fits its
    walltime; 0 -> N in one job would not). None: nothing is discarded.
    """
    ends = sorted(segment_ends)
    missing = [i for i, n in enumerate(ends) if not segment_marker(run, n).exists()]
    if not missing or missing[0] == 0:
        return None
    start = latest_resumable(run) or 0
    return start if start < ends[missing[0] - 1] else None


def run_of_checkpoint(checkpoint: str | Path) -> tuple[Path, int] | None:
    """(run dir, step) for ``RUN/checkpoints/step_N``; None for any other directory (a base model)."""
    p = Path(checkpoint).resolve()
    step = step_of(p.name)
    if step is not None and p.parent.name == CHECKPOINTS:
        return p.parent.parent, step
    return None


def results_of(run: str | Path) -> Path:
    """``results/`` for ``results/runs/<cell>`` and ``results/base/<model>``; else the directory itself."""
    run = Path(run).resolve()
    return run.parent.parent if run.parent.name in (RUNS, BASE) else run
