"""`aggbench data ...`: benchmark data for offline compute nodes (:mod:`aggbench.data.fetch`)."""

from __future__ import annotations

import click

from aggbench.cli.common import click_error


@click.group("data")
def command() -> None:
    """Benchmark data for offline compute nodes: fetch on a login node, checked by sha256."""


@command.command("fetch")
@click.option(
    "--config",
    type=click.Path(dir_okay=False),
    help="An experiment config: fetch its benchmarks into {results_dir}/data/benchmarks.",
)
@click.option("--benchmarks", help="Comma-separated benchmark names (instead of --config).")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    help="Where the records and lock.json go [with --config: {results_dir}/data/benchmarks].",
)
@click.option(
    "--refetch",
    multiple=True,
    metavar="NAME",
    help="Fetch this benchmark again even if its lock entry exists (repeatable).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Offline benchmark files to read instead of the hub [$AGGBENCH_DATA_DIR].",
)
@click.option(
    "--allow-public-tests-only/--refuse-public-tests-only",
    "allow_public",
    default=None,
    help="Accept a code benchmark whose only source has public tests only (the offline LiveCodeBench "
    "copy) [with --config: its evaluation.allow_public_tests_only, default refuse; else accept].",
)
def fetch(
    config: str | None,
    benchmarks: str | None,
    out: str | None,
    refetch: tuple[str, ...],
    data_dir: str | None,
    allow_public: bool | None,
) -> None:
    """Fetch benchmarks at their pinned revisions; record (first fetch) or check each file's sha256.

    Run it where there is internet; every `aggbench generate --fetched DIR` then reads only that
    copy. The workflow's local rule fetch_benchmarks runs it for the grid.
    """
    from aggbench import layout
    from aggbench.data.fetch import fetch_benchmarks

    with click_error():
        if (config is None) == (benchmarks is None):
            raise click.UsageError("give --config CONFIG or --benchmarks A,B (one of them)")
        if config is not None:
            from aggbench.grid import load_experiment, results_dir

            exp = load_experiment(config)
            names = list(exp["benchmarks"])
            if allow_public is None:
                allow_public = bool(exp["evaluation"].get("allow_public_tests_only", False))
            root = out or str(layout.benchmark_data_dir(results_dir(exp)))
        else:
            names = [b.strip() for b in (benchmarks or "").split(",") if b.strip()]
            if not names or out is None:
                raise click.UsageError("--benchmarks needs at least one name and --out DIR")
            root = out
        fetch_benchmarks(
            names,
            root,
            refetch=refetch,
            data_dir=data_dir,
            echo=click.echo,
            allow_public_tests_only=True if allow_public is None else allow_public,
        )
    click.echo(f"OK: {len(names)} benchmark(s) in {root}")
