"""The experiment grid: models x datasets x aggregation instances x seeds, and its jobs.

The Snakefile imports this module (the package never imports Snakemake) to expand the grid, and
``aggbench grid check`` runs the same validation from the shell. Validation happens before any job
starts: JSON schema first (misspelled keys, negative steps), then what a schema cannot know
(registered rules after loading plugins, known benchmarks and datasets, local model paths, the
per-cell training config), each error naming the key and the allowed values.
"""

from __future__ import annotations

import copy
import difflib
import itertools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from aggbench.errors import InputError
from aggbench.layout import RUNS, benchmark_data_dir, cell_id, data_file, experiment_file
from aggbench.resources import resource_problems

log = logging.getLogger(__name__)

SCHEMA_PATH = Path(__file__).parent / "schemas" / "experiment.schema.yaml"
REPO_ROOT = Path(__file__).resolve().parents[2]


class GridError(InputError, ValueError):
    """An experiment config that cannot run; the message names the key and the allowed values."""


@dataclass(frozen=True)
class Cell:
    id: str
    model: str
    dataset: str
    aggregation: str
    seed: int


def load_schema() -> dict:
    return yaml.safe_load(SCHEMA_PATH.read_text())


def load_experiment(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise GridError(f"experiment config {path} does not exist")
    from aggbench.config_errors import read_yaml_mapping

    exp = read_yaml_mapping(path, what="experiment config", error=GridError)
    # A plugin may sit beside its config, as under Snakemake (the Snakefile adds the config's folder).
    validate_experiment(exp, search_paths=[path.resolve().parent])
    return _results_here(path, exp)


def _results_here(path: Path, exp: dict) -> dict:
    """A results directory's own experiment.yaml (the workflow writes it there) names the directory
    it lies in: a copied results directory (``cp -a results /project/results``) holds the original's
    ``results_dir``, and reading it so would make ingest and report write into the original."""
    here = path.resolve().parent
    if path.name != experiment_file(".").name or not (here / RUNS).is_dir():
        return exp
    named = results_dir(exp).resolve()
    if named != here:
        log.warning(
            "%s: results_dir %s is not the directory of this file (a copy); using %s", path, named, here
        )
        exp = {**exp, "results_dir": str(here)}
    return exp


def _schema_errors(exp: dict) -> list[str]:
    import jsonschema

    validator = jsonschema.Draft202012Validator(load_schema())
    out = []
    for err in sorted(validator.iter_errors(exp), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "(top level)"
        if err.validator == "additionalProperties":
            known = sorted(err.schema.get("properties", {}))
            extra = sorted(set(err.instance) - set(known))
            guesses = [
                f"{key!r} -> did you mean {close[0]!r}?"
                for key in extra
                if (close := difflib.get_close_matches(key, known, n=1, cutoff=0.6))
            ]
            hint = f" ({'; '.join(guesses)})" if guesses else ""
            out.append(
                f"{where}: unknown key(s) {', '.join(map(repr, extra))}{hint}; allowed keys: {', '.join(known)}"
            )
        elif list(err.absolute_path)[:1] == ["benchmarks"] and err.validator == "pattern":
            out.append(
                f"{where}: {err.instance!r} is not a benchmark name (letters, digits, _ and - only): name a "
                "benchmark YAML of configs/benchmarks/ (or of a directory in $AGGBENCH_BENCHMARK_DIR) without "
                "its .yaml, e.g. math500; a benchmark's data files come from its YAML or $AGGBENCH_DATA_DIR"
            )
        else:
            out.append(f"{where}: {err.message}")
    return out


RANDOM_SUFFIX = "-random"  # a random-reward control's instance name: <aggregation>-random


def aggregations(exp: dict) -> list[dict]:
    """The grid's aggregation instances: ``aggregations``, then ``ablations.aggregations`` when
    ``ablations.enabled`` (off by default: an ablation adds cells, it never changes the main ones),
    then the random-reward controls when ``controls.random_reward.enabled``: for each named
    instance, ``<name>-random``, the same rule trained on a seeded Bernoulli(p) reward (a negative
    control: a gain that also appears there is not the verifier's doing)."""
    abl = exp.get("ablations") or {}
    out = list(exp["aggregations"]) + (list(abl.get("aggregations") or []) if abl.get("enabled") else [])
    rnd = (exp.get("controls") or {}).get("random_reward") or {}
    if rnd.get("enabled"):
        from aggbench.aggregation import resolve_instance  # torch: only for a grid with controls

        by_name = {a["name"]: a for a in out}
        for name in rnd.get("aggregations") or [a["name"] for a in exp["aggregations"]]:
            base = by_name.get(name, {"name": name})
            inst = resolve_instance(base)
            out.append(
                {
                    "name": name + RANDOM_SUFFIX,
                    "rule": inst.rule,
                    "params": dict(inst.params),
                    "reward": "random",
                    "random_p": float(rnd.get("p", 0.5)),
                }
            )
    return out


def fill_defaults(exp: dict) -> dict:
    """Schema defaults for the top level and evaluation (what snakemake.utils.validate also sets)."""
    schema = load_schema()["properties"]
    for key in ("results_dir", "tracking_uri", "plugins"):
        exp.setdefault(key, copy.deepcopy(schema[key]["default"]))
    ev = exp.setdefault("evaluation", {})
    for key, spec in schema["evaluation"]["properties"].items():
        if "default" in spec:
            ev.setdefault(key, spec["default"])
    exp.setdefault("resources", {})
    return exp


def selection(exp: dict) -> dict[str, str | dict[str, str]]:
    """``evaluation.selection`` as written: {test benchmark: selection benchmark, or {dataset:
    selection benchmark}} (empty: no "selected" table)."""
    return dict((exp.get("evaluation") or {}).get("selection") or {})


def selection_for(exp: dict, dataset: str) -> dict[str, str]:
    """{test benchmark: the benchmark the checkpoints of ``dataset``'s cells are selected on}: a
    per-dataset entry resolves to ``dataset``'s (a held-out slice of the set those cells trained on)."""
    out = {}
    for test, sel in selection(exp).items():
        chosen = sel.get(dataset) if isinstance(sel, dict) else sel
        if chosen:
            out[test] = chosen
    return out


def selection_benchmarks(exp: dict) -> set[str]:
    """Every benchmark some test benchmark is selected on (none of them is a table column)."""
    return {b for sel in selection(exp).values() for b in (sel.values() if isinstance(sel, dict) else [sel])}


def test_benchmarks(exp: dict) -> list[str]:
    """The benchmarks the tables show as columns: all but the selection benchmarks."""
    chosen_on = selection_benchmarks(exp)
    return [b for b in exp["benchmarks"] if b not in chosen_on]


def _data_problems(exp: dict) -> list[str]:
    """The benchmark and training-set specs load; the selection, holdouts, prepared training files
    and fetched copies agree with them (:mod:`aggbench.data.grid_checks`)."""
    from aggbench.data.grid_checks import (
        fetched_problems,
        holdout_problems,
        load_data_specs,
        selection_problems,
        split_problems,
    )

    specs = load_data_specs(exp)
    root = results_dir(exp)
    problems = list(specs.problems)
    problems += selection_problems(exp, selection(exp), specs)
    prepared = {name: data_file(root, name) for name in exp["datasets"]}
    problems += holdout_problems(specs, prepared)
    problems += fetched_problems(specs, benchmark_data_dir(root))
    problems += split_problems(specs, prepared, benchmark_data_dir(root))
    for name, ds in exp["datasets"].items():
        problems += _random_reward_problems(name, ds)
    return problems


def validate_experiment(exp: dict, *, search_paths: list[Path] | tuple = ()) -> None:
    """Raise GridError listing every problem, or return None.

    Plugins are looked up in ``search_paths`` (a config's folder), the working directory and the
    repository root."""
    errors = _schema_errors(exp)
    if errors:
        raise GridError("invalid experiment config:\n  " + "\n  ".join(errors))
    fill_defaults(exp)
    from aggbench.aggregation import load_plugins, resolve_instance

    problems: list[str] = resource_problems(exp)
    try:
        load_plugins(exp["plugins"], search_paths=[Path.cwd(), REPO_ROOT, *search_paths])
    except Exception as exc:
        problems.append(f"plugins: {exc}")
    names = [a["name"] for a in aggregations(exp)]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"aggregations: duplicate instance name(s) {dupes}")
    for i, agg in enumerate(aggregations(exp)):
        try:
            resolve_instance(agg)
        except Exception as exc:
            problems.append(f"aggregations[{i}] ({agg['name']}): {exc}")
    problems += _data_problems(exp)
    for name, m in exp["models"].items():
        if m.get("path") and not Path(m["source"]).is_dir():
            problems.append(f"models.{name}.source: local model directory {m['source']!r} does not exist")
        if m.get("task") and m["source"] != "tiny":
            problems.append(
                f"models.{name}.task: applies to source 'tiny' only (the warm start), not {m['source']!r}"
            )
    if not problems:
        cfg = None
        first = cells(exp)[0].id
        try:
            cfg = cell_train_config(exp, first)
        except Exception as exc:
            problems += _training_problems(exc, first)
        for name, m in exp["models"].items():
            positions = m.get("config_overrides", {}).get("max_position_embeddings")
            if m.get("max_context") and isinstance(positions, int) and m["max_context"] > positions:
                problems.append(
                    f"models.{name}: max_context {m['max_context']} exceeds the "
                    f"config_overrides.max_position_embeddings {positions} it is prepared with; "
                    "make them equal"
                )
            if cfg is None or not m.get("max_context"):
                continue
            mc = cell_train_config(exp, next(c.id for c in cells(exp) if c.model == name))
            need = mc.sampling.max_prompt_tokens + mc.sampling.max_new_tokens
            if need > m["max_context"]:
                problems.append(
                    f"models.{name}: sampling.max_prompt_tokens + max_new_tokens = {need} exceeds its "
                    f"max_context {m['max_context']}; lower them in models.{name}.training.sampling"
                )
        if cfg is not None:
            every = cfg.checkpoint.every
            ev_every = exp["evaluation"].get("every", every)
            if ev_every % every:
                problems.append(
                    f"evaluation.every={ev_every} must be a multiple of training.checkpoint.every={every} "
                    "(only checkpoints can be evaluated)"
                )
    if problems:
        raise GridError("invalid experiment config:\n  " + "\n  ".join(problems))


def _training_problems(exc: Exception, cell: str) -> list[str]:
    """One line per bad field of a cell's training config, by its path in the experiment config
    (``training.algorithm.lr``) where it comes from the ``training`` section."""
    fields = getattr(exc, "fields", None)
    if fields is None:
        return [f"training: {exc}"]
    keys = getattr(exc, "training_keys", set())
    out = []
    for loc, msg in fields:
        where = f"training.{loc}" if loc.split(".")[0] in keys else loc or "training"
        out.append(f"{where}: {msg} (the training config of cell {cell})")
    return out


def _random_reward_problems(name: str, ds: dict) -> list[str]:
    """random as a dataset's own reward would put coin flips in a main row, tabled as a rule."""
    return [
        f"datasets.{name}.{key}: random is the negative control, not a dataset's reward: "
        "set controls.random_reward.enabled: true (it adds <rule>-random cells beside the grid's)"
        for key in ("reward", "compare_reward")
        if ds.get(key) == "random"
    ]


def cells(exp: dict) -> list[Cell]:
    return [
        Cell(cell_id(m, d, a["name"], s), m, d, a["name"], s)
        for m, d, a, s in itertools.product(exp["models"], exp["datasets"], aggregations(exp), exp["seeds"])
    ]


def cell_by_id(exp: dict, cid: str) -> Cell:
    for c in cells(exp):
        if c.id == cid:
            return c
    raise GridError(f"cell {cid!r} is not in this grid")


def _merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in (over or {}).items():
        out[k] = (
            _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
        )
    return out


def results_dir(exp: dict) -> Path:
    return Path(exp.get("results_dir", "results"))


def total_steps(exp: dict, model: str | None = None) -> int:
    training = _merge(exp["training"], exp["models"][model].get("training", {}) if model else {})
    return int(training.get("algorithm", {}).get("total_steps", 20))


def checkpoint_steps(exp: dict, model: str | None = None) -> list[int]:
    """Steps at which training segments end: every k steps, and the last step."""
    training = _merge(exp["training"], exp["models"][model].get("training", {}) if model else {})
    every = int(training.get("checkpoint", {}).get("every", 5))
    last = total_steps(exp, model)
    return sorted(set(range(every, last + 1, every)) | {last})


def eval_steps(exp: dict, model: str | None = None) -> list[int]:
    """Checkpoint steps that are evaluated (step 0, the base model, is evaluated per model)."""
    steps = checkpoint_steps(exp, model)
    every = exp["evaluation"].get("every")
    if not every:
        return steps
    return sorted({s for s in steps if s % every == 0} | {steps[-1]})


def cell_train_config(exp: dict, cid: str, *, specs: dict[str, Any] | None = None) -> Any:
    """The validated TrainConfig of one cell (paths under results_dir). specs: a dict the caller
    keeps across calls, {dataset: its loaded spec}, so a loop over cells loads each spec once."""
    from aggbench.config import TrainConfig
    from aggbench.data import load_training_spec

    c = cell_by_id(exp, cid)
    model = exp["models"][c.model]
    agg = next(a for a in aggregations(exp) if a["name"] == c.aggregation)
    specs = {} if specs is None else specs
    if c.dataset not in specs:
        specs[c.dataset] = load_training_spec(exp["datasets"][c.dataset]["spec"])
    ds_spec, root = specs[c.dataset], results_dir(exp)
    training = _merge(exp["training"], model.get("training", {}))
    # the rollouts' stop tokens are training's own (default: the model's EOS only, as verl's vLLM
    # rollout); models.<m>.stop_tokens are the evaluation's
    train_stops = list(training.pop("stop_tokens", None) or [])
    data = {
        **training,
        "cell_id": c.id,
        "seed": c.seed,
        "model": {
            "name": c.model,
            "path": str(root / "models" / c.model),
            "system_prompt": model.get("system_prompt"),
            "enable_thinking": model.get("enable_thinking"),
            "stop_tokens": train_stops,
            "chat_template": model.get("chat_template", True) and ds_spec.use_chat_template,
        },
        "dataset": _dataset_reward(exp, c.dataset, ds_spec.grader.name, agg)
        | {"name": c.dataset, "path": str(root / "data" / f"{c.dataset}.jsonl")},
        "aggregation": {"name": agg["name"], "rule": agg.get("rule"), "params": agg.get("params") or {}},
        "plugins": list(exp.get("plugins", [])),
        "tracking": {"tracking_uri": exp.get("tracking_uri"), "experiment": exp["experiment"]},
    }
    ckpt = dict(data.get("checkpoint", {}))
    ckpt.setdefault("eval_steps", eval_steps(exp, c.model))
    data["checkpoint"] = ckpt
    try:
        return TrainConfig.model_validate(data)
    except Exception as exc:
        from pydantic import ValidationError

        from aggbench.config import format_validation_error
        from aggbench.config_errors import error_fields

        if isinstance(exc, ValidationError):
            err = GridError(format_validation_error(exc, f"training config of cell {cid}"))
            err.fields = error_fields(exc, TrainConfig)  # type: ignore[attr-defined]
            err.training_keys = set(training)  # type: ignore[attr-defined]
            raise err from None
        raise


def _dataset_reward(exp: dict, dataset: str, spec_grader: str, agg: dict) -> dict[str, Any]:
    """A cell's reward: the dataset's (``datasets.<d>.reward``, else its spec's grader) and its
    comparison grader; a random-reward control trains on ``random`` and compares with the
    dataset's reward, so its logged disagreement shows how far the random labels are from right."""
    entry = exp["datasets"][dataset]
    reward = entry.get("reward") or spec_grader
    if agg.get("reward") == "random":
        return {"grader": "random", "random_p": agg["random_p"], "compare_grader": reward}
    return {"grader": reward, "compare_grader": entry.get("compare_reward")}


def job_counts(exp: dict) -> dict[str, int]:
    """How many jobs of each kind the grid schedules from scratch."""
    cs = cells(exp)
    n_bench = len(exp["benchmarks"])
    base = len(exp["models"]) if exp["evaluation"].get("base_model", True) else 0
    train = sum(len(checkpoint_steps(exp, c.model)) for c in cs)
    gen = sum(len(eval_steps(exp, c.model)) for c in cs)
    extra = len(exp["evaluation"].get("extra_seeds") or [])
    from aggbench.tiny.lab import shared_skill_phases  # cheap: torch is imported inside functions

    return {
        "cells": len(cs),
        "prepare_model": len(exp["models"]),
        "prepare_data": len(exp["datasets"]),
        "fetch_benchmarks": 1,
        "train": train,
        "generate": gen,
        "grade": gen * n_bench,
        "generate_base": base,
        "grade_base": base * n_bench,
        "prepare_skill_phase": len(shared_skill_phases(exp["models"])),
        "generate_eval_seed": gen * extra,
        "grade_eval_seed": gen * n_bench * extra,
    }
