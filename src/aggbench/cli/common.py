"""What the command lines share: the options that recur across commands, declared once, and the
translation of bad-input errors into clean click errors (a message naming the file, line or key and
the fix; no traceback). The generation options are built from their declaration,
``aggbench.evaluation.options.GenerateOptions``.

Imports only click, that declaration (the standard library only) and :mod:`aggbench.errors`
(which imports nothing): every command module stays
cheap to import (``aggbench --help`` is instant).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import click

from aggbench.errors import InputError
from aggbench.evaluation.options import FlagField, flag_fields

F = TypeVar("F", bound=Callable[..., Any])


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """Several click options as one decorator, shown in ``--help`` in the order given."""

    def apply(fn: F) -> F:
        for decorator in reversed(decorators):
            fn = decorator(fn)
        return fn

    return apply


# --------------------------------------------------------------------------- options


def dir_option(*decls: str, help: str, required: bool = True) -> Callable[[F], F]:
    """A directory the command writes (``--out DIR``, ``--samples-out DIR``); created as needed."""
    return click.option(
        *decls,
        type=click.Path(file_okay=False, path_type=Path),
        required=required,
        default=None,
        help=help,
    )


def out_dir_option(help: str, *, required: bool = True) -> Callable[[F], F]:
    """``--out DIR``."""
    return dir_option("--out", help=help, required=required)


def in_file_option(*decls: str, help: str) -> Callable[[F], F]:
    """A file the command reads (must exist), e.g. ``--input`` / ``--samples``."""
    return click.option(
        *decls, type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True, help=help
    )


def out_file_option(*decls: str, help: str) -> Callable[[F], F]:
    """A file the command writes (atomically), e.g. ``--output`` / ``--out``."""
    return click.option(*decls, type=click.Path(dir_okay=False, path_type=Path), required=True, help=help)


def checkpoint_option(help: str = "Model directory (save_pretrained).") -> Callable[[F], F]:
    return click.option(
        "--checkpoint",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        required=True,
        help=help,
    )


def quiet_option(help: str = "No progress bars or status lines.") -> Callable[[F], F]:
    return click.option("--quiet", is_flag=True, help=help)


workers_option = click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Grading processes [usable CPUs, at most 8].",
)

timeout_option = click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="math: hard deadline per response [10 s]; code: per-test timeout [6 s].",
)


def _click_type(f: FlagField) -> Any:
    if f.flag.choices:
        return click.Choice(list(f.flag.choices))
    if f.flag.directory:
        return click.Path(file_okay=False)
    if f.flag.min is None and f.flag.max is None:
        return f.kind
    ranged = click.IntRange if f.kind is int else click.FloatRange
    return ranged(min=f.flag.min, max=f.flag.max, min_open=f.flag.min_open)


def generate_option(name: str) -> Callable[[F], F]:
    """The click option of the ``GenerateOptions`` field ``name`` (its parameter is the field)."""
    f = flag_fields()[name]
    kw: dict[str, Any] = {"default": f.default, "help": f.flag.help}
    if f.flag.show_default:
        kw["show_default"] = True
    if f.flag.metavar:
        kw["metavar"] = f.flag.metavar
    if f.kind is bool:
        return click.option(f"{f.flag.name}/--no-{f.flag.name.removeprefix('--')}", name, **kw)
    if f.kind is tuple:
        if f.default == ():
            del kw["default"]  # a repeatable option's own default: nothing given
        return click.option(f.flag.name, name, multiple=True, **kw)
    return click.option(f.flag.name, name, type=_click_type(f), **kw)


def generate_options(*names: str) -> Callable[[F], F]:
    """The click options of these ``GenerateOptions`` fields, in the order given."""
    return options(*(generate_option(name) for name in names))


# How the model runs and how prompts are formatted: generation and the lm-eval cross-check.
MODEL_OPTIONS = ("device", "dtype", "system_prompt", "enable_thinking", "chat_template", "data_dir")
model_options = generate_options(*MODEL_OPTIONS)


# --------------------------------------------------------------------------- errors


@contextlib.contextmanager
def click_error(*types: type[Exception]) -> Iterator[None]:
    """Inside the block, bad input (:class:`aggbench.errors.InputError`, or ``types`` when given)
    becomes a click error with the same message (exit status 1, no traceback); any other exception
    propagates with its traceback."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, types or InputError):
            raise click.ClickException(str(exc)) from exc
        raise


def click_errors(fn: F) -> F:
    """Decorator form of :func:`click_error` for a whole command: bad input is one line."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with click_error():
            return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
