"""`aggbench plan CONFIG`: GPU-hours, memory per GPU and SLURM jobs of a grid, before submitting it."""

from __future__ import annotations

import json

import click

from aggbench.cli.common import click_error


@click.command("plan")
@click.argument("config", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def command(config: str, fmt: str) -> None:
    """Cost of the grid in CONFIG before submitting it: GPU-hours per cell and in all, peak memory
    per GPU (weights, gradients, optimizer state, activations, KV cache) and the SLURM jobs."""
    from aggbench.cli.grid import _load
    from aggbench.plan.estimate import build_plan
    from aggbench.plan.render import render

    exp = _load(config)
    with click_error():
        plan = build_plan(exp, config)
    click.echo(json.dumps(plan, indent=2) if fmt == "json" else render(plan))
