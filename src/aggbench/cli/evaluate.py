"""``aggbench generate`` / ``score`` / ``evaluate``: the command lines of :mod:`aggbench.evaluation.generate`.

Thin on purpose: options are parsed here (the generation options built from their declaration,
:class:`aggbench.evaluation.options.GenerateOptions`), the work is in :mod:`aggbench.evaluation.generate`
(importing this module imports neither torch nor mlflow).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from aggbench.cli.common import (
    MODEL_OPTIONS,
    checkpoint_option,
    click_errors,
    dir_option,
    generate_options,
    in_file_option,
    model_options,
    options,
    out_dir_option,
    out_file_option,
    quiet_option,
    timeout_option,
    workers_option,
)
from aggbench.evaluation.options import GenerateOptions, flag_fields


class _ClickHandler(logging.Handler):
    """Log records to the current stderr through click (works under CliRunner too)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)


def _setup_logging(quiet: bool) -> None:
    logger = logging.getLogger("aggbench")
    if not any(isinstance(h, _ClickHandler) for h in logger.handlers):
        handler = _ClickHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    if quiet:
        import os

        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except ImportError:
            pass


def _split(value: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise click.BadParameter("give at least one benchmark name, e.g. math500,aime24")
    return names


# The options shared by ``generate`` and ``evaluate``.
generation_options = options(
    checkpoint_option("Model directory (save_pretrained); step 0 = the base model."),
    click.option(
        "--benchmarks",
        required=True,
        callback=lambda c, p, v: _split(v),
        help="Comma-separated benchmark names or YAML paths (configs/benchmarks).",
    ),
    generate_options(*(name for name in flag_fields() if name not in MODEL_OPTIONS)),
    model_options,
    quiet_option(),
)


def _options(kw: dict[str, Any]) -> GenerateOptions:
    """The ``GenerateOptions`` of a command's keywords: every flagged field, and ``--quiet``."""
    return GenerateOptions(**{name: kw[name] for name in flag_fields()}, progress=not kw["quiet"])


@click.command(name="generate")
@generation_options
@out_dir_option("Writes OUT/{benchmark}.jsonl and OUT/generation.json.")
@click_errors
def generate_command(checkpoint: Path, benchmarks: list[str], out: Path, **kw: Any) -> None:
    """Sample a checkpoint on benchmarks (the model is loaded once for all of them)."""
    from aggbench.evaluation.generate import generate_benchmarks

    _setup_logging(kw["quiet"])
    info = generate_benchmarks(checkpoint, benchmarks, out, _options(kw))
    if not kw["quiet"]:
        for name, b in info["benchmarks"].items():
            click.echo(
                f"{name}: {b['n_problems']} problems x {b['n_samples']} -> {out / b['file']}", err=True
            )
        for name, b in info.get("greedy", {}).get("benchmarks", {}).items():
            where = out / info["greedy"]["dir"] / b["file"]
            click.echo(f"{name}: {b['n_problems']} problems x 1 greedy -> {where}", err=True)


@click.command(name="score")
@click.option("--benchmark", required=True, help="Benchmark name or YAML path (its grader is used).")
@in_file_option("--samples", help="The samples JSONL written by `aggbench generate`.")
@out_file_option("--out", help="Graded samples JSONL; the metrics go next to it as NAME.metrics.json.")
@click.option(
    "--greedy-samples",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Also grade the greedy protocol's samples (generate --greedy: OUT/greedy/NAME.jsonl) in the "
    "same process; with --greedy-out.",
)
@click.option(
    "--greedy-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Graded greedy samples JSONL (metrics beside it); with --greedy-samples.",
)
@workers_option
@timeout_option
@quiet_option("No progress bar or summary line.")
@click_errors
def score_command(
    benchmark: str,
    samples: Path,
    out: Path,
    greedy_samples: Path | None,
    greedy_out: Path | None,
    workers: int | None,
    timeout_s: float | None,
    quiet: bool,
) -> None:
    """Grade one benchmark's samples and compute its metrics (and its greedy samples', if given)."""
    from aggbench.evaluation.score import metrics_path, score_benchmark

    if (greedy_samples is None) != (greedy_out is None):
        raise click.UsageError("give --greedy-samples and --greedy-out together (or neither)")
    _setup_logging(quiet)
    jobs = [(samples, out)] + ([(greedy_samples, greedy_out)] if greedy_samples and greedy_out else [])
    for path, dest in jobs:
        metrics = score_benchmark(
            benchmark, path, dest, workers=workers, timeout_s=timeout_s, progress=not quiet
        )
        if not quiet:
            click.echo(_summary_line(metrics) + f" -> {metrics_path(dest)}", err=True)


def _summary_line(m: dict[str, Any]) -> str:
    n = m["n_samples"]
    text = f"{m['benchmark']}: avg@{n} {m[f'avg@{n}']:.4f} [{m['ci_low']:.4f}, {m['ci_high']:.4f}]"
    text += f", pass@1 {m['pass@1']:.4f}" + (f", pass@{n} {m[f'pass@{n}']:.4f}" if n > 1 else "")
    if f"maj@{n}" in m:
        text += f", maj@{n} {m[f'maj@{n}']:.4f}"
    text += f" ({m['n_problems']} problems)"
    return text + (" [public tests only]" if m.get("public_tests_only") else "")


@click.command(name="evaluate")
@generation_options
@out_dir_option("Graded samples, metrics and evaluation.json (e.g. results/runs/CELL/eval/step_N).")
@dir_option("--samples-out", help="Where the raw samples go [OUT/samples].", required=False)
@click.option(
    "--step",
    type=click.IntRange(min=0),
    required=True,
    help="Training step of the checkpoint (0 = the base model).",
)
@dir_option(
    "--run-dir",
    help="The cell's run directory [RUN for a checkpoint RUN/checkpoints/step_N].",
    required=False,
)
@click.option("--cell-id", default=None, help="The cell's id [the run directory's name].")
@click.option(
    "--tracking-uri",
    default=None,
    help="MLflow tracking URI [$MLFLOW_TRACKING_URI, else sqlite under results/].",
)
@click.option("--experiment", default="aggbench", show_default=True, help="MLflow experiment.")
@click.option("--tracking/--no-tracking", default=True, show_default=True, help="Log to MLflow.")
@workers_option
@click_errors
def evaluate_command(
    checkpoint: Path,
    benchmarks: list[str],
    out: Path,
    samples_out: Path | None,
    step: int,
    run_dir: Path | None,
    cell_id: str | None,
    tracking_uri: str | None,
    experiment: str,
    tracking: bool,
    workers: int | None,
    **kw: Any,
) -> None:
    """generate + score + log to MLflow, for one checkpoint."""
    from aggbench.evaluation.evaluate import evaluate_checkpoint
    from aggbench.evaluation.score import EvaluationError
    from aggbench.layout import run_of_checkpoint

    _setup_logging(kw["quiet"])
    inferred = run_of_checkpoint(checkpoint)
    if inferred is not None and inferred[1] != step:
        raise EvaluationError(f"--step {step} but the checkpoint is {checkpoint} (step {inferred[1]})")
    if run_dir is None and inferred is not None:
        run_dir = inferred[0]
    result = evaluate_checkpoint(
        checkpoint,
        benchmarks,
        out,
        step,
        options=_options(kw),
        samples_dir=samples_out,
        workers=workers,
        run_dir=run_dir,
        cell_id=cell_id,
        tracking_uri=tracking_uri,
        experiment=experiment,
        track=tracking,
    )
    if not kw["quiet"]:
        for metrics in result["metrics"].values():
            click.echo(_summary_line(metrics), err=True)
            if "greedy" in metrics:
                g = metrics["greedy"]
                click.echo(
                    f"{g['benchmark']}: greedy@1 {g['avg@1']:.4f} [{g['ci_low']:.4f}, {g['ci_high']:.4f}] "
                    f"({g['n_problems']} problems)",
                    err=True,
                )
        if "mlflow" in result:
            ml = result["mlflow"]
            click.echo(
                f"MLflow run {ml['run_id']} ({ml['cell_id']}) step {step}: logged {len(ml['logged'])} "
                f"metrics, {len(ml['skipped'])} already there",
                err=True,
            )
