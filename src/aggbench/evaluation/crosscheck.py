"""``aggbench crosscheck``: run lm-eval on the same checkpoint and items, and compare with ours.

For each math benchmark:

1. our canonical records (``load_benchmark``) are formatted exactly as ``aggbench generate`` does
   (template, chat template, system prompt) and written to a JSONL, with an lm-eval task YAML that
   reads it (``dataset_path: json``, absolute ``data_files``), uses that formatted text verbatim as
   ``doc_to_text`` (lm-eval adds no chat template, no BOS and no few-shot text), decodes greedily
   with ``max_gen_toks`` = our max tokens and no stop string but EOS, and scores with lm-eval's
   own ``exact_match`` on the content of the last ``\\boxed{}`` (its regex filter);
2. lm-eval runs through its Python API (``--model hf`` with ``pretrained=<local dir>``), with only
   these tasks indexed (``TaskManager(include_defaults=False)``) and ``log_samples=True``;
3. our own greedy generation (:func:`aggbench.evaluation.generate.greedy_generate`) and our grader run on the
   same items;
4. the report counts identical prompts and generations (listing every difference) and the items
   where lm-eval's verdict and ours differ (exact match vs math-verify: equivalent forms such as
   ``\\frac12`` and ``0.5`` are the expected disagreements).

Both sides decode one prompt at a time (batch size 1) by default: padding changes floating-point
reduction order, which can flip a near-tie argmax and is not what this check is about.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aggbench.evaluation.options import GenerateOptions
    from aggbench.grading.pool import GradingPool

log = logging.getLogger(__name__)

# The last \boxed{...}, with up to two levels of nested braces (lm-eval filters are regexes).
BOXED_REGEX = r"\\boxed\{((?:[^{}]|\{(?:[^{}]|\{[^{}]*\})*\})*)\}"
NO_BOX = "[no box]"


def lmeval_task_config(task: str, data_file: Path, *, max_gen_toks: int) -> dict[str, Any]:
    """An lm-eval task over a JSONL of ``{id, prompt_text, target}`` docs (greedy, exact match)."""
    return {
        "task": task,
        "dataset_path": "json",
        # absolute: a relative data_files path resolves against the CWD, not this YAML's folder;
        # a dict with a `test` key (a plain string would give a `train` split)
        "dataset_kwargs": {"data_files": {"test": str(Path(data_file).resolve())}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "prompt_text",  # a column name: lm-eval returns the text verbatim
        "doc_to_target": "target",
        "target_delimiter": "",
        "num_fewshot": 0,
        "generation_kwargs": {
            "until": [],
            "do_sample": False,
            "temperature": 0.0,
            "max_gen_toks": max_gen_toks,
        },
        "filter_list": [
            {
                "name": "boxed",
                "filter": [
                    {
                        "function": "regex",
                        "regex_pattern": BOXED_REGEX,
                        "group_select": -1,
                        "fallback": NO_BOX,
                    },
                    {"function": "take_first"},
                ],
            }
        ],
        "metric_list": [{"metric": "exact_match", "aggregation": "mean", "higher_is_better": True}],
        "metadata": {"version": 1},
    }


def write_task(
    task_dir: Path, benchmark: str, records: Sequence[Mapping], texts: Sequence[str], max_gen_toks: int
) -> str:
    """Write ``{task}.jsonl`` + ``{task}.yaml`` under ``task_dir``; returns the task name."""
    import yaml

    from aggbench.evaluation.score import write_jsonl
    from aggbench.files import write_atomic

    task = f"aggbench_xc_{benchmark}"
    docs = [
        {"id": str(r["id"]), "prompt_text": t, "target": _target(r["answer"])}
        for r, t in zip(records, texts, strict=True)
    ]
    data = write_jsonl(task_dir / f"{task}.jsonl", docs)
    config = lmeval_task_config(task, data, max_gen_toks=max_gen_toks)
    write_atomic(task_dir / f"{task}.yaml", yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
    return task


def _target(answer: Any) -> str:
    """The gold string lm-eval's exact match compares with (the first of a list of answers)."""
    return str(answer[0] if isinstance(answer, list) and answer else answer)


