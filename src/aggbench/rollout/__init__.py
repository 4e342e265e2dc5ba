"""Rollout engines behind one protocol: transformers `generate` (CPU/GPU) and vLLM (GPU).

The training loop only sees ``RolloutEngine``: it hands over tokenised prompts and gets token ids
back, so the vLLM engine plugs in without touching the loop.
"""

from aggbench.rollout.base import RolloutEngine, Rollouts, make_engine

__all__ = ["RolloutEngine", "Rollouts", "make_engine"]
