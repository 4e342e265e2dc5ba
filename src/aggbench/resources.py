"""A rule's resources (cpus, mem_mb, runtime, gpus): how a config's ``resources:`` and
``models.<m>.resources:`` resolve, and the near misses of their keys that validation reports.

workflow/rules/common.smk and ``aggbench plan`` both resolve resources through :func:`resource`, so
the plan costs what the jobs request.
"""

from __future__ import annotations

import difflib
from typing import Any

# What a rule gets when neither `resources.<rule>` nor `models.<m>.resources.<rule>` sets a key
# (grade's cpus: evaluation.workers).
RESOURCE_FALLBACK = {"cpus": 1, "mem_mb": 4000, "runtime": 60, "gpus": 0}
# The keys the workflow itself reads; every other key goes to the SLURM executor unchanged, so a
# misspelling of one of these would silently leave its default in force.
RESOURCE_KEYS = tuple(sorted(RESOURCE_FALLBACK))


def resource(exp: dict, section: str, model: str | None, key: str) -> Any:
    """A rule section's resource ``key``: model override > config > fallback (grade's cpus fall
    back to ``evaluation.workers``)."""
    value = exp["evaluation"].get("workers", 2) if (section, key) == ("grade", "cpus") else None
    value = RESOURCE_FALLBACK.get(key) if value is None else value
    value = (exp.get("resources") or {}).get(section, {}).get(key, value)
    if model is not None:
        value = ((exp["models"][model].get("resources") or {}).get(section) or {}).get(key, value)
    return value


# Near misses of them; `gpu` and `cpus_per_task` are also the executor's own names, which the
# workflow sets from `gpus` and `cpus` (a config's value would be overwritten or skip threads:).
RESOURCE_ALIASES = {
    "cpu": "cpus",
    "cpus_per_task": "cpus",
    "cores": "cpus",
    "threads": "cpus",
    "gpu": "gpus",
    "gpus_per_node": "gpus",
    "mem": "mem_mb",
    "memory": "mem_mb",
    "mem_gb": "mem_mb",
    "time": "runtime",
    "walltime": "runtime",
    "time_min": "runtime",
}


def resource_problems(exp: dict) -> list[str]:
    """``resources.<rule>.<key>`` (and per model) whose key is a near miss of a standard key."""

    sections = [("resources", exp.get("resources") or {})]
    for name, m in (exp.get("models") or {}).items():
        sections.append((f"models.{name}.resources", (m or {}).get("resources") or {}))
    out = []
    for where, res in sections:
        for rule, keys in res.items():
            for key in keys if isinstance(keys, dict) else ():
                if key in RESOURCE_KEYS:
                    continue
                want = RESOURCE_ALIASES.get(key) or next(
                    iter(difflib.get_close_matches(key, RESOURCE_KEYS, n=1, cutoff=0.8)), None
                )
                if want:
                    out.append(
                        f"{where}.{rule}.{key}: did you mean {want!r}? The workflow reads "
                        f"{', '.join(RESOURCE_KEYS)} (mem_mb in MB, runtime in minutes); other keys "
                        "(slurm_partition, constraint, qos, ...) go to the SLURM executor unchanged"
                    )
    return out


def partial_keys(exp: dict) -> list[str]:
    """Pass-through keys (not the workflow's own) that some models set for a rule and others leave
    unset, with no config-wide value: Snakemake then declares the key for the whole rule, so the
    other models' jobs go without it, the SLURM profile's default-resources value included (a
    rule's resource replaces the profile's default for all its jobs). One warning each."""
    models = exp.get("models") or {}
    top = exp.get("resources") or {}
    per = {m: (spec or {}).get("resources") or {} for m, spec in models.items()}
    out = []
    for rule in sorted({r for res in per.values() for r in res}):
        keys = {k for res in per.values() for k in (res.get(rule) or {}) if k not in RESOURCE_KEYS}
        for key in sorted(keys - set(top.get(rule) or {})):
            unset = [m for m in models if key not in (per[m].get(rule) or {})]
            if unset:
                have = [m for m in models if m not in unset]
                out.append(
                    f"resources: {rule}.{key} is set for {', '.join(have)} but not for {', '.join(unset)} nor "
                    f"under resources.{rule}: their {rule} jobs are submitted without it, and the SLURM "
                    f"profile's default-resources value of {key} does not reach them either (the rule's "
                    f"resource replaces it for all its jobs); set it for every model, or under resources.{rule}"
                )
    return out


def requests_gpus(exp: dict, sections: tuple[str, ...] = ("train", "generate", "generate_base")) -> bool:
    """Whether any model's job of these rule sections asks for a GPU (then the grid is meant for a
    cluster); each model's value already falls back to the config's."""
    return any(resource(exp, s, m, "gpus") for m in exp["models"] for s in sections)
