"""Model directories: prepared (``aggbench prepare-model``: the built-in tiny model, a local copy or
a hub snapshot, written atomically with an ``aggbench_model.json`` record), and, where a user names
one (``model.path``, ``--checkpoint``), checked before loading, load failures reported as one line
naming the directory instead of a transformers traceback.

transformers' own errors for these cases are misleading ("Repo id must be in the form ..." for a
local path that does not exist, a sentencepiece hint for an empty folder, ``header too small`` for
a truncated safetensors file), so aggbench checks the directory itself first.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from aggbench.errors import InputError
from aggbench.files import sha256_file
from aggbench.layout import COMPLETE

MARKER = "aggbench_model.json"
TINY = "tiny"


class ModelDirError(InputError, ValueError):
    """A model directory that does not exist, is not a model, or does not load."""


def require_model_dir(path: str | Path, *, what: str, fix: str) -> Path:
    """Return ``path`` if it is a directory holding a readable ``config.json``; else raise.

    ``what`` names the setting (``"model.path"``, ``"--checkpoint"``); ``fix`` says what to run.
    """
    p = Path(path)
    if not p.exists():
        raise ModelDirError(f"{what} {p} does not exist; {fix}")
    if not p.is_dir():
        raise ModelDirError(f"{what} {p} is a file, not a model directory; {fix}")
    cfg = p / "config.json"
    if not cfg.is_file():
        raise ModelDirError(f"{what} {p} is not a model directory (no config.json); {fix}")
    try:
        json.loads(cfg.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelDirError(f"{what} {p}: config.json is not valid JSON ({exc}); {fix}") from exc
    bad = checksum_mismatch(p)
    if bad is not None:
        raise ModelDirError(f"{what} {p}: {bad[0].relative_to(p)} {bad[1]}; {fix}")
    return p


# --------------------------------------------------------------------------- checksums

# What a checkpoint's retention removes from every step but the latest (train/checkpoint.py):
# recorded when the checkpoint was written, and allowed to be gone since.
RETAINED_ONLY_LATEST = ("trainer_state.pt", "sharded/")
_VERIFIED: set[tuple] = set()  # (marker, each file's size and mtime): hashed once per process


def directory_checksums(directory: Path) -> dict[str, str]:
    """sha256 of every file below ``directory`` by its relative POSIX path, except the COMPLETE
    marker that carries them (what ``save_checkpoint`` records, as safetensors' and orbax's
    checkpoints carry theirs)."""
    return {
        f.relative_to(directory).as_posix(): sha256_file(f)
        for f in sorted(directory.rglob("*"))
        if f.is_file() and f.relative_to(directory).as_posix() != COMPLETE
    }


def checksum_mismatch(directory: Path, part: tuple[int, int] = (0, 1)) -> tuple[Path, str] | None:
    """(file, why) for the first file of a committed checkpoint whose bytes differ from the sha256
    its COMPLETE marker recorded, or that is gone; None when all match, or when the directory has
    no marker with checksums (a prepared model, or a checkpoint written before they were recorded).
    A directory is hashed once per process while no file's size or mtime changes. ``part`` (i, n):
    only the i-th of n slices of the recorded files (the ranks of a job share the reading), and
    nothing is cached: the caller marks the directory verified when every slice passed."""
    marker = Path(directory) / COMPLETE
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    sums = recorded.get("sha256") if isinstance(recorded, dict) else None
    if not isinstance(sums, dict):
        return None
    key = _verified_key(Path(directory))
    if key in _VERIFIED:
        return None
    i, n = part
    for rel, want in sorted(sums.items())[i::n]:
        path = Path(directory) / rel
        if not path.is_file():
            if rel.startswith(RETAINED_ONLY_LATEST):
                continue
            return path, "missing (it was there when the checkpoint was written)"
        try:
            got = sha256_file(path)
        except OSError as exc:  # a verdict, not a raise: the other ranks wait for this one's
            why = (
                f"{type(exc).__name__} while hashing it: {exc}; if the filesystem or the permissions were at"
            )
            return path, why + " fault, fix them and rerun first"
        if got != want:
            return path, (
                f"changed since the checkpoint was written: sha256 {got[:12]}..., recorded {want[:12]}...; "
                "damaged on disk or in a copy"
            )
    if n == 1:
        _VERIFIED.add(key)
    return None


def _verified_key(directory: Path) -> tuple:
    """What a verdict of :func:`checksum_mismatch` holds for: the marker and every file's size and mtime."""
    stats = []
    for f in sorted(directory.rglob("*")):
        with contextlib.suppress(OSError):
            st = f.stat()
            stats.append((str(f), st.st_size, st.st_mtime_ns))
    return (str((directory / COMPLETE).resolve()), tuple(stats))


