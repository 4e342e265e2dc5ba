"""``aggbench probe``: a contamination probe of a base model on benchmarks (partial-prompt completion).

The protocol of Wu et al. 2025, "Reasoning or Memorization? Unreliable Results of Reinforcement
Learning Due to Data Contamination" (arXiv 2507.10532): give the model the first 60% of each
problem statement and see whether it writes the rest verbatim. They report, on MATH-500 at 60%,
an exact-match rate of 54.6% for Qwen2.5-Math-7B and 3.8% for Llama-3.1-8B; a model that
completes a benchmark's problems verbatim has seen them, and its gains there (under random
rewards too) may be recall. Per benchmark, for each record's raw problem text (``record["prompt"]``,
before the benchmark's prompt template)::

    ids     = tokenizer(text, add_special_tokens=False)       # the model's own tokens
    k       = clamp(floor(fraction * len(ids)), 1, len(ids) - 1)
    prefix  = ids[:k]       target = ids[k:]                  # prefix + target == ids
    budget  = min(len(target), --max-tokens, context - k)     # 0: not probed (prompt_too_long)
    continuation = greedy decode of `budget` new tokens after `prefix`: no chat template, no
                   system prompt, no special tokens added, stopping only at the model's EOS
    exact   = ws(decode(continuation)) == ws(decode(target[:budget]))   # ws: whitespace collapsed

Why tokens, not characters: the split then falls where the model's own tokenisation has a
boundary, so the prefix ends exactly as the text does inside a longer document (a character split
at a word boundary leaves a prompt ending in a space, or a word without the space that BPE
tokenisers attach to the next token: an artefact that lowers exact match for reasons unrelated
to memorisation), and the remainder's length in tokens is the decode budget, with nothing to
guess. The cost: the 60% is of each model's tokens, so the split point differs slightly between
tokenisers (the rows record both parts as text, so any two models' splits can be compared).
No BOS is added (lm-eval's default for causal models, ``add_bos_token=False``).

Softer measures beside exact match, both cheap: ``prefix_match``, the fraction of the scored
target's tokens that the continuation reproduces before its first wrong token (the length of the
common prefix of the two id lists over the target's length), and ``rouge_l``, the ROUGE-L F1 of
the two texts' whitespace-separated words (the paper's second measure).

Files, each written to a temporary name and renamed into place::

    OUT/{benchmark}.jsonl   one row per record: id, prefix, target, continuation, exact, the
                            measures, token counts, budget, capped, finish_reason
    OUT/probe.json          model, engine, protocol, and per benchmark n, exact-match rate, means
    OUT/probe.md            the markdown table (also printed by the command)

The model is loaded and the engine built the way ``aggbench generate`` does
(:mod:`aggbench.evaluation.generate`); torch and transformers are imported inside the functions.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aggbench import seeds
from aggbench.evaluation.context import PROMPT_TOO_LONG
from aggbench.evaluation.options import GenerateOptions
from aggbench.evaluation.score import EvaluationError, write_json, write_jsonl
from aggbench.files import write_atomic

log = logging.getLogger(__name__)

SUMMARY_FILE = "probe.json"
TABLE_FILE = "probe.md"
_PATHS = ("data_dir", "fetched")
TOO_SHORT = "too_short"  # under 2 tokens, or a remainder of whitespace only: nothing to probe
DEFAULT_FRACTION = 0.6  # the paper's headline setting

# The GenerateOptions fields that apply to a probe (decoding is greedy and the prompt is the raw
# prefix, so the sampling and prompt options do not); the command line offers these, and probe.json
# records them but the data paths.
PROBE_FIELDS = (
    "engine",
    "limit",
    "batch_size",
    "seed",
    "device",
    "dtype",
    "data_dir",
    "fetched",
    "max_context",
    "tensor_parallel_size",
)


@dataclass
class ProbeOptions:
    """How ``aggbench probe`` runs.

    fraction: the share of each problem's tokens given as the prefix (0 < fraction < 1).
    max_tokens: a cap on the new tokens per problem (None: the remainder's length); a capped
        problem is scored on its remainder's first ``max_tokens`` tokens and counted as capped.
    label: the model's name in the table (None: the checkpoint directory's name).
    generation: the engine, device, dtype, batch size, seed, data and context options, declared
        once in :class:`~aggbench.evaluation.options.GenerateOptions`; its sampling and prompt
        fields are not used (decoding is greedy, the prompt is the raw prefix).
    """

    fraction: float = DEFAULT_FRACTION
    max_tokens: int | None = None
    label: str | None = None
    generation: GenerateOptions = field(default_factory=GenerateOptions)

    def __post_init__(self) -> None:
        if not 0 < self.fraction < 1:
            raise EvaluationError(
                f"--fraction {self.fraction}: must lie strictly between 0 and 1 (the share of each "
                "problem's tokens given to the model), e.g. 0.6"
            )
        if self.max_tokens is not None and self.max_tokens < 1:
            raise EvaluationError(f"--max-tokens {self.max_tokens}: give at least 1, or leave it out")


# --------------------------------------------------------------------------- split and measures


def split_ids(ids: Sequence[int], fraction: float) -> tuple[list[int], list[int]] | None:
    """(prefix, target) with ``prefix + target == ids`` and both non-empty; None under 2 tokens."""
    if len(ids) < 2:
        return None
    k = min(max(int(fraction * len(ids)), 1), len(ids) - 1)
    return list(ids[:k]), list(ids[k:])


def normalise(text: str) -> str:
    """Whitespace collapsed to single spaces, the ends stripped."""
    return " ".join(text.split())


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading items ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1 of two texts' whitespace-separated words (longest common subsequence)."""
    c, r = candidate.split(), reference.split()
    if not c or not r:
        return float(c == r)
    prev = [0] * (len(r) + 1)
    for word in c:
        row = [0]
        for j, ref in enumerate(r):
            row.append(prev[j] + 1 if word == ref else max(prev[j + 1], row[j]))
        prev = row
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(c), lcs / len(r)
    return 2 * precision * recall / (precision + recall)


