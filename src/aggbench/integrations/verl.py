"""Any aggbench aggregation rule inside verl (0.9.x), as a registered advantage estimator.

    pip install "aggbench[verl]"          # registers the estimators through verl's plugin entry point
    python -m verl.trainer.main_ppo ... \\
        algorithm.adv_estimator=aggbench_balanced \\
        actor_rollout_ref.actor.loss_agg_mode=token-sum
    python -m aggbench.integrations.verl <the same overrides>   # the refusals below, before launching

Design (docs/integrations.md):

- A registered policy loss cannot carry a rule: it never sees group ids (verl's
  ``global_batch_info`` holds only dp_size, token and sequence counts). A registered advantage
  estimator (``register_adv_est``) receives the uid index, so it can compute verl's own GRPO
  advantages, run the rule on the whole step batch with groups = uids, and write per-token
  effective advantages.
- verl's ``loss_agg_mode=token-sum`` (verl >= 0.9.0) is a plain masked token sum that each rank
  multiplies by dp_size before FSDP averages the ranks' gradients: the optimiser step sees the token
  sum over the global mini-batch, for any micro-batching or dp split, with no normaliser at all.
  The estimator writes ``k x eff`` (k = B / G mini-batches per step; B: rows of the step batch, G:
  ``ppo_mini_batch_size x rollout.n``). With one mini-batch per step (k = 1) the step's gradient is
  the rule's plain token sum on the whole batch: exact for every rule.
- With k > 1 mini-batches per step, each holds G = B / k rows. A rule whose weights on a set of
  whole groups are the whole-batch weights x (B / G) (``layout_free`` runs the rule on a probe
  batch to decide: group scope, batch-scope ``sequence``/``seq_sum``/``constant``) is still exact,
  provided each mini-batch is a fixed set of whole groups; everything that breaks that is refused
  (``check_config``), and so is a step batch that is not whole mini-batches (``minibatch_count``).
- Why ``token-sum`` and not ``seq-mean-token-sum`` with ``B x eff`` (the adapter's route before; both
  exact on whole mini-batches, tests/integrations/test_verl.py): token-sum applies no normaliser, so
  the update's scale is one factor the estimator sets (k), not two that must cancel (the estimator's
  B and verl's 1/G), and the mode's name says what the loss is: a token sum, not a sequence mean.
- ``token`` at its defaults is verl's own exact ``token-mean`` (global token count per
  mini-batch): its estimator writes verl's GRPO advantages unchanged and requires that mode.
- KL and entropy losses use the same ``loss_agg_mode`` and would inherit a rescaled sum: refused.
- Names: ``aggbench_<instance>`` for every registered rule and built-in instance
  (``aggbench_balanced``, ``aggbench_sequence``, ``aggbench_token``, ``aggbench_balanced_mass`` ...);
  ``AGGBENCH_PLUGINS`` (comma-separated modules or .py files) registers users' rules first (set it in
  Ray's ``runtime_env.env_vars`` on a multi-node cluster). verl imports plugins at debug-level
  logging and swallows their errors, so a failed plugin import is kept and raised by the estimators
  on first use, and ``python -m aggbench.integrations.verl`` shows it.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Any

import numpy as np
import torch
from torch import Tensor

from aggbench.aggregation import RuleInstance, builtin_instances, env_plugins, load_plugins
from aggbench.integrations import AdapterConfigError

# The verl releases this adapter is tested against (the `verl` extra pins the same range).
TESTED_VERL = (0, 9)
TESTED_STRATEGIES = ("fsdp", "fsdp2")  # the loss path tests/integrations/test_verl.py runs
PREFIX = "aggbench_"
SUM_MODE = "token-sum"
TOKEN_MODE = "token-mean"
ACTOR = "actor_rollout_ref.actor"  # the config section of the policy being trained
_REGISTERED: dict[str, Any] = {}
_LOAD_ERROR: list[BaseException] = []


def native_token(instance: RuleInstance) -> bool:
    """True for ``token`` at its defaults, which verl's ``token-mean`` already computes exactly."""
    return (
        instance.rule == "token"
        and instance.params["scope"] == "batch"
        and instance.params["include_zero_groups"]
    )


