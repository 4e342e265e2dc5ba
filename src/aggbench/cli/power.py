"""`aggbench power`: seeds needed to detect a paired difference, or what n seeds can detect."""

from __future__ import annotations

import json
from pathlib import Path

import click

from aggbench.cli.common import click_error


@click.command("power")
@click.option("--sd", type=float, help="Standard deviation of the paired differences (points). Or --pilot.")
@click.option("--delta", type=float, help="The true difference to detect (points): prints the seeds needed.")
@click.option("--n", "n", type=int, help="Seeds (pairs) you have: prints the minimum detectable difference.")
@click.option("--alpha", type=float, default=0.05, show_default=True, help="Two-sided significance level.")
@click.option("--power", "target", type=float, default=0.8, show_default=True, help="The power to reach.")
@click.option(
    "--pilot",
    type=click.Path(file_okay=False, exists=True),
    help="A results directory whose paired cells give --sd (rule B minus rule A at the same seed).",
)
@click.option("--a", "rule_a", default="sequence", show_default=True, help="Pilot: the baseline aggregation.")
@click.option(
    "--b", "rule_b", default="token", show_default=True, help="Pilot: the aggregation compared to it."
)
@click.option("--benchmark", help="Pilot: the benchmark (default: the only one evaluated).")
@click.option(
    "--step",
    type=int,
    help="Pilot: the evaluated step (default: the latest every pilot cell evaluated; all pairs at one step).",
)
@click.option("--metric", help="Pilot: the metric (default avg@k).")
@click.option(
    "--samples", type=int, help="Pilot: plan for this many answers per problem instead of the pilot's k."
)
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
def command(
    sd, delta, n, alpha, target, pilot, rule_a, rule_b, benchmark, step, metric, samples, fmt
) -> None:
    """Power of the two-sided paired t test (noncentral t) of a difference between two rules, one pair
    per training seed. --sd S --delta D prints the seeds needed; --sd S --n N the minimum detectable
    difference; --format json prints {"n", "min_delta", "power"} (the power achieved at n).

    \b
      aggbench power --sd 1 --delta 1                  # 10 seeds (power 0.803)
      aggbench power --sd 3.2 --n 3                    # what 3 seeds can detect
      aggbench power --pilot results/lab --benchmark tiny_test --delta 2 --samples 16
    """
    from aggbench.plan import power as pw

    with click_error():
        found = None
        if pilot is not None:
            if sd is not None:
                raise pw.PowerError("give --sd or --pilot, not both")
            found = pw.pilot(
                pilot, rule_a, rule_b, benchmark or _only_benchmark(pilot), step=step, metric=metric
            )
            sd = found.sd_at(samples or found.samples)
        elif sd is None:
            raise pw.PowerError("give --sd S (the paired differences' standard deviation) or --pilot RESULTS")
        elif samples is not None:
            raise pw.PowerError("--samples needs --pilot (it splits the sd into training and sampling)")
        out = pw.plan(sd=sd, alpha=alpha, power=target, delta=delta, n=n)
        # seeds against answers per problem: more samples shrink only the sampling part of the sd
        by_samples = {}
        if found is not None and delta is not None and found.sd_eval is not None:
            ks = sorted({found.samples * m for m in (1, 2, 4, 8, 16)} | ({samples} if samples else set()))
            by_samples = {k: pw.seeds_needed(delta, found.sd_at(k), alpha, target) for k in ks}
    if fmt == "json":
        extra = {"sd": sd, "pilot": pw.pilot_summary(found), "seeds_by_samples": by_samples} if found else {}
        click.echo(json.dumps({**out, **extra}, indent=2))
        return
    if found is not None:
        split = (
            f"training {found.sd_train:.3g}, sampling {found.sd_eval:.3g} at k = {found.samples}"
            if found.sd_eval is not None
            else f"not split into training and sampling: that is avg@k's alone, not {found.metric}'s"
            if found.metric != f"avg@{found.samples}"
            else "not split into training and sampling: one answer per problem gives no sampling estimate"
        )
        pooled = f" (pooled within {found.settings} model x dataset settings)" if found.settings > 1 else ""
        click.echo(
            f"pilot {pilot}: {found.b} - {found.a} on {found.benchmark} {found.metric} at step {found.step}, "
            f"{len(found.differences)} pairs: sd {found.sd:.3g} points{pooled} ({split}); planning with sd "
            f"{sd:.3g}" + (f" at k = {samples}" if samples else "")
        )
    if delta is not None and n is None:
        click.echo(
            f"n = {out['n']} seeds detect delta {delta:g} at alpha {alpha:g} (power {out['power']:.3f})"
        )
    else:
        click.echo(
            f"n = {out['n']} seeds detect delta >= {out['min_delta']:.4g} at alpha {alpha:g}, power {target:g}"
        )
        if delta is not None:
            click.echo(f"power at delta {delta:g}: {out['power']:.3f}")
    if by_samples:
        row = ", ".join(f"k = {k}: {n_k}" for k, n_k in by_samples.items())
        click.echo(f"seeds needed for delta {delta:g} by answers per problem: {row}")


def _only_benchmark(results: str) -> str:
    from aggbench.layout import METRICS_SUFFIX
    from aggbench.plan.power import PowerError

    found = Path(results).glob(f"runs/*/eval/step_*/*{METRICS_SUFFIX}")
    names = {p.name[: -len(METRICS_SUFFIX)] for p in found}
    if len(names) != 1:
        raise PowerError(f"{results}: give --benchmark (evaluated: {', '.join(sorted(names)) or 'none'})")
    return names.pop()