def score_continuation(
    continuation_ids: Sequence[int], continuation: str, target_ids: Sequence[int], target: str
) -> dict[str, Any]:
    """The verdict on one continuation against the (scored) target, ids and decoded texts."""
    return {
        "exact": normalise(continuation) == normalise(target),
        "prefix_match": round(common_prefix(continuation_ids, target_ids) / len(target_ids), 6),
        "rouge_l": round(rouge_l(normalise(continuation), normalise(target)), 6),
    }


# --------------------------------------------------------------------------- one benchmark


@dataclass
class _Item:
    """One record's split: its row (without the verdict yet), ids and decode budget."""

    row: dict[str, Any]
    prefix_ids: list[int]
    scored_ids: list[int]
    budget: int


def _items(records: Sequence[Mapping[str, Any]], tokenizer: Any, options: ProbeOptions, context: int | None):
    """The split of every record, in order; a record with nothing to probe has budget 0."""
    items = []
    for record in records:
        text = str(record["prompt"])
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        parts = split_ids(ids, options.fraction)
        prefix_ids, target_ids = parts or (list(ids), [])
        want = len(target_ids) if options.max_tokens is None else min(len(target_ids), options.max_tokens)
        budget = want if context is None else max(0, min(want, context - len(prefix_ids)))
        target = tokenizer.decode(target_ids, skip_special_tokens=True)
        row = {
            "id": record["id"],
            "prefix": tokenizer.decode(prefix_ids, skip_special_tokens=True),
            "target": target,
            "prefix_tokens": len(prefix_ids),
            "target_tokens": len(target_ids),
            "budget": budget,
            "capped": 0 < budget < len(target_ids),
        }
        reason = None
        if parts is None or not normalise(target):
            reason, budget = TOO_SHORT, 0
        elif budget == 0:
            reason = PROMPT_TOO_LONG
        if reason:
            row.update(budget=0, capped=False, continuation="", continuation_tokens=0)
            row.update(finish_reason=reason, exact=None, prefix_match=None, rouge_l=None)
        items.append(_Item(row, prefix_ids, target_ids[:budget], budget))
    return items


