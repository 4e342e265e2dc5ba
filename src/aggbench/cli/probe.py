"""``aggbench probe``: the command line of :mod:`aggbench.evaluation.probe` (a contamination probe).

Thin on purpose: the engine, data and context options are ``GenerateOptions`` fields, built from
their declaration as ``aggbench generate``'s are; the work is in :mod:`aggbench.evaluation.probe`
(importing this module imports neither torch nor transformers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from aggbench.cli.common import (
    checkpoint_option,
    click_errors,
    generate_options,
    out_dir_option,
    quiet_option,
)
from aggbench.cli.evaluate import _setup_logging, _split
from aggbench.evaluation.probe import PROBE_FIELDS


@click.command(name="probe")
@checkpoint_option("Base model directory (save_pretrained), e.g. one made by `aggbench prepare-model`.")
@click.option(
    "--benchmarks",
    required=True,
    callback=lambda c, p, v: _split(v),
    help="Comma-separated benchmark names or YAML paths (configs/benchmarks).",
)
@click.option(
    "--fraction",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.6,
    show_default=True,
    help="Share of each problem's tokens given as the prefix; the rest is the target.",
)
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Cap on new tokens per problem; a capped problem is scored on the target's first N "
    "tokens [the target's length].",
)
@click.option(
    "--label", default=None, help="The model's name in the table [the checkpoint directory's name]."
)
@generate_options(*PROBE_FIELDS)
@out_dir_option("Writes OUT/{benchmark}.jsonl (one row per problem), OUT/probe.json and OUT/probe.md.")
@quiet_option()
@click_errors
def command(
    checkpoint: Path,
    benchmarks: list[str],
    fraction: float,
    max_tokens: int | None,
    label: str | None,
    out: Path,
    quiet: bool,
    **kw: Any,
) -> None:
    """Contamination probe: does the model complete each problem verbatim from its first 60%?

    Greedy decoding after the raw prefix (no chat template); prints the markdown table of
    exact-match rates (also written to OUT/probe.md).
    """
    from aggbench.evaluation.options import GenerateOptions
    from aggbench.evaluation.probe import ProbeOptions, probe_benchmarks

    _setup_logging(quiet)
    generation = GenerateOptions(**{name: kw[name] for name in PROBE_FIELDS}, progress=not quiet)
    options = ProbeOptions(fraction=fraction, max_tokens=max_tokens, label=label, generation=generation)
    info = probe_benchmarks(checkpoint, benchmarks, out, options)
    click.echo(info["table"], nl=False)
    if not quiet:
        click.echo(f"rows in {out}/<benchmark>.jsonl, summary in {out / 'probe.json'}", err=True)
