"""aggbench's aggregation rules inside other trainers: ``aggbench.integrations.trl`` (TRL's
``GRPOTrainer``) and ``aggbench.integrations.verl`` (a verl advantage estimator). Each adapter turns
a rule into per-token advantages computed on the whole optimiser batch, which the host trainer's own
loss then applies exactly; each refuses, before training, the host settings under which that would
no longer be exact (docs/integrations.md). Importing this package imports no host trainer."""

from aggbench.errors import InputError


class AdapterConfigError(InputError, ValueError):
    """A host-trainer setting under which the rule would not be exact; the message names the fix."""
