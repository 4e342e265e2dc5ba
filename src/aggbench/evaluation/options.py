"""How ``aggbench generate`` samples, declared once: :class:`GenerateOptions`.

Each field the command line sets carries a :class:`Flag` in its metadata (the option's name, its
help, the checks on its value); ``aggbench.cli.common`` builds the click options of ``generate``,
``evaluate`` and ``crosscheck`` from them. :data:`WORKFLOW` says where the generate rules take an
option's value from in the experiment config; ``workflow/rules/common.smk`` builds ``aggbench
generate``'s arguments with :func:`workflow_args`, the flags coming from the same fields.

Imports only the standard library: the Snakefile imports this module on a login node.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass(frozen=True)
class Flag:
    """A field's command-line option: ``name`` (``--top-p``; a bool field is the switch
    ``--x/--no-x``, a tuple field is repeatable), its help, and the checks on a value: ``choices``,
    a range ``min`` .. ``max`` (``min_open``: ``min`` excluded), or ``directory`` (a folder path)."""

    name: str
    help: str
    choices: tuple[str, ...] = ()
    min: int | None = None
    max: int | None = None
    min_open: bool = False
    directory: bool = False
    show_default: bool = False
    metavar: str | None = None


def _flag(default: Any, name: str, help: str, **checks: Any) -> Any:
    return field(default=default, metadata={"flag": Flag(name, help, **checks)})


@dataclass
class GenerateOptions:
    """How ``generate`` samples. ``None`` means: take it from the benchmark's YAML (or the default).

    chat_template: None = the benchmark's ``use_chat_template``; True/False force it.
    tensor_parallel_size: GPUs one vLLM engine spans (vllm only).
    chunk_prompts: prompts per engine call (None: batch_size // n for hf, all at once for vllm);
        each call gets seed ``benchmark seed + chunk index``.
    max_context: the positions a prompt + response must fit in (None: the checkpoint's
        ``max_position_embeddings``); the policy is ``aggbench.evaluation.context``.
    stop_tokens: vocabulary tokens that end a response besides the model's EOS (Qwen's
        ``<|im_end|>``, ``<|endoftext|>``: the stop words of Qwen2.5-Math's evaluation).
    greedy: also the greedy protocol (:func:`greedy_options`), written to ``OUT/greedy/``.
    progress: progress bars (the command line's ``--quiet`` turns them off).
    """

    engine: str = _flag(
        "hf",
        "--engine",
        "hf: transformers generate (CPU/GPU); vllm: needs the `gpu` extra.",
        choices=("hf", "vllm"),
        show_default=True,
    )
    limit: int | None = _flag(None, "--limit", "First N problems only.", min=1)
    n: int | None = _flag(None, "--n", "Samples per problem [YAML].", min=1)
    temperature: float | None = _flag(
        None, "--temperature", "Sampling temperature [YAML]; 0 = greedy.", min=0
    )
    top_p: float | None = _flag(None, "--top-p", "Nucleus sampling [YAML].", min=0, max=1, min_open=True)
    top_k: int | None = _flag(
        None, "--top-k", "Sample among the k most likely tokens; 0 = off [YAML, else 0].", min=-1
    )
    max_tokens: int | None = _flag(None, "--max-tokens", "Max new tokens per response [YAML].", min=1)
    seed: int = _flag(0, "--seed", "Base sampling seed.", show_default=True)
    system_prompt: str | None = _flag(None, "--system-prompt", "System message [YAML's system_prompt].")
    enable_thinking: bool | None = _flag(
        None, "--enable-thinking", "Qwen3 thinking switch passed to the chat template [template default]."
    )
    chat_template: bool | None = _flag(
        None,
        "--chat-template",
        "Format prompts with the tokenizer's chat template [YAML's use_chat_template].",
    )
    batch_size: int = _flag(64, "--batch-size", "Sequences per generate call (hf).", min=1, show_default=True)
    chunk_prompts: int | None = None
    device: str | None = _flag(None, "--device", "cpu, cuda, cuda:N or auto [auto: cuda when available].")
    dtype: str = _flag(
        "auto",
        "--dtype",
        "auto: bfloat16 on GPU, float32 on CPU.",
        choices=("auto", "float32", "bfloat16", "float16"),
        show_default=True,
    )
    data_dir: str | None = _flag(
        None, "--data-dir", "Offline benchmark files [$AGGBENCH_DATA_DIR].", directory=True
    )
    fetched: str | None = _flag(
        None,
        "--fetched",
        "A fetched copy of the benchmarks (aggbench data fetch): the only data read, checked "
        "against its lock.json; the generate rules pass {results}/data/benchmarks.",
        directory=True,
    )
    progress: bool = True
    tensor_parallel_size: int = _flag(
        1,
        "--tensor-parallel-size",
        "GPUs one vLLM engine spans (--engine vllm); the generate rule passes its job's gpus.",
        min=1,
        show_default=True,
    )
    max_context: int | None = _flag(
        None,
        "--max-context",
        "Positions a prompt + response must fit in; new tokens are capped at it minus the prompt "
        "[the checkpoint's max_position_embeddings; the generate rule passes models.<m>.max_context].",
        min=2,
    )
    stop_tokens: tuple[str, ...] = _flag(
        (),
        "--stop-token",
        "A vocabulary token that ends a response besides the model's EOS (repeatable), e.g. "
        "<|im_end|>; the generate rule passes models.<m>.stop_tokens.",
        metavar="TOKEN",
    )

    prompt_format: tuple[str, ...] = _flag(
        (),
        "--prompt-format",
        "A raw prompt format written as an evaluation's source writes it (repeatable: a benchmark "
        "gets the first whose graders include its grader; qwen25-math-cot: Qwen2.5-Math's, "
        "lcb-codeqwen: LiveCodeBench's CodeQwenInstruct style); the chat template and, for a "
        "problem-wrapping format, the benchmark's prompt_template are then not applied [none; the "
        "generate rule passes models.<m>.prompt_format].",
        metavar="NAME",
    )

    greedy: bool = _flag(
        False,
        "--greedy",
        "Also decode every problem once greedily (n=1, temperature 0: Qwen2.5-Math's protocol), "
        "with the model already loaded, into OUT/greedy/{benchmark}.jsonl [off; the generate rule "
        "passes evaluation.greedy].",
    )

    tiny_task: str | None = _flag(
        None,
        "--tiny-task",
        'The built-in task\'s warm-start knobs as JSON (TaskConfig fields, e.g. {"gap": "negative"}) for '
        "the probability metric of a tiny model on a built-in benchmark (aggbench.tiny.probability) [the "
        "default task; the generate rule passes models.<m>.task].",
    )

    def __post_init__(self) -> None:
        if isinstance(self.prompt_format, str):  # one name, as models.<m>.prompt_format may give it
            self.prompt_format = (self.prompt_format,)
        self.prompt_format = tuple(self.prompt_format or ())
        if self.prompt_format:
            from aggbench.evaluation.prompt_formats import get_prompt_format
            from aggbench.evaluation.score import EvaluationError
            from aggbench.registry import RegistryError

            for name in self.prompt_format:
                try:
                    get_prompt_format(name)
                except RegistryError as exc:
                    raise EvaluationError(f"--prompt-format: {exc}") from None
        if self.tensor_parallel_size > 1 and self.engine != "vllm":
            from aggbench.evaluation.score import EvaluationError  # not imported by the Snakefile

            raise EvaluationError(
                f"--tensor-parallel-size {self.tensor_parallel_size} applies to --engine vllm only "
                f"(the {self.engine} engine runs on one device): drop it or use --engine vllm"
            )


def greedy_options(options: GenerateOptions) -> GenerateOptions:
    """The greedy n=1 protocol of ``options``: one decode per problem at temperature 0 (top-p and
    top-k do not apply to argmax), everything else (prompt, context, stop tokens, max tokens) the
    same, so the greedy row differs from the sampled one by the decoding only."""
    return dataclasses.replace(options, n=1, temperature=0.0, top_p=None, top_k=None, greedy=False)


class FlagField(NamedTuple):
    """A field the command line sets: its name, :class:`Flag`, value type without None (int, float,
    str, bool for a switch, tuple for a repeatable option) and default."""

    name: str
    flag: Flag
    kind: type
    default: Any


@functools.cache
def flag_fields() -> dict[str, FlagField]:
    """The fields that carry a :class:`Flag`, in declaration order."""
    hints = typing.get_type_hints(GenerateOptions)
    out = {}
    for f in dataclasses.fields(GenerateOptions):
        if "flag" not in f.metadata:
            continue
        hint = hints[f.name]
        kinds = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
        kind = tuple if typing.get_origin(hint) is tuple else kinds[0]
        out[f.name] = FlagField(f.name, f.metadata["flag"], kind, f.default)
    return out


def cli_args(name: str, value: Any) -> list[str]:
    """The command-line words that give field ``name`` the value ``value``: ``--x VALUE``; a switch
    ``--x`` or ``--no-x``; a repeatable option its flag before each item."""
    f = flag_fields()[name]
    if f.kind is bool:
        return [f.flag.name if value else "--no-" + f.flag.name.removeprefix("--")]
    if f.kind is tuple:
        return [word for item in value for word in (f.flag.name, str(item))]
    return [f.flag.name, str(value)]


@dataclass(frozen=True)
class FromConfig:
    """Where the generate rules take field ``name`` from: ``section`` "evaluation" (the config's
    ``evaluation.<name>``), "model" (``models.<m>.<name>``), "model_sampling"
    (``models.<m>.evaluation_sampling.<name>``) or "job" (the generate job itself). The
    option is left out when its value is one of ``unless`` (the benchmark's, the checkpoint's or the
    template's own setting holds); ``unless=()``: always passed, the key must be there."""

    name: str
    section: str
    unless: tuple[Any, ...] = (None,)


# In the order of the generate rules' command line: it is a Snakemake param, so another order would
# re-run every generate job.
WORKFLOW: tuple[FromConfig, ...] = (
    FromConfig("engine", "evaluation", unless=()),
    FromConfig("batch_size", "evaluation", unless=()),
    FromConfig("tensor_parallel_size", "job"),
    FromConfig("limit", "evaluation"),
    FromConfig("n", "evaluation"),
    FromConfig("max_tokens", "evaluation"),
    FromConfig("max_context", "model", unless=(None, 0)),
    FromConfig("system_prompt", "model", unless=(None, "")),
    FromConfig("enable_thinking", "model"),
    FromConfig("chat_template", "model", unless=(None, True)),  # true: the benchmark's use_chat_template
    FromConfig("stop_tokens", "model"),
    FromConfig(
        "prompt_format", "model", unless=(None, "", ())
    ),  # last: added later, the others keep their order
    # models.<m>.evaluation_sampling: the model's own recommended sampling over the benchmarks' YAML
    FromConfig("temperature", "model_sampling"),
    FromConfig("top_p", "model_sampling"),
    FromConfig("top_k", "model_sampling"),
    FromConfig("greedy", "evaluation", unless=(None, False)),  # off: the command line as before
    FromConfig("tiny_task", "model_task", unless=(None,)),  # the default task: as before
)


def workflow_args(evaluation: Mapping[str, Any], model: Mapping[str, Any], gpus: int) -> list[str]:
    """``aggbench generate``'s sampling options for one model's generate jobs, in :data:`WORKFLOW`'s order.

    ``evaluation``: the config's ``evaluation`` section; ``model``: the model's entry of ``models``
    (its ``evaluation_sampling`` the section "model_sampling");
    ``gpus``: the generate job's GPUs, which vLLM spans with tensor parallelism when there are several
    (a different GPU count changes the reductions' order, so it counts as a sampling option too).
    """
    job = {"tensor_parallel_size": gpus if evaluation["engine"] == "vllm" and gpus > 1 else None}
    sections = {
        "evaluation": evaluation,
        "model": model,
        "job": job,
        "model_sampling": model.get("evaluation_sampling") or {},
        "model_task": {"tiny_task": json.dumps(model["task"], sort_keys=True) if model.get("task") else None},
    }
    args: list[str] = []
    for source in WORKFLOW:
        values = sections[source.section]
        if not source.unless:
            args += cli_args(source.name, values[source.name])
        elif (value := _as_field(source.name, values.get(source.name))) not in source.unless:
            args += cli_args(source.name, value)
    return args


def _as_field(name: str, value: Any) -> Any:
    """A config value as its field holds it: a repeatable field's one name (``prompt_format:
    qwen25-math-cot``) or list as a tuple."""
    if flag_fields()[name].kind is tuple and value is not None:
        return (value,) if isinstance(value, str) else tuple(value)
    return value
