"""JSONL files for tests, written and read plainly (not through aggbench's own readers and writers,
which are what the tests check). Imports nothing of aggbench, so any suite may use it."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any] | str]) -> Path:
    """One line per row, UTF-8: a mapping as ``json.dumps`` writes it, a string as it is (a broken
    line on purpose); returns ``path``."""
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return path


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every line of ``path`` as JSON (a blank line is an error: aggbench writes none)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