# The probe batch of ``layout_free``: 4 groups of 3 with distinct lengths, mixed signs and one
# all-correct group (zero advantages), split into two mini-batches of whole groups two ways.
_PROBE_LENGTHS = [3, 17, 1, 12, 5, 9, 2, 26, 7, 4, 11, 6]
_PROBE_REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0]
_PROBE_SPLITS = ([0, 1, 2, 3, 4, 5], [0, 1, 2, 6, 7, 8])


def layout_free(instance: RuleInstance) -> bool:
    """True when the rule's weights on a mini-batch of whole groups are its whole-batch weights on those
    rows times (batch rows / mini-batch rows), which is what k > 1 mini-batches need.

    Decided by running the rule (a check that can fail, whatever the rule's parameter names): on a
    probe batch of 4 groups of 3 (``_PROBE_*``) the weights of each half, for two different splits
    into two halves of whole groups, must equal the whole batch's rows x 2 (rtol 1e-9).
    """
    from aggbench.aggregation import mask_from_lengths
    from aggbench.aggregation.advantages import get_advantage

    n = len(_PROBE_LENGTHS)
    mask = mask_from_lengths(_PROBE_LENGTHS)
    gids = torch.arange(n) // 3
    adv = get_advantage("grpo")(torch.tensor(_PROBE_REWARDS, dtype=torch.float64), gids)
    with torch.no_grad():
        full = instance(mask, adv, gids).to(torch.float64)
        for first in _PROBE_SPLITS:
            for rows in (first, [i for i in range(n) if i not in first]):
                idx = torch.tensor(rows)
                part = instance(mask[idx], adv[idx], gids[idx]).to(torch.float64)
                if not torch.allclose(part, full[idx] * (n / len(rows)), rtol=1e-9, atol=1e-15):
                    return False
    return True


def group_ids_of(index: Any) -> Tensor:
    """[B] int64 group ids from verl's uid index (any hashable ids, e.g. uuid strings)."""
    _, inverse = np.unique(np.asarray(index, dtype=object).astype(str), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long)


def effective_advantages(
    instance: RuleInstance, advantages: Tensor, mask: Tensor, index: Any, *, minibatches: int = 1
) -> Tensor:
    """The estimator's output: ``minibatches x`` the rule's effective advantages on the whole step batch
    (what verl's token-sum turns into the rule's update on each of ``minibatches`` mini-batches).

    advantages: [B, T] verl's GRPO advantages (constant over each response's tokens); mask: [B, T]
    response mask; index: [B] uids. Returns [B, T] in the advantages' dtype (0 outside the mask),
    the rule computed in float64.
    """
    m = mask.to(torch.float64)
    per_seq = (advantages.to(torch.float64) * m).sum(dim=1) / m.sum(dim=1).clamp_min(1.0)
    eff = instance(m, per_seq, group_ids_of(index).to(mask.device))
    return (eff * minibatches).to(advantages.dtype)


# ----------------------------------------------------------------------------- refusals


def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    node = cfg
    for part in dotted.split("."):
        if node is None:
            return default
        node = node.get(part) if hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


def check_config(config: Any, instance: RuleInstance) -> None:
    """Refuse, with one line naming the setting and the fix, a verl config the estimator is not exact under.

    ``config``: verl's whole trainer config (the DictConfig ``main_ppo`` receives).
    """
    _check_loss(config, instance)
    if native_token(instance):
        return  # token-mean normalises each mini-batch by its own global token count: any layout
    n = int(_get(config, "actor_rollout_ref.rollout.n", 1))
    batch = int(_get(config, "data.train_batch_size")) * n
    mini = int(_get(config, f"{ACTOR}.ppo_mini_batch_size")) * n
    if mini >= batch:
        return  # one mini-batch per step: the whole batch is the mini-batch, exact in any order or split
    _check_minibatches(config, instance, n=n, batch=batch, mini=mini)