def mark_verified(directory: Path) -> None:
    """Record that another process (rank 0 of the job) found ``directory`` intact: this process's
    :func:`checksum_mismatch` skips it while no file's size or mtime changes."""
    _VERIFIED.add(_verified_key(Path(directory)))


def require_weights(path: str | Path, *, what: str, fix: str) -> Path:
    """:func:`require_model_dir`, and its ``.safetensors`` files complete (their
    headers read: an empty or truncated weights file fails here, before anything loads)."""
    p = require_model_dir(path, what=what, fix=fix)
    for weights in sorted(p.glob("*.safetensors")):
        if why := weights_problem(weights):
            raise ModelDirError(f"{what} {p}: {weights.name} is unreadable ({why}); {fix}")
    return p


def require_positions(path: str | Path, need: int, *, what: str, lengths: str) -> None:
    """Refuse a model directory whose ``max_position_embeddings`` is below ``need`` tokens.

    transformers would run a rotary model past its positions without a word, and vLLM refuses the
    engine only once it is built; ``lengths`` names the settings that add up to ``need``.
    """
    config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    positions = config.get("max_position_embeddings")
    if isinstance(positions, int) and need > positions:
        raise ModelDirError(
            f"{what} {path} has max_position_embeddings {positions}, but {lengths} = {need}; lower "
            f"those lengths, or raise the model's positions where it is prepared (models.<model>."
            f"config_overrides: {{max_position_embeddings: N}}, `aggbench prepare-model "
            f"--config-override max_position_embeddings=N`; verl's DAPO 7B math recipe uses 32768)"
        )


def weights_problem(path: Path) -> str | None:
    """Why a ``.safetensors`` file cannot be complete (empty, header or data cut short), or None;
    reads its header only."""
    try:
        size = path.stat().st_size
    except OSError as exc:  # a dangling link
        return f"{type(exc).__name__}: {exc.strerror}"
    if size == 0:
        return "empty file"
    try:
        with open(path, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8).ljust(8, b"\xff"))
            if 8 + n > size:
                return f"truncated: {size} bytes, shorter than its header says"
            header = json.loads(fh.read(n))
        ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, UnicodeDecodeError):
        return "not a safetensors file (corrupt header)"
    need = 8 + n + max(ends, default=0)
    return f"truncated: {size} of {need} bytes" if size < need else None


