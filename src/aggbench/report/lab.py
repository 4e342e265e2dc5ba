"""The length-bias lab's pre-registered decisions (docs/lab.md), computed from its run files.

    python -m aggbench.report.lab results/lab            # prints every cell and H1-H4 as Markdown

(the benchmark, metric and step come from results/lab/experiment.yaml)

Unit: one cell = (setting, rule, seed). Primary outcome: the last step's test accuracy (avg@n on
the lab's one benchmark, in points); secondary: the mean training ``accuracy`` of the last four
steps. Differences are taken within a seed and summarised as the mean with a 95% Student-t interval
(``stats.t_interval``). The decision rules are docs/lab.md's, written before the lab was run:

- H1: every token cell's mean ``agg/token/weight_ratio`` is above 1 when the gap is positive and
  below 1 when it is negative; every sequence and balanced cell's is within 1e-6 of 1.
- H2: D = (token - sequence)[positive] - (token - sequence)[negative] per (spread, seed): supported
  if the interval lies above 0, contradicted if below 0, else inconclusive.
- H3: E = |token - sequence|[high] - |token - sequence|[low] per (gap, seed): as H2.
- H4: BA - token and BA - sequence per (setting, seed): supported if both lower ends are above
  -MARGIN ("BA better" if both intervals lie above 0), contradicted if either lies entirely below
  -MARGIN, else inconclusive.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aggbench.layout import RUNS, eval_metrics_file, experiment_file, metrics_file
from aggbench.report.stats import t_interval

RULES = ("token", "sequence", "balanced")
MARGIN = 2.0  # points: H4's non-inferiority margin
LAST_STEPS = 4  # the secondary outcome's window: the last four training steps


def _setting(model: str) -> tuple[str, str]:
    """'tiny-pos-high' -> ('pos', 'high')."""
    _, gap, spread = model.rsplit("-", 2)
    return gap, spread


def load_cells(results: str | Path, *, step: int, benchmark: str, metric: str) -> list[dict[str, Any]]:
    """One row per cell run under ``results``: setting, rule, seed, primary, secondary, weight ratio."""
    rows = []
    for run in sorted((Path(results) / RUNS).iterdir()):
        model, _, rule, seed = run.name.split("__")
        if rule not in RULES:
            continue
        metrics = [json.loads(line) for line in metrics_file(run).read_text().splitlines() if line.strip()]
        train = [m for m in metrics if "accuracy" in m]
        last = [m["accuracy"] for m in train if m["step"] > step - LAST_STEPS]
        ratios = [
            m[f"agg/{rule}/weight_ratio"] for m in train if m.get(f"agg/{rule}/weight_ratio") is not None
        ]
        ev = json.loads(eval_metrics_file(run, step, benchmark).read_text())
        gap, spread = _setting(model)
        rows.append(
            {
                "cell": run.name,
                "gap": gap,
                "spread": spread,
                "rule": rule,
                "seed": int(seed.removeprefix("s")),
                "primary": 100.0 * ev[metric],
                "secondary": 100.0 * statistics.fmean(last),
                "weight_ratio": statistics.fmean(ratios),
            }
        )
    return rows


def _table(rows: list[dict[str, Any]], outcome: str) -> dict[tuple[str, str, int, str], float]:
    return {(r["gap"], r["spread"], r["seed"], r["rule"]): r[outcome] for r in rows}


def _summary(values: list[float]) -> dict[str, Any]:
    low, high = t_interval(values)
    return {"n": len(values), "mean": statistics.fmean(values), "low": low, "high": high}


def _sign_decision(s: Mapping[str, Any]) -> str:
    return "supported" if s["low"] > 0 else "contradicted" if s["high"] < 0 else "inconclusive"


def decide(rows: list[dict[str, Any]], outcome: str = "primary") -> dict[str, Any]:
    """H1-H4 on ``outcome`` ('primary' or 'secondary'), each with its values, intervals and decision."""
    v = _table(rows, outcome)
    seeds = sorted({r["seed"] for r in rows})
    gaps, spreads = ("pos", "neg"), ("low", "high")

    def diff(g: str, s: str, k: int) -> float:
        return v[(g, s, k, "token")] - v[(g, s, k, "sequence")]

    out: dict[str, Any] = {}
    # H1 (the same for either outcome: it reads the logged weights)
    bad = []
    for r in rows:
        w = r["weight_ratio"]
        if r["rule"] == "token":
            ok = w > 1 if r["gap"] == "pos" else w < 1
        else:
            ok = abs(w - 1.0) <= 1e-6
        if not ok:
            bad.append(f"{r['cell']}: {w:.6f}")
    out["H1"] = {"decision": "holds" if not bad else "does not hold", "violations": bad}
    d = [diff("pos", s, k) - diff("neg", s, k) for s in spreads for k in seeds]
    out["H2"] = {"values": d, **_summary(d)}
    out["H2"]["decision"] = _sign_decision(out["H2"])
    e = [abs(diff(g, "high", k)) - abs(diff(g, "low", k)) for g in gaps for k in seeds]
    out["H3"] = {"values": e, **_summary(e)}
    out["H3"]["decision"] = _sign_decision(out["H3"])
    h4 = {}
    for other in ("token", "sequence"):
        vals = [v[(g, s, k, "balanced")] - v[(g, s, k, other)] for g in gaps for s in spreads for k in seeds]
        h4[other] = {"values": vals, **_summary(vals)}
    if all(h["low"] > 0 for h in h4.values()):
        decision = "supported (BA better)"
    elif all(h["low"] > -MARGIN for h in h4.values()):
        decision = "supported"
    elif any(h["high"] < -MARGIN for h in h4.values()):
        decision = "contradicted"
    else:
        decision = "inconclusive"
    out["H4"] = {"vs": h4, "decision": decision}
    return out


def _fmt(s: Mapping[str, Any]) -> str:
    return f"{s['mean']:+.2f} [{s['low']:+.2f}, {s['high']:+.2f}] (n={s['n']})"


def render(rows: list[dict[str, Any]]) -> str:
    """Every cell, then H1-H4 on the primary and secondary outcomes, as Markdown."""
    lines = ["| setting | rule | seed | test (step, points) | train acc, last 4 steps | token weight ratio |"]
    lines.append("|---|---|---:|---:|---:|---:|")
    for r in sorted(
        rows, key=lambda r: (r["gap"] != "pos", r["spread"] != "low", RULES.index(r["rule"]), r["seed"])
    ):
        lines.append(
            f"| {r['gap']}-{r['spread']} | {r['rule']} | {r['seed']} | {r['primary']:.1f} | "
            f"{r['secondary']:.1f} | {r['weight_ratio']:.4f} |"
        )
    for outcome in ("primary", "secondary"):
        h = decide(rows, outcome)
        lines += ["", f"**{outcome}** outcome (points; mean [95% t interval] over paired values):", ""]
        lines.append(
            f"- H1 (weight ratios): {h['H1']['decision']}"
            + (f"; {h['H1']['violations']}" if h["H1"]["violations"] else "")
        )
        lines.append(f"- H2 D = (tok-seq)[pos] - (tok-seq)[neg]: {_fmt(h['H2'])}: {h['H2']['decision']}")
        lines.append(f"- H3 E = |tok-seq|[high] - |tok-seq|[low]: {_fmt(h['H3'])}: {h['H3']['decision']}")
        lines.append(
            f"- H4 BA-token {_fmt(h['H4']['vs']['token'])}, BA-sequence {_fmt(h['H4']['vs']['sequence'])}: "
            f"{h['H4']['decision']}"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    """``python -m aggbench.report.lab [RESULTS]``: the benchmark, its avg@n and the last step come
    from RESULTS/experiment.yaml (the effective config the lab ran with)."""
    import yaml

    args = sys.argv[1:] if argv is None else argv
    results = Path(args[0] if args else "results/lab")
    path = experiment_file(results)
    if not path.is_file():
        sys.exit(f"{path} not found: run the lab first (snakemake --configfile configs/lab.yaml)")
    exp = yaml.safe_load(path.read_text())
    benchmarks = exp["benchmarks"]
    if len(benchmarks) != 1:
        sys.exit(f"{path}: the lab's decisions use one benchmark; benchmarks lists {benchmarks}")
    rows = load_cells(
        results,
        step=int(exp["training"]["algorithm"]["total_steps"]),
        benchmark=benchmarks[0],
        metric=f"avg@{exp['evaluation']['n']}",
    )
    print(render(rows), end="")


if __name__ == "__main__":
    main()
