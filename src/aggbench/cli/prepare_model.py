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
directory, the command fails and says to pass ``--force`` (rebuild) or choose another DIR.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import click

from aggbench.tiny.model import DEFAULT_SFT_BATCH, DEFAULT_SFT_STEPS  # cheap: torch is imported lazily there
from aggbench.tiny.task import TaskConfig

MARKER = "aggbench_model.json"
TINY = "tiny"


def _request(
    name: str, revision: str | None, seed: int, sft_steps: int, task: dict[str, Any]
) -> dict[str, Any]:
    """The fields that identify a prepared directory: a rerun with the same ones is a no-op."""
    if name == TINY:
        return {"name": name, "seed": seed, "sft_steps": sft_steps, "task": task}
    return {"name": name, "revision": revision}


def _check_existing(out_dir: Path, request: dict[str, Any], force: bool) -> bool:
    """True when ``out_dir`` already holds this request (skip); raises when it holds something else."""
    if not out_dir.exists():
        return False
    marker = out_dir / MARKER
    if force:
        return False
    if not marker.is_file():
        raise click.ClickException(
            f"{out_dir} exists but has no {MARKER}, so it is not a finished aggbench model directory "
            "(perhaps a copy made by hand, or another tool's output); pass --force to replace it, or "
            "choose another --out"
        )
    try:
        recorded = json.loads(marker.read_text())
    except json.JSONDecodeError as err:
        raise click.ClickException(f"{marker} is not valid JSON ({err}); pass --force to rebuild") from err
    old = {k: recorded.get(k) for k in request}
    if old != request:
        diff = ", ".join(f"{k}: {old[k]!r} -> {request[k]!r}" for k in request if old[k] != request[k])
        raise click.ClickException(
            f"{out_dir} was prepared with different settings ({diff}); pass --force to rebuild it, "
            "or choose another --out"
        )
    return True


