"""`aggbench power` (aggbench.plan.power): the paired t test's power by the noncentral t.

Reference values are G*Power's "t tests - means: difference from constant (one sample case)", two
tailed, alpha 0.05, power 0.8 (the paired test is this test on the differences): effect size d =
delta / sd 1.0 -> N 10 (actual power 0.803), 0.8 -> 15 (0.821), 0.5 -> 34 (0.808), 0.25 -> 128
(0.802), 0.1 -> 787 (0.800). A Monte-Carlo check simulates the test itself.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from aggbench.cli.power import command
from aggbench.plan.power import PowerError, achieved_power, min_delta, pilot, seeds_needed

REFERENCE = [  # (sd, delta, n, achieved power): G*Power, alpha 0.05, power 0.8
    (1.0, 1.0, 10, 0.803),
    (2.0, 1.6, 15, 0.821),  # d = 0.8: only the ratio matters
    (1.0, 0.5, 34, 0.808),
    (4.0, 1.0, 128, 0.802),
    (10.0, 1.0, 787, 0.800),
]


@pytest.mark.parametrize(("sd", "delta", "n", "power"), REFERENCE)
def test_seeds_needed_and_achieved_power_match_the_reference_tables(sd, delta, n, power):
    assert seeds_needed(delta, sd) == n
    assert achieved_power(n, delta, sd) == pytest.approx(power, abs=5e-4)
    assert achieved_power(n - 1, delta, sd) < 0.8 <= achieved_power(n, delta, sd)  # the smallest such n
    assert seeds_needed(-delta, sd) == n  # two-sided: the sign of the difference does not matter


MONTE_CARLO = [  # (sd, delta, alpha, power): n from 2 to several hundred
    (1.0, 15.0, 0.05, 0.8),  # n = 2 (df 1)
    (1.0, 8.0, 0.05, 0.8),  # n = 3: the lower tail underflows in statsmodels' formula (NaN), not here
    (3.0, 2.0, 0.05, 0.8),
    (1.0, 1.0, 0.01, 0.9),
    (5.0, 0.6, 0.05, 0.8),  # n in the hundreds
]


@pytest.mark.parametrize(("sd", "delta", "alpha", "power"), MONTE_CARLO)
def test_the_achieved_power_is_what_the_test_does_in_simulation(sd, delta, alpha, power):
    from scipy import stats

    n = seeds_needed(delta, sd, alpha, power)
    expected = achieved_power(n, delta, sd, alpha)
    reps = 20_000
    rng = np.random.default_rng(20261204 + n)
    diffs = rng.normal(delta, sd, size=(reps, n))
    rejected = stats.ttest_1samp(diffs, 0.0, axis=1).pvalue < alpha
    se = math.sqrt(expected * (1 - expected) / reps)
    assert abs(rejected.mean() - expected) < 4 * se, (n, rejected.mean(), expected)
    assert expected >= power
    if n > 2:
        assert achieved_power(n - 1, delta, sd, alpha) < power


def test_the_two_smallest_cases_are_in_the_simulation_set():
    assert min(seeds_needed(d, s, a, p) for s, d, a, p in MONTE_CARLO) == 2
    assert max(seeds_needed(d, s, a, p) for s, d, a, p in MONTE_CARLO) > 100


@pytest.mark.parametrize("n", [2, 3, 5, 10, 40, 500])
@pytest.mark.parametrize(("alpha", "power"), [(0.05, 0.8), (0.01, 0.9)])
def test_the_minimum_detectable_delta_inverts_the_power(n, alpha, power):
    sd = 2.5
    d = min_delta(n, sd, alpha, power)
    assert achieved_power(n, d, sd, alpha) == pytest.approx(power, abs=1e-9)
    assert seeds_needed(d * 1.001, sd, alpha, power) == n  # n seeds detect it, n - 1 do not
    assert seeds_needed(d * 0.999, sd, alpha, power) == n + 1


def test_questions_without_an_answer_are_one_line_errors():
    with pytest.raises(PowerError, match="--delta must be a nonzero"):
        seeds_needed(0.0, 1.0)
    with pytest.raises(PowerError, match="--sd must be a positive"):
        seeds_needed(1.0, 0.0)
    with pytest.raises(PowerError, match="at least 2 pairs"):
        achieved_power(1, 1.0, 1.0)
    with pytest.raises(PowerError, match="--power must lie in"):
        min_delta(5, 1.0, power=1.0)
    # power at or below alpha: delta 0 already reaches it, so no positive delta is the minimum
    with pytest.raises(PowerError, match=r"--power must exceed --alpha \(got power 0.04 <= alpha 0.05\)"):
        min_delta(10, 1.0, power=0.04)
    code, out = _cli("--sd", "1", "--n", "10", "--power", "0.04")
    assert code == 1 and "--power must exceed --alpha" in out and "Traceback" not in out, out


def _cli(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(command, list(args))
    return res.exit_code, res.output


def test_the_command_prints_n_the_minimum_delta_and_json():
    code, out = _cli("--sd", "1", "--delta", "1")
    assert code == 0 and out.strip() == "n = 10 seeds detect delta 1 at alpha 0.05 (power 0.803)"
    code, out = _cli("--sd", "1", "--n", "10")
    assert code == 0 and "n = 10 seeds detect delta >= 0.996 at alpha 0.05, power 0.8" in out
    code, out = _cli("--sd", "1", "--delta", "1", "--format", "json")
    got = json.loads(out)
    assert set(got) == {"n", "min_delta", "power"} and got["n"] == 10
    assert got["power"] == pytest.approx(0.8031, abs=1e-4) and got["min_delta"] == pytest.approx(
        0.996, abs=1e-3
    )
    code, out = _cli("--sd", "1", "--n", "10", "--format", "json")
    assert json.loads(out)["power"] == pytest.approx(0.8)  # at the minimum detectable delta
    code, out = _cli("--delta", "1")
    assert code != 0 and "give --sd S" in out
    code, out = _cli("--sd", "1", "--delta", "1", "--samples", "8")
    assert code != 0 and "--samples needs --pilot" in out


# ---------------------------------------------------------------- a pilot results directory
K = 4  # answers per problem
HALF = [True, True, False, False]  # a problem answered right 2 of 4 times
ALL, ONE = [True] * K, [True, False, False, False]


def _cell(
    results, rule: str, seed: int, correct: list[list[bool]], step: int = 8, model: str = "tiny"
) -> None:
    """A cell's graded file and metrics at ``step``: correct[problem][sample]."""
    run = results / "runs" / f"{model}__tiny__{rule}__s{seed}" / "eval" / f"step_{step}"
    run.mkdir(parents=True)
    rows = [
        {"id": f"p{i}", "sample": j, "correct": c} for i, cs in enumerate(correct) for j, c in enumerate(cs)
    ]
    (run / "tiny_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    avg = sum(r["correct"] for r in rows) / len(rows)
    passed = sum(any(cs) for cs in correct) / len(correct)
    k = len(correct[0])  # K unless a test gives another
    metrics = {"n_samples": k, f"avg@{k}": avg, f"pass@{k}": passed}
    (run / "tiny_test.metrics.json").write_text(json.dumps(metrics))


def _sampling_var(correct: list[list[bool]]) -> float:
    """A cell's sampling variance in points^2: 1e4 * sum_i p_i (1 - p_i) / (k - 1) / P^2."""
    return 1e4 * sum(np.mean(c) * (1 - np.mean(c)) / (K - 1) for c in correct) / len(correct) ** 2


def test_a_pilot_gives_the_paired_differences_and_splits_their_variance(tmp_path):
    """Known components: 20 problems; sequence answers each 2 of 4 times right; token, at seeds 0-2,
    answers 8 of them always (+20 points), 4 of them once only (-5), 16 always (+40). The split:
    sampling variance from the graded files, training the rest."""
    problems = 20
    sequence = [HALF] * problems
    token = {0: [ALL] * 8 + [HALF] * 12, 1: [ONE] * 4 + [HALF] * 16, 2: [ALL] * 16 + [HALF] * 4}
    for seed in range(3):
        _cell(tmp_path, "sequence", seed, sequence)
        _cell(tmp_path, "token", seed, token[seed])
    _cell(tmp_path, "balanced", 0, sequence)  # another rule: not part of the pair
    p = pilot(tmp_path, "sequence", "token", "tiny_test")
    assert p.step == 8 and p.samples == K and p.metric == f"avg@{K}"
    assert p.differences == pytest.approx(
        {"tiny__tiny__s0": 20.0, "tiny__tiny__s1": -5.0, "tiny__tiny__s2": 40.0}
    )
    assert p.sd == pytest.approx(np.std([20, -5, 40], ddof=1))
    cells = [_sampling_var(sequence)] * 3 + [_sampling_var(token[s]) for s in range(3)]
    assert p.sd_eval**2 == pytest.approx(2 * np.mean(cells))  # a difference: two cells' sampling
    assert p.sd_train**2 == pytest.approx(p.sd**2 - p.sd_eval**2) and p.sd_train > 0
    assert p.sd_at(K) == pytest.approx(p.sd) and p.sd_at(4 * K) < p.sd
    assert p.sd_at(4 * K) ** 2 == pytest.approx(p.sd_train**2 + p.sd_eval**2 / 4)
    code, out = _cli(
        "--pilot", str(tmp_path), "--a", "sequence", "--b", "token", "--delta", "2", "--format", "json"
    )
    got = json.loads(out)
    assert code == 0 and got["sd"] == pytest.approx(p.sd) and got["n"] == seeds_needed(2, p.sd)
    by_k = {int(k): v for k, v in got["seeds_by_samples"].items()}
    assert by_k == {k: seeds_needed(2, p.sd_at(k)) for k in (4, 8, 16, 32, 64)}
    assert by_k[4] >= by_k[64] >= seeds_needed(2, p.sd_train)  # samples shrink only sampling's part
    code, out = _cli("--pilot", str(tmp_path), "--delta", "2", "--samples", "16")
    assert code == 0 and f"n = {seeds_needed(2, p.sd_at(16))} seeds" in out and "sampling" in out


def test_a_pilot_whose_spread_sampling_explains_has_no_training_part(tmp_path):
    """Differences smaller than k = 4 samples of 5 problems produce by chance: training's part is 0,
    not negative, and more samples per problem shrink the sd towards it."""
    for seed, flips in enumerate((1, 0, 2)):
        _cell(tmp_path, "sequence", seed, [HALF] * 5)
        _cell(tmp_path, "token", seed, [ALL] * flips + [HALF] * (5 - flips))
    p = pilot(tmp_path, "sequence", "token", "tiny_test")
    cells = [_sampling_var([HALF] * 5)] * 3 + [_sampling_var([ALL] * f + [HALF] * (5 - f)) for f in (1, 0, 2)]
    assert p.sd**2 < 2 * np.mean(cells)  # the sampling estimate alone exceeds the observed spread
    assert p.sd_train == 0.0 and p.sd_eval == p.sd  # so sampling's part is all of it, no more
    sds = [p.sd_at(k) for k in (K, 2 * K, 4 * K, 16 * K)]
    assert sds[0] == pytest.approx(p.sd) and sds == sorted(sds, reverse=True)  # more samples never cost seeds
    assert p.sd_at(100 * K) == pytest.approx(p.sd / 10)


def _token(up: int, down: int = 0, problems: int = 20) -> list[list[bool]]:
    """Token's answers against sequence's [HALF] * problems: +2.5 points per ``up``, -1.25 per ``down``."""
    return [ALL] * up + [ONE] * down + [HALF] * (problems - up - down)


def test_a_pilot_over_several_settings_pools_the_sd_within_each(tmp_path):
    """Two settings whose token - sequence means differ by design (+20 and -20 points, each +-5 over
    its seeds): the sd is the within-setting one (5), not the 20-point spread between settings."""
    for seed, up in enumerate((8, 10, 6)):
        _cell(tmp_path, "sequence", seed, [HALF] * 20, model="pos")
        _cell(tmp_path, "token", seed, _token(up), model="pos")
        _cell(tmp_path, "sequence", seed, [HALF] * 20, model="neg")
        _cell(tmp_path, "token", seed, _token(0, 2 * up), model="neg")
    p = pilot(tmp_path, "sequence", "token", "tiny_test")
    assert sorted(p.differences.values()) == pytest.approx([-25, -20, -15, 15, 20, 25])
    assert p.settings == 2 and p.sd == pytest.approx(5.0)  # pooled: sqrt((50 + 50) / (6 - 2))
    assert np.std(list(p.differences.values()), ddof=1) > 20  # what mixing the settings would give
    code, out = _cli("--pilot", str(tmp_path), "--delta", "2")
    assert code == 0 and "sd 5 points (pooled within 2 model x dataset settings)" in out, out
    code, out = _cli("--pilot", str(tmp_path), "--delta", "2", "--format", "json")
    assert json.loads(out)["pilot"]["setting_means"] == pytest.approx({"neg__tiny": -20.0, "pos__tiny": 20.0})
    # one seed per setting: no within-setting spread to take
    one = tmp_path / "one"
    for model in ("pos", "neg"):
        _cell(one, "sequence", 0, [HALF] * 20, model=model)
        _cell(one, "token", 0, _token(8), model=model)
    code, out = _cli("--pilot", str(one), "--delta", "2")
    assert code == 1 and "each model x dataset setting has one pair (neg__tiny, pos__tiny)" in out, out


def test_a_pilot_reads_every_pair_at_the_latest_step_all_of_them_evaluated(tmp_path):
    """Seeds 0 and 1 go on to step 12 (token +20 there), seed 2 stops at step 4: every pair is read at
    step 4, not seeds 0-1 at 12 and seed 2 at 4."""
    for seed, up in enumerate((2, -2, 4)):
        _cell(tmp_path, "sequence", seed, [HALF] * 20, step=4)
        _cell(tmp_path, "token", seed, _token(max(up, 0), max(-2 * up, 0)), step=4)
        if seed < 2:
            _cell(tmp_path, "sequence", seed, [HALF] * 20, step=12)
            _cell(tmp_path, "token", seed, _token(8), step=12)
    p = pilot(tmp_path, "sequence", "token", "tiny_test")
    assert p.step == 4 and p.differences == pytest.approx(
        {"tiny__tiny__s0": 5.0, "tiny__tiny__s1": -5.0, "tiny__tiny__s2": 10.0}
    )
    assert pilot(tmp_path, "sequence", "token", "tiny_test", step=4) == p
    late = tmp_path / "runs" / "tiny__tiny__token__s2" / "eval"
    late.joinpath("step_4").rename(late / "step_6")  # seed 2's token cell evaluated at 6 only
    code, out = _cli("--pilot", str(tmp_path), "--delta", "2")
    assert code == 1 and "no step at which every pilot cell evaluated 'tiny_test'" in out, out
    assert "tiny__tiny__token__s2 6" in out and "whose cells share an evaluated step" in out


def test_a_pilot_of_pass_at_k_is_not_split_into_training_and_sampling(tmp_path):
    """The graded rows give avg@k's binomial sampling variance, not pass@k's: the pilot's sd stays
    whole and --samples (which rescales the sampling part) is refused."""
    for seed, up in enumerate((8, 2, 14)):
        _cell(tmp_path, "sequence", seed, [HALF] * 20)
        _cell(tmp_path, "token", seed, [[False] * K] * up + [HALF] * (20 - up))
    p = pilot(tmp_path, "sequence", "token", "tiny_test", metric=f"pass@{K}")
    assert p.differences == pytest.approx(
        {"tiny__tiny__s0": -40.0, "tiny__tiny__s1": -10.0, "tiny__tiny__s2": -70.0}
    )
    assert p.sd_eval is None and p.sd_train is None and p.sd_at(K) == p.sd
    with pytest.raises(PowerError, match="for avg@k only, not pass@4"):
        p.sd_at(4 * K)
    code, out = _cli("--pilot", str(tmp_path), "--metric", f"pass@{K}", "--delta", "2")
    assert code == 0 and "not split into training and sampling" in out and "by answers per problem" not in out
    code, out = _cli("--pilot", str(tmp_path), "--metric", f"pass@{K}", "--delta", "2", "--samples", "16")
    assert code == 1 and "for avg@k only, not pass@4" in out, out


def test_a_pilot_of_one_answer_per_problem_is_not_split_either(tmp_path):
    """avg@1: no problem answered twice, so no sampling estimate; booking the whole sd as training
    would tell the user that more answers per problem buy nothing. The sd stays whole, --samples is
    refused with what to do."""
    for seed, up in enumerate((8, 2, 14)):
        _cell(tmp_path, "sequence", seed, [[True], [False]] * 10)
        _cell(tmp_path, "token", seed, [[True]] * up + [[True], [False]] * ((20 - up) // 2))
    p = pilot(tmp_path, "sequence", "token", "tiny_test")
    assert p.metric == "avg@1" and p.samples == 1
    assert p.differences == pytest.approx(
        {"tiny__tiny__s0": 20.0, "tiny__tiny__s1": 5.0, "tiny__tiny__s2": 35.0}
    )
    assert p.sd_eval is None and p.sd_train is None and p.sd_at(1) == p.sd
    with pytest.raises(PowerError, match="only with k >= 2 answers per problem"):
        p.sd_at(8)
    code, out = _cli("--pilot", str(tmp_path), "--delta", "2")
    assert code == 0 and "one answer per problem gives no sampling estimate" in out, out
    assert "by answers per problem" not in out
    code, out = _cli("--pilot", str(tmp_path), "--delta", "2", "--samples", "8")
    assert code == 1 and "evaluate the pilot with n_samples >= 2" in out, out


def test_a_pilot_without_two_pairs_is_refused_naming_what_it_found(tmp_path):
    _cell(tmp_path, "sequence", 0, [HALF] * 5)
    _cell(tmp_path, "token", 0, [HALF] * 5)
    code, out = _cli("--pilot", str(tmp_path), "--delta", "2")
    assert code != 0 and "1 pair(s) of 'sequence' and 'token'" in out and "at least 2" in out


def test_a_pilot_copied_without_its_graded_files_or_with_torn_ones_is_one_error_naming_the_file(tmp_path):
    """A pilot copied back from a cluster with only the small metrics files, or a torn one."""
    for seed in range(2):
        _cell(tmp_path, "sequence", seed, [HALF] * 5)
        _cell(tmp_path, "token", seed, [ALL] + [HALF] * 4)
    graded = tmp_path / "runs" / "tiny__tiny__token__s1" / "eval" / "step_8" / "tiny_test.jsonl"
    good = graded.read_text()
    cases = [
        (None, "is missing: the sampling variance is computed from each evaluation's graded samples"),
        ("", "no graded rows"),
        (good.splitlines()[0] + "\n", "problem 'p0' has one graded sample"),
        (good[:-9] + "\n", f"{graded}:20: invalid JSON"),
        ('{"id": "p0"}\n', f"{graded}:1: field 'correct': missing"),
        ("[1, 2]\n", f"{graded}:1: expected a JSON object"),
        (good.encode("utf-16"), f"{graded}:1: not UTF-8 text"),
    ]
    for text, message in cases:
        graded.unlink(missing_ok=True)
        if isinstance(text, bytes):
            graded.write_bytes(text)
        elif text is not None:
            graded.write_text(text)
        code, out = _cli("--pilot", str(tmp_path), "--delta", "2")
        assert code == 1 and message in out and str(graded) in out and "Traceback" not in out, out
    graded.write_text(good)
    metrics = graded.with_name("tiny_test.metrics.json")
    metrics.write_text('{"avg@4": 0.5}')
    code, out = _cli("--pilot", str(tmp_path), "--delta", "2")
    assert code == 1 and f"{metrics}: not a grade job's metrics (KeyError" in out, out
