"""GRPO-style training of one cell, readable top to bottom.

Design decisions, stated first:

1. One process trains one cell, or one *segment* of it (``until_step``) that ends at a checkpoint,
   so a SLURM walltime bounds a segment, not a 7B run. A run directory is locked while trained.
2. A step is one rollout batch: sample P prompts -> G responses each -> rewards -> group
   advantages -> ``mini_batches`` x ``ppo_epochs`` optimiser updates.
3. The aggregation rule is a weighting of the WHOLE optimiser mini-batch: effective advantages (and
   the KL/entropy token weights) are computed once per mini-batch, before it is cut into
   micro-batches; each micro-batch's loss is a plain token sum, so accumulation is exact.
4. Everything random is a function of (seed, step) and the prompt stream's cursor: the prompts of
   a step (read on from the cursor, without replacement within an epoch: ``batching.PromptStream``)
   and its sampling seed. The cursor is saved in every checkpoint, so resuming reproduces the
   uninterrupted run, on CPU bit for bit.
5. ``metrics.jsonl`` is the source of truth, one line per finished step, cut back to the
   checkpoint's step on resume. MLflow receives a step only after the checkpoint containing it
   committed, through an idempotent sync (``aggbench.tracking``): no step is lost or doubled. The
   run's params are the resolved config, checked against the run's before anything is written; its
   status says how the segment ended (RUNNING, SCHEDULED between segments, FINISHED, KILLED on
   SIGTERM, FAILED on an error: ``tracking``'s docstring).
6. Crash tests inject faults at named points: ``AGGBENCH_FAULT=<point>:<step>`` makes the process
   die with ``os._exit`` (no cleanup, like a kill) at ``mid_step``, ``after_metrics`` or
   ``checkpoint_write``.
7. Under ``torchrun`` every rank runs this same loop on its own share of the step's prompt groups;
   the weights come from the whole batch (all-gathered), gradients are summed over ranks, and rank 0
   alone writes metrics, rollouts, MLflow and the run lock (``aggbench.train.parallel`` says how). One
   process is the special case of one rank.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from aggbench import layout
from aggbench.aggregation import load_plugins, resolve_instance
from aggbench.aggregation.advantages import get_advantage
from aggbench.config import (
    TrainConfig,
    check_resume,
    dump_config,
    mlflow_fields,
    resume_refused,
)
from aggbench.data.training import read_training_records
from aggbench.files import write_atomic
from aggbench.modeldir import loading, require_positions, require_weights
from aggbench.tracking import MetricsLog, MlflowRun, resolve_tracking_uri, run_status, run_tags
from aggbench.train import batching, checkpoint, engine_checks, parallel, prompt_fit, sampling, step_log
from aggbench.train.global_batch import gather_minibatch
from aggbench.train.update import LossSettings, accumulate_gradients, fixed_logprobs, minibatch_weights

log = logging.getLogger("aggbench.train.loop")


def fault(point: str, step: int | None = None) -> None:
    """Crash-test hook: die without cleanup when AGGBENCH_FAULT names this point (and step)."""
    spec = os.environ.get("AGGBENCH_FAULT", "")
    if not spec:
        return
    name, _, at = spec.partition(":")
    if name == point and (not at or step is None or int(at) == step):
        sys.stderr.write(f"AGGBENCH_FAULT: dying at {point} (step {step})\n")
        sys.stderr.flush()
        os._exit(17)


def _device_and_dtype(cfg: TrainConfig, ranks: parallel.Ranks) -> tuple[torch.device, torch.dtype, Any]:
    dev = cfg.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = ranks.device or torch.device(dev)
    if cfg.precision == "fp64":
        return device, torch.float64, contextlib.nullcontext
    if cfg.precision == "bf16" and not ranks.fsdp:  # (FSDP: its MixedPrecisionPolicy casts instead)
        # fp32 master weights and optimizer state; bf16 autocast for forward passes and generation
        return device, torch.float32, lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return device, torch.float32, contextlib.nullcontext


@dataclass
class Prepared:
    """What is checked before the run directory, its lock or a model exist (bad input fails first):
    the plugin files (hashed into the run's tags), the rule instance, the advantage estimator, and
    the training records (None when nothing is left to train: they are read later if needed), and
    whether a changed config may continue the run (``--allow-config-change``)."""

    plugin_files: list[Path]
    rule: Any
    estimator: Any
    records: list[dict] | None
    allow_change: bool = False


@dataclass
class Policy:
    """The trained model and what updates it; ``ref_model`` only with a KL term."""

    model: torch.nn.Module
    ref_model: torch.nn.Module | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    autocast: Any


@dataclass
class StepBatch:
    """This rank's rows of one rollout batch: packed batch, loss mask [b, T], advantages [b],
    group ids [b] (global positions in the step's prompt list)."""

    batch: Any
    mask: torch.Tensor
    adv: torch.Tensor
    gids: torch.Tensor


def train(
    cfg: TrainConfig,
    out_dir: str | Path,
    *,
    until_step: int | None = None,
    quiet: bool = False,
    allow_config_change: bool = False,
) -> dict:
    """Train ``cfg``'s cell into ``out_dir`` up to ``until_step`` (default: the end). Returns a summary.

    Under torchrun every rank calls this (design decision 7). A run directory is one experiment:
    resuming it with a config that changes training is refused (``config.check_resume``).
    """
    out, a = Path(out_dir), cfg.algorithm
    # bad input fails here, on every rank, before the run directory, its lock or a model exist
    plugin_files, rule, estimator = _resolve(cfg)
    start = checkpoint.latest_resumable(out) or 0
    if start:
        check_resume(out, cfg, allow_change=allow_config_change)
        checkpoint.check_rule_version(out, rule)
    last = min(until_step or a.total_steps, a.total_steps)
    records = _check_inputs(cfg, start) if start < last else None
    prep = Prepared(plugin_files, rule, estimator, records, allow_config_change)
    ranks = parallel.setup(cfg)
    try:
        with parallel.run_lock(out, ranks):  # creates the run directory
            return _train_locked(cfg, out, last, quiet or not ranks.main, ranks, prep)
    finally:
        parallel.teardown(ranks)


def _resolve(cfg: TrainConfig) -> tuple[list[Path], Any, Any]:
    """(plugin files, aggregation rule instance, advantage estimator): registry errors come first."""
    loaded = load_plugins(cfg.plugins, search_paths=[Path.cwd()])
    # the plugin's source is hashed into the run's tags, so a changed rule is visible in MLflow
    plugin_files = [Path(f) for m in loaded if (f := getattr(sys.modules.get(m), "__file__", None))]
    rule = resolve_instance(cfg.aggregation, max_new_tokens=cfg.sampling.max_new_tokens)
    return plugin_files, rule, get_advantage(cfg.advantage.estimator)


def _check_inputs(cfg: TrainConfig, start: int) -> list[dict]:
    """The training records, and model.path where a model loads from it (the policy of a fresh run,
    the KL reference): DataError / ModelDirError naming the file and the fix."""
    records = read_training_records(cfg.dataset.path, name=cfg.dataset.name)
    if not start or cfg.algorithm.kl_coef > 0:
        fix = f"run `aggbench prepare-model NAME --out {cfg.model.path}` (NAME: tiny, hub id or directory)"
        require_weights(cfg.model.path, what="model.path", fix=fix)
        need = cfg.sampling.max_prompt_tokens + cfg.sampling.max_new_tokens
        lengths = "sampling.max_prompt_tokens + max_new_tokens"
        require_positions(cfg.model.path, need, what="model.path", lengths=lengths)
    return records


def open_tracker(cfg: TrainConfig, out: Path, *, allow_change: bool = False) -> MlflowRun:
    """The cell's MLflow run with its params: the resolved config (``flat_config``) but the fields a
    resume may change, which are tags (they change with it; MLflow params cannot).

    A run that already holds other values (found by its cell id: a resume, or a new --out under the
    same cell id and experiment) is refused with the config-change error, before anything is written;
    with ``allow_change`` the run keeps its first values and the tag ``aggbench.config_changes`` says
    what changed, at which checkpoint.
    """
    uri = resolve_tracking_uri(cfg.tracking.tracking_uri, out)
    tracker = MlflowRun(uri, cfg.tracking.experiment, cfg.resolved_cell_id, out)
    params, tags = mlflow_fields(cfg)
    diff = tracker.param_conflicts(params)
    if diff and not allow_change:
        where = f"MLflow run {tracker.run_id} ({cfg.resolved_cell_id}, experiment {cfg.tracking.experiment})"
        fix = (
            "restore those values; or give this cell another cell_id or tracking.experiment, or delete "
            "that MLflow run (`aggbench ingest` fills a new one from the run files); or pass "
            "--allow-config-change to continue the run on purpose (its params keep the first values)."
        )
        raise resume_refused(where, diff, fix)
    tracker.log_params(params)  # those the run lacks: a changed value is never sent
    if diff:
        start = checkpoint.latest_resumable(out) or 0
        log.warning("%s: MLflow params kept; changed: %s", cfg.resolved_cell_id, "; ".join(diff))
        tags["aggbench.config_changes"] = f"at step {start}: " + "; ".join(diff)
    tracker.set_tags(tags)
    return tracker


def _train_locked(
    cfg: TrainConfig, out: Path, last: int, quiet: bool, ranks: parallel.Ranks, prep: Prepared
) -> dict:
    """One segment under the run lock; on rank 0 the MLflow run's status follows it (``run_status``)."""
    tracker = None
    if cfg.tracking.enabled and ranks.main:  # before config.resolved.yaml is rewritten
        tracker = open_tracker(cfg, out, allow_change=prep.allow_change)
    reached = max(checkpoint.latest_resumable(out) or 0, last)
    with run_status(tracker, "FINISHED" if reached >= cfg.algorithm.total_steps else "SCHEDULED"):
        return _train_segment(cfg, out, last, quiet, ranks, prep, tracker)


def _train_segment(
    cfg: TrainConfig,
    out: Path,
    last: int,
    quiet: bool,
    ranks: parallel.Ranks,
    prep: Prepared,
    tracker: MlflowRun | None,
) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aggbench.prompts import stop_token_ids
    from aggbench.rollout import make_engine
    from aggbench.train.rewards import RewardFn

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    a, s = cfg.algorithm, cfg.sampling
    rule, estimator = prep.rule, prep.estimator
    adv_kwargs = (
        {"std": cfg.advantage.std, "eps": cfg.advantage.eps} if cfg.advantage.estimator == "grpo" else {}
    )
    device, dtype, autocast = _device_and_dtype(cfg, ranks)
    main = ranks.main
    if main:
        dump_config(cfg, layout.resolved_config_file(out))
        if not layout.rule_file(out).exists():  # what the run was started with, kept on resumes
            write_atomic(layout.rule_file(out), json.dumps(rule.describe(), indent=2) + "\n")
        checkpoint.clean_partial(out)
    ranks.barrier()

    # ---- resume point: the latest complete checkpoint with trainer state
    start = checkpoint.latest_resumable(out) or 0
    if start >= last:
        log.info("%s: already at step %d (asked for %d); nothing to do", cfg.resolved_cell_id, start, last)
        return {"cell_id": cfg.resolved_cell_id, "start_step": start, "end_step": start}
    records = prep.records if prep.records is not None else _check_inputs(cfg, start)  # (another job ran)
    with checkpoint.opening(out, start, cfg.model.path) as model_dir:  # step_N, or model.path
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # over-long prompts leave before any is drawn, and before the weights load (prompt_fit)
    report = layout.prompt_filter_file(out) if main else None
    records = prompt_fit.fit_training_records(cfg, tokenizer, records, report)
    with checkpoint.opening(out, start, cfg.model.path) as model_dir:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = parallel.prepare_model(model, ranks, cfg, device)  # this device; FSDP: sharded
    model.train()
    ref_model = None
    if a.kl_coef > 0:
        with loading(cfg.model.path, what="model.path"):
            ref = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype).requires_grad_(False)
        ref_model = parallel.prepare_model(ref, ranks, cfg, device, trainable=False).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=a.betas, weight_decay=a.weight_decay)
    # Warmup counts ROLLOUT steps, as verl's actor scheduler (stepped once per rollout step); with
    # verl's factor current_step / warmup, rollout step s (1-based) trains at lr * (s-1) / warmup:
    # the first step at lr 0 (verl's off-by-one, kept so the recipe's warmup means the same here)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min(1.0, k / a.warmup_steps) if a.warmup_steps else 1.0
    )
    policy = Policy(model, ref_model, optimizer, scheduler, autocast)
    state = parallel.load(out, start, model, optimizer, ranks) if start else None
    if state is not None:  # optimizer (FSDP: and model shards), scheduler, RNG
        scheduler.load_state_dict(state["scheduler"])
    cursor = checkpoint.prompt_cursor(state, start, a.prompts_per_step)
    stream = batching.PromptStream(len(records), cfg.seed, cursor)  # where the prompts are read on
    metrics_log = MetricsLog(out / "metrics.jsonl")
    if main:
        metrics_log.truncate_after(start)
    if tracker is not None:
        tracker.set_tags(run_tags(cfg, prep.rule, prep.plugin_files))
        tracker.sync(metrics_log.read(), upto=start)  # fills in steps a crash kept from MLflow

    reward_fn = RewardFn(cfg.dataset.grader)
    engine = make_engine(
        cfg.rollout.engine,
        model,
        tokenizer,
        batch_size=cfg.rollout.batch_size,
        model_path=str(model_dir),
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        tensor_parallel_size=cfg.rollout.tensor_parallel_size,
        max_model_len=cfg.sampling.max_prompt_tokens + cfg.sampling.max_new_tokens,
        seed=cfg.seed,
        dtype=cfg.rollout.dtype,
        enable_sleep_mode=cfg.rollout.enable_sleep_mode,
        in_process=True,  # the weight push needs tensors to reach the worker (rollout/vllm.py)
        stop_token_ids=stop_token_ids(tokenizer, cfg.model.stop_tokens),
    )
    prompt_kw = prompt_fit.prompt_options(cfg)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    probe = None  # (prompt, response) the engine and the policy score after every push
    bar = step_log.progress(
        range(start + 1, last + 1), quiet, cfg.resolved_cell_id, initial=start, total=a.total_steps
    )
    try:
        for step in bar:
            t0 = time.perf_counter()
            # ---- 1. rollouts: G samples per prompt (dynamic sampling refills zero-variance groups);
            # this rank's share of the prompts, group ids = positions in the step's prompt list
            slots = parallel.my_groups(a.prompts_per_step, ranks)
            # vLLM samples from its own copy of the weights: no need to gather the FSDP shards
            with autocast(), parallel.full_params(model if cfg.rollout.engine == "hf" else None, ranks):
                roll, recs, rewards, sampled = sampling.rollouts_with_rewards(
                    cfg, engine, tokenizer, records, stream, slots, step, reward_fn, prompt_kw, ranks.rank
                )
            # every round read one block of the stream: the rank that ran the most decides
            stream.advance(parallel.max_over_ranks(sampled.rounds, ranks), a.prompts_per_step)
            t_gen = time.perf_counter() - t0
            # ---- 2. rewards -> group advantages (overlong shaping first)
            lengths = [len(r) for r in roll.response_ids]
            shaped = [
                r + p
                for r, p in zip(
                    rewards,
                    batching.soft_overlong_penalty(
                        lengths, s.max_new_tokens, a.overlong.buffer, a.overlong.penalty
                    ),
                    strict=True,
                )
            ]
            gids = torch.tensor(roll.group, dtype=torch.long)
            adv = estimator(torch.tensor(shaped, dtype=torch.float64), gids, **adv_kwargs)
            batch = batching.pack(roll, pad_id)
            mask = batch.response_mask.clone()
            if a.overlong.filter:  # truncated responses leave the loss entirely (DAPO overlong filter)
                truncated = torch.tensor([not f for f in roll.finished])
                mask[truncated] = False
                adv = torch.where(truncated, torch.zeros_like(adv), adv)
            # ---- 3. updates: weights of each mini-batch computed once, before micro-batching
            t1 = time.perf_counter()
            upd = _update(cfg, ranks, policy, StepBatch(batch, mask, adv, gids), rule, step)
            # vLLM: push the updated policy (and check it arrived); HF shares the weights
            probe = probe or engine_checks.push_probe(cfg.rollout, roll)
            checks = engine_checks.gap_of(roll, upd.behaviour, lengths)
            own = functools.partial(_own, policy, probe, ranks)
            before, after = engine_checks.push_and_check(engine, model, probe, own)
            if checks is not None:
                checks.push_before, checks.push_after = before, after
            t_upd = time.perf_counter() - t1
            # ---- 4. metrics (source of truth first; whole batch, on rank 0), rollouts, checkpoint, MLflow
            sample = step_log.rollout_rows(step, roll, recs, rewards, adv, cfg.rollout.save_rollouts)
            parts = parallel.gather_to_main(
                step_log.RankPart(rewards, roll.finished, upd.unit_loss, sample, sampled, checks), ranks
            )
            if main:
                row = step_log.step_metrics(step, parts, rule, upd, t_gen, t_upd, scheduler)
                metrics_log.append(row)
                rows = [r for p in parts for r in p.rollouts]
                step_log.save_rollouts(out, step, rows, cfg.rollout.save_rollouts)
            scheduler.step()  # once per rollout step (above), after the row logged the lr it used
            if step % cfg.checkpoint.every == 0 or step == last:
                fault("after_metrics", step)
                state = {"step": step, "scheduler": scheduler.state_dict(), "prompt_cursor": stream.cursor}
                at_step = functools.partial(fault, step=step)
                parallel.save(out, step, model, tokenizer, optimizer, state, ranks, fault=at_step)
                if main:
                    checkpoint.apply_retention(
                        out, step, cfg.checkpoint.keep_weights, cfg.checkpoint.eval_steps
                    )
                if tracker is not None:
                    tracker.sync(metrics_log.read(), upto=step)
            if main:
                step_log.report(bar, quiet, cfg.resolved_cell_id, row, a.total_steps)
    finally:
        reward_fn.close()
        if hasattr(engine, "close"):  # vLLM: before the process group goes (VLLMEngine.close)
            engine.close()
    return {"cell_id": cfg.resolved_cell_id, "start_step": start, "end_step": last}


