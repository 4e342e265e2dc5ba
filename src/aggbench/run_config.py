"""A run's recorded config: its MLflow params and tags (the resolved config, flattened) and the
check that refuses to resume a run under a config that changes what it trains.

Split from aggbench.config (the typed config itself): these read and compare a run's stored
config.resolved.yaml, which the trainer writes and ``aggbench ingest`` reads back.
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from aggbench.config import TrainConfig
from aggbench.config_errors import ConfigError, yaml_problem
from aggbench.errors import InputError
from aggbench.files import relative_to_file, write_atomic
from aggbench.layout import data_record_file, resolved_config_file

log = logging.getLogger(__name__)

# Fields that may change between the segments of one run without changing what is trained: where
# things are, how they are logged and checkpointed, CPU threads, how many rollouts are kept, the
# run's length (extending total_steps continues the same run), and the memory knobs a resume after
# an out-of-memory crash needs: micro-batch size (the aggregation weights are computed on the whole
# mini-batch, so micro-batching is exact up to summation order: tests/train/test_invariance.py),
# activation checkpointing (recomputes the same forward: tests/train/test_fsdp.py), vLLM's
# memory share and sleep mode, and the weight-push check (a diagnostic). Everything else changes the math.
RESUME_MUTABLE: tuple[str, ...] = (
    "model.path",
    "dataset.path",
    "threads",
    "device",
    "plugins",
    "tracking",
    "checkpoint",
    "rollout.batch_size",
    "rollout.save_rollouts",
    "rollout.gpu_memory_utilization",
    "rollout.enable_sleep_mode",
    "rollout.check_weight_push",
    "algorithm.total_steps",
    "algorithm.micro_batch_size",
    "distributed.activation_checkpointing",
)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: data}


def resume_mutable(key: str) -> bool:
    """Whether the dotted ``key`` (``tracking.experiment``) is, or is under, a RESUME_MUTABLE field."""
    return any(key == m or key.startswith(m + ".") for m in RESUME_MUTABLE)


# MLflow's MAX_PARAM_VAL_LENGTH (mlflow 3.17): longer values are cut here, so resumes compare what it stored
PARAM_VALUE_LIMIT = 6000


def flat_config(cfg: TrainConfig | dict[str, Any]) -> dict[str, str]:
    """``cfg`` (or its dump, config.resolved.yaml) as {dotted key: text} (``algorithm.lr: '1e-06'``) by key;
    ``aggregation`` is the instance's name (what a search filters on); strings kept, other values as
    JSON; every value cut to PARAM_VALUE_LIMIT."""
    flat = _flatten(cfg if isinstance(cfg, dict) else cfg.model_dump(mode="json"))
    flat["aggregation"] = flat.pop("aggregation.name")
    text = {k: v if isinstance(v, str) else json.dumps(v) for k, v in flat.items()}
    return {k: text[k][:PARAM_VALUE_LIMIT] for k in sorted(text)}


def mlflow_fields(cfg: TrainConfig | dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """(params, tags) of a cell's MLflow run: ``flat_config``, RESUME_MUTABLE fields as tags (a param never changes)."""
    params = flat_config(cfg)
    return params, {k: params.pop(k) for k in [k for k in params if resume_mutable(k)]}


def resume_refused(where: str, diff: list[str], fix: str) -> ConfigError:
    """The error of a resume under a changed config (``diff``: resume_conflicts' lines)."""
    return ConfigError(
        f"{where} was trained with a different config; resuming would mix two experiments in "
        "one run. Changed fields:\n  " + "\n  ".join(diff) + f"\nFix: {fix} "
        f"These may change on a resume: {', '.join(RESUME_MUTABLE)}."
    )


def resume_conflicts(previous: dict[str, Any], current: TrainConfig) -> list[str]:
    """Dotted keys whose values differ between a run's stored resolved config and ``current``,
    ignoring RESUME_MUTABLE. Resuming with any of them changed would splice two experiments into
    one run (its metrics, checkpoints and MLflow run would mix both)."""
    # fields added since the run started get their defaults; one removed since: compared as stored
    with contextlib.suppress(ValidationError):
        previous = TrainConfig.model_validate(previous).model_dump(mode="json")
    old, new = _flatten(previous), _flatten(current.model_dump(mode="json"))
    keys = sorted(k for k in set(old) | set(new) if not resume_mutable(k))
    # json round trip: tuples stored by YAML as lists compare equal to the model's lists
    return [
        f"{k}: {old.get(k, '<absent>')!r} -> {new.get(k, '<absent>')!r}"
        for k in keys
        if json.dumps(old.get(k), sort_keys=True) != json.dumps(new.get(k), sort_keys=True)
    ]


class ResolvedUnreadable(InputError, ValueError):
    """A run's config.resolved.yaml that cannot be read as a mapping; ``cause`` says why (bad input:
    a file torn or edited by hand)."""

    def __init__(self, path: Path, cause: str) -> None:
        super().__init__(f"{path} is unreadable ({cause})")
        self.path, self.cause = path, cause


