"""aggbench.integrations.verl: any rule as a verl advantage estimator, exact through verl's actor update.

The gradient tests run verl's own driver and worker code on CPU (tests/helpers/verl_support.py):
the estimator through ``compute_advantage``, the rank dispatch, each rank's mini-batch iterator,
micro-batches and ``ppo_loss``; the result must equal aggbench's own trainer's gradient for the rule
on each mini-batch (float64, relative 1e-6). verl's built-in ``token-mean`` and ``seq-mean-token-mean``
run on the same batch beside them: they are the ``token`` and ``sequence`` rules, and ``balanced``
is neither.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

if os.environ.get("AGGBENCH_REQUIRE_VERL"):  # the verl leg: a broken install fails, never skips
    import verl  # noqa: F401
else:
    pytest.importorskip(
        "verl", reason="verl's config stack is installed only in its own environment: `make test-verl`"
    )

from aggbench.aggregation import builtin_instances, make_instance  # noqa: E402
from aggbench.integrations import AdapterConfigError  # noqa: E402
from aggbench.integrations import verl as adapter  # noqa: E402
from helpers import verl_support as vs  # noqa: E402

SUM, TOKEN_MEAN = adapter.SUM_MODE, adapter.TOKEN_MODE


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from helpers.tiny_models import tiny_model_for_tests

    return tiny_model_for_tests(tmp_path_factory.mktemp("verl-tiny"))


def _run(model_dir, estimator, mode, mini_batches, extra=()):
    config = adapter.compose_config(vs.overrides(estimator, mode, mini_batches=mini_batches, extra=extra))
    model = vs.load_model(model_dir)
    batch = vs.make_batch(model_dir)
    vs.add_old_logprobs(model, batch)
    batch = vs.compute_advantage(batch, config)
    return model, batch, vs.verl_update_gradients(model, batch, config)


CASES = [
    # (estimator, loss_agg_mode, the aggbench instance it must equal, mini-batches per step)
    ("aggbench_balanced", SUM, "balanced", 1),
    ("aggbench_balanced", SUM, "balanced", 2),
    ("aggbench_sequence", SUM, "sequence", 1),
    ("aggbench_sequence", SUM, "sequence", 2),
    ("aggbench_token", TOKEN_MEAN, "token", 1),
    ("aggbench_token", TOKEN_MEAN, "token", 2),
    ("aggbench_balanced_batch", SUM, "balanced_batch", 1),
    ("aggbench_balanced_mass", SUM, "balanced_mass", 2),
    # a batch-scope rule that passes the probe check (weights 1/N: rescaled on any set of groups),
    # refused by parameter names before and exact at k = 2
    ("aggbench_seq_sum", SUM, "seq_sum", 2),
    # verl's own modes with its GRPO estimator, beside them: the token and sequence rules
    ("grpo", TOKEN_MEAN, "token", 2),
    ("grpo", "seq-mean-token-mean", "sequence", 2),
]


@pytest.mark.parametrize(
    ("estimator", "mode", "rule", "k"), CASES, ids=[f"{c[0]}-{c[1]}-k{c[3]}" for c in CASES]
)
def test_verl_update_equals_aggbench_gradient(model_dir, estimator, mode, rule, k):
    model, batch, steps = _run(model_dir, estimator, mode, k)
    assert len(steps) == k
    instance = make_instance(rule)
    covered = []
    for rows, grads in steps:
        assert len(rows) == len(batch) // k
        covered += rows
        want = vs.aggbench_gradient(model, batch, rows, instance)
        assert vs.relative_difference(grads, want) < 1e-6, (estimator, mode, rows)
    assert sorted(covered) == list(range(len(batch)))


def test_balanced_is_neither_of_verls_builtin_modes(model_dir):
    _, _, [(_, balanced)] = _run(model_dir, "aggbench_balanced", SUM, 1)
    for mode in (TOKEN_MEAN, "seq-mean-token-mean"):
        _, _, [(_, builtin)] = _run(model_dir, "grpo", mode, 1)
        assert vs.relative_difference(balanced, builtin) > 1e-2, mode


def test_one_minibatch_is_exact_in_any_row_order(model_dir):
    """With one mini-batch per step, verl's reorderings (balance_batch, shuffle) leave the gradient
    unchanged: the rule was computed on the whole batch, so the adapter allows them."""
    config = adapter.compose_config(vs.overrides("aggbench_balanced", SUM, mini_batches=1))
    model = vs.load_model(model_dir)
    batch = vs.make_batch(model_dir)
    vs.add_old_logprobs(model, batch)
    batch = vs.compute_advantage(batch, config)
    [(_, straight)] = vs.verl_update_gradients(model, batch, config)
    perm = torch.randperm(len(batch), generator=torch.Generator().manual_seed(3)).tolist()
    [(_, shuffled)] = vs.verl_update_gradients(model, batch.select_idxs(perm), config)
    assert vs.relative_difference(shuffled, straight) < 1e-9
    for extra in (
        ["trainer.balance_batch=true"],
        ["actor_rollout_ref.actor.shuffle=true"],
        ["trainer.use_v1=true"],
    ):
        adapter.check_config(
            adapter.compose_config(vs.overrides("aggbench_balanced", SUM, extra=extra)),
            make_instance("balanced"),
        )


def test_estimator_writes_the_rule_times_the_minibatch_count(model_dir):
    config = adapter.compose_config(vs.overrides("aggbench_balanced", SUM))
    batch = vs.compute_advantage(vs.make_batch(model_dir), config)
    t = batch.batch
    mask = t["response_mask"].bool()
    gids = adapter.group_ids_of(batch.non_tensor_batch["uid"])
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    grpo, _ = compute_grpo_outcome_advantage(
        t["token_level_rewards"], t["response_mask"], batch.non_tensor_batch["uid"]
    )
    eff = make_instance("balanced")(mask, (grpo * mask).sum(1) / mask.sum(1), gids)
    torch.testing.assert_close(t["advantages"], eff, rtol=1e-12, atol=1e-12)  # k = 1 mini-batch
    torch.testing.assert_close(t["returns"], t["advantages"])
    assert float(t["advantages"][4:8].abs().max()) == 0.0  # the all-wrong group has no signal


# ----------------------------------------------------------------------------- registration


def _fresh(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=300,
    )


def test_fresh_import_verl_registers_the_estimators_through_the_entry_point():
    code = """
        import sys
        import verl
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn
        assert "aggbench.integrations.verl" in sys.modules, "the entry point did not import the adapter"
        fn = get_adv_estimator_fn("aggbench_balanced")
        print(fn.aggbench_instance.rule, dict(fn.aggbench_instance.params)["scope"])
    """
    proc = _fresh(code)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["balanced", "group"]
    # the control: with verl's plugin discovery off, nothing registers it
    off = _fresh(code, VERL_USE_EXTERNAL_PLUGINS="none")
    assert off.returncode != 0 and "the entry point did not import the adapter" in off.stderr


def test_a_verl_config_naming_it_validates():
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    config = adapter.compose_config(vs.overrides("aggbench_balanced", SUM, mini_batches=2))
    validate_config(
        config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config)
    )
    assert not need_critic(config)  # a GRPO-style run: no value model
    adapter.check_config(config, make_instance("balanced"))


def test_plugin_rules_register_and_a_broken_plugin_surfaces_on_first_use(tmp_path):
    plugin = tmp_path / "my_rules.py"
    plugin.write_text(
        textwrap.dedent(
            """
            from aggbench.aggregation import register_rule, broadcast, check_inputs

            @register_rule("half_token", version="1")
            def half_token(mask, advantages, group_ids, *, scope="group", include_zero_groups=True):
                m = check_inputs(mask, advantages, group_ids)
                return broadcast(0.5 * advantages / m.sum(), m)
            """
        )
    )
    ok = _fresh(
        """
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn
        print(get_adv_estimator_fn("aggbench_half_token").aggbench_instance.rule)
        """,
        AGGBENCH_PLUGINS=str(plugin),
    )
    assert ok.returncode == 0 and ok.stdout.strip() == "half_token", ok.stderr[-2000:]
    broken = tmp_path / "broken_rules.py"
    broken.write_text("raise ImportError('no such thing')\n")
    proc = _fresh(
        """
        import torch
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn
        fn = get_adv_estimator_fn("aggbench_balanced")
        try:
            fn(torch.zeros(2, 3), torch.ones(2, 3), index=["a", "a"], config=None)
        except ValueError as exc:
            print(exc)
        """,
        AGGBENCH_PLUGINS=str(broken),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "failed to import" in proc.stdout and "no such thing" in proc.stdout


def test_cli_checks_registration_and_config():
    good = subprocess.run(
        [
            sys.executable,
            "-m",
            "aggbench.integrations.verl",
            *vs.overrides("aggbench_balanced", SUM, mini_batches=2),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert good.returncode == 0, good.stdout + good.stderr[-2000:]
    assert "registered in a fresh `import verl`" in good.stdout and "exact under this config" in good.stdout
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "aggbench.integrations.verl",
            *vs.overrides(
                "aggbench_balanced", SUM, mini_batches=2, extra=["actor_rollout_ref.actor.shuffle=true"]
            ),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 1 and "refused: actor_rollout_ref.actor.shuffle=true" in bad.stdout


# ----------------------------------------------------------------------------- refusals

A = "actor_rollout_ref.actor"
REFUSALS = [
    # (rule, loss_agg_mode, mini-batches, extra overrides, the setting the one-line message names)
    ("balanced", SUM, 1, [f"{A}.strategy=megatron"], f"{A}.strategy=megatron"),
    ("balanced", SUM, 1, [f"{A}.policy_loss.loss_mode=gspo"], f"{A}.policy_loss.loss_mode=gspo"),
    ("balanced", TOKEN_MEAN, 1, [], f"{A}.loss_agg_mode=token-mean"),
    ("token", SUM, 1, [], f"set {A}.loss_agg_mode=token-mean"),
    ("balanced", SUM, 1, [f"{A}.entropy_coeff=0.001"], f"{A}.entropy_coeff=0.001"),
    ("balanced", SUM, 1, [f"{A}.use_kl_loss=true", f"{A}.kl_loss_coef=0.001"], f"{A}.use_kl_loss=true"),
    ("balanced", SUM, 2, [f"{A}.shuffle=true"], f"{A}.shuffle=true"),
    ("balanced", SUM, 2, ["trainer.use_v1=true"], "trainer.use_v1=true"),
    ("balanced", SUM, 2, ["trainer.balance_batch=true"], "trainer.balance_batch=true"),
    ("balanced_batch", SUM, 2, [], "'balanced_batch'"),
    ("no_zero_groups", SUM, 2, [], "'no_zero_groups'"),
    ("balanced", SUM, 2, ["trainer.n_gpus_per_node=4"], "whole groups of 4"),
    ("balanced", SUM, 1, [f"{A}.strategy=torchtitan"], f"{A}.strategy=torchtitan"),
    (
        "balanced",
        SUM,
        1,
        ["algorithm.rollout_correction.bypass_mode=true"],
        "rewrites actor_rollout_ref.actor.policy_loss.loss_mode to 'bypass_mode'",
    ),
]


@pytest.mark.parametrize(("rule", "mode", "k", "extra", "names"), REFUSALS, ids=[r[4] for r in REFUSALS])
def test_refusal(rule, mode, k, extra, names):
    instance = (
        make_instance(rule)
        if rule != "no_zero_groups"
        else make_instance("no_zero_groups", "balanced", {"include_zero_groups": False})
    )
    config = adapter.compose_config(
        vs.overrides(f"aggbench_{instance.name}", mode, mini_batches=k, extra=extra)
    )
    with pytest.raises(AdapterConfigError) as err:
        adapter.check_config(config, instance)
    message = str(err.value)
    assert names in message and "\n" not in message
    assert " set " in message or "use " in message  # and the fix


def test_refusal_fires_through_verls_compute_advantage_before_any_update(model_dir):
    """On first use: the estimator checks the whole trainer config verl passes (config.algorithm's root)."""
    config = adapter.compose_config(vs.overrides("aggbench_balanced", SUM, extra=[f"{A}.entropy_coeff=0.01"]))
    with pytest.raises(AdapterConfigError, match=f"{A}.entropy_coeff=0.01"):
        vs.compute_advantage(vs.make_batch(model_dir), config)


@pytest.mark.parametrize("case", ["batch-scope rule", "rows reordered across mini-batches"])
def test_what_is_refused_is_really_inexact(model_dir, case):
    """The control for the refusals: verl runs them, but the update is not the rule on its mini-batches."""
    name, permute = ("balanced_batch", False) if case == "batch-scope rule" else ("balanced", True)
    # the estimator refuses this config on first use, so its advantages come from the one-mini-batch
    # config (the rule on the whole batch), x 2 as the estimator scales for two mini-batches, and
    # verl's update then runs two mini-batches on them
    one = adapter.compose_config(vs.overrides(f"aggbench_{name}", SUM, mini_batches=1))
    config = adapter.compose_config(vs.overrides(f"aggbench_{name}", SUM, mini_batches=2))
    model = vs.load_model(model_dir)
    batch = vs.make_batch(model_dir)
    vs.add_old_logprobs(model, batch)
    batch = vs.compute_advantage(batch, one)
    batch.batch["advantages"] = (
        2 * batch.batch["advantages"]
    )  # k = 2: only the layout is wrong, not the scale
    if permute:  # what balance_batch / shuffle do: groups split between the two mini-batches
        batch = batch.select_idxs(
            torch.randperm(len(batch), generator=torch.Generator().manual_seed(5)).tolist()
        )
    worst = max(
        vs.relative_difference(grads, vs.aggbench_gradient(model, batch, rows, make_instance(name)))
        for rows, grads in vs.verl_update_gradients(model, batch, config)
    )
    assert worst > 1e-3


def test_a_plugin_rule_that_normalises_by_the_batch_tokens_is_refused_at_two_minibatches():
    """Decided by running the rule, not by its parameter names: this rule has a group-scope
    parameter (what the name check accepted) but divides by the whole batch's token count."""
    from aggbench.aggregation import RuleInstance, register_rule
    from aggbench.aggregation.contract import check_inputs

    @register_rule("test_batch_tokens_named_group", version="1")
    def batch_tokens(mask, advantages, group_ids, *, scope: str = "group", include_zero_groups: bool = True):
        """c_i = 1 / (tokens of the whole batch), whatever ``scope`` says."""
        m = check_inputs(mask, advantages, group_ids)
        return advantages[:, None] * m / m.sum()

    instance = RuleInstance("test_batch_tokens_named_group", "test_batch_tokens_named_group")
    assert not adapter.layout_free(instance)
    config = adapter.compose_config(vs.overrides("aggbench_balanced", SUM, mini_batches=2))
    with pytest.raises(AdapterConfigError, match="not its whole-batch weights rescaled"):
        adapter.check_config(config, instance)
    adapter.check_config(config, make_instance("seq_sum"))  # a batch-scope rule that passes the probe


def test_a_step_batch_that_is_not_whole_minibatches_is_refused(model_dir):
    """The estimator scales the rule by the mini-batch count k = rows / (ppo_mini_batch_size x n): a
    batch that is not whole mini-batches is refused, naming the setting; the native token-mean path
    divides by the real token count and is not refused."""
    batch = vs.make_batch(model_dir)
    rows = len(batch)
    extra = [f"data.train_batch_size={2 * rows // vs.N}", f"{A}.ppo_mini_batch_size={2 * rows // vs.N}"]
    config = adapter.compose_config(vs.overrides("aggbench_balanced", SUM, extra=extra))
    with pytest.raises(
        AdapterConfigError, match=f"the step batch has {rows} rows, not a multiple of {A}.ppo_mini_batch_size"
    ):
        vs.compute_advantage(batch, config)
    token = adapter.compose_config(vs.overrides("aggbench_token", TOKEN_MEAN, extra=extra))
    vs.compute_advantage(vs.make_batch(model_dir), token)


def test_a_step_batch_of_other_whole_minibatches_is_exact(model_dir):
    """Fewer rows than configured but whole mini-batches (a short step): k follows the batch the
    estimator sees, and each mini-batch's update is still the rule on it (refused before the switch
    to token-sum, whose route needed exactly the configured rows)."""
    rows = vs.PROMPTS * vs.N
    extra = [f"data.train_batch_size={2 * vs.PROMPTS}"]  # configured: 2 x the rows the step has
    config = adapter.compose_config(vs.overrides("aggbench_balanced", SUM, mini_batches=2, extra=extra))
    assert int(config.data.train_batch_size) * vs.N == 2 * rows
    model = vs.load_model(model_dir)
    batch = vs.make_batch(model_dir)
    vs.add_old_logprobs(model, batch)
    batch = vs.compute_advantage(batch, config)
    steps = vs.verl_update_gradients(model, batch, config)
    assert len(steps) == 2
    for step_rows, grads in steps:
        want = vs.aggbench_gradient(model, batch, step_rows, make_instance("balanced"))
        assert vs.relative_difference(grads, want) < 1e-6


def test_the_documented_command_passes_the_checker():
    """docs/integrations.md's and README's AGG overrides (the same), as written, pass the check
    `python -m aggbench.integrations.verl` runs (verl's defaults otherwise: use_v1=true, balance_batch);
    without the mini-batch line they are refused (verl's default 1024 / 256 = 4 mini-batches under the
    v1 trainer)."""
    import re
    import shlex

    repo = Path(__file__).resolve().parents[2]
    found = []
    for doc in (repo / "docs" / "integrations.md", repo / "README.md"):
        (block,) = re.findall(r'^AGG="(.*?)"$', doc.read_text(), re.M | re.S)
        found.append(sorted(shlex.split(block.replace("\\\n", " "))))
    assert found[0] == found[1], found
    overrides = found[0]
    config = adapter.compose_config(overrides)
    assert bool(config.trainer.use_v1)  # the default path
    name = str(config.algorithm.adv_estimator)
    adapter.check_config(config, builtin_instances()[name.removeprefix(adapter.PREFIX)])
    without = [o for o in overrides if "train_batch_size" not in o and "ppo_mini_batch_size" not in o]
    with pytest.raises(AdapterConfigError, match="trainer.use_v1=true with 4 mini-batches"):
        adapter.check_config(adapter.compose_config(without), builtin_instances()["balanced"])


def test_the_monitor_estimator_leaves_grpo_and_logs_aggbenchs_diagnostics(model_dir):
    """algorithm.adv_estimator=aggbench_monitor_grpo through verl's driver call: the advantages are
    verl's grpo's, bit for bit, and the next Tracking.log carries aggbench/* values equal to
    aggbench's own diagnostics on the batch (under the run's loss_agg_mode, here seq-mean-token-mean:
    the sequence rule, so run/weight_ratio == agg/sequence/weight_ratio)."""
    from verl.utils.tracking import Tracking

    from aggbench.aggregation.diagnostics import diagnostics
    from aggbench.integrations import verl_monitor

    mode = "seq-mean-token-mean"
    plain = vs.compute_advantage(vs.make_batch(model_dir), adapter.compose_config(vs.overrides("grpo", mode)))
    mon = vs.compute_advantage(
        vs.make_batch(model_dir), adapter.compose_config(vs.overrides(verl_monitor.NAME, mode))
    )
    assert torch.equal(plain.batch["advantages"], mon.batch["advantages"])
    seen = []

    class Capture:
        def log(self, data, step):
            seen.append((dict(data), step))

    tracker = Tracking.__new__(Tracking)  # no backend set-up: one capturing logger
    tracker.logger = {"capture": Capture()}
    tracker.log({"actor/pg_loss": 0.5}, step=3)
    tracker.log({"actor/pg_loss": 0.4}, step=4)
    (first, _), (second, _) = seen
    assert first["actor/pg_loss"] == 0.5 and not any(k.startswith("aggbench/") for k in second)
    mask = mon.batch["response_mask"].bool()
    adv = (mon.batch["advantages"] * mask).sum(1) / mask.sum(1)
    gids = adapter.group_ids_of(mon.non_tensor_batch["uid"])
    diag = diagnostics(mask, adv.double(), gids)
    for key in ("len/cv", "len/gap", "len/cv_within", "agg/balanced/weight_ratio", "agg/token/weight_ratio"):
        assert first[f"aggbench/{key}"] == pytest.approx(diag[key], rel=1e-9, nan_ok=True), key
    assert first["aggbench/run/weight_ratio"] == pytest.approx(diag["agg/sequence/weight_ratio"], rel=1e-9)
    assert first["aggbench/agg/balanced/weight_ratio"] != pytest.approx(
        first["aggbench/agg/token/weight_ratio"]
    )


@pytest.mark.parametrize("k", [1, 2])
def test_seq_mean_token_sum_is_the_same_update_with_the_advantages_times_its_divisor(model_dir, k):
    """The adapter's route before (kept as a check of the choice): verl's seq-mean-token-sum divides each
    mini-batch's token sum by the configured G rows, so advantages of B x the rule (the token-sum
    route's k x the rule, times G) give the same update as token-sum's: both exact on verl's own loss
    path; token-sum is kept because its scale is the one factor the estimator sets (docs/integrations.md)."""
    config = adapter.compose_config(vs.overrides("aggbench_balanced", SUM, mini_batches=k))
    model = vs.load_model(model_dir)
    batch = vs.make_batch(model_dir)
    vs.add_old_logprobs(model, batch)
    batch = vs.compute_advantage(batch, config)
    via_token_sum = vs.verl_update_gradients(model, batch, config)
    instance = make_instance("balanced")
    for rows, grads in via_token_sum:  # the rule on each mini-batch (computed before the rescale below)
        assert vs.relative_difference(grads, vs.aggbench_gradient(model, batch, rows, instance)) < 1e-6
    batch.batch["advantages"] = batch.batch["advantages"] * (len(batch) // k)  # B x the rule's weights
    seq_mean = adapter.compose_config(vs.overrides("aggbench_balanced", "seq-mean-token-sum", mini_batches=k))
    via_seq_mean = vs.verl_update_gradients(model, batch, seq_mean)
    assert len(via_seq_mean) == len(via_token_sum) == k
    for (rows, a), (rows_b, b) in zip(via_token_sum, via_seq_mean, strict=True):
        assert rows == rows_b
        assert vs.relative_difference(a, b) < 1e-9
