# aggbench's workflow: prepare -> train segments -> generate -> grade -> ingest + report.
#
#   snakemake --cores 2                                         # the smoke grid, CPU, minutes
#   snakemake -n --configfile configs/paper.yaml                # what the paper grid would run
#   snakemake --profile slurm --configfile configs/paper.yaml   # the paper grid on a SLURM cluster
#
# Rules are thin: each calls the `aggbench` CLI (the package never imports Snakemake). The files
# under results_dir are the source of truth; MLflow is fed from them. docs/workflow.md explains how
# to run on a cluster, add an aggregation rule, and where the tables and the MLflow UI are.

import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version, validate

min_version("9.0")


# The embedded default. A --configfile on the command line REPLACES it (Snakemake would otherwise
# merge, say, the paper grid into the smoke grid: three models, one nonsense grid); --config
# KEY=VALUE still overrides single keys of whichever file is used.
if not workflow.overwrite_configfiles:

    configfile: "configs/smoke.yaml"


# Plugins (`plugins: [my_rules]`) are found in the working directory, the repository root, and the
# directory of the config file that names them (a user's rule can live beside their config).
CONFIG_FILES = [str(f) for f in (workflow.overwrite_configfiles or workflow.configfiles)]
CONFIG_DIRS = [str(Path(f).resolve().parent) for f in CONFIG_FILES]
sys.path.extend(d for d in CONFIG_DIRS if d not in sys.path)

# Validation before any job starts. aggbench's check comes first because its messages name the bad
# key and the allowed keys or values (misspelled key, unknown rule or benchmark, negative step
# count, missing model directory); Snakemake's schema validation then fills the schema's defaults.
# The schema is the package's own (aggbench.grid.SCHEMA_PATH): one file, which the CLI's
# `aggbench grid check` validates with too.
from aggbench.grid import SCHEMA_PATH, GridError, validate_experiment

try:
    validate_experiment(config)
except GridError as exc:
    raise WorkflowError(f"{exc}\n(config: {', '.join(CONFIG_FILES)})") from None
validate(config, str(SCHEMA_PATH))


include: "workflow/rules/common.smk"
include: "workflow/rules/prepare.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


onstart:
    # jobs submitted to a cluster with the embedded SQLite store: say so where the user looks,
    # not only in `aggbench grid check` (the executor is known here, not at parse time)
    if workflow.non_local_exec and not workflow.remote_exec:
        from snakemake.logging import logger

        from aggbench.plan.readiness import sqlite_on_cluster

        if warning := sqlite_on_cluster(config):
            logger.warning(f"WARNING: {warning}")


rule all:
    default_target: True
    input:
        kept_files(),
