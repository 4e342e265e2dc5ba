"""HumanEval+ and MBPP+ (EvalPlus) through evalplus's own loaders, as canonical benchmark records.

evalplus downloads its data on first use into its cache directory (``~/.cache/evalplus``);
offline it reads the file named by ``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH``. evalplus
0.3.1 reads those variables once, when its modules are imported; :func:`load_problems` applies
the current environment at each call, so setting the variable later (a test, a notebook) works.

Canonical record (prompt = evalplus's task prompt, stripped, as its chat prompt shows it)::

    {"id": "HumanEval/0", "prompt", "entry_point", "evalplus_dataset": "humaneval",
     "evalplus_version": "v0.1.10", "evalplus_hash": md5 of the data file,
     "n_base": base inputs, "n_plus": plus inputs}

The inputs and the canonical solution stay out of the records (HumanEval+ has ~750 inputs per
task); the grader (:mod:`aggbench.grading.evalplus_grader`) loads them again, through the same
loader, and refuses samples whose ``evalplus_hash`` differs from the data it finds.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import Any, Literal

from aggbench.data.jsonl import DataError
from aggbench.data.sources import DataUnavailableError, Strict

OVERRIDE_ENV = {"humaneval": "HUMANEVAL_OVERRIDE_PATH", "mbpp": "MBPP_OVERRIDE_PATH"}
_NAMES = {"humaneval": "HumanEvalPlus", "mbpp": "MbppPlus"}
_DEFAULT_VERSION_ATTR = {"humaneval": "HUMANEVAL_PLUS_VERSION", "mbpp": "MBPP_PLUS_VERSION"}


class EvalPlusSource(Strict):
    """An EvalPlus dataset: ``dataset`` (humaneval | mbpp) at release ``version`` (e.g. v0.1.10)."""

    dataset: Literal["humaneval", "mbpp"]
    version: str


@contextlib.contextmanager
def _current_override(dataset: str) -> Iterator[tuple[Any, str | None]]:
    """evalplus's data module with its override variable set from the environment now."""
    module = importlib.import_module(f"evalplus.data.{dataset}")
    var = OVERRIDE_ENV[dataset]
    old, now = getattr(module, var), os.environ.get(var) or None
    setattr(module, var, now)
    try:
        yield module, now
    finally:
        setattr(module, var, old)


def load_problems(dataset: str, version: str, *, name: str | None = None) -> tuple[dict[str, dict], str, str]:
    """(evalplus problems by task id, md5 of the data file, where the data came from).

    ``version``: an evalplus release (``v0.1.10``) or ``default`` (the installed evalplus's own).

    Errors name the override variable to set when the data cannot be had (offline, no cache).
    """
    name = name or f"{dataset}_plus"
    var = OVERRIDE_ENV[dataset]
    try:
        import evalplus.data as ep_data
        from evalplus.data.utils import get_dataset_metadata
    except ImportError as exc:
        raise DataUnavailableError(
            f"{name}: HumanEval+/MBPP+ need the evalplus package: pip install 'aggbench[eval]' ({exc})"
        ) from exc
    with _current_override(dataset) as (module, override):
        default = getattr(module, _DEFAULT_VERSION_ATTR[dataset])
        version = default if version == "default" else version
        cache_path = get_dataset_metadata(_NAMES[dataset], version, False)[1]
        if override is not None and not os.path.isfile(override):
            raise DataUnavailableError(
                f"{name}: {var}={override!r} is not a file; point {var} at a local "
                f"{_NAMES[dataset]}-{version}.jsonl (the evalplus release file, gunzipped)"
            )
        if override is None and dataset == "humaneval" and version != default:
            # evalplus 0.3.1 ignores the version argument for HumanEval+ and always loads its default
            raise DataUnavailableError(
                f"{name}: this evalplus loads HumanEval+ {default} only, not {version!r}; set "
                f"evalplus.version: {default} in the benchmark YAML, or give the file through {var}"
            )
        get, get_hash = (
            (ep_data.get_human_eval_plus, ep_data.get_human_eval_plus_hash)
            if dataset == "humaneval"
            else (ep_data.get_mbpp_plus, ep_data.get_mbpp_plus_hash)
        )
        try:
            problems, digest = get(version=version), get_hash(version=version)
        except AssertionError as exc:  # evalplus's completeness check: a field is missing
            raise DataError(
                override or cache_path, None, None, f"not an evalplus {dataset} file: {exc}"
            ) from None
        except Exception as exc:  # the download (offline: no network) or a bad file
            raise DataUnavailableError(
                f"{name}: evalplus could not load {_NAMES[dataset]} {version} "
                f"({type(exc).__name__}: {exc}). evalplus downloads it on first use; offline, set "
                f"{var} to a local copy of {_NAMES[dataset]}-{version}.jsonl, or put that file at "
                f"{cache_path} ({var} is {'set to ' + repr(override) if override else 'unset'})."
            ) from exc
    return problems, digest, override or cache_path


def to_records(
    problems: dict[str, dict], dataset: str, version: str, digest: str, where: str
) -> list[dict[str, Any]]:
    """Canonical records (see the module docstring), in the file's order."""
    records = []
    for line, (task_id, problem) in enumerate(problems.items(), start=1):
        for key in ("prompt", "entry_point"):
            if not isinstance(problem.get(key), str) or not problem[key].strip():
                raise DataError(where, line, key, f"task {task_id!r}: expected a non-empty string")
        records.append({
            "id": task_id,
            "prompt": problem["prompt"].strip(),
            "entry_point": problem["entry_point"],
            "evalplus_dataset": dataset,
            "evalplus_version": version,
            "evalplus_hash": digest,
            "n_base": len(problem["base_input"]),
            "n_plus": len(problem["plus_input"]),
        })  # fmt: skip
    return records


def load_records(source: EvalPlusSource, *, name: str) -> tuple[list[dict[str, Any]], str]:
    """(canonical records, a description of the source) for a benchmark spec's ``evalplus:``."""
    problems, digest, where = load_problems(source.dataset, source.version, name=name)
    return to_records(
        problems, source.dataset, source.version, digest, where
    ), f"evalplus:{source.dataset}@{source.version} {where}"