@contextlib.contextmanager
def loading(path: str | Path, *, what: str) -> Iterator[None]:
    """Around ``from_pretrained`` calls: a failure to read the files (truncated or missing weights,
    a bad tokenizer file) becomes :class:`ModelDirError` naming the directory and the cause."""
    try:
        yield
    except (OSError, ValueError) as exc:
        if isinstance(exc, ModelDirError):
            raise
        raise ModelDirError(f"cannot load {what} {path}: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:  # safetensors raises its own SafetensorError (not an OSError)
        if type(exc).__name__ != "SafetensorError":
            raise
        raise ModelDirError(f"cannot load {what} {path}: weights file unreadable ({exc})") from exc


# --------------------------------------------------------------------------- prepare-model


def _request(
    name: str,
    revision: str | None,
    seed: int,
    sft_steps: int,
    task: dict[str, Any],
    config_overrides: dict[str, Any],
) -> dict[str, Any]:
    """The fields that identify a prepared directory: a rerun with the same ones is a no-op."""
    if name == TINY:
        request = {"name": name, "seed": seed, "sft_steps": sft_steps, "task": task}
    else:
        request = {"name": name, "revision": revision}
    if config_overrides:  # absent when empty, so directories prepared before overrides existed match
        request["config_overrides"] = dict(sorted(config_overrides.items()))
    return request


def apply_config_overrides(model_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """Write ``overrides`` into ``model_dir/config.json``; return the values they replaced.

    This is the recipe's own instruction for Qwen2.5-Math-7B (verl's DAPO 7B math scripts: "modify
    the max_position_embeddings in config.json to 32768 after downloading", also passed there as
    ``override_config``): the prepared directory is what the trainer, both rollout engines and the
    evaluator load, and training's checkpoints are saved from the loaded config, so one edit here
    reaches all of them. A key the config does not have is refused (a typo would otherwise change
    nothing, silently).
    """
    if not overrides:
        return {}
    path = model_dir / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    unknown = sorted(set(overrides) - set(config))
    if unknown:
        import difflib

        close = [difflib.get_close_matches(k, sorted(config), n=1, cutoff=0.5) for k in unknown]
        hints = "".join(f" Did you mean {c[0]!r}?" for c in close if c)
        raise ModelDirError(
            f"config override(s) {', '.join(map(repr, unknown))} name no field of {path.name} "
            f"(its fields include {', '.join(sorted(config)[:12])}, ...){hints}; fix the key in "
            "models.<model>.config_overrides (or --config-override)"
        )
    original = {k: config[k] for k in overrides}
    config.update(overrides)
    # prepare-model calls this on its DIR.tmp-<pid>, renamed whole at the end: no file of it needs its
    # own atomic write
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return original


def _check_existing(out_dir: Path, request: dict[str, Any], force: bool) -> bool:
    """True when ``out_dir`` already holds this request (skip); raises when it holds something else."""
    if not out_dir.exists():
        return False
    marker = out_dir / MARKER
    if force:
        return False
    if not marker.is_file():
        raise ModelDirError(
            f"{out_dir} exists but has no {MARKER}, so it is not a finished aggbench model directory "
            "(perhaps a copy made by hand, or another tool's output); pass --force to replace it, or "
            "choose another --out"
        )
    try:
        recorded = json.loads(marker.read_text())
    except json.JSONDecodeError as err:
        raise ModelDirError(f"{marker} is not valid JSON ({err}); pass --force to rebuild") from err
    keys = [*request, *(["config_overrides"] if "config_overrides" in recorded else [])]
    old = {k: recorded.get(k) for k in keys}
    new = {k: request.get(k) for k in keys}
    if old != new:
        diff = ", ".join(f"{k}: {old[k]!r} -> {new[k]!r}" for k in keys if old[k] != new[k])
        raise ModelDirError(
            f"{out_dir} was prepared with different settings ({diff}); pass --force to rebuild it, "
            "or choose another --out"
        )
    return True


def _check_warm_start_threads(out_dir: Path) -> None:
    """A tiny warm start's weights depend on torch's thread count (``sft_threads``): a directory
    trained on another count is not what this request would write, so it is not "already prepared"."""
    from aggbench.tiny.model import thread_count_mismatch

    recorded = json.loads((out_dir / MARKER).read_text()).get("sft_threads")
    mismatch = thread_count_mismatch(recorded)
    if mismatch:
        raise ModelDirError(
            f"{out_dir} {mismatch}: set OMP_NUM_THREADS={recorded} to use it as it is (the "
            "workflow's WARM_START_THREADS), or pass --force to rebuild it on this count"
        )


def _download(name: str, revision: str | None, into: Path) -> None:
    """Fetch a hub snapshot into ``into``; offline and not-found failures get an actionable message."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    how = (
        f"to prepare it offline, download it where the hub is reachable "
        f"(`hf download {name}{' --revision ' + revision if revision else ''} --local-dir SOME_DIR`), "
        f"copy SOME_DIR here and run `aggbench prepare-model SOME_DIR --out ...`, or point the "
        "config's model at that local directory"
    )
    try:
        snapshot_download(repo_id=name, revision=revision, local_dir=into)
    except RevisionNotFoundError as err:
        raise ModelDirError(f"model {name!r} has no revision {revision!r} on the hub ({err})") from err
    except GatedRepoError as err:
        raise ModelDirError(
            f"model {name!r} is gated: accept its licence on the hub and log in (`hf auth login`) ({err})"
        ) from err
    except RepositoryNotFoundError as err:
        raise ModelDirError(
            f"no model {name!r} on the hub (check the id; private repos need `hf auth login`). "
            f"NAME must be 'tiny', a local directory or a hub model id ({type(err).__name__})"
        ) from err
    except (LocalEntryNotFoundError, OSError) as err:
        # LocalEntryNotFoundError: HF_HUB_OFFLINE is set, or the hub could not be reached and nothing
        # is cached; connection errors from requests/httpx are OSError subclasses.
        raise ModelDirError(
            f"cannot download {name!r}: the Hugging Face hub is unreachable from this machine "
            f"({type(err).__name__}: {err}); {how}"
        ) from err


def _check_name(name: str) -> None:
    """NAME must be 'tiny', a model directory (holding config.json), or a well-formed hub id;
    anything else fails here, before any download or copy."""
    if name == TINY:
        return
    if Path(name).exists():
        require_model_dir(
            name,
            what="NAME",
            fix="a local NAME must be a model directory in save_pretrained format (config.json, "
            "weights, tokenizer files), e.g. a `hf download ... --local-dir` folder",
        )
        return
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        raise ModelDirError(
            f"NAME {name!r} is not 'tiny', not an existing directory, and not a valid hub id "
            "(MODEL or ORG/MODEL of letters, digits, '-', '_', '.'); check the path or the model id"
        ) from None


def _check_skill_from(skill_from: Path, seed: int, sft_steps: int, task: Any) -> None:
    from aggbench.tiny.lab import check_skill_phase, skill_phase_record

    try:
        check_skill_phase(skill_from, skill_phase_record(seed=seed, steps=sft_steps, task=task))
    except ValueError as err:
        raise ModelDirError(f"--skill-from: {err}") from None


def _tiny(
    tmp: Path,
    seed: int,
    sft_steps: int,
    task: Any,
    progress: bool,
    probe_prompts: int,
    skill_from: Path | None,
) -> dict[str, Any]:
    """The tiny model built and warm-started in ``tmp``: its facts for aggbench_model.json."""
    from aggbench.tiny.model import build_and_warm_start

    facts = build_and_warm_start(
        tmp,
        seed=seed,
        sft_steps=sft_steps,
        task=task,
        progress=progress,
        probe_prompts=probe_prompts,
        skill_from=skill_from,
    )
    return {**facts, "sampled_accuracy": facts["probe"]["accuracy"] if facts.get("probe") else None}


def prepare_model(
    name: str,
    out_dir: Path,
    *,
    revision: str | None = None,
    seed: int = 0,
    sft_steps: int | None = None,
    worked_fraction: float | None = None,
    verbosity: int | None = None,
    gap: str | None = None,
    spread: str | None = None,
    probe_prompts: int = 32,
    config_overrides: dict[str, Any] | None = None,
    force: bool = False,
    quiet: bool = False,
    skill_from: Path | None = None,
) -> dict[str, Any] | None:
    """Prepare ``name`` in ``out_dir`` (see ``aggbench prepare-model``); returns what was recorded in
    its ``aggbench_model.json``, or None when ``out_dir`` already held this request (nothing done).
    ``skill_from`` (tiny only): continue the warm start from that saved skill phase (the same
    weights, so not part of the request).

    The tiny model's record holds its task config (``task``); the lab knobs (``gap``, ``spread``)
    appear there only when they differ from the default task, so directories prepared before the
    knobs existed still match a default request.
    """
    from aggbench.tiny.model import DEFAULT_SFT_STEPS  # cheap: torch is imported lazily there
    from aggbench.tiny.task import KNOBS, TaskConfig

    out_dir = Path(out_dir)
    overrides = {
        "worked_fraction": worked_fraction,
        "verbosity": verbosity,
        "gap": gap,
        "spread": spread,
    }
    task = replace(TaskConfig(), **{k: v for k, v in overrides.items() if v is not None})
    sft_steps = DEFAULT_SFT_STEPS if sft_steps is None else sft_steps
    task_fields = {k: v for k, v in asdict(task).items() if k not in KNOBS or k in task.knobs()}
    request = _request(name, revision, seed, sft_steps, task_fields, config_overrides or {})
    if _check_existing(out_dir, request, force):
        if name == TINY and sft_steps:
            _check_warm_start_threads(out_dir)
        return None
    _check_name(name)
    if skill_from is not None and name == TINY and sft_steps:  # before anything is written
        _check_skill_from(Path(skill_from), seed, sft_steps, task)

    tmp = out_dir.parent / f"{out_dir.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        record: dict[str, Any] = dict(request)
        if name == TINY:
            record.update(_tiny(tmp, seed, sft_steps, task, not quiet, probe_prompts, skill_from))
        elif Path(name).is_dir():
            shutil.copytree(name, tmp, symlinks=False)
            record["source"] = str(Path(name).resolve())
        else:
            _download(name, revision, tmp)
            record["source"] = "huggingface_hub"
        if config_overrides:
            record["config_replaced"] = apply_config_overrides(tmp, config_overrides)
        record["seconds"] = round(time.monotonic() - t0, 1)
        (tmp / MARKER).write_text(json.dumps(record, indent=2) + "\n")
        if out_dir.exists() and force:
            shutil.rmtree(out_dir)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            # another job finished the same directory while this one was building: keep theirs
            # when it is the same request, fail as usual otherwise
            if not _check_existing(out_dir, request, force=False):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return record
