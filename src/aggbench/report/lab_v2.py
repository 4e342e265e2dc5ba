"""Lab v2's checks and decisions (docs/lab.md, "Lab v2: pre-registration"), from its run files.

    python -m aggbench.report.lab_v2 results/lab_v2      # every cell, the gate, H1-H4 and C as Markdown

The rules below are the registered ones (docs/lab.md decides where the two differ; two pilots set the
tolerances and thresholds before the registration, none after results). Unit: one cell = (setting, rule, seed). Settings: ``tiny-{pos,neg}-{low,high}`` (gap arm x spread) and ``tiny-control``.

- **Rule check** (per cell): at every step the trainer's ``loss/pg`` and ``loss/weight_sq`` equal
  the diagnostics' ``agg/<named rule>/pg_loss`` and ``.../weight_sq`` (relative tolerance
  ``LOSS_RTOL``, with an absolute floor ``LOSS_ATOL``), and at some step one of them differs from each other rule's by more than that:
  the cell trained the rule its name says, and the check could have told otherwise. A cell that fails it is a harness error: reported, not analysed.
- **Manipulation gate** (from metrics.jsonl; means over the training steps): G1, the within-group
  length gap, averaged over all training steps, has the setting's sign (positive arm and control
  above 0, negative arm below 0; the mean over the last ``LAST_STEPS`` is reported, not gated:
  pilot 2's per-step gap in the echo settings had a spread of ~7 tokens, so a 4-step mean's noise
  is the size of the one-line gap); G2, in each gap arm the within-group CV of the high
  spread cell is at least ``CV_CONTRAST`` above the low spread cell's (same rule and seed); G3, at
  each spread the two gap arms' within-group CVs differ by at most ``CV_MATCH`` (same rule and
  seed). A cell that fails is reported, not analysed (G2 and G3 fail both cells they compare).
- **Outcomes**: primary, avg@n on the test benchmark at the last step (``sampled``: always defined,
  what the reward measures); secondary, the teacher-forced probability of a correct answer of the
  same checkpoint (``prob``, only where ``prob_usable``: pilot 1 found RL moves models off its
  templates, so as a primary outcome it would go missing depending on the rule) and the training
  accuracy of the last ``LAST_STEPS`` steps. Points.
- Differences are paired within a seed; each statistic is the mean with a 95% Student-t interval
  over its paired values (``stats.t_interval``). All statistics are signed.
- H1: token cells' mean ``agg/token/weight_ratio`` on the gap's side of 1 (above 1 for the positive
  arm and the control); sequence and balanced within 1e-6 of 1. Decided on the analysed cells, as
  every statistic is (a cell that fails a check is "reported, not analysed"); a failed cell that
  would violate it is listed apart (lab v3's results had counted those: docs/lab.md's notes).
- H2: D = (token - sequence)[pos] - (token - sequence)[neg], averaged over the two spreads: one
  value per seed (so a spread effect, H3's business, is not noise here): supported if the interval
  lies above 0, contradicted if below, else inconclusive.
- H3: E = [(tok - seq)[pos, high] - (tok - seq)[pos, low]] - [(tok - seq)[neg, high] -
  (tok - seq)[neg, low]], one value per seed (the spread amplifies the gap's effect): as H2.
- H4, per setting: BA - token and BA - sequence per seed: non-inferior if both lower ends are above
  -``MARGIN``, "BA better" if both lie above 0, contradicted if either lies entirely below
  -``MARGIN``, else inconclusive; overall it holds if every setting is non-inferior.
- C, the positive control: in ``tiny-control`` (``spread: echo_worked``: right answers of two
  lengths, the worked answer with or without its echo block) the share of echoing answers among the
  worked answers of the last-step evaluation, token minus sequence, per seed (percentage points):
  sequence aggregation's 1/|o| weighting must favour the short form of two equally right forms,
  token aggregation has no preference; supported if the interval lies above 0.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggbench.layout import RUNS, eval_metrics_file, experiment_file, graded_file, metrics_file
from aggbench.report.lab import MARGIN, RULES
from aggbench.report.stats import t_interval
from aggbench.tiny.task import has_echo, response_style

LAST_STEPS = 4
# G2: high minus low spread, within-group CV. The issue's example was 0.2; pilot 2's negative arm
# measured 0.20-0.21 (CV 0.08 -> 0.28-0.29), so a gate at 0.2 would drop about half of those cells
# on noise; 0.15 still asks the high-spread CV to be about 3x the low one there.
CV_CONTRAST = 0.15
CV_MATCH = 0.1  # G3: |positive minus negative arm|, within-group CV
LOSS_RTOL = 1e-4  # rule check, relative to the step's scale: float32 trainer sums vs float64 diagnostics
# ... plus an absolute floor for the loss: where every rule's loss is near 0 (pilot 2: all below
# 1e-5 at a cell's last step) float32 rounding of the summed terms (each up to ~|advantage| / G)
# is ~1e-8 (seen: balanced -1.4e-8 against 2.8e-17), larger than any relative tolerance of ~0
LOSS_ATOL = {"pg_loss": 1e-6, "weight_sq": 1e-12}
ARMS = ("pos", "neg")
SPREADS = ("low", "high")
CONTROL = "control"


def setting_of(model: str) -> tuple[str, str | None]:
    """'tiny-pos-high' -> ('pos', 'high'); 'tiny-control' -> ('control', None)."""
    parts = model.split("-")
    if parts[-1] == CONTROL:
        return CONTROL, None
    if len(parts) < 3 or parts[-2] not in ARMS or parts[-1] not in SPREADS:
        raise ValueError(
            f"{model!r} is not a lab v2 model: want tiny-{{pos,neg}}-{{low,high}} or tiny-control"
        )
    return parts[-2], parts[-1]


@dataclass
class Cell:
    """One cell's outcomes and checks (points for outcomes, tokens for the gap)."""

    cell: str
    arm: str
    spread: str | None
    rule: str
    seed: int
    sampled: float  # avg@n, the primary outcome
    prob: float | None  # 100 x prob_correct, None where the metric is not usable
    train_acc: float  # mean training accuracy of the last LAST_STEPS steps
    gap: float  # mean len/gap_within over all steps
    gap_last: float  # ... over the last LAST_STEPS steps
    cv: float  # mean len/cv_within over all steps
    weight_ratio: float  # mean agg/<rule>/weight_ratio of the trained rule (positive / negative weight)
    echo_share: float | None  # % of worked eval answers that echo (None: no worked answer)
    rule_problem: str | None  # None: the rule check passed
    gate: list[str] = field(default_factory=list)  # the gate criteria the cell failed

    @property
    def setting(self) -> str:
        return self.arm if self.spread is None else f"{self.arm}-{self.spread}"

    @property
    def analysed(self) -> bool:
        return self.rule_problem is None and not self.gate


