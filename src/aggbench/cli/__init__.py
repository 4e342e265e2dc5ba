"""The `aggbench` command line.

Start-up is lazy on purpose: torch, transformers and mlflow each take seconds to import, so the
group only knows each sub-command's module path and imports it when that command runs (or when
`--help` of that command is asked for). A sub-command lives in its own module and exposes a
click command named `command`.

Before any command, the modules ``$AGGBENCH_PLUGINS`` names (comma-separated modules or .py files)
are imported: the workflow sets it from the config's ``plugins:`` for every job, so a plugin's
grader named in a benchmark YAML (checked when the spec is read) is known to the generate, score
and fetch jobs too, not only to train, which loads its cell config's plugins itself. The verl
integration reads the same variable.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import click

# name -> (module path, one-line help shown by `aggbench --help` without importing the module)
COMMANDS: dict[str, tuple[str, str]] = {
    "explain": ("aggbench.cli.explain", "Show what every aggregation rule does to a batch."),
    "rules": ("aggbench.cli.explain:rules_command", "List the registered aggregation rules."),
    "audit": (
        "aggbench.cli.audit",
        "Show what another trainer's loss mode (TRL, verl, OpenRLHF, SkyRL) does to a batch.",
    ),
    "prepare-model": (
        "aggbench.cli.prepare_model",
        "Build a model directory: the tiny model, a local copy, or a hub snapshot.",
    ),
    "grade": ("aggbench.cli.grade", "Grade generations (math or code) from a JSONL file."),
    "train": ("aggbench.cli.train", "Train one cell, or one segment of it, resuming from checkpoints."),
    "generate": (
        "aggbench.cli.evaluate:generate_command",
        "Sample a checkpoint on benchmarks (model loaded once).",
    ),
    "score": (
        "aggbench.cli.evaluate:score_command",
        "Grade one benchmark's samples and compute its metrics.",
    ),
    "evaluate": (
        "aggbench.cli.evaluate:evaluate_command",
        "generate + score + log to MLflow, for one checkpoint.",
    ),
    "grid": ("aggbench.cli.grid", "Check and expand an experiment grid (cells, job counts, cell configs)."),
    "prepare-data": (
        "aggbench.cli.grid:prepare_data_command",
        "Write a training dataset as canonical JSONL.",
    ),
    "data": (
        "aggbench.cli.data",
        "Fetch benchmark data for offline compute nodes (sha256-locked).",
    ),
    "ingest": ("aggbench.cli.report:ingest_command", "Put run files into MLflow (idempotent)."),
    "report": ("aggbench.cli.report:report_command", "Peak and last-step tables and plots from MLflow."),
    "crosscheck": ("aggbench.cli.crosscheck", "Cross-check generations and verdicts with lm-eval."),
    "plan": ("aggbench.cli.plan", "Cost of a grid before submitting: GPU-hours, memory per GPU, jobs."),
    "power": ("aggbench.cli.power", "Seeds needed to detect a difference between two rules (paired t)."),
    "probe": (
        "aggbench.cli.probe",
        "Contamination probe: exact-match rate of a model completing each problem from its first 60%.",
    ),
}


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        target, _help = COMMANDS[name]
        module_path, _, attr = target.partition(":")
        module = importlib.import_module(module_path)
        return getattr(module, attr or "command")

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="aggbench")
def main() -> None:
    """aggbench: loss aggregation in GRPO-style RL with verifiable rewards, reproduced."""
    _env_plugins()


def _env_plugins() -> None:
    """Import ``$AGGBENCH_PLUGINS`` (relative paths from the working directory); a plugin that fails
    to import is a one-line error naming the variable."""
    from aggbench.registry import PLUGINS_ENV, RegistryError, env_plugins, load_plugins

    specs = env_plugins()
    if not specs:
        return

    try:
        load_plugins(specs, search_paths=[Path.cwd()])
    except RegistryError as exc:
        raise click.ClickException(f"{PLUGINS_ENV}={','.join(specs)}: {exc}") from None


if __name__ == "__main__":
    main()
