"""``aggbench crosscheck``: the same checkpoint through lm-eval, generations and verdicts compared
(the comparison itself is ``aggbench.evaluation.crosscheck``)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from aggbench.cli.common import checkpoint_option, click_errors, model_options, out_dir_option, quiet_option


@click.command(name="crosscheck")
@checkpoint_option()
@click.option(
    "--benchmarks", default="math500,aime24", show_default=True, help="Comma-separated math benchmarks."
)
@click.option(
    "--limit", type=click.IntRange(min=1), default=20, show_default=True, help="First N items per benchmark."
)
@out_dir_option("Writes crosscheck.json, lm-eval's task YAMLs and its logged samples.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=None, help="Max new tokens [the YAML's].")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Both sides; 1 makes greedy decoding bit-reproducible.",
)
@model_options
@click.option(
    "--strict/--no-strict",
    default=True,
    show_default=True,
    help="Exit with status 1 when any generation differs.",
)
@quiet_option("Only the summary.")
@click_errors
def command(
    checkpoint: Path, benchmarks: str, limit: int, out: Path, strict: bool, quiet: bool, **kw: Any
) -> None:
    """Cross-check generations and verdicts with lm-eval (greedy, same prompts, same items)."""
    for name in ("lm_eval", "lm-eval"):
        logging.getLogger(name).setLevel(logging.WARNING if quiet else logging.INFO)
    names = [b.strip() for b in benchmarks.split(",") if b.strip()]
    from aggbench.evaluation.crosscheck import crosscheck

    report = crosscheck(checkpoint, names, out, limit=limit, **kw)
    for name, b in report["benchmarks"].items():
        acc = b["accuracy"]
        click.echo(
            f"{name}: {b['identical_generations']}/{b['n_items']} identical generations, "
            f"{b['identical_prompts']}/{b['n_items']} identical prompts, verdicts agree on "
            f"{b['verdict_agreement']}/{b['n_items']} (ours {acc['ours']:.3f}, lm-eval exact match "
            f"{acc['lmeval_exact_match']:.3f})",
            err=True,
        )
        if b["context_overflow"]:
            click.echo(
                f"  prompt + max tokens above the model's length (lm-eval cuts them): {b['context_overflow']}",
                err=True,
            )
        for d in b["generation_diffs"]:
            click.echo(f"  generation differs: {d['id']} at character {d['first_difference_at']}", err=True)
        for d in b["verdict_diffs"]:
            click.echo(
                f"  verdict differs: {d['id']}: ours {d['ours_correct']} ({d['ours_extracted']!r}), "
                f"lm-eval {d['lmeval_correct']} ({d['lmeval_extracted']!r}), gold {d['gold']!r}",
                err=True,
            )
    for note in report["notes"]:
        click.echo(f"note: {note}", err=True)
    click.echo(f"report: {out / 'crosscheck.json'}", err=True)
    if strict and not report["ok"]:
        raise SystemExit(1)