def _mean(rows: list[dict[str, Any]], key: str) -> float:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]
    return statistics.fmean(vals) if vals else math.nan


def rule_problem(train: list[dict[str, Any]], rule: str, rules: tuple[str, ...] = RULES) -> str | None:
    """Why a cell's log does not show it trained ``rule`` (None when it does); see the module doc.

    Two trainer-side numbers are compared with what the diagnostics say the named rule applies: the
    policy-gradient loss (``loss/pg``; tells token from sequence and balanced) and the sum of the
    squared token weights (``loss/weight_sq``; sequence and balanced both have loss 0 at ratio 1 with
    binary rewards, but not the same weights)."""
    told_apart = set()
    for m in train:
        for got_key, key in (("loss/pg", "pg_loss"), ("loss/weight_sq", "weight_sq")):
            own = m.get(f"agg/{rule}/{key}")
            if own is None or got_key not in m:
                return f"step {m.get('step')}: {got_key} or agg/{rule}/{key} not logged"
            # relative to the quantity's size at this step (the largest of the rules'): sequence's and
            # balanced's losses are 0 up to float32 rounding, their weights differ by ~0.1%
            tol = LOSS_RTOL * max(abs(m.get(f"agg/{r}/{key}", 0.0)) for r in rules) + LOSS_ATOL[key]
            if abs(m[got_key] - own) > tol:
                return f"step {m['step']}: {got_key} {m[got_key]:.6g} != agg/{rule}/{key} {own:.6g}"
            told_apart |= {r for r in rules if r != rule and abs(m.get(f"agg/{r}/{key}", own) - own) > tol}
    missing = sorted(set(rules) - {rule} - told_apart)
    return f"never told apart from {missing}" if missing else None


