"""One rank of the 2-process TRL run (tests/integrations/test_trl.py): per-device batch 8, so the two
ranks together hold the generation batch of 16 the 1-process run holds; gloo on CPU. Saves this
rank's generation batch and (after DDP's all-reduce) its first-step gradient to OUT.rank<r>.pt.

    python -m torch.distributed.run --standalone --nproc_per_node 2 trl_worker.py MODEL_DIR OUT
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from helpers.trl_support import group_seeded_rollout, recording_trainer

torch.set_num_threads(1)
model_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
trainer, grads = recording_trainer(
    model_dir, out.parent / "run", rollout=group_seeded_rollout, per_device_train_batch_size=8
)
trainer.train()
rank = trainer.accelerator.process_index
assert trainer.accelerator.num_processes == 2, trainer.accelerator.num_processes
assert torch.distributed.get_backend() == "gloo", torch.distributed.get_backend()
torch.save({"batch": trainer.batches[0], "grads": grads.steps[0]}, f"{out}.rank{rank}.pt")
