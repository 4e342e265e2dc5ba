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
  size); ``prepare_model`` sets its divide factor to 1. DDP sums with ``allreduce_grads_sum``.
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
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from aggbench.config import TrainConfig
from aggbench.config_errors import ConfigError
from aggbench.layout import checkpoint_dir
from aggbench.train.checkpoint import (
    SHARDED_DIR,
    STATE_FILE,
    RunLock,
    RunLockedError,
    reading,
    save_checkpoint,
)
from aggbench.train.global_batch import allreduce_grads_sum


@dataclass
class Ranks:
    """This process's place in the job. ``strategy``: none (one process), fsdp or ddp."""

    rank: int = 0
    world: int = 1
    strategy: str = "none"
    device: torch.device | None = None  # this rank's device (None: one process, cfg.device decides)
    owns_group: bool = False  # this module started the process group, so it also ends it

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def fsdp(self) -> bool:
        return self.strategy == "fsdp"

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


def setup(cfg: TrainConfig) -> Ranks:
    """Join the torchrun job this process belongs to (environment WORLD_SIZE/RANK/LOCAL_RANK).

    One process (no torchrun, or ``--nproc_per_node 1``): ``Ranks()``, nothing is started.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Ranks()
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
    return Ranks(dist.get_rank(), dist.get_world_size(), strategy, device, owns)


def teardown(ranks: Ranks) -> None:
    if ranks.owns_group and dist.is_initialized():
        dist.destroy_process_group()


@contextlib.contextmanager
def run_lock(out: Path, ranks: Ranks) -> Iterator[None]:
    """The run directory's lock, held by rank 0; every rank fails when another job holds it."""
    if ranks.world == 1:
        with RunLock(out):
            yield
        return
    lock, err = None, None
    if ranks.main:
        try:
            lock = RunLock(out).__enter__()
        except RunLockedError as exc:
            err = str(exc)
    err = ranks.broadcast(err)
    if err:
        raise RunLockedError(err)
    try:
        yield
    finally:
        if lock is not None:
            lock.__exit__(None, None, None)


def my_groups(n_prompts: int, ranks: Ranks) -> list[int]:
    """Positions in the step's prompt list (= global group ids) this rank samples: r, r+N, ..."""
    return list(range(ranks.rank, n_prompts, ranks.world))


# ---------------------------------------------------------------- the model


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face model (the classes in ``_no_split_modules``)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ConfigError(
            f"FSDP: found no decoder layers in {type(model).__name__} (its _no_split_modules is "
            f"{sorted(names) or 'empty'}); set distributed.strategy: ddp for this model"
        )
    return layers


def prepare_model(
    model: torch.nn.Module, ranks: Ranks, cfg: TrainConfig, device: torch.device, *, trainable: bool = True
) -> torch.nn.Module:
    """Put ``model`` on this rank: whole (one process, DDP) or sharded with FSDP2 (in place).

    FSDP2: ``fully_shard`` on every decoder layer, then on the root (embeddings, head, tied weights);
    with precision bf16, parameters are gathered and computed in bf16 while master weights, optimizer
    state and the gradient reduction stay fp32 (``MixedPrecisionPolicy``). Gradients are reduced as
    a SUM over ranks. ``distributed.activation_checkpointing`` recomputes each layer's activations in
    the backward pass (Hugging Face gradient checkpointing, applied before sharding).
    """
    if trainable and cfg.distributed.activation_checkpointing:
        kw = {"use_reentrant": False}
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kw)
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
    if not ranks.fsdp:
        return model.to(device)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (ranks.world,))
    mp = MixedPrecisionPolicy()
    if cfg.precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            sum_gradients(m)
    return model


def sum_gradients(module: Any) -> None:
    """Make an FSDP2 module reduce gradients as a plain SUM over ranks (its default is the mean)."""
    module.set_gradient_divide_factor(1.0)
    module.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PreMulSum)


@contextlib.contextmanager
def full_params(model: torch.nn.Module | None, ranks: Ranks) -> Iterator[None]:
    """No-grad passes on whole parameters: FSDP gathers them once here, not in every forward.

    Ranks generate different numbers of tokens, so per-forward all-gathers would not pair up.
    A no-op without FSDP. Costs the memory of the unsharded model while inside.
    """
    if model is None or not ranks.fsdp:
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    mods = [m for m in model.modules() if isinstance(m, FSDPModule)]
    model.set_reshard_after_forward(False)
    for m in mods:
        m.unshard()
    # transformers' generate() sees this flag (set by fully_shard) and turns on `synced_gpus`: an
    # all-reduce per token so that finished ranks keep calling forward. With the parameters gathered,
    # no forward needs the other ranks, and under dynamic sampling ranks call generate() different
    # numbers of times, so those all-reduces would not pair up: hide the flag while inside.
    model._is_fsdp_managed_module = False
    try:
        yield
    finally:
        model._is_fsdp_managed_module = True
        for m in mods:
            m.reshard()
        model.set_reshard_after_forward(True)  # FSDP2's defaults: layers reshard after forward,
        model.set_reshard_after_forward(False, recurse=False)  # the root keeps its parameters


def missing_passes(n_rows: int, micro_batch_size: int, ranks: Ranks) -> int:
    """FSDP: how many zero-loss passes this rank owes so that every rank runs as many
    forward/backward passes as the rank with the most micro-batches in this mini-batch (their
    collectives must pair up). Only dynamic sampling makes ranks hold different numbers of rows.
    Ask BEFORE the rank's own passes: the question is itself a collective."""
    if not ranks.fsdp:
        return 0
    mine = math.ceil(n_rows / micro_batch_size)
    return max_over_ranks(mine, ranks) - mine