def lmeval_model_dir(checkpoint: Path, scratch: Path) -> tuple[Path, str | None]:
    """The directory lm-eval loads, and why it is not the checkpoint itself (None when it is).

    A ``max_new_tokens`` in the checkpoint's generation_config.json overrides the ``max_length``
    lm-eval passes to ``generate`` (transformers gives max_new_tokens precedence), so lm-eval would
    ignore ``max_gen_toks``. Then lm-eval gets a shadow directory: links to every file of the
    checkpoint and a generation_config.json without that key.
    """
    path = checkpoint / "generation_config.json"
    if not path.is_file():
        return checkpoint, None
    cfg = json.loads(path.read_text())
    if cfg.get("max_new_tokens") is None:
        return checkpoint, None
    shadow = scratch / "lmeval_model"
    shutil.rmtree(shadow, ignore_errors=True)
    shadow.mkdir(parents=True)
    for item in checkpoint.iterdir():
        if item.name != "generation_config.json":
            (shadow / item.name).symlink_to(item.resolve())
    value = cfg.pop("max_new_tokens")
    (shadow / "generation_config.json").write_text(json.dumps(cfg, indent=2))
    return shadow, (
        f"generation_config.json sets max_new_tokens={value}, which would override lm-eval's max_gen_toks; "
        f"lm-eval loads {shadow} (links to the checkpoint, that key removed)"
    )