def _check_loss(config: Any, instance: RuleInstance) -> None:
    """The loss path: FSDP, the clipped PPO loss, the loss_agg_mode the rule needs, no entropy or KL loss."""
    strategy = _get(config, f"{ACTOR}.strategy", "fsdp")
    if strategy not in TESTED_STRATEGIES:
        why = (
            "Megatron scales each micro-batch's loss by its micro-batch count"
            if strategy == "megatron"
            else "its loss scaling is not the FSDP path's"
        )
        raise AdapterConfigError(
            f"{ACTOR}.strategy={strategy}: {why}, and the adapter is tested on the FSDP loss path only; use the "
            f"FSDP backend ({ACTOR}.strategy=fsdp2)"
        )
    if _get(config, "algorithm.rollout_correction.bypass_mode", False):
        raise AdapterConfigError(
            "algorithm.rollout_correction.bypass_mode=true: verl then rewrites "
            f"{ACTOR}.policy_loss.loss_mode to 'bypass_mode' at run time (rollout_corr_helper.apply_bypass_mode), "
            "not the clipped PPO loss the rule is exact under; set algorithm.rollout_correction.bypass_mode=false"
        )
    loss_mode = _get(config, f"{ACTOR}.policy_loss.loss_mode", "vanilla")
    if loss_mode != "vanilla":
        raise AdapterConfigError(
            f"{ACTOR}.policy_loss.loss_mode={loss_mode}: only the clipped PPO loss ('vanilla') scales each token's "
            f"term by its advantage's size; set {ACTOR}.policy_loss.loss_mode=vanilla"
        )
    want = TOKEN_MODE if native_token(instance) else SUM_MODE
    mode = _get(config, f"{ACTOR}.loss_agg_mode")
    if mode != want:
        why = (
            "verl's token-mean is the token rule, exactly"
            if want == TOKEN_MODE
            else "the estimator's advantages are the rule's weights x the mini-batch count, for a plain token sum"
        )
        raise AdapterConfigError(
            f"{ACTOR}.loss_agg_mode={mode} with aggbench rule {instance.name!r}: {why}; "
            f"set {ACTOR}.loss_agg_mode={want}"
        )
    entropy = float(_get(config, f"{ACTOR}.entropy_coeff", 0.0))
    if entropy != 0.0:
        raise AdapterConfigError(
            f"{ACTOR}.entropy_coeff={entropy}: verl's entropy loss uses the same loss_agg_mode, which the rule "
            f"changed; set {ACTOR}.entropy_coeff=0"
        )
    if (
        _get(config, f"{ACTOR}.use_kl_loss", False)
        and float(_get(config, f"{ACTOR}.kl_loss_coef", 0.0)) != 0.0
    ):
        raise AdapterConfigError(
            f"{ACTOR}.use_kl_loss=true (kl_loss_coef={_get(config, f'{ACTOR}.kl_loss_coef')}): verl's KL loss uses "
            f"the same loss_agg_mode, which the rule changed; set {ACTOR}.use_kl_loss=false (or algorithm.use_kl_in_reward=true)"
        )