def _own(policy: Policy, probe: tuple[list[int], list[int]], ranks: parallel.Ranks) -> list[float]:
    """The updated policy's log-probs of the probe (FSDP: every rank runs it, parameters gathered)."""
    with parallel.full_params(policy.model, ranks):
        return engine_checks.policy_logprobs(policy.model, *probe, autocast=policy.autocast)


def _update(
    cfg: TrainConfig, ranks: parallel.Ranks, policy: Policy, sb: StepBatch, rule: Any, step: int
) -> step_log.UpdateTotals:
    """ppo_epochs x mini_batches optimiser updates on one rollout batch (design decision 3).

    ``sb`` holds this rank's rows (all of them on one process); the weights of every mini-batch
    come from the whole batch's (lengths, advantages, group ids), all-gathered into ``view``.
    """
    a = cfg.algorithm
    model, ref_model, optimizer, autocast = policy.model, policy.ref_model, policy.optimizer, policy.autocast
    batch, mask, adv, gids = sb.batch, sb.mask, sb.adv, sb.gids
    settings = _loss_settings(cfg)
    with parallel.full_params(model, ranks):
        old = fixed_logprobs(model, batch, settings, autocast) if a.ppo_epochs * a.mini_batches > 1 else None
    with parallel.full_params(ref_model, ranks):
        ref = fixed_logprobs(ref_model, batch, settings, autocast) if ref_model is not None else None
    view = gather_minibatch(mask.sum(1), adv, gids)  # rows of every rank, rank order
    view.mask = _widen(view.mask, parallel.max_over_ranks(mask.shape[1], ranks))  # the batch's width
    row_map = view.row_map()  # position in the view -> this rank's row (-1: another rank's)
    unit_loss = torch.zeros(mask.shape, dtype=torch.float64)
    # the behaviour log-probs: `old` when computed, else those of the one (on-policy) pass
    seen = torch.zeros(mask.shape, dtype=torch.float64) if old is None else None
    sums = {"pg_loss": 0.0, "kl": 0.0, "entropy": 0.0, "clipped": 0.0, "tokens": 0.0}
    norms = []
    # the same every epoch; under dynamic sampling fewer groups than mini-batches can be left, and
    # an empty mini-batch is no update (a rule needs rows; every rank skips it: the split is global)
    minibatches = [mb for mb in batching.split_groups(view.group_ids, a.mini_batches) if len(mb)]
    for epoch in range(a.ppo_epochs):
        for mb in minibatches:
            eff, aux_w = minibatch_weights(
                rule, view.mask[mb], view.advantages[mb], view.group_ids[mb], a.aux_reduction
            )  # once, on the whole mini-batch
            local = view.local_in(mb)  # this rank's part of it
            owed = parallel.missing_passes(len(local), settings.micro_batch_size, ranks)
            stats = accumulate_gradients(
                model,
                batch,
                mask,
                adv,
                row_map[mb],
                local,
                _widen(eff, mask.shape[1]),
                _widen(aux_w, mask.shape[1]),
                settings,
                old=old,
                ref=ref,
                autocast=autocast,
                unit_loss_out=unit_loss if epoch == 0 else None,
                logp_out=seen if epoch == 0 else None,
                after_backward=lambda: fault("mid_step", step),
            )
            parallel.finish_backward(model, batch, owed, settings, autocast, ranks)  # SUM over ranks
            norms.append(parallel.clip_grad_norm(model, a.max_grad_norm))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            for k, v in stats.items():
                sums[k] += v
    sums = parallel.sum_over_ranks(sums, ranks)
    return step_log.UpdateTotals(
        **sums,
        grad_norm=sum(norms),
        updates=len(norms),
        unit_loss=unit_loss,
        view=view,
        behaviour=old.float() if old is not None else seen.float(),
        minibatches=minibatches,
    )


def _widen(x: torch.Tensor, width: int) -> torch.Tensor:
    """[B, T] -> [B, max(T, width)], zero-padded on the right (weights of padding are zero)."""
    return torch.nn.functional.pad(x, (0, width - x.shape[1])) if x.shape[1] < width else x


def _loss_settings(cfg: TrainConfig) -> LossSettings:
    a = cfg.algorithm
    return LossSettings(
        clip_low=a.clip_low,
        clip_high=a.clip_high,
        dual_clip=a.dual_clip,
        kl_coef=a.kl_coef,
        entropy_coef=a.entropy_coef,
        aux_reduction=a.aux_reduction,
        temperature=cfg.sampling.temperature,
        micro_batch_size=a.micro_batch_size,
    )