def echo_share(graded: Path) -> float | None:
    """% of the worked answers in ``graded`` (a graded-samples jsonl) that echo their letter."""
    responses = [
        str(json.loads(line).get("response", "")) for line in graded.read_text().splitlines() if line.strip()
    ]
    worked = [r for r in responses if response_style(r) == "worked"]
    return 100.0 * sum(map(has_echo, worked)) / len(worked) if worked else None


def load_cells(results: str | Path, *, step: int, benchmark: str, metric: str) -> list[Cell]:
    """One :class:`Cell` per run under ``results`` (the gate is applied by :func:`apply_gate`)."""
    cells = []
    for run in sorted((Path(results) / RUNS).iterdir()):
        model, _, rule, seed = run.name.split("__")
        arm, spread = setting_of(model)
        metrics = [json.loads(line) for line in metrics_file(run).read_text().splitlines() if line.strip()]
        train = [m for m in metrics if "accuracy" in m]
        last = [m for m in train if m["step"] > step - LAST_STEPS]
        ev = json.loads(eval_metrics_file(run, step, benchmark).read_text())
        usable = bool(ev.get("prob_usable"))
        cells.append(
            Cell(
                cell=run.name,
                arm=arm,
                spread=spread,
                rule=rule,
                seed=int(seed.removeprefix("s")),
                sampled=100.0 * ev[metric],
                prob=100.0 * ev["prob_correct"] if usable and "prob_correct" in ev else None,
                train_acc=100.0 * _mean(last, "accuracy"),
                gap=_mean(train, "len/gap_within"),
                gap_last=_mean(last, "len/gap_within"),
                cv=_mean(train, "len/cv_within"),
                weight_ratio=_mean(train, f"agg/{rule}/weight_ratio"),
                echo_share=echo_share(graded_file(run, step, benchmark)),
                rule_problem=rule_problem(train, rule),
            )
        )
    return cells


def apply_gate(cells: list[Cell]) -> None:
    """Mark each cell with the gate criteria (G1-G3, module doc) it fails."""
    by = {(c.arm, c.spread, c.rule, c.seed): c for c in cells}
    for c in cells:
        sign = -1 if c.arm == "neg" else 1
        if not sign * c.gap > 0:
            c.gate.append(f"G1 gap {c.gap:+.1f} against the setting's sign")
    for (arm, spread, rule, seed), c in by.items():
        if arm == "pos" and spread is not None:  # G3: pos vs neg at this spread
            other = by.get(("neg", spread, rule, seed))
            if other is not None and abs(c.cv - other.cv) > CV_MATCH:
                for x in (c, other):
                    x.gate.append(f"G3 CV pos {c.cv:.2f} vs neg {other.cv:.2f} at spread {spread}")
        if arm in ARMS and spread == "high":  # G2: high vs low in this arm
            low = by.get((arm, "low", rule, seed))
            if low is not None and c.cv - low.cv < CV_CONTRAST:
                for x in (c, low):
                    x.gate.append(f"G2 CV {arm} high {c.cv:.2f} - low {low.cv:.2f} < {CV_CONTRAST}")


def _summary(values: list[float]) -> dict[str, Any]:
    """n, the values, their mean, 95% t interval and sd (the sd is what ``aggbench power --sd`` takes
    to give the measured power: docs/lab.md's power section)."""
    if len(values) < 2:
        nan = math.nan
        return {"n": len(values), "values": values, "mean": nan, "low": nan, "high": nan, "sd": nan}
    low, high = t_interval(values)
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    return {"n": len(values), "values": values, "mean": mean, "low": low, "high": high, "sd": sd}


def _sign_decision(s: Mapping[str, Any]) -> str:
    if s["n"] < 2:
        return "not decidable (fewer than 2 values)"
    return "supported" if s["low"] > 0 else "contradicted" if s["high"] < 0 else "inconclusive"


