"""`aggbench prepare-model NAME --out DIR`: make a model directory the rest of the pipeline loads.

NAME ``tiny`` builds the built-in tiny model and warm-starts it on the synthetic task (CPU,
minutes). An existing local directory is copied. Anything else is a Hugging Face hub model id,
downloaded with ``huggingface_hub.snapshot_download`` (compute nodes are often offline: download
on a login node, or point NAME at a local copy).

The directory appears atomically: everything is written into ``DIR.tmp-<pid>`` and renamed to
DIR at the end, so a killed job leaves no DIR that looks finished. DIR holds
``aggbench_model.json`` (what was prepared, how, and the tiny model's probe results).

Into an existing DIR: if its ``aggbench_model.json`` records the same request, nothing is done
(exit 0, "already prepared"); if it records another request, or DIR is not a finished model
directory, the command fails and says to pass ``--force`` (rebuild) or choose another DIR. A tiny
warm start is the same request only on the same torch thread count (its weights depend on it):
on another count the command fails and names the ``OMP_NUM_THREADS`` that matches DIR.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from aggbench.cli.common import click_errors
from aggbench.modeldir import TINY
from aggbench.tiny.model import DEFAULT_SFT_BATCH, DEFAULT_SFT_STEPS  # cheap: torch is imported lazily there
from aggbench.tiny.task import GAPS, SPREADS, TaskConfig


def parse_overrides(items: tuple[str, ...]) -> dict:
    """``KEY=VALUE`` strings to a dict; VALUE is JSON (``32768``, ``null``, ``{"type": "yarn"}``) or,
    if it does not parse, the string itself."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise click.BadParameter(f"{item!r} is not KEY=VALUE", param_hint="--config-override")
        try:
            out[key.strip()] = json.loads(value)
        except ValueError:
            out[key.strip()] = value
    return out


def _task_option(field: str, kind: click.ParamType, help: str):
    """``--FIELD`` for a field of the tiny task's config (None: the field's default)."""
    flag = "--" + field.replace("_", "-")
    return click.option(
        flag,
        field,
        default=None,
        type=kind,
        help=f"Tiny model: {help} [default: {getattr(TaskConfig, field)}]",
    )


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1f}"


