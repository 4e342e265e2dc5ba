"""aggbench's aggregation rules inside other trainers: ``aggbench.integrations.trl`` (TRL's
``GRPOTrainer``). Each adapter turns a rule into per-token advantages computed on the whole
optimiser batch, which the host trainer's own token-sum loss then applies exactly; each refuses,
before training, the host settings under which that would no longer be exact
(docs/integrations.md). Importing this package imports no host trainer."""
