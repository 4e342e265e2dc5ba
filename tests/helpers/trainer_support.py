"""Helpers for trainer tests: a small cell config (written, or read back as a TrainConfig) and
readers of a run directory."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from aggbench.config import TrainConfig, load_train_config

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


def bare_cell(tmp_path: Path, **top: Any) -> Path:
    """A valid cell config (tmp_path/cell.yaml) of few keys, ``top`` merged in at the top level; model
    and data paths need not exist (config errors come first)."""
    cfg = {
        "model": {"name": "tiny", "path": str(tmp_path / "model")},
        "dataset": {"name": "tiny", "path": str(tmp_path / "data.jsonl"), "grader": "tiny"},
        "threads": 1,
        "algorithm": {"total_steps": 4, "prompts_per_step": 4, "group_size": 4},
        "tracking": {"enabled": False},
        **top,
    }
    path = tmp_path / "cell.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def train_config(cell: Path | Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> TrainConfig:
    """The TrainConfig of ``cell`` with ``overrides`` set by dotted key (``{"tracking.enabled": False}``):
    a cell YAML is read as ``aggbench train`` reads it (load_train_config, the overrides as its
    ``--set``); a mapping, for a config no test needs on disk, is validated as it is."""
    if not isinstance(cell, Mapping):
        return load_train_config(cell, dict(overrides or {}))
    data = copy.deepcopy(dict(cell))
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        node = data
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return TrainConfig.model_validate(data)


def cell_config(
    path: Path, model: Path, data: Path, *, overrides: Mapping[str, Any] | None = None, **cell: Any
) -> TrainConfig:
    """:func:`write_cell` at ``path`` (``cell``: its keywords), read back by :func:`train_config`."""
    return train_config(write_cell(path, model, data, **cell), overrides)


def metrics_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def stable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in VOLATILE}