@click.command(name="prepare-model")
@click.argument("name")
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Model directory to create (written atomically).",
)
@click.option(
    "--revision", default=None, help="Hub revision (branch, tag or commit) to pin; hub models only."
)
@click.option("--seed", default=0, show_default=True, type=int, help="Tiny model: init and warm-start seed.")
@click.option(
    "--sft-steps",
    default=None,
    type=click.IntRange(min=0),
    help=f"Tiny model: warm-start steps (batch {DEFAULT_SFT_BATCH}); 0 leaves it untrained. "
    f"[default: {DEFAULT_SFT_STEPS}]",
)
@_task_option(
    "worked_fraction", click.FloatRange(0.0, 1.0), "share of worked (long) answers in the warm-start data."
)
@_task_option("verbosity", click.IntRange(0, 2), "worked-line format 0/1/2, i.e. the length gap.")
@_task_option(
    "gap",
    click.Choice(GAPS),
    "which style is long, the mostly right worked answers (positive) or the mostly wrong guesses, "
    "padded with filler lines (negative).",
)
@_task_option(
    "spread",
    click.Choice(SPREADS),
    "high opens a share of the answers (either style) with a padding block; echo writes the letter on "
    "6 lines before the box in half of them, echo_worked the same in worked answers only.",
)
@click.option(
    "--probe-prompts",
    default=32,
    show_default=True,
    type=click.IntRange(min=0),
    help="Tiny model: test prompts (x8 samples) for the accuracy probe; 0 skips it.",
)
@click.option(
    "--config-override",
    "config_override",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a field of the model's config.json (VALUE parsed as JSON, else a string), e.g. "
    "max_position_embeddings=32768 as verl's DAPO 7B math recipe does; repeatable. What every later "
    "step loads (trainer, rollout engines, evaluator) then carries it.",
)
@click.option(
    "--skill-phase-only",
    is_flag=True,
    help="Tiny model: write only the warm start's first half (the knob-free skill phase) to --out, with "
    "its optimizer and RNG state, for --skill-from (the workflow runs it once for models that share it).",
)
@click.option(
    "--skill-from",
    "skill_from",
    default=None,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Tiny model: continue the warm start from this --skill-phase-only directory (the same weights "
    "as running it here; refused when it was made with other --seed, --sft-steps or task options).",
)
@click.option("--force", is_flag=True, help="Rebuild even if --out already holds a prepared model.")
@click.option("--quiet", is_flag=True, help="No progress bar, no summary.")
@click_errors
def command(
    name,
    out_dir,
    revision,
    seed,
    sft_steps,
    worked_fraction,
    verbosity,
    gap,
    spread,
    probe_prompts,
    config_override,
    skill_phase_only,
    skill_from,
    force,
    quiet,
):
    """Prepare model NAME in --out: 'tiny' (built-in, CPU), a local directory, or a hub model id.

    Rerunning with the same settings into a finished directory does nothing; different settings
    need --force.
    """
    if name == TINY and revision:
        raise click.UsageError("--revision applies to hub models only, not to 'tiny'")
    if (skill_phase_only or skill_from) and name != TINY:
        raise click.UsageError("--skill-phase-only and --skill-from apply to 'tiny' only")
    if skill_phase_only and skill_from:
        raise click.UsageError(
            "--skill-phase-only writes a skill phase; --skill-from reads one: pass one of them"
        )
    if skill_phase_only:
        _skill_phase(out_dir, seed, sft_steps, worked_fraction, verbosity, quiet)
        return
    from aggbench.modeldir import MARKER, prepare_model

    record = prepare_model(
        name,
        out_dir,
        revision=revision,
        seed=seed,
        sft_steps=sft_steps,
        worked_fraction=worked_fraction,
        verbosity=verbosity,
        gap=gap,
        spread=spread,
        probe_prompts=probe_prompts,
        config_overrides=parse_overrides(config_override),
        force=force,
        quiet=quiet,
        skill_from=skill_from,
    )
    if quiet:
        return
    if record is None:
        click.echo(f"{out_dir} already prepared ({MARKER} matches); nothing to do")
        return
    summary = ""
    if record.get("sampled_accuracy") is not None:
        p = record["probe"]
        summary = (
            f"; sampled accuracy {p['accuracy']:.1%}, mean length correct "
            f"{_fmt(p['mean_len_correct'])} vs incorrect {_fmt(p['mean_len_incorrect'])} tokens"
        )
    click.echo(f"prepared {name} in {out_dir} ({record['seconds']} s{summary})")


def _skill_phase(
    out_dir: Path, seed: int, sft_steps: int | None, worked_fraction, verbosity, quiet: bool
) -> None:
    """--skill-phase-only: the knob-free first half of the warm start (gap and spread do not enter it)."""
    from dataclasses import replace

    from aggbench.tiny.lab import prepare_skill_phase

    fields = {"worked_fraction": worked_fraction, "verbosity": verbosity}
    task = replace(TaskConfig(), **{k: v for k, v in fields.items() if v is not None})
    steps = DEFAULT_SFT_STEPS if sft_steps is None else sft_steps
    if steps < 1:
        raise click.BadParameter("a skill phase needs --sft-steps of at least 1", param_hint="--sft-steps")
    try:
        record = prepare_skill_phase(out_dir, seed=seed, steps=steps, task=task, progress=not quiet)
    except ValueError as err:
        raise click.ClickException(str(err)) from None
    if not quiet:
        done = "already there; nothing to do" if record is None else f"{record['skill_steps']} steps"
        click.echo(f"skill phase of a {steps}-step warm start in {out_dir}: {done}")
