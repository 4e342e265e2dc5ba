"""Checkpoint evaluation: generate once per checkpoint, grade, compute metrics, log to MLflow, and
cross-check against lm-eval."""