def _values(cells: list[Cell], outcome: str) -> dict[tuple[str, str | None, int, str], float]:
    """(arm, spread, seed, rule) -> outcome, analysed cells with a value only."""
    out = {}
    for c in cells:
        v = getattr(c, outcome)
        if c.analysed and v is not None and not math.isnan(v):
            out[(c.arm, c.spread, c.seed, c.rule)] = v
    return out


def _diff(
    v: Mapping, arm: str, spread: str | None, seed: int, a: str = "token", b: str = "sequence"
) -> float | None:
    x, y = v.get((arm, spread, seed, a)), v.get((arm, spread, seed, b))
    return None if x is None or y is None else x - y


def _h4(v: Mapping, settings: list[tuple[str, str | None]], seeds: list[int]) -> dict[str, Any]:
    per = {}
    for arm, spread in settings:
        vs = {}
        for other in ("token", "sequence"):
            vals = [_diff(v, arm, spread, k, "balanced", other) for k in seeds]
            vs[other] = _summary([x for x in vals if x is not None])
        if any(s["n"] < 2 for s in vs.values()):
            decision = "not decidable (fewer than 2 values)"
        elif all(s["low"] > 0 for s in vs.values()):
            decision = "non-inferior (BA better)"
        elif all(s["low"] > -MARGIN for s in vs.values()):
            decision = "non-inferior"
        elif any(s["high"] < -MARGIN for s in vs.values()):
            decision = "contradicted"
        else:
            decision = "inconclusive"
        per[arm if spread is None else f"{arm}-{spread}"] = {"vs": vs, "decision": decision}
    decisions = [p["decision"] for p in per.values()]
    if not any(c == "balanced" for *_, c in v):  # lab v3: token and sequence only
        overall = "not decidable (no balanced cells)"
    elif all(d.startswith("non-inferior") for d in decisions):
        overall = "holds"
    elif any(d == "contradicted" for d in decisions):
        overall = "contradicted"
    else:
        overall = "inconclusive"
    return {"settings": per, "decision": overall}


def _h1(cells: list[Cell]) -> dict[str, Any]:
    """H1 over the analysed cells; ``not_analysed``: the cells a check excluded that would violate it
    (reported, never deciding)."""
    bad: dict[bool, list[str]] = {True: [], False: []}
    for c in cells:
        if c.rule == "token":
            ok = c.weight_ratio < 1 if c.arm == "neg" else c.weight_ratio > 1
        else:
            ok = abs(c.weight_ratio - 1.0) <= 1e-6
        if not ok:
            bad[c.analysed].append(f"{c.cell}: {c.weight_ratio:.4f}")
    decision = "holds" if not bad[True] else "does not hold"
    return {"decision": decision, "violations": bad[True], "not_analysed": bad[False]}


def decide(cells: list[Cell], outcome: str = "sampled") -> dict[str, Any]:
    """H1-H4 and C on ``outcome`` ('sampled', the primary; 'prob' or 'train_acc'); the gate must be
    applied first."""
    v = _values(cells, outcome)
    seeds = sorted({c.seed for c in cells})
    d = []
    for k in seeds:
        per_spread = [(_diff(v, "pos", s, k), _diff(v, "neg", s, k)) for s in SPREADS]
        if all(x is not None and y is not None for x, y in per_spread):
            d.append(statistics.fmean(x - y for x, y in per_spread))
    e = []
    for k in seeds:
        parts = [_diff(v, arm, s, k) for arm in ARMS for s in SPREADS]
        if None not in parts:
            pos_low, pos_high, neg_low, neg_high = parts
            e.append((pos_high - pos_low) - (neg_high - neg_low))
    out: dict[str, Any] = {"H1": _h1(cells)}
    for name, vals in (("H2", d), ("H3", e)):
        out[name] = _summary(vals)
        out[name]["decision"] = _sign_decision(out[name])
    settings = sorted(
        {(c.arm, c.spread) for c in cells}, key=lambda s: (s[0] == CONTROL, s[0] != "pos", str(s[1]))
    )
    out["H4"] = _h4(v, settings, seeds)
    share = _values(cells, "echo_share")
    c_vals = [x for k in seeds if (x := _diff(share, CONTROL, None, k)) is not None]
    out["C"] = _summary(c_vals)
    out["C"]["decision"] = _sign_decision(out["C"])
    return out


