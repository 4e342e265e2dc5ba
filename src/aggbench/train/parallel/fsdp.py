"""FSDP2: parameters, gradients and optimizer state sharded over ranks (``fully_shard`` on every
decoder layer and on the root), gradients reduce-scattered as a SUM, checkpoints written by every
rank with torch.distributed.checkpoint beside rank 0's ``save_pretrained`` export.

FSDP all-gathers parameters in every forward, so every rank must run the same passes: no-grad
passes run inside :meth:`FSDPRanks.full_params` (parameters gathered once), and a rank with fewer
micro-batches than another (dynamic sampling) runs zero-loss passes (:meth:`FSDPRanks.finish_backward`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import torch

from aggbench.config import TrainConfig
from aggbench.config_errors import ConfigError
from aggbench.layout import checkpoint_dir
from aggbench.train.checkpoint import SHARDED_DIR, reading, save_checkpoint
from aggbench.train.parallel import Ranks, activation_checkpointing


class FSDPRanks(Ranks):
    """``distributed.strategy: fsdp`` (the default on several GPUs)."""

    strategy: ClassVar[str] = "fsdp"
    casts_bf16: ClassVar[bool] = True

    def prepare_model(
        self, model: torch.nn.Module, cfg: TrainConfig, device: torch.device, *, trainable: bool = True
    ) -> torch.nn.Module:
        """Shard ``model`` with FSDP2 (in place).

        ``fully_shard`` on every decoder layer, then on the root (embeddings, head, tied weights); with
        precision bf16, parameters are gathered and computed in bf16 while master weights, optimizer
        state and the gradient reduction stay fp32 (``MixedPrecisionPolicy``). Gradients are reduced
        as a SUM over ranks. Activation checkpointing is applied before sharding.
        """
        if trainable and cfg.distributed.activation_checkpointing:
            activation_checkpointing(model)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (self.world,))
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

    @contextlib.contextmanager
    def full_params(self, model: torch.nn.Module | None) -> Iterator[None]:
        """No-grad passes on whole parameters: FSDP gathers them once here, not in every forward.

        Ranks generate different numbers of tokens, so per-forward all-gathers would not pair up.
        Costs the memory of the unsharded model while inside.
        """
        if model is None:
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

    def missing_passes(self, n_rows: int, micro_batch_size: int) -> int:
        """How many zero-loss passes this rank owes so that every rank runs as many forward/backward
        passes as the rank with the most micro-batches in this mini-batch (their collectives must
        pair up). Only dynamic sampling makes ranks hold different numbers of rows. A collective."""
        mine = math.ceil(n_rows / micro_batch_size)
        return self.max_over_ranks(mine) - mine

    def finish_backward(
        self, model: torch.nn.Module, batch: Any, owed: int, settings: Any, autocast: Callable
    ) -> None:
        """FSDP reduce-scatters (SUM) in every backward already; here a rank runs the ``owed``
        zero-loss passes (:meth:`missing_passes`)."""
        if not owed:
            return
        from aggbench.train.update import forward_logprobs

        for _ in range(owed):
            logp, _, _ = forward_logprobs(
                model, batch, torch.arange(1), grad=True, temperature=settings.temperature, autocast=autocast
            )
            (logp.sum() * 0.0).backward()

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
        """Write ``step_N`` atomically (a collective): every rank first writes its shard of model and
        optimizer to ``sharded/`` (torch.distributed.checkpoint), inside rank 0's temporary
        directory; rank 0 writes the gathered ``save_pretrained`` export and ``trainer_state.pt``."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_state_dict,
        )

        state = self._with_rng(state)
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        for name in tied_names(model):  # saved once, as save_pretrained does for an unsharded model
            full.pop(name, None)
        sharded = dict(zip(("model", "optim"), get_state_dict(model, optimizer), strict=True))

        def write_shards(tmp: Path | None) -> None:  # every rank, into rank 0's temporary directory
            where = Path(self.broadcast(None if tmp is None else str(tmp)))
            dcp.save(sharded, checkpoint_id=where / SHARDED_DIR)
            self.barrier()

        if self.main:
            save_checkpoint(
                out, step, model, tokenizer, state, state_dict=full, extra=write_shards, fault=fault
            )
        else:
            write_shards(None)
        self.barrier()  # nobody goes on before step_N is in place

    def _load_weights(
        self, out: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict
    ) -> None:
        """Model and optimizer shards from ``step_N/sharded/``."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        where = checkpoint_dir(out, step)
        msd, osd = get_state_dict(model, optimizer)
        with reading(out, step, where / SHARDED_DIR):
            dcp.load({"model": msd, "optim": osd}, checkpoint_id=where / SHARDED_DIR)
        set_state_dict(model, optimizer, model_state_dict=msd, optim_state_dict=osd)


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


def sum_gradients(module: Any) -> None:
    """Make an FSDP2 module reduce gradients as a plain SUM over ranks (its default is the mean)."""
    module.set_gradient_divide_factor(1.0)
    module.set_force_sum_reduction_for_comms(True)  # plain SUM collectives (gloo has no PreMulSum)


def tied_names(model: torch.nn.Module) -> list[str]:
    """Names of parameters that are another name's parameter (tied embeddings' ``lm_head.weight``)."""
    seen: set[int] = set()
    tied = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.append(name)
        seen.add(id(p))
    return tied
