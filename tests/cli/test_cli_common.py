"""aggbench.cli.common: bad input becomes a clean click error (exit 1, the message), a bug does not;
shared options parse the same way in every command that uses them."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from aggbench.cli.common import (
    click_error,
    click_errors,
    options,
    quiet_option,
    timeout_option,
    workers_option,
)
from aggbench.data.jsonl import DataError
from aggbench.data.sources import SpecError


@click.command()
@options(workers_option, timeout_option, quiet_option())
@click.option("--fail", type=click.Choice(["none", "spec", "data", "bug", "value"]), default="none")
@click_errors
def toy(workers, timeout_s, quiet, fail):
    if fail == "spec":
        raise SpecError("configs/benchmarks/x.yaml: unknown key 'nn'. Did you mean 'n'?")
    if fail == "data":
        raise DataError("in.jsonl", 3, "answer", "missing")
    if fail == "bug":
        raise KeyError("a bug, not bad input")
    if fail == "value":
        with click_error(ValueError):
            raise ValueError("reported.tiny: unknown model")
    click.echo(f"{workers} {timeout_s} {quiet}")


@pytest.mark.parametrize(
    ("fail", "message"),
    [
        ("spec", "Error: configs/benchmarks/x.yaml: unknown key 'nn'. Did you mean 'n'?"),
        ("data", "Error: in.jsonl:3: field 'answer': missing"),
        ("value", "Error: reported.tiny: unknown model"),
    ],
)
def test_bad_input_is_a_one_line_error_with_exit_status_1(fail, message):
    result = CliRunner().invoke(toy, ["--fail", fail])
    assert result.exit_code == 1
    assert result.output.strip() == message


def test_a_bug_is_not_dressed_up_as_bad_input():
    result = CliRunner().invoke(toy, ["--fail", "bug"])
    assert isinstance(result.exception, KeyError)


def test_shared_options_parse_and_validate():
    assert CliRunner().invoke(toy, ["--workers", "3", "--timeout", "2.5", "--quiet"]).output == "3 2.5 True\n"
    assert CliRunner().invoke(toy, []).output == "None None False\n"
    for bad in (["--workers", "0"], ["--timeout", "0"]):
        result = CliRunner().invoke(toy, bad)
        assert result.exit_code == 2 and "Invalid value" in result.output