def _download(name: str, revision: str | None, into: Path) -> None:
    """Fetch a hub snapshot into ``into``; offline and not-found failures get an actionable message."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    how = (
        f"to prepare it offline, download it where the hub is reachable "
        f"(`hf download {name}{' --revision ' + revision if revision else ''} --local-dir SOME_DIR`), "
        f"copy SOME_DIR here and run `aggbench prepare-model SOME_DIR --out ...`, or point the "
        "config's model at that local directory"
    )
    try:
        snapshot_download(repo_id=name, revision=revision, local_dir=into)
    except RevisionNotFoundError as err:
        raise click.ClickException(f"model {name!r} has no revision {revision!r} on the hub ({err})") from err
    except GatedRepoError as err:
        raise click.ClickException(
            f"model {name!r} is gated: accept its licence on the hub and log in (`hf auth login`) ({err})"
        ) from err
    except RepositoryNotFoundError as err:
        raise click.ClickException(
            f"no model {name!r} on the hub (check the id; private repos need `hf auth login`). "
            f"NAME must be 'tiny', a local directory or a hub model id ({type(err).__name__})"
        ) from err
    except (LocalEntryNotFoundError, OSError) as err:
        # LocalEntryNotFoundError: HF_HUB_OFFLINE is set, or the hub could not be reached and nothing
        # is cached; connection errors from requests/httpx are OSError subclasses.
        raise click.ClickException(
            f"cannot download {name!r}: the Hugging Face hub is unreachable from this machine "
            f"({type(err).__name__}: {err}); {how}"
        ) from err


def _check_name(name: str) -> None:
    """NAME must be 'tiny', a model directory (holding config.json), or a well-formed hub id;
    anything else fails here, before any download or copy."""
    if name == TINY:
        return
    if Path(name).exists():
        from aggbench.modeldir import ModelDirError, require_model_dir

        try:
            require_model_dir(
                name,
                what="NAME",
                fix="a local NAME must be a model directory in save_pretrained format (config.json, "
                "weights, tokenizer files), e.g. a `hf download ... --local-dir` folder",
            )
        except ModelDirError as exc:
            raise click.ClickException(str(exc)) from None
        return
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise click.ClickException(
            f"NAME {name!r} is not 'tiny', not an existing directory, and not a valid hub id "
            "(MODEL or ORG/MODEL of letters, digits, '-', '_', '.'); check the path or the model id"
        ) from None


def prepare_model(
    name: str,
    out_dir: Path,
    *,
    revision: str | None = None,
    seed: int = 0,
    sft_steps: int | None = None,
    worked_fraction: float | None = None,
    verbosity: int | None = None,
    probe_prompts: int = 32,
    force: bool = False,
    quiet: bool = False,
) -> Path:
    """Library form of the command (see the module docstring); returns ``out_dir``."""
    out_dir = Path(out_dir)
    overrides = {"worked_fraction": worked_fraction, "verbosity": verbosity}
    task = replace(TaskConfig(), **{k: v for k, v in overrides.items() if v is not None})
    sft_steps = DEFAULT_SFT_STEPS if sft_steps is None else sft_steps
    task_fields = asdict(task)
    request = _request(name, revision, seed, sft_steps, task_fields)
    if _check_existing(out_dir, request, force):
        if not quiet:
            click.echo(f"{out_dir} already prepared ({MARKER} matches); nothing to do")
        return out_dir
    _check_name(name)

    tmp = out_dir.parent / f"{out_dir.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        record: dict[str, Any] = dict(request)
        if name == TINY:
            from aggbench.tiny.model import build_and_warm_start

            facts = build_and_warm_start(
                tmp,
                seed=seed,
                sft_steps=sft_steps,
                task=task,
                progress=not quiet,
                probe_prompts=probe_prompts,
            )
            record.update(facts)
            record["sampled_accuracy"] = facts["probe"]["accuracy"] if facts.get("probe") else None
        elif Path(name).is_dir():
            shutil.copytree(name, tmp, symlinks=False)
            record["source"] = str(Path(name).resolve())
        else:
            _download(name, revision, tmp)
            record["source"] = "huggingface_hub"
        record["seconds"] = round(time.monotonic() - t0, 1)
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        if out_dir.exists() and force:
            shutil.rmtree(out_dir)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            # another job finished the same directory while this one was building: keep theirs
            # when it is the same request, fail as usual otherwise
            if not _check_existing(out_dir, request, force=False):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        summary = ""
        if record.get("sampled_accuracy") is not None:
            p = record["probe"]
            summary = (
                f"; sampled accuracy {p['accuracy']:.1%}, mean length correct "
                f"{_fmt(p['mean_len_correct'])} vs incorrect {_fmt(p['mean_len_incorrect'])} tokens"
            )
        click.echo(f"prepared {name} in {out_dir} ({record['seconds']} s{summary})")
    return out_dir


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
@click.option(
    "--worked-fraction",
    default=None,
    type=click.FloatRange(0.0, 1.0),
    help="Tiny model: share of worked (long) answers in the warm-start data. "
    f"[default: {TaskConfig.worked_fraction}]",
)
@click.option(
    "--verbosity",
    default=None,
    type=click.IntRange(0, 2),
    help=f"Tiny model: worked-line format 0/1/2, i.e. the length gap. [default: {TaskConfig.verbosity}]",
)
@click.option(
    "--probe-prompts",
    default=32,
    show_default=True,
    type=click.IntRange(min=0),
    help="Tiny model: test prompts (x8 samples) for the accuracy probe; 0 skips it.",
)
@click.option("--force", is_flag=True, help="Rebuild even if --out already holds a prepared model.")
@click.option("--quiet", is_flag=True, help="No progress bar, no summary.")
def command(
    name, out_dir, revision, seed, sft_steps, worked_fraction, verbosity, probe_prompts, force, quiet
):
    """Prepare model NAME in --out: 'tiny' (built-in, CPU), a local directory, or a hub model id.

    Rerunning with the same settings into a finished directory does nothing; different settings
    need --force.
    """
    if name == TINY and revision:
        raise click.UsageError("--revision applies to hub models only, not to 'tiny'")
    prepare_model(
        name,
        out_dir,
        revision=revision,
        seed=seed,
        sft_steps=sft_steps,
        worked_fraction=worked_fraction,
        verbosity=verbosity,
        probe_prompts=probe_prompts,
        force=force,
        quiet=quiet,
    )
