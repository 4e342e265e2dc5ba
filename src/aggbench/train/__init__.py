"""Training: the GRPO loop and everything a step needs (rollouts and rewards, advantages, the
rule's weights on the whole mini-batch, the clipped objective, gradient accumulation, checkpoints,
multi-rank training). Entry point: `aggbench.train.loop.train`."""
