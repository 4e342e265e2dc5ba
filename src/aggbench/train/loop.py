"""GRPO-style training of one cell, readable top to bottom.

Design decisions, stated first:

1. One process trains one cell, or one *segment* of it (``until_step``) that ends at a checkpoint,
   so a SLURM walltime bounds a segment, not a 7B run. A run directory is locked while trained.
   Where the job's end is known (SLURM's, or ``--stop-by``), a segment that would not finish before
   it stops early at a checkpoint of the step it reached (``aggbench.train.walltime``).
2. A step is one rollout batch: sample P prompts -> G responses each -> rewards -> group
   advantages -> ``mini_batches`` x ``ppo_epochs`` optimiser updates, as named stages with typed
   values between them (``aggbench.train.step``); this module sets a segment up around them.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from aggbench import environment, layout
from aggbench.aggregation import load_plugins, resolve_instance
from aggbench.aggregation.advantages import get_advantage
from aggbench.config import TrainConfig, dump_config
from aggbench.data.training import read_training_records
from aggbench.files import disk_full, write_atomic, written_file
from aggbench.modeldir import loading, require_positions, require_weights
from aggbench.provenance import record_tags, run_tags
from aggbench.run_config import check_resume, check_resume_data, mlflow_fields, record_data, resume_refused
from aggbench.tracking import MetricsLog, MlflowRun, resolve_tracking_uri
from aggbench.train import batching, checkpoint, parallel, prompt_fit, step_log, walltime
from aggbench.train.parallel import Ranks
from aggbench.train.run_status import Terminated, run_status
from aggbench.train.sampling import Sampler
from aggbench.train.scoring import Scoring
from aggbench.train.step import Segment, run_step
from aggbench.train.update import Policy, UpdateSettings

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


def _device_and_dtype(cfg: TrainConfig, ranks: Ranks) -> tuple[torch.device, torch.dtype, Any]:
    dev = cfg.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = ranks.device or torch.device(dev)
    if cfg.precision == "fp64":
        return device, torch.float64, contextlib.nullcontext
    if cfg.precision == "bf16" and not ranks.casts_bf16:  # (FSDP: its MixedPrecisionPolicy casts instead)
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
    stop_by: float | None = None  # the job's end as a Unix time (--stop-by; else SLURM's: walltime)
    source: dict[str, str] = field(default_factory=dict)  # a plugin rule's file (checkpoint.rule_source)


def train(
    cfg: TrainConfig,
    out_dir: str | Path,
    *,
    until_step: int | None = None,
    quiet: bool = False,
    allow_config_change: bool = False,
    stop_by: float | None = None,
) -> dict:
    """Train ``cfg``'s cell into ``out_dir`` up to ``until_step`` (default: the end). Returns a summary.

    Under torchrun every rank calls this (design decision 7). A run directory is one experiment:
    resuming it with a config that changes training is refused (``run_config.check_resume``).
    ``stop_by``: the job's end as a Unix time (default: SLURM's, inside a SLURM job): the segment
    stops at a checkpoint before it (``aggbench.train.walltime``).
    """
    out, a = Path(out_dir), cfg.algorithm
    # bad input fails here, on every rank, before the run directory, its lock or a model exist
    plugin_files, rule, estimator = _resolve(cfg)
    if stop_by is not None:  # a bad --stop-by fails here, on every rank, before any collective
        walltime.job_end(stop_by)
    # a plugin rule's file, hashed once: what the resume check judges is what aggregation.json pins
    source = checkpoint.rule_source(rule)
    start = layout.latest_resumable(out) or 0
    if start:
        check_resume(out, cfg, allow_change=allow_config_change)
        checkpoint.check_rule_version(out, rule, source=source, allow_change=allow_config_change)
    last = min(until_step or a.total_steps, a.total_steps)
    records = _check_inputs(cfg, start) if start < last else None
    if start and records is not None:
        check_resume_data(out, cfg.dataset.path, records, allow_change=allow_config_change)
    prep = Prepared(plugin_files, rule, estimator, records, allow_config_change, stop_by, source)
    ranks = parallel.setup(cfg)
    try:
        with ranks.run_lock(out):  # creates the run directory
            summary = _train_locked(cfg, out, last, quiet or not ranks.main, ranks, prep)
            if until_step is not None and ranks.main:
                _record_segment(out, until_step)
            return summary
    except walltime.WalltimeStop:
        # every rank waits for rank 0's retention, MLflow sync and status: under torchrun the first
        # worker to exit ends the others, so one leaving early would cut rank 0's work short
        ranks.barrier()
        raise
    finally:
        ranks.teardown()


def _record_segment(out: Path, step: int) -> None:
    """``segments/step_N.done``, the workflow's marker of the segment that ends at N, holds which
    checkpoint it left: its COMPLETE record (the step and every file's sha256). Snakemake skips an
    input that is newer but has the checksum it recorded, so an empty marker made the evaluation of
    a retrained checkpoint look up to date; with this content it reruns exactly when the checkpoint
    changed. (The rule declares the marker with touch(), which keeps what is written here.)"""
    complete = layout.checkpoint_dir(out, step) / layout.COMPLETE
    text = (
        complete.read_text() if complete.is_file() else json.dumps({"step": step, "checkpoint": None}) + "\n"
    )
    write_atomic(layout.segment_marker(out, step), text)


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
        start = layout.latest_resumable(out) or 0
        log.warning("%s: MLflow params kept; changed: %s", cfg.resolved_cell_id, "; ".join(diff))
        tags["aggbench.config_changes"] = f"at step {start}: " + "; ".join(diff)
        record_tags(
            out, {"aggbench.config_changes": tags["aggbench.config_changes"]}
        )  # kept in the files too
    tracker.set_tags(tags)
    return tracker


def _train_locked(cfg: TrainConfig, out: Path, last: int, quiet: bool, ranks: Ranks, prep: Prepared) -> dict:
    """One segment under the run lock; on rank 0 the MLflow run's status follows it (``run_status``)."""
    tracker = None
    if cfg.tracking.enabled and ranks.main:  # before config.resolved.yaml is rewritten
        tracker = open_tracker(cfg, out, allow_change=prep.allow_change)
    reached = max(layout.latest_resumable(out) or 0, last)
    try:
        with run_status(tracker, "FINISHED" if reached >= cfg.algorithm.total_steps else "SCHEDULED"):
            return _train_segment(cfg, out, last, quiet, ranks, prep, tracker)
    except Exception as exc:
        if ranks.main and disk_full(exc):  # judged by the chain, or by the writer that failed
            raise _disk_full(cfg, out, exc) from exc
        raise
    except walltime.WalltimeStop as exc:
        if ranks.main:
            log.error("%s", exc)
        raise
    except (Terminated, KeyboardInterrupt) as exc:
        if ranks.main:
            resume = layout.latest_resumable(out) or 0
            log.error(
                "%s: terminated by %s (a walltime limit, scancel or Snakemake stop it so)%s; rerun the same "
                "command to resume from step %d (%s)",
                cfg.resolved_cell_id,
                "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C",
                "; MLflow run marked KILLED" if tracker is not None else "",
                resume,
                layout.checkpoint_dir(out, resume) if resume else "the start model",
            )
        raise


def _disk_full(cfg: TrainConfig, out: Path, exc: BaseException) -> checkpoint.DiskFullError:
    """The one-line error of a segment that ran out of disk: the partial checkpoint removed, the
    failure written to the run files where space allows (the next ingest marks the MLflow run
    FAILED from it when the store could not be written now), and where a rerun resumes."""
    checkpoint.clean_partial(out)
    resume = layout.latest_resumable(out) or 0
    file = written_file(exc) or str(out)
    line = (
        f"no space left on device while writing {file}; free space and rerun: training resumes from step "
        f"{resume}"
    )
    with contextlib.suppress(OSError):
        write_atomic(
            layout.failure_file(out),
            json.dumps({"error": "no space left on device", "file": file, "resumes_from": resume}) + "\n",
        )
    log.error("%s: %s", cfg.resolved_cell_id, line)
    return checkpoint.DiskFullError(line)


def _train_segment(
    cfg: TrainConfig,
    out: Path,
    last: int,
    quiet: bool,
    ranks: Ranks,
    prep: Prepared,
    tracker: MlflowRun | None,
) -> dict:
    """Set up the segment (run files, model, optimizer, engine, the prompt stream at its cursor),
    run its steps (``aggbench.train.step``), checkpoint, and tear down."""
    from aggbench.train.rewards import RewardFn, make_reward

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    a, main = cfg.algorithm, ranks.main
    if main:
        layout.failure_file(out).unlink(missing_ok=True)  # a new attempt
        dump_config(cfg, layout.resolved_config_file(out))
        environment.write(layout.environment_file(out))  # rewritten per segment, like the config
        # what the run was started with, kept on resumes (a plugin's file pin follows an allowed edit)
        checkpoint.record_rule(out, prep.rule, prep.source, layout.latest_resumable(out) or 0)
        checkpoint.clean_partial(out)
    ranks.barrier()
    # ---- resume point: the latest complete checkpoint with trainer state
    start = layout.latest_resumable(out) or 0
    if start >= last:
        log.info("%s: already at step %d (asked for %d); nothing to do", cfg.resolved_cell_id, start, last)
        return {"cell_id": cfg.resolved_cell_id, "start_step": start, "end_step": start}
    records = prep.records if prep.records is not None else _check_inputs(cfg, start)  # (another job ran)
    if main:
        record_data(out, cfg.dataset.path, records, start, allow_change=prep.allow_change)
    tokenizer, records = _fit_prompts(cfg, out, start, records, ranks)
    policy, model_dir, state = _open_policy(cfg, out, start, ranks)
    cursor = checkpoint.prompt_cursor(state, start, a.prompts_per_step)
    metrics_log = MetricsLog(out / "metrics.jsonl")
    if main:
        metrics_log.truncate_after(start)
        # the run files keep every tag MLflow gets: a store rebuilt from them has them all
        tags = record_tags(out, run_tags(cfg, prep.rule, prep.plugin_files))
    if tracker is not None:
        tracker.set_tags(tags)
        tracker.sync(metrics_log.read(), upto=start)  # fills in steps a crash kept from MLflow
    reward_fn = make_reward(cfg.dataset)
    compare_fn = RewardFn(cfg.dataset.compare_grader) if cfg.dataset.compare_grader else None
    engine = _open_engine(cfg, policy.model, tokenizer, model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    seg = Segment(
        cfg=cfg,
        ranks=ranks,
        policy=policy,
        sampler=Sampler(
            cfg, engine, tokenizer, records, reward_fn, prompt_fit.prompt_options(cfg), ranks.rank, compare_fn
        ),
        scoring=Scoring.from_config(cfg, prep.estimator, pad_id),
        updating=UpdateSettings.from_config(cfg),
        rule=prep.rule,
        stream=batching.PromptStream(len(records), cfg.seed, cursor),  # where the prompts are read on
    )
    bar = step_log.progress(
        range(start + 1, last + 1), quiet, cfg.resolved_cell_id, initial=start, total=a.total_steps
    )
    try:
        deadline = _deadline(cfg, out, start, prep, ranks, metrics_log)
        _run_steps(seg, out, bar, last, tokenizer, metrics_log, tracker, deadline, quiet)
    finally:
        reward_fn.close()
        if compare_fn is not None:
            compare_fn.close()
        if hasattr(engine, "close"):  # vLLM: before the process group goes (VLLMEngine.close)
            engine.close()
    return {"cell_id": cfg.resolved_cell_id, "start_step": start, "end_step": last}


def _deadline(
    cfg: TrainConfig, out: Path, start: int, prep: Prepared, ranks: Ranks, metrics_log: MetricsLog
) -> walltime.Deadline:
    """The job's end (SLURM's walltime, or --stop-by) and the run's past timings, read by rank 0, so
    every rank stops alike (``aggbench.train.walltime``)."""
    timings: tuple[float, float | None] = (0.0, None)
    if ranks.main and start:
        timings = walltime.past_timings(
            metrics_log.read(), layout.checkpoint_dir(out, start) / layout.COMPLETE
        )
    return walltime.for_segment(
        cfg.resolved_cell_id, prep.stop_by, main=ranks.main, broadcast=ranks.broadcast, timings=timings
    )


def _run_steps(
    seg: Segment,
    out: Path,
    bar: Any,
    last: int,
    tokenizer: Any,
    metrics_log: MetricsLog,
    tracker: MlflowRun | None,
    deadline: walltime.Deadline,
    quiet: bool,
) -> None:
    """The segment's steps (``bar`` iterates them): each logged (rank 0, the metrics row first),
    checkpointed every ``checkpoint.every`` steps and at ``last``. A step after which one more step
    and a checkpoint would pass the job's end is checkpointed too, and the segment stops there
    (:class:`walltime.WalltimeStop`; a rerun resumes from it)."""
    cfg, main = seg.cfg, seg.ranks.main
    for step in bar:
        t0 = time.monotonic()
        result = run_step(seg, step, after_backward=functools.partial(fault, "mid_step", step))
        step_s = time.monotonic() - t0
        if main:  # the source of truth first
            metrics_log.append(result.row)
            step_log.save_rollouts(out, step, result.rollouts, cfg.rollout.save_rollouts)
        seg.policy.scheduler.step()  # once per rollout step, after the row logged the lr it used
        saved = step % cfg.checkpoint.every == 0 or step == last
        if saved:
            t1 = time.monotonic()
            _checkpoint(seg, out, step, tokenizer, metrics_log, tracker)
            deadline.saved(time.monotonic() - t1)
        if main:
            step_log.report(bar, quiet, cfg.resolved_cell_id, result.row, cfg.algorithm.total_steps)
        if deadline.end is not None and step < last and seg.ranks.broadcast(deadline.stop_after(step_s)):
            if not saved:
                _checkpoint(seg, out, step, tokenizer, metrics_log, tracker)
            where = str(layout.checkpoint_dir(out, step))
            raise walltime.stopped(cfg.resolved_cell_id, step, deadline.end, where)  # train() syncs ranks


def _fit_prompts(
    cfg: TrainConfig, out: Path, start: int, records: list[dict], ranks: Ranks
) -> tuple[Any, list]:
    """The tokenizer, and the records whose prompts fit ``sampling.max_prompt_tokens``: over-long
    prompts leave before any is drawn, and before the weights load (``prompt_fit``). A resume's
    step_N is checked first, its files' checksums shared out between the ranks."""
    from transformers import AutoTokenizer

    if start:
        checkpoint.verify_checksums(out, start, ranks)
    with checkpoint.opening(out, start, cfg.model.path) as model_dir:  # step_N, or model.path
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    report = layout.prompt_filter_file(out) if ranks.main else None
    return tokenizer, prompt_fit.fit_training_records(cfg, tokenizer, records, report)


def _open_policy(cfg: TrainConfig, out: Path, start: int, ranks: Ranks) -> tuple[Policy, Path, dict | None]:
    """The policy at ``start`` (step_N, or model.path), on this rank (FSDP: sharded), the KL
    reference, the optimizer and the LR schedule, and the trainer state restored from step_N
    (optimizer, scheduler, RNG; None on a fresh run). Returns (policy, model directory, state)."""
    from transformers import AutoModelForCausalLM

    a = cfg.algorithm
    device, dtype, autocast = _device_and_dtype(cfg, ranks)
    with checkpoint.opening(out, start, cfg.model.path) as model_dir:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype)
    model = ranks.prepare_model(model, cfg, device)  # this device; FSDP: sharded
    model.train()
    ref_model = None
    if a.kl_coef > 0:
        with loading(cfg.model.path, what="model.path"):
            ref = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype).requires_grad_(False)
        ref_model = ranks.prepare_model(ref, cfg, device, trainable=False).eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=a.betas, weight_decay=a.weight_decay)
    # Warmup counts ROLLOUT steps, as verl's actor scheduler (stepped once per rollout step); with
    # verl's factor current_step / warmup, rollout step s (1-based) trains at lr * (s-1) / warmup:
    # the first step at lr 0 (verl's off-by-one, kept so the recipe's warmup means the same here)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: min(1.0, k / a.warmup_steps) if a.warmup_steps else 1.0
    )
    state = ranks.load(out, start, model, optimizer) if start else None
    if state is not None:  # optimizer (FSDP: and model shards), scheduler, RNG
        scheduler.load_state_dict(state["scheduler"])
    return Policy(model, ref_model, optimizer, scheduler, autocast), model_dir, state


