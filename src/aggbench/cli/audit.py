"""``aggbench audit``: what another trainer's loss setting does to a batch, and which rule it equals.

The batch options are ``aggbench explain``'s; the numbers are ``aggbench.audit``'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from aggbench.aggregation.explain import Batch, BatchInputError
from aggbench.audit import SETTING, AuditReport, audit, get_mode, mode_names
from aggbench.audit.configs import LossSetting, read_config
from aggbench.cli.explain import _bad, batch_options, read_batch
from aggbench.registry import RegistryError

_EXAMPLE = "aggbench audit --trl-loss-type grpo --verl-loss-agg-mode token-mean --lengths 10,500,20,30 --rewards 1,0,1,0"
_MODE_OPTIONS = {  # option -> library
    "trl_loss_type": "trl",
    "verl_loss_agg_mode": "verl",
    "openrlhf_loss_agg_mode": "openrlhf",
    "skyrl_loss_reduction": "skyrl",
}
_SETTINGS = ("max_completion_length", "epsilon", "epsilon_high", "loss_scale_factor", "max_seq_len")


def _mode_option(name: str, library: str):
    flag = "--" + name.replace("_", "-")
    return click.option(
        flag,
        name,
        multiple=True,
        help=f"{SETTING[library]} value ({', '.join(mode_names(library))}); repeatable.",
    )


def _settings_for(mode_defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in given.items() if k in mode_defaults and v is not None}


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def format_report(batch: Batch, r: AuditReport) -> str:
    """A text block per mode, like ``aggbench explain``'s table."""
    lines = [
        f"{r.mode.label}   [{r.mode.source}]",
        f"  normaliser: {r.mode.normaliser}",
        f"  settings: {', '.join(f'{k}={v}' for k, v in r.settings.items()) or '(none)'};"
        f" micro-batch size: {r.micro_batch_size or 'the whole batch'}",
        f"  depends on the micro-batch layout: {r.layout}",
        "     i  group  length  reward  advantage  weight/token     push",
    ]
    for i, (n, w) in enumerate(zip(batch.lengths, r.weights, strict=True)):
        if not w:
            per = "-"
        elif max(w) - min(w) <= 1e-12 * max(abs(x) for x in w):
            per = _fmt(w[0])
        else:
            per = f"{_fmt(sum(w) / len(w))} (mean)"
        lines.append(
            f"  {i:4d}  {str(batch.groups[i]):>5}  {n:6d}  {batch.rewards[i]:6.3g}  "
            f"{batch.advantages[i]:9.4f}  {per:>12}  {_fmt(r.push[i]):>7}"
        )
    lines.append(
        f"  total weight: positive {_fmt(r.weight_pos)}, negative {_fmt(r.weight_neg)}, ratio pos/neg {_fmt(r.ratio)}"
    )
    if r.equivalents:
        first = r.equivalents[0]
        scale = (
            ""
            if abs(first.scale - 1) < 1e-9
            else f" x {first.scale:.4g} (a constant factor of the learning rate)"
        )
        others = ", ".join(
            e.name + ("" if abs(e.scale - 1) < 1e-9 else f" x {e.scale:.4g}") for e in r.equivalents[1:]
        )
        lines.append(
            f"  equals aggbench rule: {first.name}{scale}" + (f" (also: {others})" if others else "")
        )
    elif r.proportional:
        p = r.proportional[0]
        lines.append(
            f"  equals aggbench rule: none at a constant scale; {p.name} x {p.scale:.4g} on this batch "
            "(a factor that changes with the batch: the effective learning rate moves with it)"
        )
    else:
        lines.append("  equals aggbench rule: none (no built-in rule gives these weights under this layout)")
    return "\n".join(lines) + "\n"


@click.command(
    "audit",
    epilog=f"\b\nExample:\n  {_EXAMPLE}\n  aggbench audit --config grpo.yaml --rollouts rollouts.jsonl --format json",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@_mode_option("trl_loss_type", "trl")
@_mode_option("verl_loss_agg_mode", "verl")
@_mode_option("openrlhf_loss_agg_mode", "openrlhf")
@_mode_option("skyrl_loss_reduction", "skyrl")
@click.option(
    "--config",
    "configs",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A TRL GRPOConfig YAML/JSON, or a verl YAML or key=value override list; repeatable.",
)
@batch_options
@click.option(
    "--micro-batch-size",
    type=int,
    help="Rows per micro-batch over accumulation steps and ranks (default: the config's, else the whole batch).",
)
@click.option(
    "--max-completion-length", type=int, help="TRL max_completion_length (dr_grpo; TRL's default 512)."
)
@click.option("--epsilon", type=float, help="TRL epsilon (cispo's epsilon_high defaults to it; 0.2).")
@click.option("--epsilon-high", type=float, help="TRL epsilon_high (cispo's coefficient cap).")
@click.option(
    "--loss-scale-factor", type=int, help="verl loss_scale_factor (seq-mean-token-sum-norm's horizon)."
)
@click.option("--max-seq-len", type=int, help="SkyRL max_seq_len (seq_mean_token_sum_norm).")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def command(configs: tuple[Path, ...], micro_batch_size: int | None, fmt: str, **kw: Any) -> None:
    """Show what another trainer's loss setting does to one batch and name the aggbench rule it equals.

    Per response: the weight each of its tokens gets before the advantage (the gradient of the
    library's loss w.r.t. the token's log-probability is -weight x advantage at importance ratio
    1) and its total push; the total weight per advantage sign; the normaliser and whether it
    depends on the micro-batch layout.
    """
    given = {k: kw.pop(k) for k in _SETTINGS}
    chosen = [kw.pop(opt) for opt in _MODE_OPTIONS]
    # what the command line gives replaces the config files' values (a launch script's `$VAR` too)
    on_command_line = {k for k, v in given.items() if v is not None}
    on_command_line |= {"micro-batch-size"} if micro_batch_size is not None else set()
    try:
        batch = read_batch(**kw, example=_EXAMPLE)
        settings = [
            LossSetting(lib, name, source=f"--{opt.replace('_', '-')}")
            for (opt, lib), names in zip(_MODE_OPTIONS.items(), chosen, strict=True)
            for name in names
        ] + [read_config(p, frozenset(on_command_line)) for p in configs]
        if not settings:
            raise click.UsageError(
                f"give a loss setting (--trl-loss-type, ... or --config). Example: {_EXAMPLE}"
            )
        reports = []
        used: set[str] = set()
        for s in settings:
            try:
                mode = get_mode(s.library, s.mode)
            except RegistryError as exc:
                raise BatchInputError(s.source, str(exc)) from None
            values = {**s.settings, **{k: v for k, v in given.items() if v is not None}}
            own = _settings_for(dict(mode.defaults), values)
            used |= set(own)
            mb = micro_batch_size if micro_batch_size is not None else s.micro_batch_size
            reports.append(audit(batch, mode, micro_batch_size=mb, settings=own))
        unused = [k for k, v in given.items() if v is not None and k not in used]
        if unused:
            flag = "--" + unused[0].replace("_", "-")
            raise BatchInputError(
                flag, "no chosen loss mode reads this setting; drop it or choose a mode that does"
            )
    except BatchInputError as exc:
        raise _bad(exc) from None
    if fmt == "json":
        click.echo(json.dumps({"batch": batch.to_json(), "audits": [r.to_json() for r in reports]}, indent=2))
    else:
        click.echo("\n".join(format_report(batch, r) for r in reports), nl=False)
