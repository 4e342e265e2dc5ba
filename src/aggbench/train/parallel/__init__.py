"""Training one cell on several processes (``torchrun``): FSDP2 or DDP, with the aggregation exact.

Launched as ``torchrun --standalone --nproc_per_node N -m aggbench.cli train ...`` (the ``train``
rule does this when a cell asks for more than one GPU): one process per GPU, NCCL on CUDA, gloo on
CPU. Why the update equals the one-process update:

* Prompts: rank r takes positions r, r+N, r+2N, ... of the step's prompt list; a position is the
  global id of that prompt's group. Groups never span ranks, so group advantages are local.
* Weights: the ranks all-gather (lengths, advantages, group ids) of every row
  (``aggbench.train.global_batch.gather_minibatch``) and each computes every mini-batch's weights on the
  whole mini-batch. Mini-batches are cut from the global group ids, so a mini-batch holds the same
  groups whatever the number of ranks (and every rank the same number of them).
* Gradients: each rank backpropagates a plain token sum over its own rows with the global weights,
  and the gradients are SUMMED over ranks. FSDP2 averages by default (it divides by the world
  size); ``FSDPRanks.prepare_model`` sets its divide factor to 1. DDP sums with an all-reduce.
* FSDP all-gathers parameters in every forward, so every rank must run the same passes. No-grad
  passes (generation, behaviour and reference log-probs) run inside ``full_params``, which gathers
  the parameters once; a rank with fewer micro-batches than another (dynamic sampling) runs
  zero-loss passes (``finish_backward``).
* Checkpoints: ``step_N/`` holds the ``save_pretrained`` export gathered on rank 0 (the evaluator
  loads it unchanged) and, under FSDP, ``step_N/sharded/``: model and optimizer state written by
  every rank with torch.distributed.checkpoint, which a resume on the same number of ranks loads.

* vLLM rollouts (``rollout.engine: vllm``): every rank runs its own engine in vLLM's torchrun mode
  (``external_launcher``, independent "external DP" engines, tensor_parallel_size 1) on its own
  prompt groups, and
  ``sync_weights`` gathers the sharded parameters whole into it after each update
  (``aggbench.rollout.vllm``).

Rollouts depend on how prompts are split unless ``rollout.seeding: prompt`` seeds each group's
sampling from (seed, step, group id); with it (and fp64) N ranks reproduce the one-process run.

One module per strategy behind one small interface, :class:`Ranks` (this process's place in the
job, and what it does at each point where the ranks must agree): this module is the interface and
its one-process behaviour (the collectives that every multi-process strategy shares, too);
``ddp.py`` and ``fsdp.py`` override what their strategy does differently. :func:`setup` picks one.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist

from aggbench.config import TrainConfig
from aggbench.config_errors import ConfigError
from aggbench.layout import STATE_FILE, checkpoint_dir
from aggbench.train.checkpoint import RunLock, RunLockedError, reading, save_checkpoint


@dataclass
class Ranks:
    """This process's place in the job, and the strategy's behaviour at every point where ranks
    must agree. This class is one process (``distributed.strategy: none``) and the shared
    multi-process parts; a strategy's subclass overrides the rest.

    The interface, in the order a segment uses it: ``run_lock``, ``prepare_model``, ``load``,
    ``my_groups``, ``full_params``, ``missing_passes`` / ``finish_backward`` / ``clip_grad_norm``
    (each mini-batch), ``max_over_ranks`` / ``sum_over_ranks`` / ``gather_to_main`` (each step),
    ``save``, ``teardown``.
    """

    rank: int = 0
    world: int = 1
    device: torch.device | None = None  # this rank's device (None: one process, cfg.device decides)
    owns_group: bool = False  # this module started the process group, so it also ends it
    strategy: ClassVar[str] = "none"  # what the checkpoints record (resume refuses another)
    # the strategy casts parameters to bf16 itself (FSDP's MixedPrecisionPolicy): no autocast then
    casts_bf16: ClassVar[bool] = False

    @property
    def main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------ collectives (identity on one rank)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        if self.world == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def max_over_ranks(self, value: int) -> int:
        if self.world == 1:
            return value
        t = torch.tensor([value], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t)

    def sum_over_ranks(self, values: dict[str, float]) -> dict[str, float]:
        if self.world == 1:
            return values
        t = torch.tensor(list(values.values()), dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return dict(zip(values, t.tolist(), strict=True))

    def gather_to_main(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` in rank order on rank 0; None elsewhere."""
        if self.world == 1:
            return [obj]
        out: list[Any] | None = [None] * self.world if self.main else None
        dist.gather_object(obj, out, dst=0)
        return out

    # ------------------------------------------------------------ the job

    @contextlib.contextmanager
    def run_lock(self, out: Path) -> Iterator[None]:
        """The run directory's lock, held by rank 0; every rank fails when another job holds it."""
        if self.world == 1:
            with RunLock(out):
                yield
            return
        lock, err = None, None
        if self.main:
            try:
                lock = RunLock(out).__enter__()
            except RunLockedError as exc:
                err = str(exc)
        err = self.broadcast(err)
        if err:
            raise RunLockedError(err)
        try:
            yield
        finally:
            if lock is not None:
                lock.__exit__(None, None, None)

    def my_groups(self, n_prompts: int) -> list[int]:
        """Positions in the step's prompt list (= global group ids) this rank samples: r, r+N, ..."""
        return list(range(self.rank, n_prompts, self.world))

    def teardown(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()

    # ------------------------------------------------------------ the model

    def prepare_model(
        self, model: torch.nn.Module, cfg: TrainConfig, device: torch.device, *, trainable: bool = True
    ) -> torch.nn.Module:
        """Put ``model`` on this rank, whole. ``distributed.activation_checkpointing`` recomputes each
        layer's activations in the backward pass (Hugging Face gradient checkpointing)."""
        if trainable and cfg.distributed.activation_checkpointing:
            activation_checkpointing(model)
        return model.to(device)

    @contextlib.contextmanager
    def full_params(self, model: torch.nn.Module | None) -> Iterator[None]:
        """No-grad passes on whole parameters (a no-op where every rank holds them whole)."""
        yield

    def missing_passes(self, n_rows: int, micro_batch_size: int) -> int:
        """How many zero-loss passes this rank owes in this mini-batch (FSDP only: ``fsdp.py``).
        Ask BEFORE the rank's own passes: the question may be a collective."""
        return 0

    def finish_backward(
        self, model: torch.nn.Module, batch: Any, owed: int, settings: Any, autocast: Callable
    ) -> None:
        """After this rank's micro-batches of one mini-batch: gradients become the SUM over ranks
        (one process: they are)."""

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float | None) -> float:
        """Clip to ``max_norm`` (None: no clipping) and return the total norm, over all shards."""
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)
        if hasattr(norm, "full_tensor"):  # FSDP: a DTensor
            norm = norm.full_tensor()
        return float(norm)

    # ------------------------------------------------------------ checkpoints

    def save(
        self,
        out: Path,
        step: int,
        model: torch.nn.Module,
        tokenizer: Any,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        *,
        fault: Callable[[str], None] | None = None,
    ) -> None:
        """Write ``step_N`` atomically (a collective: every rank calls it).

        Rank 0 writes the ``save_pretrained`` export and ``trainer_state.pt`` (with the world size and
        strategy, and every rank's RNG state; here also the optimizer: rank 0's model and optimizer
        are the whole state) and renames the directory into place.
        """
        state = self._with_rng(state)
        if self.main:
            state["optimizer"] = optimizer.state_dict()
            save_checkpoint(out, step, model, tokenizer, state, fault=fault)
        self.barrier()

    def _with_rng(self, state: dict[str, Any]) -> dict[str, Any]:
        """``state`` with the strategy, the world size and the RNG state of every rank."""
        rng = (torch.get_rng_state(), random.getstate())
        state = {**state, "distributed": {"world_size": self.world, "strategy": self.strategy}}
        if self.world > 1:
            state["rank_rng"] = self.gather_to_main(rng)
        else:
            state["torch_rng"], state["python_rng"] = rng
        return state

    def load(
        self, out: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """Restore optimizer (and, under FSDP, model shards) and RNG from ``step_N``; returns its state.

        The checkpoint must come from the same number of processes and strategy (its shards and the
        split of prompts over ranks depend on them); anything else is an error that says so. A file
        that does not read is a ``CheckpointError`` naming it (every rank reads, so every rank fails).
        """
        where = checkpoint_dir(out, step)
        with reading(out, step, where / STATE_FILE):
            state = torch.load(where / STATE_FILE, weights_only=False)
        was = state.get("distributed", {"world_size": 1, "strategy": "none"})
        if (was["world_size"], was["strategy"]) != (self.world, self.strategy):
            raise ConfigError(
                f"checkpoint {where} was written by {was['world_size']} process(es) with "
                f"distributed.strategy={was['strategy']}, but this run has {self.world} with "
                f"{self.strategy}. Resume it the same way (torchrun --nproc_per_node {was['world_size']}, "
                "i.e. the same GPU count), or train into a new --out directory"
            )
        self._load_weights(out, step, model, optimizer, state)
        torch_rng, py_rng = (
            state["rank_rng"][self.rank] if "rank_rng" in state else (state["torch_rng"], state["python_rng"])
        )
        torch.set_rng_state(torch_rng)
        random.setstate(py_rng)
        return state

    def _load_weights(
        self, out: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict
    ) -> None:
        """The optimizer state (the model's weights were loaded from ``step_N`` with the model)."""
        optimizer.load_state_dict(state["optimizer"])


def activation_checkpointing(model: torch.nn.Module) -> None:
    """Recompute each layer's activations in the backward pass (in place)."""
    kw = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)