def _greedy(engine: Any, kind: str, prompts: list[list[int]], budgets: list[int], seed: int):
    """Greedy continuations (a :class:`~aggbench.rollout.base.Rollouts`, one per prompt)."""
    if kind == "hf":
        return engine.generate_greedy(prompts, max_new_tokens=budgets)
    return engine.generate(prompts, n=1, temperature=0.0, top_p=1.0, max_new_tokens=budgets, seed=seed)


def probe_records(
    name: str,
    records: Sequence[Mapping[str, Any]],
    engine: Any,
    tokenizer: Any,
    options: ProbeOptions,
    context: int | None,
) -> list[dict[str, Any]]:
    """One row per record of benchmark ``name`` (see the module docstring), in record order."""
    from tqdm.auto import tqdm

    gen = options.generation
    items = _items(records, tokenizer, options, context)
    todo = [it for it in items if it.budget > 0]
    per_call = gen.chunk_prompts or (len(todo) if gen.engine == "vllm" else gen.batch_size)
    seed = seeds.benchmark(gen.seed, name)
    show = gen.progress and sys.stderr.isatty()
    special = set(tokenizer.all_special_ids)
    with tqdm(total=len(todo), desc=f"probe {name}", unit="problem", disable=not show) as bar:
        for c, start in enumerate(range(0, len(todo), max(per_call, 1))):
            chunk = todo[start : start + per_call]
            roll = _greedy(
                engine,
                gen.engine,
                [it.prefix_ids for it in chunk],
                [it.budget for it in chunk],
                seeds.eval_chunk(seed, c),
            )
            for i, it in enumerate(chunk):
                # decoded here, the same way for both engines (vLLM's own text is detokenised
                # in the prompt's context, which can differ in a leading space)
                ids = [t for t in roll.response_ids[i] if t not in special]
                text = tokenizer.decode(ids, skip_special_tokens=True)
                target = tokenizer.decode(it.scored_ids, skip_special_tokens=True)
                it.row.update(continuation=text, continuation_tokens=len(ids))
                it.row["finish_reason"] = "stop" if roll.finished[i] else "length"
                it.row.update(score_continuation(ids, text, it.scored_ids, target))
            bar.update(len(chunk))
    return [it.row for it in items]


