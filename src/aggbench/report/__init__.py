"""Reporting: run files into MLflow (idempotent ingest), then peak and last-step tables and plots.
Never imports torch."""
