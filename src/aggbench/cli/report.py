"""`aggbench ingest` (run files -> MLflow) and `aggbench report` (MLflow -> tables, plots).

    aggbench ingest --config configs/smoke.yaml [--cell ID ...]
    aggbench report --config configs/smoke.yaml [--out results/tables] [--metric avg@n]
                    [--allow-mismatch] [--no-plots]

`report` first checks MLflow against the run files (the source of truth): any value in the
committed files that MLflow lacks or holds differently is listed and the command exits 1, writing
nothing, unless --allow-mismatch (then the affected rows are flagged in the tables). It then writes
OUT/{peak,last}.{md,csv,tex}, OUT/values.csv (the tidy table) and OUT/plots/*.png (the report's
plots, then the analysis figures of aggbench.report.analysis, from the run files), and logs them
as artifacts of the summary MLflow run `{experiment}__summary` (one run, found by its tag, its
artifacts replaced on every report; each CSV also as an MLflow table, `tables/{name}.json`). Nothing else is written under OUT: it is exactly the
Snakemake `report` rule's declared outputs.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from aggbench import layout
from aggbench.cli.common import click_error, out_dir_option, quiet_option

if TYPE_CHECKING:
    from aggbench.data.overlap import Overlap

_SHOW = 40  # problems printed in full before "... and N more"


def _rule_versions(exp: dict) -> dict[str, str]:
    """{aggregation instance: its rule's version now} (the plugins are loaded by load_experiment);
    the report refuses to table a cell trained under another version."""
    from aggbench.aggregation import resolve_instance
    from aggbench.grid import aggregations

    return {a["name"]: resolve_instance(a).spec.version for a in aggregations(exp)}


def _overlaps(exp: dict) -> tuple[dict[tuple[str, str], Overlap], dict[tuple[str, str], Overlap]]:
    """({(selection benchmark, test benchmark): problems both hold, or why not compared} over the
    grid's selections, noted under the selected tables; {(dataset, test benchmark): the same for
    its prepared training file}, noted under every table of the dataset's blocks, since every cell
    there trained on it). One ``data.overlap.shared_problems`` call: each benchmark's fetched copy
    is read once (a code benchmark's can be gigabytes)."""
    from aggbench import grid, layout
    from aggbench.data import load_training_spec
    from aggbench.data.overlap import TrainingFile, shared_problems

    root, tests = grid.results_dir(exp), grid.test_benchmarks(exp)
    chosen = [(sel, test) for ds in exp["datasets"] for test, sel in grid.selection_for(exp, ds).items()]
    sides, trained = [], {}
    for name, ds in exp["datasets"].items():
        path = layout.data_file(root, name)
        if path.is_file():
            sides.append(TrainingFile(name, path, load_training_spec(ds["spec"])))
        else:
            trained |= {(name, t): f"no prepared file {path} in the results directory" for t in tests}
    pairs = [(side, t) for side in sides for t in tests]
    found = shared_problems([*chosen, *pairs], layout.benchmark_data_dir(root)) if chosen or pairs else {}
    trained |= {(side.dataset, t): found[side, t] for side, t in pairs}

    def relative(why: Overlap) -> Overlap:  # every reason one way: the tables read the same everywhere
        return _relative(why, root) if isinstance(why, str) else why

    return {pair: relative(found[pair]) for pair in chosen}, {
        pair: relative(w) for pair, w in trained.items()
    }


def _relative(reason: str, root: Path) -> str:
    """``reason`` with the results directory ``root`` taken off where a path starts (as given or
    resolved, the longer first; not inside another name such as ``/tmp/results``): a reason names
    the file to fix, and relative to the results directory the tables read the same everywhere."""
    spelt = sorted({str(root), str(root.resolve())}, key=len, reverse=True)
    start = re.compile("|".join(rf"(?<![^\s'\"(]){re.escape(p + os.sep)}" for p in spelt))
    return start.sub("", reason)


def _load(config: Path) -> dict:
    from aggbench.grid import load_experiment

    with click_error():
        return load_experiment(config)


def ui_hint(client: Any, uri: str, experiment: str) -> str:
    """Where to look at the runs: the address that opens the experiment on its runs table
    (``tracking.ui_url``; the plain experiment address opens MLflow 3.17's GenAI overview), and for
    a local store the ``mlflow ui`` command that serves it first. ``client``: the store at ``uri``."""
    from aggbench.tracking import ui_url

    found = client.get_experiment_by_name(experiment)
    if found is None:
        return f"MLflow UI: experiment {experiment!r} is not in {uri} yet"
    if uri.startswith(("http://", "https://")):
        return f"MLflow UI: {ui_url(uri, found.experiment_id)}"
    return (
        f"MLflow UI: mlflow ui --backend-store-uri {uri}  then open "
        f"{ui_url('http://127.0.0.1:5000', found.experiment_id)}"
    )


def _metric(value: str) -> str:
    """--metric checked as click parses it: a typo fails before the config or MLflow is read."""
    from aggbench.report.collect import check_metric_name

    try:
        return check_metric_name(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


_config = click.option(
    "--config",
    "config",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Experiment grid (configs/smoke.yaml, configs/paper.yaml).",
)


@click.command("ingest")
@_config
@click.option(
    "--cell", "cell_ids", multiple=True, help="Only this cell id (repeatable; `{model}__base` too)."
)
@quiet_option("No progress bar.")
def ingest_command(config: Path, cell_ids: tuple[str, ...], quiet: bool) -> None:
    """Put the run files of every cell and base model into MLflow (idempotent).

    Training metrics up to each cell's latest complete checkpoint, and every evaluation's
    metrics.json at its step. Rerunning it, or running it after live logging, stores nothing twice.
    """
    from aggbench.report.ingest import ingest, tracking_uri
    from aggbench.tracking import init_store

    exp = _load(config)
    with click_error(ValueError):
        done = ingest(exp, only=cell_ids or None, progress=False if quiet else None)
    steps = sum(d["steps"] for d in done)
    evals = sum(d["eval_values"] for d in done)
    replaced = [d["cell_id"] for d in done if d.get("replaced")]
    click.echo(
        f"ingested {len(done)} run(s) into {tracking_uri(exp)} (experiment {exp['experiment']}): "
        f"{steps} new training step(s), {evals} new evaluation value(s)"
        + (
            f"; rebuilt from the files (the store held a discarded attempt): {', '.join(replaced)}"
            if replaced
            else ""
        )
    )
    uri = tracking_uri(exp)
    click.echo(ui_hint(init_store(uri), uri, exp["experiment"]))


@click.command("report")
@_config
@out_dir_option("Output directory [results_dir/tables].", required=False)
@click.option(
    "--metric",
    default="avg@n",
    show_default=True,
    callback=lambda ctx, param, value: _metric(value),
    help="Tabulated metric: avg@n, maj@n, pass@n (n = the benchmark's samples) or e.g. pass@1.",
)
@click.option(
    "--allow-mismatch", is_flag=True, help="Write the tables even if MLflow differs from the files."
)
@click.option("--no-plots", is_flag=True, help="Tables only.")
def report_command(config: Path, out: Path | None, metric: str, allow_mismatch: bool, no_plots: bool) -> None:
    """Peak and last-step tables (Markdown, CSV, LaTeX) and plots, from MLflow, checked against the files."""
    from aggbench.grid import results_dir
    from aggbench.metric_names import GREEDY
    from aggbench.report.collect import collect, config_changes
    from aggbench.report.ingest import summarize, tracking_uri, verify
    from aggbench.report.render import write_tables
    from aggbench.report.tables import build_tables, check_reported
    from aggbench.tracking import init_store

    exp = _load(config)
    with click_error(ValueError):
        check_reported(exp)
    out = out or layout.tables_dir(results_dir(exp))
    uri = tracking_uri(exp)
    client = init_store(uri)
    with click_error(ValueError):  # a torn run file: ingest's own message, which names it and the fix
        problems = verify(exp, client)
    errors = [p for p in problems if p.is_error]
    for line in summarize([p for p in problems if not p.is_error])[:_SHOW]:
        click.echo(f"warning: {line}", err=True)
    if errors:
        click.echo(f"MLflow ({uri}) disagrees with the run files in {len(errors)} place(s):", err=True)
        lines = summarize(errors)
        for line in lines[:_SHOW]:
            click.echo(f"  {line}", err=True)
        if len(lines) > _SHOW:
            click.echo(f"  ... and {len(lines) - _SHOW} more", err=True)
        if not allow_mismatch:
            raise click.ClickException(
                f"MLflow does not match the run files; run `aggbench ingest --config {config}`, which fills "
                "in missing values and rebuilds a run holding values its files do not (a run whose run "
                "files are gone needs its cell retrained or the run deleted), or pass --allow-mismatch "
                "to tabulate what MLflow holds, flagged"
            )
    with click_error(ValueError):
        changes = config_changes(exp)  # once: both table sets flag the same cells
        col = collect(exp, client, metric=metric, rule_versions=_rule_versions(exp), changes=changes)
        overlaps, trained = _overlaps(exp)  # read once: both table sets chose on and trained on the same
        tables = build_tables(col, mismatched={p.cell_id for p in errors}, overlaps=overlaps, trained=trained)
    paths = write_tables(tables, out, exp["experiment"], col)
    if exp["evaluation"].get("extra_seeds"):  # training seed vs evaluation sampling vs problems
        from aggbench.report.variance import write_variance

        paths += write_variance(exp, out, stale={c.cell.id for c in col.cells if c.stale})
    greedy: list[Path] = []
    if exp["evaluation"].get("greedy"):  # the greedy n=1 protocol's own tables, beside avg@n's
        with click_error(ValueError):
            g_col = collect(exp, client, metric=GREEDY, rule_versions=_rule_versions(exp), changes=changes)
            g_tables = build_tables(
                g_col,
                mismatched={p.cell_id for p in errors},
                reported=False,
                overlaps=overlaps,
                trained=trained,
            )
        heading = f"{exp['experiment']}, greedy decoding (n=1, temperature 0)"
        greedy = write_tables(g_tables, layout.greedy_dir(out), heading, g_col)
    plots: list[Path] = []
    if not no_plots:
        from aggbench.report.analysis import plot_analysis
        from aggbench.report.plots import plot_all

        plots = plot_all(col, out / "plots")
        with click_error(ValueError):  # it reads each cell's metrics.jsonl again
            plots += plot_analysis(col, out / "plots", results_dir(exp))
    from aggbench.report.summary import log_summary

    run_id = log_summary(uri, exp["experiment"], paths, plots, greedy)
    for p in [*paths, *greedy, *plots]:
        click.echo(str(p))
    click.echo(f"summary MLflow run {run_id} ({exp['experiment']}__summary)")
    click.echo(ui_hint(client, uri, exp["experiment"]))
    flagged = sorted({n for t in tables["last"] for n in t.notes})
    if flagged:
        click.echo(f"{len(flagged)} note(s) under the last-step tables, see their footnotes", err=True)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(report_command())