def finish_backward(
    model: torch.nn.Module, batch: Any, owed: int, settings: Any, autocast: Callable, ranks: Ranks
) -> None:
    """After this rank's micro-batches of one mini-batch: gradients become the SUM over ranks.

    DDP: one all-reduce (SUM) per parameter. FSDP reduce-scatters (SUM) in every backward already;
    here a rank runs the ``owed`` zero-loss passes (``missing_passes``).
    """
    if ranks.strategy == "ddp":
        allreduce_grads_sum(model)
    if owed:
        from aggbench.train.update import forward_logprobs

        for _ in range(owed):
            logp, _, _ = forward_logprobs(
                model, batch, torch.arange(1), grad=True, temperature=settings.temperature, autocast=autocast
            )
            (logp.sum() * 0.0).backward()


def clip_grad_norm(model: torch.nn.Module, max_norm: float | None) -> float:
    """Clip to ``max_norm`` (None: no clipping) and return the total norm, over all shards."""
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm or math.inf)
    if hasattr(norm, "full_tensor"):  # FSDP: a DTensor
        norm = norm.full_tensor()
    return float(norm)


# ---------------------------------------------------------------- metrics


def max_over_ranks(value: int, ranks: Ranks) -> int:
    if ranks.world == 1:
        return value
    t = torch.tensor([value], device=ranks.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def sum_over_ranks(values: dict[str, float], ranks: Ranks) -> dict[str, float]:
    if ranks.world == 1:
        return values
    t = torch.tensor(list(values.values()), dtype=torch.float64, device=ranks.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return dict(zip(values, t.tolist(), strict=True))


def gather_to_main(obj: Any, ranks: Ranks) -> list[Any] | None:
    """Every rank's ``obj`` in rank order on rank 0; None elsewhere."""
    if ranks.world == 1:
        return [obj]
    out: list[Any] | None = [None] * ranks.world if ranks.main else None
    dist.gather_object(obj, out, dst=0)
    return out


# ---------------------------------------------------------------- checkpoints


def save(
    out: Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    state: dict[str, Any],
    ranks: Ranks,
    *,
    fault: Callable[[str], None] | None = None,
) -> None:
    """Write ``step_N`` atomically (a collective: every rank calls it).

    Rank 0 writes the ``save_pretrained`` export, ``trainer_state.pt`` (with the world size and
    strategy, and every rank's RNG state) and renames the directory into place; under FSDP every rank
    first writes its shard of model and optimizer to ``sharded/`` (torch.distributed.checkpoint).
    """
    rng = (torch.get_rng_state(), random.getstate())
    state = {**state, "distributed": {"world_size": ranks.world, "strategy": ranks.strategy}}
    if ranks.world > 1:
        state["rank_rng"] = gather_to_main(rng, ranks)
    else:
        state["torch_rng"], state["python_rng"] = rng
    if not ranks.fsdp:  # one process or DDP: rank 0's model and optimizer are the whole state
        if ranks.main:
            state["optimizer"] = optimizer.state_dict()
            save_checkpoint(out, step, model, tokenizer, state, fault=fault)
        ranks.barrier()
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_state_dict,
    )

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    for name in tied_names(model):  # saved once, as save_pretrained does for an unsharded model
        full.pop(name, None)
    sharded = dict(zip(("model", "optim"), get_state_dict(model, optimizer), strict=True))

    def write_shards(tmp: Path | None) -> None:  # every rank, into rank 0's temporary directory
        where = Path(ranks.broadcast(None if tmp is None else str(tmp)))
        dcp.save(sharded, checkpoint_id=where / SHARDED_DIR)
        ranks.barrier()

    if ranks.main:
        save_checkpoint(out, step, model, tokenizer, state, state_dict=full, extra=write_shards, fault=fault)
    else:
        write_shards(None)
    ranks.barrier()  # nobody goes on before step_N is in place


def tied_names(model: torch.nn.Module) -> list[str]:
    """Names of parameters that are another name's parameter (tied embeddings' ``lm_head.weight``)."""
    seen: set[int] = set()
    tied = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.append(name)
        seen.add(id(p))
    return tied


def load(
    out: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ranks: Ranks
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
    if (was["world_size"], was["strategy"]) != (ranks.world, ranks.strategy):
        raise ConfigError(
            f"checkpoint {where} was written by {was['world_size']} process(es) with "
            f"distributed.strategy={was['strategy']}, but this run has {ranks.world} with "
            f"{ranks.strategy}. Resume it the same way (torchrun --nproc_per_node {was['world_size']}, "
            "i.e. the same GPU count), or train into a new --out directory"
        )
    if ranks.fsdp:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        msd, osd = get_state_dict(model, optimizer)
        with reading(out, step, where / SHARDED_DIR):
            dcp.load({"model": msd, "optim": osd}, checkpoint_id=where / SHARDED_DIR)
        set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)
    else:
        optimizer.load_state_dict(state["optimizer"])
    torch_rng, py_rng = (
        state["rank_rng"][ranks.rank] if "rank_rng" in state else (state["torch_rng"], state["python_rng"])
    )
    torch.set_rng_state(torch_rng)
    random.setstate(py_rng)
    return state
