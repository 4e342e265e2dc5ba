"""What the command lines share: the options that recur across commands, declared once, and the
translation of bad-input errors into clean click errors (a message naming the file, line or key and
the fix; no traceback).

Imports only click and :mod:`aggbench.errors` (which imports nothing): every command module stays
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

# How the model runs and how prompts are formatted: generation and the lm-eval cross-check.
model_options = options(
    click.option("--device", default=None, help="cpu, cuda, cuda:N or auto [auto: cuda when available]."),
    click.option(
        "--dtype",
        type=click.Choice(["auto", "float32", "bfloat16", "float16"]),
        default="auto",
        show_default=True,
        help="auto: bfloat16 on GPU, float32 on CPU.",
    ),
    click.option("--system-prompt", default=None, help="System message [YAML's system_prompt]."),
    click.option(
        "--enable-thinking/--no-enable-thinking",
        default=None,
        help="Qwen3 thinking switch passed to the chat template [template default].",
    ),
    click.option(
        "--chat-template/--no-chat-template",
        default=None,
        help="Format prompts with the tokenizer's chat template [YAML's use_chat_template].",
    ),
    click.option(
        "--data-dir",
        type=click.Path(file_okay=False),
        default=None,
        help="Offline benchmark files [$AGGBENCH_DATA_DIR].",
    ),
)


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