def run_lmeval(
    model_dir: Path, task_dir: Path, tasks: list[str], *, batch_size: int, device: str, dtype: str
) -> dict:
    """``simple_evaluate`` on our task YAMLs only; returns lm-eval's results (with ``samples``)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    try:
        from lm_eval import simple_evaluate
        from lm_eval.tasks import TaskManager
    except ImportError as exc:
        from aggbench.evaluation.score import EvaluationError

        raise EvaluationError(f"the cross-check needs lm-eval: pip install 'aggbench[eval]' ({exc})") from exc
    manager = TaskManager(include_defaults=False, include_path=[str(task_dir)])
    return simple_evaluate(
        model="hf",
        model_args={"pretrained": str(model_dir), "dtype": dtype, "add_bos_token": False},
        tasks=tasks,
        task_manager=manager,
        batch_size=batch_size,
        device=device,
        log_samples=True,
        apply_chat_template=False,
        bootstrap_iters=0,
    )


def compare(
    records: Sequence[Mapping],
    texts: Sequence[str],
    ours: Sequence[str],
    our_verdicts: Sequence[Mapping],
    lm_samples: Sequence[Mapping],
    lm_on_ours: Sequence[Mapping] | None = None,
) -> dict[str, Any]:
    """Compare one benchmark item by item.

    records/texts/ours/our_verdicts: our canonical records, formatted prompts, greedy generations
    and grader verdicts (dicts with correct/extracted/reason), in record order. lm_samples:
    lm-eval's logged samples (``doc``, ``arguments``, ``resps``, ``filtered_resps``,
    ``exact_match``), any order. lm_on_ours: our grader's verdicts on lm-eval's generations.
    """
    by_id = {str(s["doc"]["id"]): s for s in lm_samples}
    missing = [str(r["id"]) for r in records if str(r["id"]) not in by_id]
    if missing:
        raise ValueError(f"lm-eval returned no sample for items {missing[:5]}")
    gen_diffs, prompt_diffs, verdict_diffs = [], [], []
    lm_correct = []
    for i, r in enumerate(records):
        s = by_id[str(r["id"])]
        theirs = _response(s)
        context = _context(s)
        if context is not None and context != texts[i]:
            prompt_diffs.append(str(r["id"]))
        if theirs != ours[i]:
            at = next(
                (k for k, (a, b) in enumerate(zip(theirs, ours[i], strict=False)) if a != b),
                min(len(theirs), len(ours[i])),
            )
            gen_diffs.append(
                {"id": str(r["id"]), "first_difference_at": at, "ours": ours[i], "lmeval": theirs}
            )
        ok = float(s.get("exact_match", 0.0)) > 0
        lm_correct.append(ok)
        if ok != bool(our_verdicts[i]["correct"]):
            verdict_diffs.append(
                {
                    "id": str(r["id"]),
                    "gold": r["answer"],
                    "ours_correct": bool(our_verdicts[i]["correct"]),
                    "ours_extracted": our_verdicts[i].get("extracted"),
                    "ours_reason": our_verdicts[i].get("reason"),
                    "lmeval_correct": ok,
                    "lmeval_extracted": _filtered(s),
                    "same_generation": theirs == ours[i],
                }
            )
    n = len(records)
    out = {
        "n_items": n,
        "identical_prompts": n - len(prompt_diffs),
        "identical_generations": n - len(gen_diffs),
        "verdict_agreement": n - len(verdict_diffs),
        "verdict_agreement_rate": (n - len(verdict_diffs)) / n if n else None,
        "accuracy": {
            "ours": sum(bool(v["correct"]) for v in our_verdicts) / n if n else None,
            "lmeval_exact_match": sum(lm_correct) / n if n else None,
        },
        "prompt_diffs": prompt_diffs,
        "generation_diffs": gen_diffs,
        "verdict_diffs": verdict_diffs,
    }
    if lm_on_ours is not None:
        out["accuracy"]["ours_grader_on_lmeval_generations"] = sum(bool(v["correct"]) for v in lm_on_ours) / n
    return out


def _response(sample: Mapping) -> str:
    resps = sample.get("resps") or [[""]]
    first = resps[0]
    return first[0] if isinstance(first, list) else first


def _filtered(sample: Mapping) -> Any:
    f = sample.get("filtered_resps")
    return f[0] if isinstance(f, list) and f else f


def _context(sample: Mapping) -> str | None:
    """The prompt string lm-eval sent to the model (its logged ``arguments``), when present."""
    args = sample.get("arguments")
    if isinstance(args, dict):  # {"gen_args_0": {"arg_0": context, "arg_1": gen_kwargs}}
        first = next(iter(args.values()), {})
        return first.get("arg_0") if isinstance(first, dict) else None
    if isinstance(args, list | tuple) and args:
        first = args[0]
        return first[0] if isinstance(first, list | tuple) else first
    return None


def crosscheck(
    checkpoint: str | Path,
    benchmarks: Sequence[str],
    out_dir: str | Path,
    *,
    limit: int | None = 20,
    max_tokens: int | None = None,
    batch_size: int = 1,
    device: str | None = None,
    dtype: str = "auto",
    system_prompt: str | None = None,
    enable_thinking: bool | None = None,
    chat_template: bool | None = None,
    data_dir: str | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Run the cross-check; writes ``out_dir/crosscheck.json`` (and lm-eval's tasks and samples)."""
    from transformers import AutoTokenizer

    import aggbench.grading.math  # noqa: F401  sympy and math-verify load before lm-eval runs, untimed
    from aggbench.devices import check_device
    from aggbench.evaluation.generate import load_model, require_checkpoint, resolve_device, resolve_dtype
    from aggbench.evaluation.options import GenerateOptions
    from aggbench.evaluation.score import write_json
    from aggbench.grading.pool import GradingPool
    from aggbench.modeldir import loading

    checkpoint, out_dir = require_checkpoint(checkpoint), Path(out_dir).resolve()
    check_device(device)
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    options = GenerateOptions(
        system_prompt=system_prompt, enable_thinking=enable_thinking, chat_template=chat_template
    )
    with loading(checkpoint, what="checkpoint"):
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    items = _write_tasks(
        benchmarks, tokenizer, options, out_dir, data_dir=data_dir, limit=limit, max_tokens=max_tokens
    )
    model_dir, note = lmeval_model_dir(checkpoint, out_dir)
    t0 = time.perf_counter()
    results = run_lmeval(
        model_dir,
        out_dir / "lmeval_tasks",
        [it["task"] for it in items.values()],
        batch_size=batch_size,
        device=device,
        dtype=dtype,
    )
    lm_s = time.perf_counter() - t0
    model, tokenizer = load_model(checkpoint, device=device, dtype=dtype)
    report: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "lmeval_model_dir": str(model_dir),
        "notes": [note] if note else [],
        "decoding": "greedy",
        "batch_size": batch_size,
        "device": device,
        "dtype": dtype,
        "versions": _versions(),
        "lmeval_s": round(lm_s, 2),
        "benchmarks": {},
    }
    t1 = time.perf_counter()
    with GradingPool(workers=workers) as pool:
        for name, it in items.items():
            samples = results["samples"][it["task"]]
            report["benchmarks"][name] = _compare_benchmark(
                name, it, samples, model, tokenizer, pool, out_dir=out_dir, batch_size=batch_size
            )
    report["ours_s"] = round(time.perf_counter() - t1, 2)
    report["ok"] = all(b["identical_generations"] == b["n_items"] for b in report["benchmarks"].values())
    write_json(out_dir / "crosscheck.json", report)
    return report


