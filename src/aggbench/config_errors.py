"""Errors of config files: the exception, pydantic errors as one line per field, and YAML reading.

Kept apart from ``aggbench.config`` (the schema) so the grid and the command line can read YAML and
word errors alike without the schema's models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from aggbench.errors import InputError, not_utf8


class ConfigError(InputError, ValueError):
    """A config that does not validate; the message lists each bad field by its dotted path."""


def format_errors(exc: ValidationError, source: str, root: type[BaseModel]) -> str:
    """``exc`` as one line per bad field (its dotted path); unknown keys list the keys allowed at
    their place in ``root``."""
    lines = [f"invalid config {source}:"]
    for loc, msg in error_fields(exc, root):
        lines.append(f"  {loc}: {msg}" if loc else f"  {msg}")
    return "\n".join(lines)


def error_fields(exc: ValidationError, root: type[BaseModel]) -> list[tuple[str, str]]:
    """(dotted path, message) per bad field of ``exc``; the path is "" for our own validators'
    whole-config messages (they name their fields), "(top level)" for pydantic's top-level ones."""
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"]
        if err["type"] == "value_error":  # our own validators: the message names its fields
            msg = str(err.get("ctx", {}).get("error", msg.removeprefix("Value error, ")))
            if not loc:
                out.append(("", msg))
                continue
        loc = loc or "(top level)"
        if err["type"] == "extra_forbidden":
            parent = model_at(root, err["loc"][:-1])
            allowed = ", ".join(parent.model_fields) if parent else "?"
            msg = f"unknown key; allowed keys here: {allowed}"
        out.append((loc, msg))
    return out


def model_at(model: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The nested pydantic model at path ``loc`` of ``model`` (None where the path is no model)."""
    for part in loc:
        field = model.model_fields.get(str(part))
        if (
            field is None
            or not isinstance(field.annotation, type)
            or not issubclass(field.annotation, BaseModel)
        ):
            return None
        model = field.annotation
    return model


def read_yaml_mapping(path: Path, *, what: str, error: type[Exception]) -> dict:
    """The top-level mapping of the YAML file ``path`` (empty file: ``{}``). A file that is missing,
    a directory, not UTF-8, not YAML or not a mapping raises ``error`` naming ``what`` and ``path``
    in one line (the cell config and the experiment config are read through this)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a directory, not a YAML file") from None
    except UnicodeDecodeError as exc:
        raise error(f"{what} {path}: {not_utf8(exc)}") from None
    except yaml.YAMLError as exc:
        raise error(f"{what} {path} is not valid YAML: {yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise error(f"{what} {path} must hold a mapping at the top level")
    return data


def yaml_problem(exc: yaml.YAMLError, *, lines: bool = True) -> str:
    """One line from a YAML error: what is wrong and where (``lines=False``: columns only, for a
    one-line value such as a ``--set``)."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return " ".join(str(exc).split())

    def at(mark: Any) -> str:
        if mark is None:
            return ""
        return (
            f" (line {mark.line + 1}, column {mark.column + 1})" if lines else f" (column {mark.column + 1})"
        )

    parts = []
    if exc.context:
        parts.append(f"{exc.context}{at(exc.context_mark)}")
    if exc.problem:
        parts.append(f"{exc.problem}{at(exc.problem_mark)}")
    return ": ".join(parts) or " ".join(str(exc).split())