def setup(cfg: TrainConfig) -> Ranks:
    """Join the torchrun job this process belongs to (environment WORLD_SIZE/RANK/LOCAL_RANK), as
    the ``distributed.strategy`` of ``cfg`` says.

    One process (no torchrun, or ``--nproc_per_node 1``): ``Ranks()``, nothing is started.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Ranks()
    _check_multi_process(cfg, world)
    cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group("nccl" if cuda else "gloo", device_id=device if cuda else None)
    if cfg.distributed.strategy == "fsdp":
        from aggbench.train.parallel.fsdp import FSDPRanks as chosen
    else:
        from aggbench.train.parallel.ddp import DDPRanks as chosen
    return chosen(dist.get_rank(), dist.get_world_size(), device, owns)


def _check_multi_process(cfg: TrainConfig, world: int) -> None:
    """What a config must say to run on ``world`` processes: ConfigError naming the fix."""
    strategy, a = cfg.distributed.strategy, cfg.algorithm
    if strategy == "none":
        raise ConfigError(
            f"torchrun started {world} processes but distributed.strategy is 'none'; "
            "set distributed.strategy to fsdp or ddp, or start one process"
        )
    if cfg.rollout.engine == "vllm" and cfg.rollout.tensor_parallel_size > 1:
        raise ConfigError(
            f"rollout.engine=vllm with rollout.tensor_parallel_size={cfg.rollout.tensor_parallel_size} "
            f"under {world} training processes is not supported: each rank samples its own prompt "
            "groups, but the ranks of one vLLM tensor-parallel engine must all get the same prompts; "
            "set rollout.tensor_parallel_size: 1 (one data-parallel vLLM engine per GPU)"
        )
    if a.prompts_per_step % (a.mini_batches * world):
        raise ConfigError(
            f"algorithm.prompts_per_step={a.prompts_per_step} must be a multiple of "
            f"algorithm.mini_batches x processes = {a.mini_batches} x {world}: every rank holds the "
            "same number of whole prompt groups of every mini-batch; change prompts_per_step, "
            "mini_batches or the GPU count"
        )
