"""aggbench: loss aggregation in GRPO-style RLVR, reproduced."""

__version__ = "0.1.0"
