"""What produced a cell's run, in its run files: the tags the trainer gives its MLflow run (commit,
package versions, config hash, the rule's identity and parameters, the environment), written to
``runs/{cell}/tags.json`` as well, so the store rebuilt from the files (``aggbench ingest``) has
every one of them. The run files are the source of truth; MLflow is fed from them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from aggbench import layout
from aggbench.files import write_atomic


def run_tags(cfg: Any, rule: Any, plugin_files: list[Path]) -> dict[str, Any]:
    """Tags of a cell's MLflow run: what it is, and what code produced it. ``rule``: the instance
    that trains (``aggregation.resolve_instance``; its every parameter, as aggregation.json has them)."""
    import hashlib
    import platform

    import torch
    import transformers

    from aggbench import __version__, environment

    tags = {
        "aggbench.cell_id": cfg.resolved_cell_id,
        "model": cfg.model.name,
        "dataset": cfg.dataset.name,
        "aggregation": rule.name,
        "aggregation.rule": rule.rule,
        "aggregation.version": rule.spec.version,
        "seed": cfg.seed,
        "config_hash": cfg.hash(),
        "git_sha": _git_sha(),
        "versions": f"aggbench={__version__} torch={torch.__version__} transformers={transformers.__version__} "
        f"python={platform.python_version()}",
    }
    for k, v in rule.params.items():
        tags[f"aggregation.{k}"] = v
    tags |= environment.tags(environment.describe())  # versions that can change a number, CPU
    if plugin_files:
        h = hashlib.sha256()
        for f in sorted(plugin_files):
            h.update(Path(f).read_bytes())
        tags["plugin_source_sha256"] = h.hexdigest()[:16]
    return tags


def tag_value(value: Any) -> str:
    """A tag's value as MLflow stores it (``MlflowRun.set_tags``)."""
    return str(value)[:5000]


def record_tags(run_dir: Path, tags: dict[str, Any]) -> dict[str, str]:
    """Merge ``tags`` into the run directory's ``tags.json`` (atomically) and return them as MLflow
    stores them: the run files keep every tag the trainer gives MLflow, so a store rebuilt from the
    files (``aggbench ingest``) has them too. A later segment's value replaces an earlier one, as
    in MLflow."""
    path = layout.tags_file(run_dir)
    have = read_recorded_tags(run_dir)
    new = {k: tag_value(v) for k, v in tags.items()}
    write_atomic(path, json.dumps({**have, **new}, indent=1, sort_keys=True) + "\n")
    return new


def read_recorded_tags(run_dir: Path) -> dict[str, str]:
    """``tags.json`` of a run directory ({} when absent; a damaged one is an error naming it)."""
    path = layout.tags_file(run_dir)
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(
            f"{path} is not valid JSON ({exc}); delete it: the next training segment writes it again"
        ) from None
    return {str(k): str(v) for k, v in data.items()}


def _git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=5
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
