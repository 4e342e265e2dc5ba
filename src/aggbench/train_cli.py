"""`aggbench train`: one cell, or one segment of it, resuming from the latest complete checkpoint."""

from __future__ import annotations

import logging
import sys

import click
import yaml


def _parse_set(values: tuple[str, ...]) -> dict:
    out = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"{item!r}: expected KEY=VALUE (e.g. algorithm.total_steps=4)", param_hint="--set"
            )
        out[key] = yaml.safe_load(raw)
    return out


@click.command("train")
@click.option("--config", "config_path", required=True, type=click.Path(dir_okay=False), help="Cell YAML.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="Run directory.")
@click.option(
    "--until-step", type=click.IntRange(min=1), default=None, help="Stop after this step's checkpoint."
)
@click.option(
    "--set", "overrides", multiple=True, help="Override a config field: dotted.key=value (repeatable)."
)
@click.option("--quiet", is_flag=True, help="One line per step instead of a progress bar (cluster logs).")
@click.option(
    "--allow-config-change",
    is_flag=True,
    help="Resume even though the config changes training (the run then mixes both configs).",
)
def command(
    config_path: str,
    out_dir: str,
    until_step: int | None,
    overrides: tuple[str, ...],
    quiet: bool,
    allow_config_change: bool,
) -> None:
    """Train one cell into OUT, resuming from its latest complete checkpoint."""
    from aggbench.checkpoint import RunLockedError
    from aggbench.config import ConfigError, load_train_config
    from aggbench.data.jsonl import DataError
    from aggbench.registry import RegistryError
    from aggbench.train import train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet = quiet or not sys.stderr.isatty()
    if quiet:  # cluster logs: one line per step, not transformers' load/save bars at every checkpoint
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        cfg = load_train_config(config_path, _parse_set(overrides))
        summary = train(
            cfg,
            out_dir,
            until_step=until_step,
            quiet=quiet,
            allow_config_change=allow_config_change,
        )
    except (ConfigError, DataError, RegistryError, RunLockedError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{summary['cell_id']}: steps {summary['start_step']} -> {summary['end_step']}")
