"""The built-in task's probability metric in evaluation: ``aggbench generate`` computes it for a
built-in task benchmark with the model it already loaded (``aggbench.tiny.probability`` says what
it is), generation.json keeps it per benchmark, and ``aggbench score`` copies it into metrics.json."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from aggbench.evaluation.options import GenerateOptions
from aggbench.evaluation.score import EvaluationError


def tiny_task(options: GenerateOptions) -> Any:
    """``--tiny-task`` as the task's TaskConfig (the default task without it); EvaluationError naming
    the option when it is not TaskConfig fields as JSON."""
    from aggbench.tiny.task import TaskConfig

    try:
        return TaskConfig(**json.loads(options.tiny_task or "{}"))
    except (ValueError, TypeError) as exc:
        raise EvaluationError(f"--tiny-task {options.tiny_task!r}: {exc}") from None


def task_probability(
    spec: Any, recs: Sequence[Any], model: Any, tokenizer: Any, options: GenerateOptions, task: Any
) -> dict[str, Any]:
    """The probability metric of a built-in task benchmark (aggbench.tiny.probability) with the loaded
    model: {prob_correct, prob_uncovered, prob_uncovered_max, usable_below, seconds, per_problem:
    {id: [p_correct, p_covered]}}, or {"skipped": why} where it is not defined."""
    from aggbench.evaluation.generate import format_prompts, prompt_settings, sampling_for  # (a cycle)
    from aggbench.tiny.probability import USABLE_BELOW, summarize, template_probabilities
    from aggbench.tiny.task import BOX

    sampling = sampling_for(spec, options)
    if model is None:
        return {"skipped": f"engine {options.engine} holds no teacher-forcing model (hf computes it)"}
    if BOX not in tokenizer.get_vocab():
        return {"skipped": "not the tiny model's tokenizer (the templates are its tokens)"}
    if not sampling["temperature"] or sampling["top_p"] < 1 or (sampling["top_k"] or 0) > 0:
        return {"skipped": "defined for plain sampling only (temperature > 0, top-p 1, no top-k)"}
    # The longest template up to its box's closing brace (max_response_tokens counts eos too): a
    # max_tokens below it cuts that answer before it is complete, and counted as correct it would
    # break the lower bound. At exactly its length the text is whole (graded on its text) and the
    # template's P(text, eos) <= P(text): the bound holds.
    if (longest := task.max_response_tokens() - 1) > sampling["max_tokens"]:
        return {
            "skipped": f"the task's longest answer template is {longest} tokens up to its box's closing "
            f"brace, above max_tokens {sampling['max_tokens']}, which cuts it: raise max_tokens to at "
            f"least {longest}"
        }
    t0 = time.perf_counter()
    _, ids = format_prompts(spec, recs, tokenizer, prompt_settings(spec, options))  # as sampling sees them
    raw = [str(r["prompt"]) for r in recs]
    per = template_probabilities(
        model, tokenizer, raw, task, prompt_ids=ids, temperature=sampling["temperature"]
    )
    return {
        **summarize(per),
        "usable_below": USABLE_BELOW,
        "seconds": round(time.perf_counter() - t0, 3),
        "per_problem": {
            str(r["id"]): [p["p_correct"], p["p_covered"]] for r, p in zip(recs, per, strict=True)
        },
    }