def _check_minibatches(config: Any, instance: RuleInstance, *, n: int, batch: int, mini: int) -> None:
    """k = batch / mini > 1 mini-batches per step (``n`` responses per prompt; ``batch`` and ``mini``
    in rows): each must be a fixed set of whole groups, and the rule's weights must not depend on
    which groups share one."""
    one_step = f"or set {ACTOR}.ppo_mini_batch_size=data.train_batch_size (one optimiser step per batch)"
    k = batch // mini
    if _get(config, f"{ACTOR}.shuffle", False):
        raise AdapterConfigError(
            f"{ACTOR}.shuffle=true with {k} mini-batches per step: shuffled mini-batches are not sets of whole "
            f"groups; set {ACTOR}.shuffle=false, {one_step}"
        )
    if _get(config, "trainer.use_v1", False):
        raise AdapterConfigError(
            f"trainer.use_v1=true with {k} mini-batches per step: the v1 trainer always reorders rows to balance "
            f"tokens across ranks, splitting groups between mini-batches; set trainer.use_v1=false, {one_step}"
        )
    if _get(config, "trainer.balance_batch", False):
        raise AdapterConfigError(
            f"trainer.balance_batch=true with {k} mini-batches per step: the reordering splits groups between "
            f"mini-batches; set trainer.balance_batch=false, {one_step}"
        )
    if not layout_free(instance):
        raise AdapterConfigError(
            f"aggbench rule {instance.name!r} ({dict(instance.params)}) with {k} mini-batches per step: its weights "
            "on a mini-batch are not its whole-batch weights rescaled (checked by running it on a probe batch; "
            "e.g. a batch token count, or include_zero_groups=false), and the estimator does not see the "
            f"mini-batches; use a group-scope instance with include_zero_groups=true, {one_step}"
        )
    sp = int(_get(config, f"{ACTOR}.fsdp_config.ulysses_sequence_parallel_size", 1) or 1)
    dp = max(
        1, int(_get(config, "trainer.n_gpus_per_node", 1)) * int(_get(config, "trainer.nnodes", 1)) // sp
    )
    if (mini // dp) % n or (batch // dp) % n:
        raise AdapterConfigError(
            f"{ACTOR}.ppo_mini_batch_size x rollout.n = {mini} rows over {dp} data-parallel ranks: each rank's "
            f"slice must hold whole groups of {n}; choose ppo_mini_batch_size so that it is a multiple of {dp}, "
            f"{one_step}"
        )


def minibatch_count(config: Any, rows: int) -> int:
    """k, the mini-batches verl's actor update cuts a step batch of ``rows`` rows into (mini-batches of
    ``ppo_mini_batch_size x rollout.n`` rows); refuses a batch that is not whole mini-batches, whose
    last rows verl's iterator would leave out or update alone. The v1 trainer pads a short step up to
    whole mini-batches with empty rows (no tokens, no reward: no weight), so it passes here."""
    n = int(_get(config, "actor_rollout_ref.rollout.n", 1))
    mini = int(_get(config, f"{ACTOR}.ppo_mini_batch_size")) * n
    if rows % mini:
        raise AdapterConfigError(
            f"aggbench verl estimator: the step batch has {rows} rows, not a multiple of "
            f"{ACTOR}.ppo_mini_batch_size x rollout.n = {mini}; the rule's weights are scaled by the mini-batch "
            f"count, which is then not whole; set data.train_batch_size to a multiple of {ACTOR}.ppo_mini_batch_size "
            "and use rollouts that return every configured prompt"
        )
    return rows // mini


def _root(config: Any) -> Any:
    """verl passes ``config.algorithm`` (an OmegaConf node); its root is the whole trainer config."""
    getter = getattr(config, "_get_root", None)
    if getter is None:
        raise AdapterConfigError(
            f"aggbench verl estimator: got config of type {type(config).__name__}, not the DictConfig node "
            "verl's trainers pass (config.algorithm); call it through verl's compute_advantage with the trainer's config"
        )
    return getter()


# ----------------------------------------------------------------------------- registration


def make_estimator(instance: RuleInstance):
    """verl advantage-estimator function for ``instance`` (``register_adv_est`` signature)."""

    def estimator(
        token_level_rewards: Tensor,
        response_mask: Tensor,
        index: Any = None,
        config: Any = None,
        **_: Any,
    ) -> tuple[Tensor, Tensor]:
        """token_level_rewards, response_mask: [B, T]; index: [B] uids -> (advantages, returns) [B, T]."""
        if _LOAD_ERROR:
            raise AdapterConfigError(
                f"AGGBENCH_PLUGINS={os.environ.get('AGGBENCH_PLUGINS')!r} failed to import: {_LOAD_ERROR[0]!r}; fix "
                "or unset it (verl hides plugin import errors; `python -m aggbench.integrations.verl` shows them)"
            )
        if index is None:
            raise AdapterConfigError(
                "aggbench verl estimator: the batch has no 'uid' (prompt groups); use verl's GRPO data flow "
                "(rollout.n > 1 responses per prompt, uids set by the trainer)"
            )
        root = _root(config)
        check_config(root, instance)
        k = 1
        if not native_token(instance):  # token-mean divides by the real token count: any row count
            k = minibatch_count(root, token_level_rewards.shape[0])
        from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

        grpo, _ = compute_grpo_outcome_advantage(
            token_level_rewards,
            response_mask,
            index,
            norm_adv_by_std_in_grpo=bool(config.get("norm_adv_by_std_in_grpo", True)),
        )
        out = (
            grpo
            if native_token(instance)
            else effective_advantages(instance, grpo, response_mask, index, minibatches=k)
        )
        return out, out

    estimator.__name__ = f"{PREFIX}{instance.name}"
    estimator.__qualname__ = estimator.__name__
    estimator.aggbench_instance = instance  # type: ignore[attr-defined]
    return estimator


def register(instance: RuleInstance | str, name: str | None = None) -> str:
    """Register ``instance`` (or a built-in instance's name) as verl estimator ``name``
    (default ``aggbench_<instance>``); returns the name. Registering the same instance again is a no-op."""
    from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, register_adv_est

    inst = builtin_instances()[instance] if isinstance(instance, str) else instance
    key = name or f"{PREFIX}{inst.name}"
    existing = ADV_ESTIMATOR_REGISTRY.get(key)
    if existing is not None and getattr(existing, "aggbench_instance", None) == inst:
        _REGISTERED[key] = existing
        return key
    if existing is not None and hasattr(existing, "aggbench_instance"):
        del ADV_ESTIMATOR_REGISTRY[key]  # an earlier aggbench registration of this name, other parameters
    fn = make_estimator(inst)
    register_adv_est(key)(fn)  # verl's own error when the name is one of verl's estimators
    _REGISTERED[key] = fn
    return key


def register_all() -> list[str]:
    """Import ``AGGBENCH_PLUGINS``, then register every rule and built-in instance; -> names."""
    import verl

    version = tuple(int(p) for p in str(getattr(verl, "__version__", "0")).split(".")[:2] if p.isdigit())
    if version != TESTED_VERL:
        warnings.warn(
            f"aggbench verl adapter: tested with verl {'.'.join(map(str, TESTED_VERL))}.x, found "
            f"{getattr(verl, '__version__', '?')}; rerun tests/integrations/test_verl.py against it",
            stacklevel=2,
        )
    plugins = env_plugins()
    try:
        load_plugins(plugins)
    except Exception as exc:  # kept: verl would swallow it (module docstring)
        _LOAD_ERROR[:] = [exc]
    from aggbench.integrations import verl_monitor

    # the monitor for unmodified GRPO runs (algorithm.adv_estimator=aggbench_monitor_grpo)
    return [register(inst) for inst in builtin_instances().values()] + [verl_monitor.register()]


def _verl_available() -> bool:
    try:
        import verl.trainer.ppo.core_algos  # noqa: F401
    except ImportError:
        return False
    return True


# Importing this module (verl's plugin entry point does, on `import verl`) registers the estimators;
# run as a script, it leaves that to the imported module (one registration per process).
if __name__ != "__main__" and _verl_available():
    register_all()


def main(argv: list[str] | None = None) -> int:
    """``python -m aggbench.integrations.verl [hydra overrides]``: is the plugin registered, and is this
    verl config one the estimator is exact under? Prints one line per check; exit 1 on a refusal."""
    import subprocess

    argv = sys.argv[1:] if argv is None else argv
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import verl.trainer.ppo.core_algos as c; print(sorted(k for k in c.ADV_ESTIMATOR_REGISTRY "
            f"if str(k).startswith({PREFIX!r})))",
        ],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0 or probe.stdout.strip() in ("", "[]"):
        print(
            f"verl did not register the aggbench estimators (entry point 'verl.plugins'): {probe.stderr.strip()[-500:]}"
        )
        return 1
    print(f"registered in a fresh `import verl`: {probe.stdout.strip()}")
    if _LOAD_ERROR:
        print(f"AGGBENCH_PLUGINS failed to import: {_LOAD_ERROR[0]!r}")
        return 1
    config = compose_config(argv)
    name = str(_get(config, "algorithm.adv_estimator"))
    if not name.startswith(PREFIX):
        print(
            f"algorithm.adv_estimator={name} is not an aggbench estimator; known: {', '.join(sorted(_REGISTERED))}"
        )
        return 1
    from aggbench.integrations import verl_monitor

    if name == verl_monitor.NAME:
        print(f"{name}: verl's own grpo advantages, unchanged; logs the aggbench/* monitor metrics each step")
        return 0
    try:
        check_config(config, _REGISTERED[name].aggbench_instance)
    except (AdapterConfigError, KeyError) as exc:
        print(f"refused: {exc}")
        return 1
    print(f"{name}: exact under this config")
    return 0


def compose_config(overrides: list[str]) -> Any:
    """verl's ``ppo_trainer`` config with hydra ``overrides``, as ``main_ppo`` composes it."""
    from pathlib import Path

    import verl
    from hydra import compose, initialize_config_dir

    config_dir = Path(verl.__file__).parent / "trainer" / "config"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None):
        return compose(config_name="ppo_trainer", overrides=list(overrides))


if __name__ == "__main__":
    from aggbench.integrations import verl as _module

    sys.exit(_module.main())
