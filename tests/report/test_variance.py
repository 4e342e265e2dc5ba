"""The variance decomposition (issue 27, item 2; aggbench.report.variance): known components are
recovered, the estimator's means are on the truth in the lab's small design (up to the truncation at 0), and the report reads the graded
files of every training and evaluation seed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from aggbench import layout
from aggbench.report.variance import decompose, variance_rows, write_variance

# sd of the training-seed effect 3 points, of problems 20, seed x problem 5, evaluation noise 10
SA, SB, SAB, SE = 0.03**2, 0.20**2, 0.05**2, 0.10**2


def _simulate(rng, S, E, P, sa=SA, b=None):
    a = rng.normal(0, sa**0.5, (S, 1, 1))
    b = rng.normal(0, SB**0.5, (1, 1, P)) if b is None else b
    ab = rng.normal(0, SAB**0.5, (S, 1, P))
    eps = rng.normal(0, SE**0.5, (S, E, P))
    return 0.5 + a + b + ab + eps


def test_known_components_are_recovered_in_a_large_design():
    """400 training seeds x 4 evaluation seeds x 2,000 problems, training-seed sd 1 point: relative
    standard errors of the estimates about 7% (training), 3% (problems), 1% (sampling)."""
    P, sa = 2000, 0.01**2
    c = decompose(_simulate(np.random.default_rng(0), 400, 4, P, sa=sa))
    truth = {
        "training seed": sa,
        "seed x problem": SAB / P,
        "evaluation sampling": SE / P,
        "problems": SB / P,
    }
    total = sum(truth.values())  # 1.2625e-4: shares 79.2%, 1.0%, 4.0%, 15.8%
    assert c.training == pytest.approx(sa, rel=0.2)
    assert c.seed_problem == pytest.approx(truth["seed x problem"], rel=0.2)
    assert c.problems == pytest.approx(truth["problems"], rel=0.1)
    assert c.sampling == pytest.approx(truth["evaluation sampling"], rel=0.03)
    for source, share in c.shares().items():
        assert share == pytest.approx(truth[source] / total, abs=0.05), source
    assert (c.S, c.E, c.P) == (400, 4, P)


def test_the_estimates_are_unbiased_in_the_labs_design():
    """3 training seeds x 2 evaluation seeds x 64 problems, 2,000 replications: each component's mean
    estimate is within 4 standard errors (+2%) of the truth, although the truncation at 0 is not rare
    (11% of the training estimates at these sizes, asserted)."""
    rng = np.random.default_rng(1)
    P = 64
    est = np.array(
        [
            [c.training, c.seed_problem, c.sampling, c.problems]
            for c in (decompose(_simulate(rng, 3, 2, P)) for _ in range(2000))
        ]
    )
    truth = np.array([SA, SAB / P, SE / P, SB / P])
    se = est.std(axis=0, ddof=1) / np.sqrt(len(est))
    assert np.all(np.abs(est.mean(axis=0) - truth) < 4 * se + 0.02 * truth), (est.mean(axis=0), truth, se)
    assert 0.05 < np.mean(est[:, 0] == 0) < 0.2  # not rare (11% with this seed; binomial se 0.7%)


def test_in_a_paired_difference_on_the_same_problems_only_the_problems_share_cancels():
    """Two rules trained at the same seeds are different runs on the same benchmark: the variance of
    their paired score difference is twice the training seed, seed x problem and sampling parts (what
    the report's text says), not twice training and sampling alone. Seed x problem is made large
    here (sd 30 points per problem) and the training seed's 0, so that leaving it out would miss by
    a factor of about 10."""
    rng = np.random.default_rng(3)
    S, E, P, sab = 4000, 2, 64, 0.3**2
    b = rng.normal(0, SB**0.5, (1, 1, P))  # the benchmark's problems: the same for both rules
    one, two = (_simulate(rng, S, E, P, sa=0.0, b=b) + rng.normal(0, sab**0.5, (S, 1, P)) for _ in range(2))
    diff = (two - one)[:, 0, :].mean(axis=1)  # one evaluation seed's score difference per training seed
    c = decompose(one)
    assert c.seed_problem == pytest.approx((SAB + sab) / P, rel=0.1)
    assert diff.var(ddof=1) == pytest.approx(2 * (c.training + c.seed_problem + c.sampling), rel=0.1)
    assert 2 * (c.training + c.sampling) < diff.var(ddof=1) / 5


def test_too_small_a_design_is_refused_with_what_is_short():
    with pytest.raises(
        ValueError, match="needs >= 2 training seeds, evaluation seeds and problems; got 1, 2, 5"
    ):
        decompose(np.zeros((1, 2, 5)))
    assert decompose(np.full((3, 2, 4), 0.5)).total == 0.0  # no variance: all shares 0, no division
    assert set(decompose(np.full((3, 2, 4), 0.5)).shares().values()) == {0.0}


def _write_graded(path, correct):
    """correct: {problem id: [bool per sample]} -> a graded samples file as `aggbench score` writes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {"benchmark": "tiny_test", "id": pid, "sample": i, "correct": c}
        for pid, samples in correct.items()
        for i, c in enumerate(samples)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_report_reads_every_training_and_evaluation_seed(tmp_path):
    rng = np.random.default_rng(2)
    S, seeds_eval, P, n = 4, (None, 1, 2), 30, 8
    exp = {
        "experiment": "var",
        "results_dir": str(tmp_path / "results"),
        "models": {"tiny": {"source": "tiny"}},
        "datasets": {"tiny": {"spec": "tiny"}},
        "aggregations": [{"name": "token"}],
        "seeds": list(range(S)),
        "benchmarks": ["tiny_test"],
        "training": {"algorithm": {"total_steps": 8}, "checkpoint": {"every": 4}},
        "evaluation": {"every": 4, "extra_seeds": [1, 2]},
    }
    truth = np.zeros((S, len(seeds_eval), P))
    for s in range(S):
        run = layout.run_dir(exp["results_dir"], f"tiny__tiny__token__s{s}")
        p_correct = rng.uniform(0.1, 0.9, P)
        for e, k in enumerate(seeds_eval):
            draws = rng.random((P, n)) < p_correct[:, None]
            truth[s, e] = draws.mean(axis=1)
            step_dir = layout.eval_dir(run, 8)
            folder = step_dir if k is None else layout.eval_seed_dir(step_dir, k)
            _write_graded(
                folder / "tiny_test.jsonl", {f"p{i:03d}": list(map(bool, draws[i])) for i in range(P)}
            )
        # step 4 lacks the extra seeds: the last step graded under every seed is 8
        _write_graded(layout.eval_dir(run, 4) / "tiny_test.jsonl", {"p000": [True]})
    (row,), notes = variance_rows(exp)
    assert notes == [] and (row.rule, row.benchmark, row.step) == ("token", "tiny_test", 8)
    want = decompose(truth)
    assert row.components == want
    paths = write_variance(exp, tmp_path / "tables")
    md = paths[0].read_text()
    assert f"| tiny | tiny | token | tiny_test | 8 | {S} x 3 x {P} |" in md
    csv_line = paths[1].read_text().splitlines()[1].split(",")
    assert float(csv_line[-4]) == pytest.approx(100 * want.shares()["training seed"], abs=0.01)
    assert float(csv_line[-3]) == pytest.approx(100 * want.shares()["seed x problem"], abs=0.01)
    # a seed trained under another version of its rule (the tables leave it out) is left out here
    stale = "tiny__tiny__token__s3"
    (row3,), notes = variance_rows(exp, stale={stale})
    assert row3.components == decompose(truth[:3]) and row3.components.S == 3
    assert notes == [f"{stale}: trained under another version of its rule, left out"]
    assert notes[0] in write_variance(exp, tmp_path / "t2", stale={stale})[0].read_text()
