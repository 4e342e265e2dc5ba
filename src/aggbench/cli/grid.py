"""`aggbench grid ...` (inspect and expand an experiment) and `aggbench prepare-data`."""

from __future__ import annotations

import json

import click

from aggbench.cli.common import click_errors


def _load(config: str):
    from aggbench.grid import GridError, load_experiment

    try:
        return load_experiment(config)
    except GridError as exc:
        raise click.ClickException(str(exc)) from None


@click.group("grid")
def command() -> None:
    """Inspect and expand an experiment grid (configs/smoke.yaml, configs/paper.yaml)."""


@command.command("check")
@click.option("--config", required=True, type=click.Path(dir_okay=False))
def check(config: str) -> None:
    """Validate the config (schema, rules, benchmarks, datasets, model paths) and print job counts."""
    from aggbench.grid import job_counts

    exp = _load(config)
    click.echo(json.dumps(job_counts(exp), indent=2))


@command.command("cells")
@click.option("--config", required=True, type=click.Path(dir_okay=False))
def list_cells(config: str) -> None:
    """List the cell ids, one per line."""
    from aggbench.grid import cells

    for c in cells(_load(config)):
        click.echo(c.id)


@command.command("cell")
@click.option("--config", required=True, type=click.Path(dir_okay=False))
@click.option("--cell", "cid", required=True)
@click.option("--out", required=True, type=click.Path(dir_okay=False))
def write_cell(config: str, cid: str, out: str) -> None:
    """Write one cell's resolved training config (the input of `aggbench train`)."""
    from aggbench.config import dump_config
    from aggbench.grid import GridError, cell_train_config

    try:
        cfg = cell_train_config(_load(config), cid)
    except GridError as exc:
        raise click.ClickException(str(exc)) from None
    dump_config(cfg, out)  # atomically


@click.command("prepare-data")
@click.argument("spec")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Canonical JSONL to write.")
@click.option("--limit", type=click.IntRange(min=1), default=None)
@click_errors
def prepare_data_command(spec: str, out: str, limit: int | None) -> None:
    """Write a training dataset (SPEC: dapo17k, polaris, tiny or a YAML path) as canonical JSONL.

    Prompts are written with the dataset's instruction template applied, so the trainer feeds them
    to the chat template as they are. $AGGBENCH_DATA_DIR overrides the hub.
    """
    from aggbench.data import load_training_dataset, load_training_spec, write_jsonl

    s = load_training_spec(spec)
    records = [{**r, "prompt": s.render_prompt(r)} for r in load_training_dataset(s, limit=limit)]
    try:
        n = write_jsonl(out, records)  # atomically
    except OSError as exc:
        raise click.ClickException(f"cannot write --out {out}: {exc.strerror or exc}") from None
    click.echo(f"{s.name}: {n} records -> {out}")
