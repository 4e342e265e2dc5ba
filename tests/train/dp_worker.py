"""Run under torchrun: raw gradients of a fixed batch, data-parallel with global weights.

Usage: torchrun --nproc_per_node N dp_worker.py OUT.pt [--mean]
Every rank builds the same float64 tiny model and the same fixed rollouts; rank r takes the
groups r, r+N, ...; weights come from the all-gathered mini-batch; gradients are all-reduced with
SUM (``--mean`` deliberately averages instead, the slip the test must catch). Rank 0 saves
{rule instance: [grad tensors]}.
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from aggbench.aggregation import builtin_instances
from aggbench.train.batching import pack
from aggbench.train.global_batch import gather_minibatch
from aggbench.train.parallel.ddp import allreduce_grads_sum
from aggbench.train.scoring import ScoredBatch
from aggbench.train.update import LossSettings, MiniBatch, accumulate_gradients, minibatch_weights
from helpers.dp_fixture import fixed_batch, tiny_model


def main() -> None:
    out, mean = sys.argv[1], "--mean" in sys.argv
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    model = tiny_model()
    roll, adv, old = fixed_batch()
    mine = [i for i in range(len(roll)) if roll.group[i] % size == rank]
    local = roll.select(mine)
    batch = pack(local, pad_id=0)
    settings = LossSettings(clip_low=0.2, clip_high=0.28, dual_clip=3.0, micro_batch_size=3)
    view = gather_minibatch(batch.response_lens, adv[mine], torch.tensor(local.group))
    result = {}
    for name, inst in builtin_instances().items():
        eff, aux_w = minibatch_weights(inst, view.mask, view.advantages, view.group_ids, "token-mean")
        model.zero_grad(set_to_none=True)
        t = batch.response_mask.shape[1]
        mb = MiniBatch(
            view.row_map(), view.local_in(torch.arange(view.mask.shape[0])), eff[:, :t], aux_w[:, :t]
        )
        scored = ScoredBatch(batch, batch.response_mask, adv[mine], torch.tensor(local.group))
        accumulate_gradients(model, scored, mb, settings, old=old[mine][:, :t])
        allreduce_grads_sum(model)
        grads = [p.grad.detach().clone() / (size if mean else 1) for p in model.parameters()]
        result[name] = grads
    if rank == 0:
        torch.save(result, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
