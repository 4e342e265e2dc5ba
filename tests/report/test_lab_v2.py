"""aggbench.report.lab_v2: lab v2's rule check, manipulation gate and signed decisions (docs/lab.md,
"Lab v2") from run files, on a fabricated lab whose outcomes, lengths and losses are set by hand."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from aggbench.layout import eval_metrics_file, graded_file, metrics_file, run_dir
from aggbench.report.lab_v2 import apply_gate, decide, load_cells, render, rule_problem, setting_of

SEEDS = (0, 1, 2)
RULES = ("token", "sequence", "balanced")
SETTINGS = [("pos", "low"), ("pos", "high"), ("neg", "low"), ("neg", "high"), ("control", None)]
# each rule's policy-gradient loss as the diagnostics log it: distinct, so the rule check can tell
LOSS = {"token": -0.03, "sequence": 0.0, "balanced": 0.0}  # sequence and balanced: 0 at ratio 1
SQ = {"token": 0.002, "sequence": 0.003, "balanced": 0.0025}  # ... but not the same squared weights
CV = {"low": 0.15, "high": 0.55, None: 1.2}


def _model(arm, spread):
    return "tiny-control" if arm == "control" else f"tiny-{arm}-{spread}"


def _defaults(arm, spread, rule, k):
    return {
        "gap": -7.0 if arm == "neg" else 7.0,
        "cv": CV[spread],
        "trained": rule,  # whose loss the trainer logged
        "usable": True,
        "echo": {"token": 0.5, "sequence": 0.3, "balanced": 0.4}[rule] + 0.01 * k,
    }


def _write_lab(root, acc, overrides, settings=SETTINGS, rules=RULES):
    """``acc(arm, spread, rule, k)`` -> avg@4; ``overrides[(arm, spread, rule, k)]`` replaces
    fields of :func:`_defaults` for one cell. ``settings`` x ``rules`` x SEEDS cells (each logs every
    rule's diagnostics, as the trainer does)."""
    for arm, spread in settings:
        for rule in rules:
            for k in SEEDS:
                f = {**_defaults(arm, spread, rule, k), **overrides.get((arm, spread, rule, k), {})}
                run = run_dir(root, f"{_model(arm, spread)}__tiny__{rule}__s{k}")
                run.mkdir(parents=True)
                ratio = f.get("ratio", (0.7 if arm == "neg" else 1.3) if rule == "token" else 1.0)
                lines = []
                for t in range(1, 13):
                    m = {"step": t, "accuracy": 0.5 + 0.01 * t, "len/gap_within": f["gap"]}
                    m["len/cv_within"] = f["cv"]
                    m[f"agg/{rule}/weight_ratio"] = ratio
                    m |= {f"agg/{r}/pg_loss": LOSS[r] * t for r in RULES}
                    m |= {f"agg/{r}/weight_sq": SQ[r] for r in RULES}
                    m["loss/pg"] = LOSS[f["trained"]] * t
                    m["loss/weight_sq"] = SQ[f["trained"]]
                    lines.append(m)
                metrics_file(run).write_text("".join(json.dumps(m) + "\n" for m in lines))
                ev = eval_metrics_file(run, 12, "tiny_test")
                ev.parent.mkdir(parents=True)
                p = acc(arm, spread, rule, k)
                ev.write_text(json.dumps({"avg@4": p, "prob_correct": p - 0.01, "prob_usable": f["usable"]}))
                n_echo = round(100 * f["echo"])
                responses = ["1) a>b\nso b\nso b\n\\boxed{b}"] * n_echo
                responses += ["1) a>b\n\\boxed{b}"] * (100 - n_echo) + [
                    "so c\n\\boxed{c}"
                ] * 20  # guesses: not counted
                graded_file(run, 12, "tiny_test").write_text(
                    "".join(json.dumps({"response": r, "correct": True}) + "\n" for r in responses)
                )


EFFECT = {("pos", "low"): 0.02, ("pos", "high"): 0.05, ("neg", "low"): -0.01, ("neg", "high"): -0.03}


def _acc(arm, spread, rule, k):
    base = 0.60 + 0.01 * k
    tok = base + EFFECT.get((arm, spread), 0.0) + 0.003 * k * k
    return {"token": tok, "sequence": base, "balanced": max(tok, base) + 0.01}[rule]


def _cells(root, overrides=None):
    _write_lab(root, _acc, overrides or {})
    cells = load_cells(root, step=12, benchmark="tiny_test", metric="avg@4")
    apply_gate(cells)
    return cells


def _t(values):
    n = len(values)
    half = {2: 4.302653, 3: 3.182446, 5: 2.570582}[n - 1] * statistics.stdev(values) / math.sqrt(n)
    return statistics.fmean(values) - half, statistics.fmean(values) + half


def test_decisions_are_the_preregistered_signed_statistics(tmp_path):
    cells = _cells(tmp_path)
    assert len(cells) == 45 and all(c.analysed for c in cells)
    c = next(c for c in cells if c.cell == "tiny-pos-high__tiny__token__s2")
    assert c.sampled == pytest.approx(100 * (0.62 + 0.05 + 0.012))
    assert c.prob == pytest.approx(c.sampled - 1)
    h = decide(cells)
    assert h["H1"] == {"decision": "holds", "violations": [], "not_analysed": []}
    # token - sequence = 100 x (EFFECT + 0.003 k^2); D = pos minus neg at each spread
    tms = {(a, s, k): 100 * (EFFECT[(a, s)] + 0.003 * k * k) for a, s in EFFECT for k in SEEDS}
    d = [statistics.fmean(tms[("pos", s, k)] - tms[("neg", s, k)] for s in ("low", "high")) for k in SEEDS]
    assert h["H2"]["values"] == pytest.approx(d)
    assert (h["H2"]["low"], h["H2"]["high"]) == pytest.approx(_t(d), abs=1e-5)
    assert h["H2"]["sd"] == pytest.approx(statistics.stdev(d))  # for the measured power
    assert h["H2"]["decision"] == "supported"
    # E: (pos high - pos low) - (neg high - neg low) = 3 - (-2) = 5 points at every seed: a constant
    assert h["H3"]["values"] == pytest.approx([5.0] * 3)
    assert h["H3"]["decision"] == "supported"
    assert h["H4"]["settings"]["neg-high"]["decision"] == "non-inferior (BA better)"
    assert h["H4"]["decision"] == "holds"
    # echo share token 50 + k, sequence 30 + k percent of worked answers: +20 at every seed
    assert h["C"]["values"] == pytest.approx([20.0] * 3)
    assert h["C"]["decision"] == "supported"
    text = render(cells)
    assert "Cells analysed: 45 of 45." in text and "H3 E" in text


def test_lab_v3s_grid_decides_h2_and_leaves_h4_and_c_undecided(tmp_path):
    """Lab v3 (docs/lab.md): the four gap x spread settings, token and sequence only, analysed by
    this module as pre-registered: H2 as in v2; no balanced cell, so H4 is not decidable; no control,
    so C is not."""
    _write_lab(tmp_path, _acc, {}, settings=SETTINGS[:4], rules=("token", "sequence"))
    cells = load_cells(tmp_path, step=12, benchmark="tiny_test", metric="avg@4")
    apply_gate(cells)
    assert len(cells) == 24 and all(c.analysed for c in cells)
    h = decide(cells)
    tms = {(a, s, k): 100 * (EFFECT[(a, s)] + 0.003 * k * k) for a, s in EFFECT for k in SEEDS}
    d = [statistics.fmean(tms[("pos", s, k)] - tms[("neg", s, k)] for s in ("low", "high")) for k in SEEDS]
    assert h["H2"]["values"] == pytest.approx(d) and h["H2"]["decision"] == "supported"
    assert h["H1"]["decision"] == "holds"
    assert sorted(h["H4"]["settings"]) == ["neg-high", "neg-low", "pos-high", "pos-low"]
    assert all(p["decision"].startswith("not decidable") for p in h["H4"]["settings"].values())
    assert h["H4"]["decision"] == "not decidable (no balanced cells)"
    assert h["C"]["n"] == 0 and h["C"]["decision"].startswith("not decidable")
    assert "Cells analysed: 24 of 24." in render(cells)


def test_a_cell_that_fails_the_gate_is_reported_not_analysed(tmp_path):
    cells = _cells(
        tmp_path,
        {
            # G1: the positive arm's gap turned negative, and with it token's weight ratio (as in lab v3)
            ("pos", "high", "token", 1): {"gap": -3.0, "ratio": 0.97},
            ("neg", "high", "sequence", 2): {"cv": 0.28},  # G2 (0.28 - 0.15 < 0.15) and G3 (|0.55 - 0.28|)
        },
    )
    by = {c.cell: c for c in cells}
    assert by["tiny-pos-high__tiny__token__s1"].gate[0] == "G1 gap -3.0 against the setting's sign"
    failed = {c.cell for c in cells if not c.analysed}
    assert failed == {
        "tiny-pos-high__tiny__token__s1",
        "tiny-neg-high__tiny__sequence__s2",
        "tiny-neg-low__tiny__sequence__s2",  # G2 fails both cells it compares
        "tiny-pos-high__tiny__sequence__s2",  # G3 too
    }
    h = decide(cells)
    # D needs token and sequence of both arms at both spreads of a seed: seeds 1 and 2 drop out
    assert h["H2"]["n"] == 1 and h["H2"]["decision"].startswith("not decidable")
    assert h["H3"]["n"] == 1 and h["H3"]["decision"].startswith("not decidable")
    assert "Cells analysed: 41 of 45." in render(cells)
    # H1 is decided on the analysed cells too; the excluded cell's ratio is reported, not counted
    assert h["H1"] == {
        "decision": "holds",
        "violations": [],
        "not_analysed": ["tiny-pos-high__tiny__token__s1: 0.9700"],
    }
    assert "- H1 (weight ratios): holds (not analysed, failed a check, would violate it: " in render(cells)


def test_the_rule_check_catches_a_cell_that_trained_another_rule(tmp_path):
    cells = _cells(tmp_path, {("neg", "low", "balanced", 0): {"trained": "sequence"}})
    bad = [c for c in cells if c.rule_problem]
    assert [c.cell for c in bad] == ["tiny-neg-low__tiny__balanced__s0"]
    assert bad[0].rule_problem == "step 1: loss/weight_sq 0.003 != agg/balanced/weight_sq 0.0025"
    assert not bad[0].analysed
    # and a log where the rules never differ cannot tell which one trained
    same = [{"step": 1, "loss/pg": 0.0, "loss/weight_sq": 1.0} | {f"agg/{r}/pg_loss": 0.0 for r in RULES}]
    same[0] |= {f"agg/{r}/weight_sq": 1.0 for r in RULES}
    assert rule_problem(same, "token") == "never told apart from ['balanced', 'sequence']"
    assert (
        rule_problem([{"step": 3, "loss/pg": 0.0}], "token")
        == "step 3: loss/pg or agg/token/pg_loss not logged"
    )
    # a token cell logged as if it had trained sequence is caught by its loss
    swapped = [
        {"step": 1, "loss/pg": 0.0, "loss/weight_sq": SQ["token"]}
        | {f"agg/{r}/pg_loss": LOSS[r] for r in RULES}
    ]
    swapped[0] |= {f"agg/{r}/weight_sq": SQ[r] for r in RULES}
    assert rule_problem(swapped, "token") == "step 1: loss/pg 0 != agg/token/pg_loss -0.03"
    # float32 rounding at a step where every rule's loss is ~0 (pilot 2's balanced cell, last step)
    # is not a wrong rule; a difference above the absolute floor still is
    quiet = {f"agg/{r}/pg_loss": v for r, v in zip(RULES, (3e-7, 2.8e-17, 2.8e-17), strict=True)}
    quiet |= {f"agg/{r}/weight_sq": SQ[r] for r in RULES} | {"loss/weight_sq": SQ["balanced"]}
    log = [
        dict(swapped[0], **{f"agg/{r}/weight_sq": SQ[r] for r in RULES}, **{"loss/weight_sq": SQ["balanced"]})
    ]
    log[0]["loss/pg"] = LOSS["balanced"]
    assert rule_problem([*log, {"step": 2, "loss/pg": -1.4e-8, **quiet}], "balanced") is None
    assert rule_problem([*log, {"step": 2, "loss/pg": -3e-6, **quiet}], "balanced") == (
        "step 2: loss/pg -3e-06 != agg/balanced/pg_loss 2.8e-17"
    )


def test_an_unusable_probability_drops_from_the_secondary_outcome_only(tmp_path):
    cells = _cells(tmp_path, {("pos", "low", "token", 0): {"usable": False}})
    c = next(c for c in cells if c.cell == "tiny-pos-low__tiny__token__s0")
    assert c.prob is None and c.analysed
    assert decide(cells, "prob")["H2"]["n"] == 2
    assert decide(cells)["H2"]["n"] == 3  # the primary outcome, avg@n, is always defined


def test_setting_names():
    assert setting_of("tiny-pos-high") == ("pos", "high")
    assert setting_of("tiny-control") == ("control", None)
    with pytest.raises(ValueError, match="not a lab v2 model"):
        setting_of("tiny-positive-wide")
