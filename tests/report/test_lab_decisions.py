"""aggbench.report.lab: the lab's pre-registered decisions (docs/lab.md) from run files, on a
fabricated lab of 4 settings x 3 rules x 3 seeds whose outcomes are set by hand."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from aggbench.layout import eval_metrics_file, metrics_file, run_dir
from aggbench.report.lab import decide, load_cells, render

SEEDS = (0, 1, 2)
SETTINGS = [(g, s) for g in ("pos", "neg") for s in ("low", "high")]


def _write_lab(
    root,
    test_acc,
    *,
    ratio=lambda g, rule: 1.2 if rule == "token" and g == "pos" else 0.8 if rule == "token" else 1.0,
):
    for g, s in SETTINGS:
        for rule in ("token", "sequence", "balanced"):
            for k in SEEDS:
                run = run_dir(root, f"tiny-{g}-{s}__tiny__{rule}__s{k}")
                run.mkdir(parents=True)
                lines = [
                    {"step": t, "accuracy": 0.1 * t / 12, f"agg/{rule}/weight_ratio": ratio(g, rule)}
                    for t in range(1, 13)
                ]
                metrics_file(run).write_text("".join(json.dumps(m) + "\n" for m in lines))
                ev = eval_metrics_file(run, 12, "tiny_test")
                ev.parent.mkdir(parents=True)
                ev.write_text(json.dumps({"avg@4": test_acc(g, s, rule, k)}))


def _t(values):
    n = len(values)
    half = {5: 2.570582, 11: 2.200985}[n - 1] * statistics.stdev(values) / math.sqrt(n)
    return statistics.fmean(values) - half, statistics.fmean(values) + half


def test_decisions_follow_the_preregistered_rules(tmp_path):
    # token helps when correct answers are longer (+5 points at low spread, +9 at high), hurts when wrong
    # ones are (-3 / -6); BA sits at the better of the two plus 1; seeds add a little noise
    def acc(g, s, rule, k):
        base = 0.50 + 0.01 * k
        effect = {("pos", "low"): 0.05, ("pos", "high"): 0.09, ("neg", "low"): -0.03, ("neg", "high"): -0.06}[
            (g, s)
        ]
        tok, seq = base + effect + 0.002 * k * k, base
        return {"token": tok, "sequence": seq, "balanced": max(tok, seq) + 0.01}[rule]

    _write_lab(tmp_path, acc)
    rows = load_cells(tmp_path, step=12, benchmark="tiny_test", metric="avg@4")
    assert len(rows) == 36
    row = next(r for r in rows if r["cell"] == "tiny-pos-high__tiny__token__s2")
    assert row["primary"] == pytest.approx(100 * (0.52 + 0.09 + 0.008))
    assert row["secondary"] == pytest.approx(100 * statistics.fmean(0.1 * t / 12 for t in (9, 10, 11, 12)))
    h = decide(rows)
    assert h["H1"] == {"decision": "holds", "violations": []}
    d = [
        100 * ((e_pos + 0.002 * k * k) - (e_neg + 0.002 * k * k))
        for e_pos, e_neg in ((0.05, -0.03), (0.09, -0.06))
        for k in SEEDS
    ]
    assert h["H2"]["values"] == pytest.approx(d)
    assert (h["H2"]["low"], h["H2"]["high"]) == pytest.approx(_t(d), abs=1e-5)
    assert h["H2"]["decision"] == "supported"
    e = [
        100 * (abs(hi + 0.002 * k * k) - abs(lo + 0.002 * k * k))
        for lo, hi in ((0.05, 0.09), (-0.03, -0.06))
        for k in SEEDS
    ]
    assert h["H3"]["values"] == pytest.approx(e)
    assert h["H3"]["decision"] == "supported"
    assert h["H4"]["decision"] == "supported (BA better)"
    assert (h["H4"]["vs"]["token"]["low"], h["H4"]["vs"]["token"]["high"]) == pytest.approx(
        _t(h["H4"]["vs"]["token"]["values"]), abs=1e-5
    )
    md = render(rows)
    assert md.count("\n| ") == 36 and "supported (BA better)" in md


def test_no_effect_is_inconclusive_and_a_bad_ratio_breaks_h1(tmp_path):
    noise = {k: d for k, d in zip(SEEDS, (-0.01, 0.0, 0.01), strict=True)}

    def acc(g, s, rule, k):  # no rule effect; BA 5 points worse than both, with seed noise
        return 0.5 + (noise[k] if rule == "token" else 0.0) - (0.05 + noise[k] if rule == "balanced" else 0.0)

    _write_lab(tmp_path, acc, ratio=lambda g, rule: 1.1 if rule == "token" else 1.0)  # token > 1 everywhere
    h = decide(load_cells(tmp_path, step=12, benchmark="tiny_test", metric="avg@4"))
    assert h["H1"]["decision"] == "does not hold"
    assert len(h["H1"]["violations"]) == 6  # the six token cells of the negative-gap settings
    assert h["H2"]["decision"] == "inconclusive" and h["H2"]["mean"] == pytest.approx(0.0)
    assert h["H4"]["decision"] == "contradicted"


def test_main_reads_benchmark_metric_and_step_from_the_experiment(tmp_path, capsys):
    import yaml

    from aggbench.layout import experiment_file
    from aggbench.report.lab import main

    _write_lab(tmp_path, lambda g, s, rule, k: 0.5 + 0.01 * k + (0.02 if rule == "balanced" else 0.0))
    with pytest.raises(SystemExit, match="run the lab first"):
        main([str(tmp_path)])
    exp = {
        "benchmarks": ["tiny_test"],
        "evaluation": {"n": 4},
        "training": {"algorithm": {"total_steps": 12}},
    }
    experiment_file(tmp_path).write_text(yaml.safe_dump(exp))
    main([str(tmp_path)])
    assert capsys.readouterr().out == render(
        load_cells(tmp_path, step=12, benchmark="tiny_test", metric="avg@4")
    )
    exp["evaluation"]["n"] = 8  # a metric the run files do not hold: the experiment is what is read
    experiment_file(tmp_path).write_text(yaml.safe_dump(exp))
    with pytest.raises(KeyError, match="avg@8"):
        main([str(tmp_path)])
    exp["benchmarks"] = ["tiny_test", "math500"]
    experiment_file(tmp_path).write_text(yaml.safe_dump(exp))
    with pytest.raises(SystemExit, match="one benchmark"):
        main([str(tmp_path)])