def _open_engine(cfg: TrainConfig, model: torch.nn.Module, tokenizer: Any, model_dir: Path) -> Any:
    """The rollout engine (``rollout.engine``: hf shares the policy's weights; vLLM holds its own)."""
    from aggbench.prompts import stop_token_ids
    from aggbench.rollout import make_engine

    r = cfg.rollout
    return make_engine(
        r.engine,
        model,
        tokenizer,
        batch_size=r.batch_size,
        model_path=str(model_dir),
        gpu_memory_utilization=r.gpu_memory_utilization,
        tensor_parallel_size=r.tensor_parallel_size,
        max_model_len=cfg.sampling.max_prompt_tokens + cfg.sampling.max_new_tokens,
        seed=cfg.seed,
        dtype=r.dtype,
        enable_sleep_mode=r.enable_sleep_mode,
        in_process=True,  # the weight push needs tensors to reach the worker (rollout/vllm.py)
        stop_token_ids=stop_token_ids(tokenizer, cfg.model.stop_tokens),
    )


def _checkpoint(
    seg: Segment, out: Path, step: int, tokenizer: Any, metrics_log: MetricsLog, tracker: MlflowRun | None
) -> None:
    """``step_N`` (every rank), the retention policy (rank 0), then MLflow up to ``step``."""
    cfg, ranks, policy = seg.cfg, seg.ranks, seg.policy
    fault("after_metrics", step)
    state = {"step": step, "scheduler": policy.scheduler.state_dict(), "prompt_cursor": seg.stream.cursor}
    at_step = functools.partial(fault, step=step)
    ranks.save(out, step, policy.model, tokenizer, policy.optimizer, state, fault=at_step)
    if ranks.main:
        checkpoint.apply_retention(out, step, cfg.checkpoint.keep_weights, cfg.checkpoint.eval_steps)
    if tracker is not None:
        tracker.sync(metrics_log.read(), upto=step)
