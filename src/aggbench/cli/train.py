"""`aggbench train`: one cell, or one segment of it, resuming from the latest complete checkpoint."""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

import click
import yaml

if TYPE_CHECKING:
    from aggbench.config import TrainConfig


def _parse_set(values: tuple[str, ...]) -> dict:
    from aggbench.config_errors import yaml_problem

    out = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(
                f"{item!r}: expected KEY=VALUE (e.g. algorithm.total_steps=4)", param_hint="--set"
            )
        try:
            out[key] = yaml.safe_load(raw)
        except yaml.YAMLError as exc:
            raise click.BadParameter(
                f"{item}: value is not valid YAML ({yaml_problem(exc, lines=False)}); quote a string "
                "value, e.g. --set 'model.system_prompt=\"...\"'",
                param_hint="--set",
            ) from None
    return out


def _check_runnable(cfg: TrainConfig) -> None:
    """What this machine must have for ``cfg``, checked before anything loads: its device, and vLLM
    for ``rollout.engine: vllm``. Raises ConfigError naming the setting and the fix."""
    import importlib.util

    from aggbench.config_errors import ConfigError
    from aggbench.devices import check_device

    check_device(cfg.device, "device")
    if (
        cfg.rollout.engine == "vllm"
        and "vllm" not in sys.modules
        and importlib.util.find_spec("vllm") is None
    ):
        from aggbench.rollout.vllm import GPU_EXTRA_HINT

        raise ConfigError(f"rollout.engine=vllm, but vLLM is not installed: {GPU_EXTRA_HINT}")


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
    "--stop-by",
    type=float,
    default=None,
    metavar="UNIX_TIME",
    help="The job's end: stop at a checkpoint when another step would not finish before it "
    "(default inside a SLURM job: its walltime's end; exit status 143, a rerun resumes).",
)
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
    stop_by: float | None,
    allow_config_change: bool,
) -> None:
    """Train one cell into OUT, resuming from its latest complete checkpoint."""
    from aggbench.config import load_train_config
    from aggbench.errors import InputError
    from aggbench.train.loop import train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    quiet = quiet or not sys.stderr.isatty()
    if quiet:  # cluster logs: one line per step, not transformers' load/save bars at every checkpoint
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        cfg = load_train_config(config_path, _parse_set(overrides))
        _check_runnable(cfg)
        summary = train(
            cfg,
            out_dir,
            until_step=until_step,
            quiet=quiet,
            allow_config_change=allow_config_change,
            stop_by=stop_by,
        )
    except InputError as exc:  # bad input, the run lock and data unavailable included: one line
        raise click.ClickException(str(exc)) from None
    except ImportError as exc:  # vLLM installed but does not import: say what to install, and why
        from aggbench.rollout.vllm import GPU_EXTRA_HINT

        if str(exc) != GPU_EXTRA_HINT:
            raise
        raise click.ClickException(
            f"rollout.engine=vllm: {exc} (import failed: {exc.__cause__ or 'unknown'})"
        ) from None
    click.echo(f"{summary['cell_id']}: steps {summary['start_step']} -> {summary['end_step']}")
