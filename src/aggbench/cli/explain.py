"""``aggbench explain`` (what every rule does to MY batch) and ``aggbench rules`` (what is registered).

Here: the options read into a batch (comma-separated lists or a rollouts JSONL file; errors are
``BatchInputError`` naming the option, made a usage error), and the output printed. The numbers are
``aggbench.aggregation.explain``'s, the table and the figure ``aggbench.report.explain_render``'s.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from aggbench.aggregation.contract import RuleInstance, builtin_instances, get_rule, rule_names
from aggbench.aggregation.explain import (
    Batch,
    BatchInputError,
    GroupLabel,
    check_counts,
    explain,
    make_batch,
    to_json,
)
from aggbench.errors import not_utf8
from aggbench.registry import RegistryError, did_you_mean, load_plugins
from aggbench.report.explain_render import format_table, plot

_EXAMPLE = "aggbench explain --lengths 10,500,20,30 --rewards 1,0,1,0 --group-size 2"


# ----------------------------------------------------------------------------- reading the batch


def _split(text: str, option: str) -> list[str]:
    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(s == "" for s in items):
        raise BatchInputError(option, f"expected a comma-separated list like 10,500,20; got {text!r}")
    return items


def parse_lengths(text: str, option: str = "--lengths") -> list[int]:
    """'10,500,20' -> [10, 500, 20]; every value a non-negative integer (positions are 1-based)."""
    out = []
    for pos, item in enumerate(_split(text, option), start=1):
        try:
            value = int(item)
        except ValueError:
            raise BatchInputError(option, f"value {item!r} at position {pos} is not an integer") from None
        if value < 0:
            raise BatchInputError(
                option, f"value {value} at position {pos} is negative (a length counts tokens)"
            )
        out.append(value)
    return out


def parse_rewards(text: str, option: str = "--rewards") -> list[float]:
    """'1,0,0.5' -> [1.0, 0.0, 0.5]; every value a finite number."""
    out = []
    for pos, item in enumerate(_split(text, option), start=1):
        try:
            value = float(item)
        except ValueError:
            raise BatchInputError(option, f"value {item!r} at position {pos} is not a number") from None
        if not math.isfinite(value):
            raise BatchInputError(option, f"value {item!r} at position {pos} is not a finite number")
        out.append(value)
    return out


def parse_groups(text: str, option: str = "--groups") -> list[GroupLabel]:
    """'0,0,1,1' -> [0, 0, 1, 1]; labels that are not integers stay strings (prompt ids)."""
    out: list[GroupLabel] = []
    for item in _split(text, option):
        try:
            out.append(int(item))
        except ValueError:
            out.append(item)
    return out


def groups_from_size(n: int, group_size: int, option: str = "--group-size") -> list[int]:
    """Consecutive groups of ``group_size``: n=4, size 2 -> [0, 0, 1, 1]."""
    if group_size < 1:
        raise BatchInputError(option, f"must be at least 1; got {group_size}")
    if n % group_size:
        raise BatchInputError(
            option, f"{n} sequences do not split into groups of {group_size}; give --groups for uneven groups"
        )
    return [i // group_size for i in range(n)]


def read_rollouts(path: str | Path) -> tuple[list[int], list[float], list[GroupLabel]]:
    """JSONL with one response per line: {"group": ..., "length": int >= 0, "reward": number}.

    Blank lines are skipped; other fields are ignored. Errors name file:line and the field.
    """
    path = Path(path)
    lengths: list[int] = []
    rewards: list[float] = []
    groups: list[GroupLabel] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise BatchInputError("--rollouts", f"{path}: {not_utf8(exc)}") from None
    for lineno, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise BatchInputError("--rollouts", f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(row, dict):
            raise BatchInputError("--rollouts", f"{where}: expected a JSON object, got {type(row).__name__}")
        for key in ("group", "length", "reward"):
            if key not in row:
                raise BatchInputError(
                    "--rollouts",
                    f"{where}: missing field {key!r} (each line needs group, length, reward)",
                )
        length, reward, group = row["length"], row["reward"], row["group"]
        if isinstance(length, bool) or not isinstance(length, int) or length < 0:
            raise BatchInputError(
                "--rollouts", f"{where}: field 'length' must be an integer >= 0; got {length!r}"
            )
        if isinstance(reward, bool):
            reward = float(reward)  # a verifiable reward stored as true/false
        if not isinstance(reward, int | float) or not math.isfinite(reward):
            raise BatchInputError(
                "--rollouts", f"{where}: field 'reward' must be a finite number; got {reward!r}"
            )
        if isinstance(group, bool) or not isinstance(group, int | str):
            raise BatchInputError(
                "--rollouts", f"{where}: field 'group' must be an integer or a string; got {group!r}"
            )
        lengths.append(length)
        rewards.append(float(reward))
        groups.append(group)
    if not lengths:
        raise BatchInputError("--rollouts", f"{path}: no rollouts (the file has no non-blank lines)")
    return lengths, rewards, groups


# ----------------------------------------------------------------------------- the commands


def _bad(exc: BatchInputError) -> click.BadParameter:
    return click.BadParameter(exc.message, param_hint=f"'{exc.option}'")


def _load_plugins(modules: Sequence[str]) -> None:
    if not modules:
        return
    rule_names()  # register the built-in rules first, so they list before the plugin's
    try:
        load_plugins(modules, search_paths=[Path.cwd()])
    except RegistryError as exc:
        raise click.BadParameter(str(exc), param_hint="'--plugin'") from None


def _select(rules: str | None) -> dict[str, RuleInstance]:
    known = builtin_instances()
    if not rules:
        return known
    chosen: dict[str, RuleInstance] = {}
    for name in (s.strip() for s in rules.split(",")):
        if name not in known:
            raise click.BadParameter(
                f"unknown rule instance {name!r}.{did_you_mean(name, known)} Valid names: {', '.join(known)}",
                param_hint="'--rules'",
            )
        chosen[name] = known[name]
    return chosen


def batch_options(fn):
    """The options that describe a batch (shared with ``aggbench audit``)."""
    for opt in reversed(_BATCH_OPTIONS):
        fn = opt(fn)
    return fn


_BATCH_OPTIONS = [
    click.option("--lengths", help="Response lengths in tokens, comma-separated: 10,500,20,30."),
    click.option("--rewards", help="Rewards, one per length, comma-separated: 1,0,1,0."),
    click.option(
        "--rollouts",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="JSONL file, one response per line with fields group, length, reward (instead of --lengths/--rewards).",
    ),
    click.option(
        "--group-size", type=int, help="Consecutive groups of this size (default: one group of all)."
    ),
    click.option("--groups", "groups_text", help="Group label of each sequence, comma-separated: 0,0,1,1."),
    click.option(
        "--advantage", default="grpo", show_default=True, help="Advantage estimator (grpo, drgrpo, ...)."
    ),
    click.option(
        "--std",
        type=click.Choice(["bessel", "population"]),
        help="grpo's group std: bessel (divide by G-1, verl/TRL; default) or population (divide by G).",
    ),
    click.option(
        "--max-length",
        type=int,
        help="Pad responses to this width (constant's L_max when it has no max_length); default: the longest.",
    ),
]


def read_batch(
    lengths: str | None,
    rewards: str | None,
    rollouts: Path | None,
    group_size: int | None,
    groups_text: str | None,
    advantage: str,
    std: str | None,
    max_length: int | None,
    example: str = _EXAMPLE,
) -> Batch:
    """The batch ``batch_options`` describe (a usage error names what is missing or clashes)."""
    if rollouts is not None:
        given = [
            n for n, v in (("--lengths", lengths), ("--rewards", rewards), ("--groups", groups_text)) if v
        ]
        if group_size is not None:
            given.append("--group-size")
        if given:
            raise click.UsageError(f"--rollouts gives lengths, rewards and groups; drop {', '.join(given)}")
        lens, rews, groups = read_rollouts(rollouts)
    else:
        if lengths is None or rewards is None:
            missing = " and ".join(
                n for n, v in (("--lengths", lengths), ("--rewards", rewards)) if v is None
            )
            raise click.UsageError(f"missing {missing} (or give --rollouts FILE). Example: {example}")
        lens, rews = parse_lengths(lengths), parse_rewards(rewards)
        if group_size is not None and groups_text is not None:
            raise click.UsageError("give --group-size or --groups, not both")
        groups: list[Any] | None = None
        if groups_text is not None:
            groups = parse_groups(groups_text)
        elif group_size is not None:
            check_counts(lens, rews)  # a count mismatch is the clearer error
            groups = groups_from_size(len(lens), group_size)
    return make_batch(lens, rews, groups, advantage=advantage, std=std, max_length=max_length)


@click.command(
    "explain",
    epilog=f"\b\nExample:\n  {_EXAMPLE}",
    context_settings={"help_option_names": ["-h", "--help"]},
)
@batch_options
@click.option("--rules", help="Comma-separated rule instances to show (default: all).")
@click.option(
    "--plugin",
    "plugins",
    multiple=True,
    help="Module (dotted path or .py file) registering extra rules; repeatable.",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write a PNG figure here.",
)
def command(
    rules: str | None, plugins: tuple[str, ...], fmt: str, plot_path: Path | None, **batch_kw: Any
) -> None:
    """Show what every aggregation rule does to one batch.

    For each rule instance: per sequence, its advantage, the per-token weight the rule gives it
    (effective advantage / advantage), the effective advantage of each token and the sequence's
    total weight; then the total weight per advantage sign and their ratio.
    """
    try:
        if plot_path is not None and not plot_path.resolve().parent.is_dir():
            raise click.BadParameter(f"folder {plot_path.parent} does not exist", param_hint="'--plot'")
        _load_plugins(plugins)
        instances = _select(rules)
        batch = read_batch(**batch_kw)  # batch_options' values
    except BatchInputError as exc:
        raise _bad(exc) from None

    try:
        reports = explain(batch, instances)
    except Exception as exc:  # a plugin rule may fail on this batch: say which
        raise click.ClickException(f"a rule failed on this batch: {type(exc).__name__}: {exc}") from exc

    if fmt == "json":
        try:
            click.echo(json.dumps(to_json(batch, reports), indent=2, default=str))
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    else:
        click.echo(format_table(batch, reports), nl=False)
    if plot_path is not None:
        written = plot(batch, reports, plot_path)
        click.echo(f"wrote {written}", err=True)


def rules_info() -> dict[str, Any]:
    """Registered rules and built-in instances as plain data (the JSON form of ``aggbench rules``)."""
    rules = {}
    for name in rule_names():
        spec = get_rule(name)
        rules[name] = {
            "version": spec.version,
            "params": spec.param_defaults(),
            "sign_balanced": spec.sign_balanced,
            "summary": spec.summary,
            "module": getattr(spec.fn, "__module__", "?"),
        }
    insts = {}
    for name, inst in builtin_instances().items():
        defaults = get_rule(inst.rule).param_defaults()
        insts[name] = {
            "rule": inst.rule,
            "params": dict(inst.params),
            "non_default": {k: v for k, v in inst.params.items() if defaults.get(k) != v},
        }
    return {"rules": rules, "instances": insts}


@click.command("rules", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--plugin",
    "plugins",
    multiple=True,
    help="Module (dotted path or .py file) registering extra rules; repeatable.",
)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True)
def rules_command(plugins: tuple[str, ...], fmt: str) -> None:
    """List the registered aggregation rules and the built-in rule instances."""
    _load_plugins(plugins)
    info = rules_info()
    if fmt == "json":
        click.echo(json.dumps(info, indent=2, default=str))
        return
    out = [f"Registered aggregation rules ({len(info['rules'])}):", ""]
    for name, r in info["rules"].items():
        params = ", ".join(f"{k}={v!r}" for k, v in r["params"].items()) or "(none)"
        origin = "" if r["module"].startswith("aggbench.") else f"   [from {r['module']}]"
        out += [
            f"  {name}  v{r['version']}   sign_balanced: {'yes' if r['sign_balanced'] else 'no'}{origin}",
            f"      {r['summary']}",
            f"      parameters: {params}",
        ]
    out += ["", "Built-in instances (the names configs and `explain --rules` use):", ""]
    width = max(len(n) for n in info["instances"])
    for name, inst in info["instances"].items():
        args = ", ".join(f"{k}={v!r}" for k, v in inst["non_default"].items())
        out.append(f"  {name.ljust(width)}  = {inst['rule']}({args})")
    click.echo("\n".join(out))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(command())
