"""Helpers for trainer tests: a small cell config and readers of a run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

# timing fields differ between runs; everything else must be identical on CPU
VOLATILE = ("time", "time/generate_s", "time/update_s", "tokens_per_s")


def write_cell(
    path: Path,
    model: Path,
    data: Path,
    *,
    rule: str = "balanced",
    steps: int = 4,
    every: int = 2,
    tracking_uri: str | None = None,
    **algorithm: Any,
) -> Path:
    cfg = {
        "model": {"name": "tiny", "path": str(model)},
        "dataset": {"name": "tiny", "path": str(data), "grader": "tiny"},
        "aggregation": {"name": rule},
        "threads": 1,
        "algorithm": {
            "total_steps": steps,
            "prompts_per_step": 4,
            "group_size": 4,
            "micro_batch_size": 8,
            "lr": 3e-4,
            **algorithm,
        },
        "sampling": {"max_new_tokens": 40},
        "checkpoint": {"every": every},
        "rollout": {"save_rollouts": 4},
        "tracking": {"tracking_uri": tracking_uri, "experiment": "test"},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def stable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in VOLATILE}
