"""How many jobs of each rule the Snakefile's DAG schedules for a grid (``grid.job_counts`` plus
the rules it leaves out), split into SLURM-submitted and local rules: the count `aggbench plan` and
`aggbench grid check` print, which tests/plan/test_plan.py compares with `snakemake -n`."""

from __future__ import annotations

from typing import Any

from aggbench.grid import job_counts

# restart: only when a deleted segment is retrained (workflow/rules/train.smk), never from scratch
LOCAL_RULES = (
    "prepare_skill_phase",
    "prepare_model",
    "prepare_data",
    "fetch_benchmarks",
    "experiment_config",
    "cell_config",
    "restart",
    "all",
)
SLURM_RULES = (
    "train", "generate", "grade", "generate_base", "grade_base", "generate_eval_seed", "grade_eval_seed", "report",
)  # fmt: skip


def grid_jobs(exp: dict) -> dict[str, Any]:
    """Jobs per rule as the Snakefile's DAG schedules them from scratch (grid.job_counts plus the
    rules it leaves out), split into SLURM-submitted and local rules."""
    j = job_counts(exp)
    rules = {k: j[k] for k in ("prepare_skill_phase", "prepare_model", "prepare_data", "fetch_benchmarks",
                               "train", "generate", "grade", "generate_base", "grade_base",
                               "generate_eval_seed", "grade_eval_seed")}  # fmt: skip
    rules.update(experiment_config=1, cell_config=j["cells"], report=1, all=1)
    rules = {k: v for k, v in rules.items() if v}  # as Snakemake's job stats: no rule without jobs
    return {
        "rules": rules,
        "slurm": sum(rules.get(r, 0) for r in SLURM_RULES),
        "local": sum(rules.get(r, 0) for r in LOCAL_RULES),
        "total": sum(rules.values()),
    }
