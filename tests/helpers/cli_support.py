"""Helpers for tests of the `aggbench` command line: run it in-process, check a clean error."""

from __future__ import annotations

from click.testing import CliRunner, Result


def cli(args: list) -> Result:
    """`aggbench ARGS` in-process (each argument as text); exceptions are caught into the result."""
    from aggbench.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


def clean_error(result: Result, *needles: str) -> str:
    """A clean click error: non-zero exit, no exception escaped, every needle in the message."""
    assert result.exit_code != 0, result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in result.output, result.output
    return result.output