def summarise(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A benchmark's summary, computed from its rows alone: ``exact_match`` is the share of the
    probed rows (those with a verdict) whose continuation is exact."""
    probed = [r for r in rows if r["exact"] is not None]
    n = len(probed)
    mean = lambda key: round(sum(r[key] for r in probed) / n, 6) if n else None  # noqa: E731
    reasons = sorted({r["finish_reason"] for r in rows if r["exact"] is None})
    return {
        "n_problems": len(rows),
        "n": n,
        "n_exact": sum(bool(r["exact"]) for r in probed),
        "exact_match": round(sum(bool(r["exact"]) for r in probed) / n, 6) if n else None,
        "prefix_match": mean("prefix_match"),
        "rouge_l": mean("rouge_l"),
        "not_probed": {k: sum(r["finish_reason"] == k for r in rows if r["exact"] is None) for k in reasons},
        "capped": sum(bool(r["capped"]) for r in probed),
        "mean_prefix_tokens": mean("prefix_tokens"),
        "mean_target_tokens": mean("target_tokens"),
    }


# --------------------------------------------------------------------------- the table


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def markdown_table(info: Mapping[str, Any]) -> str:
    """The markdown table of a probe.json's content: one line per benchmark."""
    head = "| model | benchmark | fraction | n | exact match | prefix match | ROUGE-L | not probed | capped |"
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, b in info["benchmarks"].items():
        exact = f"{_pct(b['exact_match'])} ({b['n_exact']}/{b['n']})"
        skipped = sum(b["not_probed"].values())
        cells = [info["label"], name, f"{info['fraction']:g}", str(b["n"]), exact]
        cells += [_num(b["prefix_match"]), _num(b["rouge_l"]), str(skipped), str(b["capped"])]
        lines.append("| " + " | ".join(cells) + " |")
    note = (
        f"\nGreedy continuation of the first {info['fraction']:.0%} of each problem's tokens (no chat "
        "template); exact match after whitespace normalisation; prefix match: share of the remainder's "
        "tokens reproduced before the first wrong one; ROUGE-L: F1 over words. Not probed: prompt "
        "longer than the context, or under 2 tokens. Capped: scored on the first --max-tokens tokens."
    )
    return "\n".join(lines) + "\n" + note + "\n"


# --------------------------------------------------------------------------- the command


def probe_benchmarks(
    checkpoint: str | Path,
    benchmarks: Sequence[str],
    out_dir: str | Path,
    options: ProbeOptions | None = None,
) -> dict[str, Any]:
    """Probe one model on every benchmark (model loaded once); writes the files of the module
    docstring and returns probe.json's content (its ``table`` is the markdown table)."""
    from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
    from aggbench.devices import check_device
    from aggbench.evaluation.context import model_context
    from aggbench.evaluation.generate import (
        _make_engine,
        _versions,
        _vllm_device,
        require_checkpoint,
        resolve_device,
    )

    options = options or ProbeOptions()
    gen = options.generation
    checkpoint = require_checkpoint(checkpoint)
    check_device(gen.device)
    if not benchmarks:
        raise EvaluationError("give at least one benchmark (--benchmarks A,B,...)")
    twice = sorted({b for b in benchmarks if list(benchmarks).count(b) > 1})
    if twice:
        raise EvaluationError(f"--benchmarks names {', '.join(twice)} twice: give each benchmark once")
    # Everything that can fail on bad input fails before the (slow) model load.
    specs = [load_benchmark_spec(b) for b in benchmarks]
    records = [load_benchmark(s, data_dir=gen.data_dir, limit=gen.limit, fetched=gen.fetched) for s in specs]
    for spec, recs in zip(specs, records, strict=True):
        if not recs:
            raise EvaluationError(f"benchmark {spec.name}: no records (source {recs.source})")
    t_start = time.perf_counter()
    context = gen.max_context or model_context(checkpoint)
    engine, _model, tokenizer = _make_engine(gen.engine, checkpoint, gen, context)
    load_s = time.perf_counter() - t_start
    out = Path(out_dir)
    summary: dict[str, Any] = {}
    for spec, recs in zip(specs, records, strict=True):
        t0 = time.perf_counter()
        rows = probe_records(spec.name, recs, engine, tokenizer, options, context)
        write_jsonl(out / f"{spec.name}.jsonl", rows)
        summary[spec.name] = {
            "file": f"{spec.name}.jsonl",
            "spec_version": spec.version,
            "source": recs.source,
            **summarise(rows),
            "seconds": round(time.perf_counter() - t0, 3),
        }
        log.info("%s: exact match %s", spec.name, _pct(summary[spec.name]["exact_match"]))
    info = {
        "checkpoint": str(checkpoint),
        "label": options.label or checkpoint.name,
        "engine": gen.engine,
        "device": resolve_device(gen.device) if gen.engine == "hf" else f"vllm ({_vllm_device()})",
        "fraction": options.fraction,
        "max_tokens": options.max_tokens,
        "max_context": context,
        "protocol": {
            "split": "tokens of the model's tokenizer, no special tokens added",
            "prompt": "the raw prefix: no chat template, no system prompt, no benchmark template",
            "decoding": "greedy, stopping at the model's EOS only",
            "exact": "whitespace-normalised continuation == whitespace-normalised remainder",
        },
        "seed": gen.seed,
        "batch_size": gen.batch_size,
        "benchmarks": summary,
        "model_load_s": round(load_s, 3),
        "total_s": round(time.perf_counter() - t_start, 3),
        "options": {k: v for k, v in asdict(gen).items() if k in PROBE_FIELDS and k not in _PATHS},
        "versions": _versions(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    table = markdown_table(info)
    write_json(out / SUMMARY_FILE, info)
    write_atomic(out / TABLE_FILE, table)
    return {**info, "table": table}
