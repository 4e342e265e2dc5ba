"""Read the loss setting out of another trainer's config file, for ``aggbench audit --config``.

- TRL: a GRPOConfig as YAML or JSON (the mapping ``GRPOConfig(**mapping)`` or ``trl grpo --config``
  takes): ``loss_type`` (TRL's default ``dapo`` when absent), ``max_completion_length``,
  ``epsilon``, ``epsilon_high``; the micro-batch is ``per_device_train_batch_size``.
- verl: a Hydra YAML (nested ``actor_rollout_ref.actor.*``) or an override list (a file of
  ``key=value`` tokens, as in a launch script: ``actor_rollout_ref.actor.loss_agg_mode=token-mean``,
  line continuations and ``+`` prefixes allowed): ``loss_agg_mode`` (verl's default ``token-mean``),
  ``loss_scale_factor``; the micro-batch is ``ppo_micro_batch_size_per_gpu``.

Which trainer a file is for is read from its keys; a file that names neither is refused, with the
keys each needs.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from aggbench.aggregation.explain import BatchInputError
from aggbench.config_errors import yaml_problem
from aggbench.errors import not_utf8

_VERL_ACTOR = "actor_rollout_ref.actor."
_TRL_KEYS = {"loss_type", "num_generations", "max_completion_length", "epsilon_high", "beta"}


@dataclass(frozen=True)
class LossSetting:
    """One library mode with the settings and micro-batch size a config gives it."""

    library: str
    mode: str
    settings: dict[str, Any] = field(default_factory=dict)
    micro_batch_size: int | None = None
    source: str = ""


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(tree, dict):
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = tree
    return out


def _overrides(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for token in shlex.split(text.replace("\\\n", " "), comments=True):
        key, eq, value = token.partition("=")
        if not eq or not key.lstrip("+~").replace(".", "").replace("_", "").isalnum():
            continue  # the command itself (python3 -m verl.trainer.main_ppo), flags
        out[key.lstrip("+~")] = yaml.safe_load(value) if value else None
    return out


def read_config(path: str | Path, given: frozenset[str] = frozenset()) -> LossSetting:
    """The loss setting of a TRL or verl config file (module docstring). ``given``: the settings the
    command line gives (``micro-batch-size``, ``loss_scale_factor``, ...), which replace the file's."""
    path = Path(path)
    where = "--config"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BatchInputError(where, f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise BatchInputError(where, f"{path}: {not_utf8(exc)}") from None
    data: Any
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise BatchInputError(where, f"{path}: not valid JSON ({exc})") from None
    except yaml.YAMLError as exc:
        data = None  # a launch script's override list is rarely valid YAML
        yaml_error = exc
    else:
        yaml_error = None
    as_yaml = f"as YAML: {yaml_problem(yaml_error)}" if yaml_error else ""
    try:
        flat = _flatten(data) if isinstance(data, dict) else _overrides(text)
    except ValueError as exc:  # shlex: an unclosed quote ("No closing quotation")
        raise BatchInputError(
            where,
            f"{path}: not valid YAML, and not a key=value override list either ({as_yaml}; as overrides: {exc})",
        ) from None
    setting = _loss_setting(path, data, flat)
    if setting is None:
        why = f" ({as_yaml})" if as_yaml and path.suffix in (".yaml", ".yml") else ""
        raise BatchInputError(
            where,
            f"{path}: names no TRL or verl loss setting{why}; a TRL GRPOConfig file has top-level keys "
            "such as loss_type, num_generations, max_completion_length; a verl config has "
            "actor_rollout_ref.actor.loss_agg_mode (nested YAML or key=value overrides)",
        )
    _check_numbers(setting, given)
    return setting


def _check_numbers(setting: LossSetting, given: frozenset[str]) -> None:
    """A launch script's ``key=$VAR`` reaches here as the string "$VAR": name the key and the fix
    (unless the command line gives that setting, which replaces it)."""
    values = {"micro-batch-size": setting.micro_batch_size, **setting.settings}
    for key, value in values.items():
        if key in given:
            continue
        integer = key in ("micro-batch-size", "max_completion_length", "loss_scale_factor")
        ok = isinstance(value, int) if integer else isinstance(value, (int, float))
        if value is not None and (isinstance(value, bool) or not ok):
            kind = "an integer" if integer else "a number"
            flag = "--" + key.replace("_", "-")
            raise BatchInputError(
                "--config",
                f"{setting.source}: {key} is {value!r}, not {kind} (a shell variable the script sets?); "
                f"give it on the command line, {flag} N",
            )


def _loss_setting(path: Path, data: Any, flat: dict[str, Any]) -> LossSetting | None:
    verl = {k[len(_VERL_ACTOR) :]: v for k, v in flat.items() if k.startswith(_VERL_ACTOR)}
    if verl or any(k.startswith(("actor_rollout_ref.", "algorithm.", "data.")) for k in flat):
        settings = {}
        if verl.get("loss_scale_factor") is not None:
            settings["loss_scale_factor"] = verl["loss_scale_factor"]
        return LossSetting(
            "verl",
            str(verl.get("loss_agg_mode", "token-mean")),
            settings,
            verl.get("ppo_micro_batch_size_per_gpu"),
            f"{path} (verl)",
        )
    if isinstance(data, dict) and _TRL_KEYS & set(data):
        settings = {k: data[k] for k in ("max_completion_length", "epsilon", "epsilon_high") if k in data}
        return LossSetting(
            "trl",
            str(data.get("loss_type", "dapo")),
            settings,
            data.get("per_device_train_batch_size"),
            f"{path} (TRL GRPOConfig)",
        )
    return None
