"""`aggbench grid ...` (inspect and expand an experiment) and `aggbench prepare-data`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from aggbench.cli.common import click_error, click_errors


def _load(config: str):
    from aggbench.grid import load_experiment

    with click_error():
        return load_experiment(config)


@click.group("grid")
def command() -> None:
    """Inspect and expand an experiment grid (configs/smoke.yaml, configs/paper.yaml)."""


@command.command("check")
@click.option("--config", required=True, type=click.Path(dir_okay=False))
@click.option(
    "--profile",
    default=None,
    help="The Snakemake profile the grid will run under (slurm: a cluster) [a cluster when GPUs are requested].",
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def check(config: str, profile: str | None, fmt: str) -> None:
    """Validate the config (schema, rules, benchmarks, datasets, model paths), print the job counts
    and what is not ready yet; the last line is OK, or the problems and exit status 1.

    Config faults are errors. Warnings (the grid still passes): a null tracking_uri on a cluster,
    benchmarks without fetched data, models without a prepared directory.
    """
    from aggbench.grid import job_counts
    from aggbench.plan.jobs import grid_jobs
    from aggbench.plan.readiness import readiness_warnings
    from aggbench.resources import requests_gpus

    try:
        exp = _load(config)
    except click.ClickException as exc:
        click.echo(f"Error: {exc.message}", err=True)
        click.echo(f"NOT OK: {config} has the problems above; fix them and check again", err=True)
        raise SystemExit(1) from None
    cluster = requests_gpus(exp) if profile is None else profile not in ("default", "profiles/default")
    warnings = readiness_warnings(exp, cluster=cluster, config=config)
    counts, jobs = job_counts(exp), grid_jobs(exp)
    if fmt == "json":
        click.echo(json.dumps({"ok": True, "jobs": counts, "warnings": warnings}, indent=2))
        return
    click.echo(
        f"{config}: {counts['cells']} cells, {jobs['total']} jobs ({jobs['slurm']} submitted, "
        f"{jobs['local']} local)"
    )
    click.echo("  " + ", ".join(f"{rule} {n}" for rule, n in jobs["rules"].items()))
    for warning in warnings:
        click.echo(f"warning: {warning}")
    note = f" ({len(warnings)} warning{'s' if len(warnings) != 1 else ''} above)" if warnings else ""
    click.echo(f"OK: {config} is a valid grid{note}")


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
    from aggbench.grid import cell_train_config

    with click_error():
        cfg = cell_train_config(_load(config), cid)
    dump_config(cfg, out)  # atomically


@click.command("prepare-data")
@click.argument("spec")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Canonical JSONL to write.")
@click.option("--limit", type=click.IntRange(min=1), default=None)
@click.option(
    "--fit-to",
    "fit_to",
    type=click.Path(dir_okay=False, exists=True),
    default=None,
    help="A cell's training config: drop the rows whose prompt, templated as that cell trains on it, "
    "is longer than its sampling.max_prompt_tokens with its model's tokenizer (verl's "
    "filter_overlong_prompts); their count and ids go to OUT's .filter.json.",
)
@click_errors
def prepare_data_command(spec: str, out: str, limit: int | None, fit_to: str | None) -> None:
    """Write a training dataset (SPEC: dapo17k, polaris, tiny or a YAML path) as canonical JSONL.

    Prompts are written with the dataset's instruction template applied, so the trainer feeds them
    to the chat template as they are. $AGGBENCH_DATA_DIR overrides the hub. Without --fit-to the
    trainer drops over-long prompts itself when it starts (and says so in its run directory).
    """
    from aggbench.data import load_training_spec, write_jsonl
    from aggbench.data.training import load_training_split

    cell = _cell(fit_to) if fit_to else None  # a bad cell config fails before the data loads
    s = load_training_spec(spec)
    train, held = load_training_split(s, limit=limit)
    if s.holdout is not None:  # a holdout benchmark fetched beside it must hold these problems
        from aggbench.data.holdout import check_against_lock

        check_against_lock(out, s, held)
    records = [{**r, "prompt": s.render_prompt(r)} for r in train]
    fit = _fit(cell, fit_to, records, out) if cell else None
    try:
        n = write_jsonl(out, fit.kept if fit else records)  # atomically
    except OSError as exc:
        raise click.ClickException(f"cannot write --out {out}: {exc.strerror or exc}") from None
    if fit is not None:
        from aggbench.layout import data_filter_file
        from aggbench.train.prompt_fit import write_report

        report = data_filter_file(out)
        write_report(report, fit, dataset=s.name, fit_to=fit_to, tokenizer=str(cell.model.path))
        click.echo(f"{s.name}: {fit.summary()} (listed in {report})")
    from aggbench.data.holdout import write_holdout_record

    write_holdout_record(out, s, held)  # what the grid check compares with the spec and the fetch
    if s.holdout is not None:
        _recheck_split(out, s, held)
        click.echo(
            f"{s.name}: {s.holdout.n} problems held out of training (holdout, seed {s.holdout.seed}): a "
            f"benchmark with holdout_of: {s.name} evaluates them"
        )
    click.echo(f"{s.name}: {n} records -> {out}")


def _recheck_split(out: str, spec: Any, held: list) -> None:
    """The split check again, now that the file and its record are written: a fetch running beside
    this job may have locked its holdout benchmark after the first check; the two write before they
    check, so one of them sees the other. Refused: the file and its record go, so nothing trains."""
    from aggbench.data.holdout import check_against_lock, holdout_record_file
    from aggbench.data.sources import SpecError

    try:
        check_against_lock(out, spec, held)
    except SpecError:
        Path(out).unlink(missing_ok=True)
        holdout_record_file(out).unlink(missing_ok=True)
        raise


def _cell(path: str):
    from aggbench.config import load_train_config
    from aggbench.config_errors import ConfigError

    try:
        return load_train_config(path)
    except ConfigError as exc:
        raise click.ClickException(f"--fit-to: {exc}") from None


def _fit(cfg, cell: str, records: list[dict], out: str):
    """The records that fit the cell's prompt budget (:mod:`aggbench.train.prompt_fit`)."""
    from transformers import AutoTokenizer

    from aggbench.modeldir import loading
    from aggbench.train.prompt_fit import fit_prompts

    with loading(cfg.model.path, what=f"model.path of --fit-to {cell}"):
        tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
    return fit_prompts(cfg, tokenizer, records, where=f"{out} (prepared for --fit-to {cell})")
