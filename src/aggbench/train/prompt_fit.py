"""Training prompts that fit ``sampling.max_prompt_tokens``, decided once, before any is drawn.

A record is kept iff its prompt, built exactly as the trainer builds it (``dataset.prompt_template``,
then the model's chat template with the generation header, :mod:`aggbench.prompts`), is at most
``sampling.max_prompt_tokens`` token ids long with the cell's own tokenizer. That is verl's
``data.filter_overlong_prompts`` (``verl/utils/dataset/rl_dataset.py``: keep a row iff
``len(tokenizer.apply_chat_template(messages, add_generation_prompt=True)) <= max_prompt_length``).

Two callers, one rule:

- ``aggbench prepare-data SPEC --out FILE --fit-to CELL.yaml`` drops the rows when the data is
  written, and writes their count and ids beside it (``layout.data_filter_file``) and prints them.
- The trainer applies the same filter to ``dataset.path`` when it starts (every segment, every
  rank: a deterministic function of the file, the tokenizer and the config), so data prepared
  without ``--fit-to``, or by an older version, never crashes a cell in the middle of training;
  the count and ids are logged and written to the run directory (``layout.prompt_filter_file``).
  The step's prompts are drawn from the kept records only, so a resume never draws a dropped one.

A dataset in which no record fits is refused, naming the field and the fix.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aggbench.data.jsonl import DataError
from aggbench.files import relative_to_file, write_atomic
from aggbench.prompts import overlong_prompts

log = logging.getLogger(__name__)
LIMIT = "sampling.max_prompt_tokens"
EXPERIMENT_LIMIT = "models.<model>.training.sampling.max_prompt_tokens"


def prompt_options(cfg: Any) -> dict[str, Any]:
    """Keyword arguments of :func:`aggbench.prompts.format_prompt` for a cell (its model's settings)."""
    return {
        "system_prompt": cfg.model.system_prompt,
        "enable_thinking": cfg.model.enable_thinking,
        "chat_template": cfg.model.chat_template,
    }


def prompt_text(cfg: Any, record: dict[str, Any]) -> str:
    """The user message of one training record: ``dataset.prompt_template`` around its prompt."""
    return cfg.dataset.prompt_template.replace("{prompt}", record["prompt"])


@dataclass
class PromptFit:
    """The records kept, and for each one dropped its id, 1-based row and token count."""

    kept: list[dict[str, Any]]
    dropped: list[dict[str, Any]] = field(default_factory=list)
    max_tokens: int = 0

    @property
    def rows(self) -> int:
        return len(self.kept) + len(self.dropped)

    def summary(self) -> str:
        ids = ", ".join(str(d["id"]) for d in self.dropped[:10])
        more = f" and {len(self.dropped) - 10} more" if len(self.dropped) > 10 else ""
        return (
            f"dropped {len(self.dropped)} of {self.rows} prompts longer than {LIMIT}={self.max_tokens} "
            f"tokens (chat template applied)" + (f": {ids}{more}" if self.dropped else "")
        )

    def report(self, **about: Any) -> dict[str, Any]:
        return {
            **about,
            "max_prompt_tokens": self.max_tokens,
            "rule": "kept iff templated prompt token ids <= max_prompt_tokens (verl filter_overlong_prompts)",
            "rows": self.rows,
            "kept": len(self.kept),
            "dropped": len(self.dropped),
            "dropped_rows": self.dropped,
        }


def fit_prompts(cfg: Any, tokenizer: Any, records: list[dict[str, Any]], *, where: str | Path) -> PromptFit:
    """Split ``records`` into those that fit ``cfg.sampling.max_prompt_tokens`` and those that do
    not (order kept). ``where``: the data, for the error raised when nothing fits."""
    limit = cfg.sampling.max_prompt_tokens
    texts = [prompt_text(cfg, r) for r in records]
    over = overlong_prompts(tokenizer, texts, limit, **prompt_options(cfg))
    kept = [r for i, r in enumerate(records) if i not in over]
    dropped = [
        {"id": records[i].get("id", f"row {i + 1}"), "row": i + 1, "tokens": n} for i, n in over.items()
    ]
    if not kept:
        shortest = min(over.values()) if over else 0
        raise DataError(
            where,
            None,
            None,
            f"every one of its {len(records)} prompts is longer than {LIMIT}={limit} tokens with this "
            f"model's tokenizer and chat template (the shortest has {shortest}); raise {LIMIT} "
            f"(in an experiment config: {EXPERIMENT_LIMIT}) to at least {shortest}, or prepare "
            "shorter prompts",
        )
    return PromptFit(kept, dropped, limit)


def write_report(path: str | Path, fit: PromptFit, **about: Any) -> None:
    write_atomic(path, json.dumps(fit.report(**about), indent=2) + "\n")


def fit_training_records(
    cfg: Any, tokenizer: Any, records: list[dict[str, Any]], report_to: Path | None
) -> list[dict[str, Any]]:
    """The trainer's filter: the records that fit. ``report_to`` (the main rank's; None on the
    others, which filter alike but say nothing): where the count and ids are written, and logged.
    Raises :class:`DataError` when none fits."""
    fit = fit_prompts(cfg, tokenizer, records, where=cfg.dataset.path)
    if report_to is not None:
        if fit.dropped:
            log.warning("%s: %s", cfg.dataset.path, fit.summary())
        # relative to the report (a copied results directory names its own files)
        where = {"data": cfg.dataset.path, "tokenizer": cfg.model.path}
        write_report(report_to, fit, **{k: relative_to_file(v, report_to) for k, v in where.items()})
    return fit.kept