def read_resolved(run_dir: str | Path) -> dict[str, Any] | None:
    """The config ``run_dir`` was trained with (its config.resolved.yaml, as the trainer dumped it),
    or None before the trainer wrote one. Raises ResolvedUnreadable for a file that is not YAML, not
    UTF-8 or not a mapping. The one reader of that file for a resume's check and the report's."""
    stored = resolved_config_file(run_dir)
    if not stored.exists():
        return None
    try:
        previous = yaml.safe_load(stored.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise ResolvedUnreadable(stored, f"not valid YAML: {yaml_problem(exc)}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResolvedUnreadable(stored, f"{type(exc).__name__}: {exc}") from None
    if previous is None:
        raise ResolvedUnreadable(stored, "empty")
    if not isinstance(previous, dict):
        raise ResolvedUnreadable(stored, "not a mapping")
    return previous


def check_resume(run_dir: str | Path, current: TrainConfig, *, allow_change: bool = False) -> None:
    """Refuse to resume ``run_dir`` (which has a checkpoint) when its stored resolved config differs
    from ``current`` in a field that changes training. Raises ConfigError naming each field and the fixes."""
    if allow_change:
        return
    try:
        previous = read_resolved(run_dir)
    except ResolvedUnreadable as exc:
        raise ConfigError(
            f"{exc}; it records the config {run_dir} was trained with, "
            "which a resume is checked against. Fix: if this run's config is unchanged, delete that "
            "file (train writes it again) or pass --allow-config-change; otherwise train into a new --out"
        ) from None
    if previous is None:
        return
    diff = resume_conflicts(previous, current)
    if diff:
        fix = (
            "restore those values, train into a new --out directory (in the workflow: move the cell's "
            "run directory away, and it is retrained from step 0), or pass --allow-config-change "
        )
        raise resume_refused(str(run_dir), diff, fix + "to continue this run with the new values on purpose.")


def data_fingerprint(records: list[dict[str, Any]]) -> str:
    """sha256 of the training records in their order (each one's canonical JSON, one per line): the
    prompt stream's cursor is a position in this list, so two lists with one hash read the same prompts."""
    import hashlib

    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps(r, sort_keys=True, ensure_ascii=False, default=str).encode() + b"\n")
    return h.hexdigest()


def data_history(run_dir: str | Path) -> list[dict[str, Any]]:
    """The training record sets ``run_dir`` read, oldest first (its data.json ``records``: sha256,
    count, path and ``since_step`` each); more than one when a resume continued on other records
    (``--allow-config-change``). [] before it was written (a run started before data.json existed)."""
    try:
        stored = json.loads(data_record_file(run_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []  # none yet, or torn: record_data writes it again
    if isinstance(stored, dict) and "sha256" in stored:
        return [stored]  # one flat record, as written before the history was kept
    history = stored.get("records") if isinstance(stored, dict) else None
    return [h for h in history if isinstance(h, dict) and "sha256" in h] if isinstance(history, list) else []


def _shown(run_dir: str | Path, record: dict[str, Any]) -> str:
    """A data record's file as messages show it: resolved where it is a path relative to data.json
    that still exists, else as recorded."""
    where = Path(run_dir) / str(record.get("path"))
    return str(where.resolve()) if where.exists() else str(record.get("path"))


def check_resume_data(
    run_dir: str | Path, path: str | Path, records: list[dict[str, Any]], *, allow_change: bool = False
) -> None:
    """Refuse to resume ``run_dir`` on other training records than it read so far (its data.json):
    a new ``datasets.X.limit``, another data directory or a re-fetched file changes the list the
    saved cursor indexes, so the run would go on with prompts its seed never chose. ``dataset.path``
    itself may move (RESUME_MUTABLE); its content may not. Raises ConfigError naming both."""
    history = data_history(run_dir)
    if allow_change or not history or history[-1]["sha256"] == data_fingerprint(records):
        return
    stored = history[-1]
    raise ConfigError(
        f"{run_dir} was trained on {stored.get('n_records')} records of {_shown(run_dir, stored)} (sha256 "
        f"{stored['sha256'][:12]}, {data_record_file(run_dir).name}); this resume would read on in "
        f"{len(records)} records of {path} (sha256 {data_fingerprint(records)[:12]}). The saved prompt "
        "cursor is a position in that list, so resuming on another one trains prompts the run's seed "
        "never chose. Fix: restore the training file (the same datasets.<name>.limit and data "
        "directory as when the run started), train into a new --out directory (in the workflow: move "
        "the cell's run directory away, and it is retrained from step 0), or pass "
        "--allow-config-change to continue this run on the new records on purpose (the report flags it)"
    )


def record_data(
    run_dir: str | Path,
    path: str | Path,
    records: list[dict[str, Any]],
    step: int,
    *,
    allow_change: bool = False,
) -> None:
    """Add the records ``run_dir`` reads from ``step`` on to its data.json (sha256, count, file,
    ``since_step``) unless they are the ones it read last; at step 0 they replace the history (a
    run trained again from the start). A resume (``step`` > 0) on other records is refused first
    (``check_resume_data``). A resume of a run with no record says that nothing
    recorded what it trained on before."""
    if step:
        check_resume_data(run_dir, path, records, allow_change=allow_change)
    # from step 0 the run is trained again from the start (its metrics from step 1 rewritten): what
    # earlier attempts read is no part of it
    digest, history = data_fingerprint(records), data_history(run_dir) if step else []
    if history and history[-1]["sha256"] == digest:
        return
    if step and not history:
        log.warning(
            "%s: no %s records what this run trained on before step %d (it started before the file "
            "existed); recording the %d records of %s it reads on from here",
            run_dir, data_record_file(run_dir).name, step, len(records), path,
        )  # fmt: skip
    # the path relative to data.json, as every run file records one (a copied results directory)
    where = relative_to_file(path, data_record_file(run_dir))
    history.append({"sha256": digest, "n_records": len(records), "path": where, "since_step": step})
    write_atomic(data_record_file(run_dir), json.dumps({"records": history}, indent=2) + "\n")


def data_changes(run_dir: str | Path) -> list[str]:
    """The record sets ``run_dir`` went on to after its first (each a resume told to continue on
    other records), as the report's flag shows them; [] for a run on one set."""
    return [
        f"from step {h.get('since_step')}: {h.get('n_records')} records of {_shown(run_dir, h)} (sha256 {h['sha256'][:12]})"
        for h in data_history(run_dir)[1:]
    ]