def _write_tasks(
    benchmarks: Sequence[str],
    tokenizer: Any,
    options: GenerateOptions,
    out_dir: Path,
    *,
    data_dir: str | None,
    limit: int | None,
    max_tokens: int | None,
) -> dict[str, dict[str, Any]]:
    """Per math benchmark (by spec name): our records, their prompts as ``aggbench generate`` formats
    them (texts and token ids), the response budget and the lm-eval task written for them under
    ``out_dir/lmeval_tasks``. A benchmark another grader scores is refused."""
    from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
    from aggbench.evaluation.generate import format_prompts, prompt_settings
    from aggbench.evaluation.score import EvaluationError

    items: dict[str, dict[str, Any]] = {}
    for name in benchmarks:
        spec = load_benchmark_spec(name)
        if spec.grader.name != "math":
            raise EvaluationError(
                f"crosscheck covers math benchmarks; {spec.name} uses grader {spec.grader.name!r}"
            )
        records = load_benchmark(spec, data_dir=data_dir, limit=limit)
        texts, ids = format_prompts(spec, records, tokenizer, prompt_settings(spec, options))
        max_new = max_tokens or spec.sampling.max_tokens
        task = write_task(out_dir / "lmeval_tasks", spec.name, records, texts, max_new)
        items[spec.name] = {"records": records, "texts": texts, "ids": ids, "max_new": max_new, "task": task}
    return items


def _compare_benchmark(
    name: str,
    it: Mapping[str, Any],
    samples: Sequence[Mapping],
    model: Any,
    tokenizer: Any,
    pool: GradingPool,
    *,
    out_dir: Path,
    batch_size: int,
) -> dict[str, Any]:
    """One benchmark's comparison: lm-eval's ``samples`` saved, our greedy generation of the same
    prompts, our grader on both sides' generations, then :func:`compare` and the items whose prompt
    and budget overflow the model's positions."""
    from aggbench.evaluation.generate import greedy_generate
    from aggbench.files import write_atomic
    from aggbench.grading.math import grade_math_batch, grading_options

    write_atomic(
        out_dir / f"lmeval_samples_{name}.jsonl",
        "".join(json.dumps(s, default=str, ensure_ascii=False) + "\n" for s in samples),
    )
    roll = greedy_generate(model, tokenizer, it["ids"], max_new_tokens=it["max_new"], batch_size=batch_size)
    records = it["records"]
    by_id = {str(s["doc"]["id"]): s for s in samples}
    theirs = [_response(by_id[str(r["id"])]) if str(r["id"]) in by_id else "" for r in records]
    golds = [
        [str(a) for a in r["answer"]] if isinstance(r["answer"], list) else str(r["answer"]) for r in records
    ]
    opts = [grading_options(r.get("grading")) for r in records]
    kw = {
        "pool": pool,
        "tolerances": [o.get("tolerance") for o in opts],
        "units": [o.get("unit") for o in opts],
        "multiple_answers": [o.get("multiple_answer") for o in opts],
    }
    ours_v = [v.to_dict() for v in grade_math_batch(roll.texts, golds, **kw)]
    theirs_v = [v.to_dict() for v in grade_math_batch(theirs, golds, **kw)]
    cmp = compare(records, it["texts"], roll.texts, ours_v, samples, theirs_v)
    cmp["max_gen_toks"] = it["max_new"]
    # lm-eval cuts such prompts from the left (to its max length - max_gen_toks); we do not
    limit_len = getattr(model.config, "max_position_embeddings", None)
    cmp["context_overflow"] = [
        str(r["id"])
        for r, p in zip(records, it["ids"], strict=True)
        if limit_len and len(p) + it["max_new"] > limit_len
    ]
    cmp["finished"] = sum(roll.finished)
    return cmp


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("lm_eval", "transformers", "torch")}