def _fmt(s: Mapping[str, Any]) -> str:
    if s["n"] < 2:
        return f"n={s['n']}"
    return f"{s['mean']:+.2f} [{s['low']:+.2f}, {s['high']:+.2f}] (n={s['n']}, sd {s['sd']:.2f})"


def _num(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def render_cells(cells: list[Cell]) -> list[str]:
    lines = [
        "| setting | rule | seed | avg@n | P(correct) | train acc | gap (last 4) | CV within | weight ratio "
        "| echo % | checks |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    order = {"pos": 0, "neg": 1, CONTROL: 2}
    for c in sorted(cells, key=lambda c: (order[c.arm], str(c.spread), RULES.index(c.rule), c.seed)):
        checks = "; ".join(([f"rule: {c.rule_problem}"] if c.rule_problem else []) + c.gate) or "pass"
        lines.append(
            f"| {c.setting} | {c.rule} | {c.seed} | {c.sampled:.1f} | {_num(c.prob)} | {c.train_acc:.1f} | "
            f"{c.gap:+.1f} ({c.gap_last:+.1f}) | {c.cv:.2f} | {c.weight_ratio:.4f} | {_num(c.echo_share)} "
            f"| {checks} |"
        )
    return lines


OUTCOMES = {
    "sampled": "avg@n (primary)",
    "prob": "P(correct) (secondary)",
    "train_acc": "training accuracy (secondary)",
}


def render_decisions(h: Mapping[str, Any], outcome: str) -> list[str]:
    lines = [
        f"**{OUTCOMES[outcome]}** (points; mean [95% t interval] over paired values, n after the gate):",
        "",
    ]
    excluded = h["H1"]["not_analysed"]
    lines.append(
        f"- H1 (weight ratios): {h['H1']['decision']}"
        + "".join(f"; {x}" for x in h["H1"]["violations"])
        + (f" (not analysed, failed a check, would violate it: {'; '.join(excluded)})" if excluded else "")
    )
    lines.append(f"- H2 D = (tok-seq)[pos] - (tok-seq)[neg]: {_fmt(h['H2'])}: {h['H2']['decision']}")
    lines.append(f"- H3 E = spread x gap interaction of tok-seq: {_fmt(h['H3'])}: {h['H3']['decision']}")
    for name, p in h["H4"]["settings"].items():
        lines.append(
            f"- H4 {name}: BA-token {_fmt(p['vs']['token'])}, BA-sequence {_fmt(p['vs']['sequence'])}: "
            f"{p['decision']}"
        )
    lines.append(f"- H4 overall (every setting non-inferior): {h['H4']['decision']}")
    lines.append(f"- C echo share, token - sequence (control): {_fmt(h['C'])}: {h['C']['decision']}")
    return lines


def render(cells: list[Cell]) -> str:
    """Every cell with its checks, then the decisions on the primary and secondary outcomes."""
    n_out = sum(not c.analysed for c in cells)
    lines = render_cells(cells) + ["", f"Cells analysed: {len(cells) - n_out} of {len(cells)}.", ""]
    for outcome in OUTCOMES:
        lines += render_decisions(decide(cells, outcome), outcome) + [""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """``python -m aggbench.report.lab_v2 [RESULTS]``: benchmark, avg@n and last step from
    RESULTS/experiment.yaml."""
    import yaml

    args = sys.argv[1:] if argv is None else argv
    results = Path(args[0] if args else "results/lab_v2")
    path = experiment_file(results)
    if not path.is_file():
        sys.exit(f"{path} not found: run the lab first (snakemake --configfile configs/lab_v2.yaml)")
    exp = yaml.safe_load(path.read_text())
    if len(exp["benchmarks"]) != 1:
        sys.exit(f"{path}: the lab's decisions use one benchmark; benchmarks lists {exp['benchmarks']}")
    cells = load_cells(
        results,
        step=int(exp["training"]["algorithm"]["total_steps"]),
        benchmark=exp["benchmarks"][0],
        metric=f"avg@{exp['evaluation']['n']}",
    )
    apply_gate(cells)
    print(render(cells), end="")


if __name__ == "__main__":
    main()
