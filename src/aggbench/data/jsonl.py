"""Reading JSONL data files with errors that name the file, the line and the field.

Every loader in :mod:`aggbench.data` reads rows through :func:`iter_jsonl` and pulls columns out
of them with :func:`get_field`, so a bad file always fails with ``file:line: field 'x': why``
instead of a bare ``KeyError`` deep inside a training run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aggbench.errors import InputError, not_utf8


class DataError(InputError, ValueError):
    """A data row that cannot be used. ``where`` is a file path or a hub source, ``line`` is 1-based."""

    def __init__(self, where: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.where = str(where)
        self.line = line
        self.field = field
        self.reason = message
        loc = self.where if line is None else f"{self.where}:{line}"
        what = f" field {field!r}:" if field else ""
        super().__init__(f"{loc}:{what} {message}")


_MISSING = object()


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)`` for every non-blank line of a JSONL file (1-based numbers).

    Raises :class:`DataError` naming the file and line for bytes that are not UTF-8, invalid JSON
    or a line that is not a JSON object.
    """
    path = Path(path)
    lineno = 0
    try:
        with path.open(encoding="utf-8") as handle:
            for lineno, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(
                        path, lineno, None, f"invalid JSON ({exc.msg} at column {exc.colno})"
                    ) from exc
                if not isinstance(obj, dict):
                    raise DataError(path, lineno, None, f"expected a JSON object, got {type(obj).__name__}")
                yield lineno, obj
    except UnicodeDecodeError as exc:  # the text reader decodes ahead: find the line in the bytes
        raise _not_utf8(path, lineno + 1) from exc


def _not_utf8(path: Path, first: int) -> DataError:
    """The error for the first line from ``first`` on (1-based) that is not UTF-8."""
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            if lineno < first:
                continue
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return DataError(path, lineno, None, not_utf8(exc, of="the line"))
    return DataError(path, None, None, "not UTF-8 text; save the file as UTF-8")


def write_jsonl(path: str | Path, records: Iterable[Mapping[str, Any]]) -> int:
    """Write records as UTF-8 JSONL (one object per line, non-ASCII kept), atomically: the file is
    replaced only once every record is written. Returns the row count."""
    from aggbench.files import atomic_writer

    n = 0
    with atomic_writer(path) as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
            n += 1
    return n


def get_field(row: Mapping[str, Any], path: str, *, where: str | Path, line: int | None) -> Any:
    """Return ``row[path]`` where ``path`` is dotted (``reward_model.ground_truth``) and integer
    segments index lists (``prompt.0.content``).

    A missing key or index raises :class:`DataError` naming the full dotted path.
    """
    value: Any = row
    for segment in path.split("."):
        if isinstance(value, Mapping):
            value = value.get(segment, _MISSING)
        elif isinstance(value, list | tuple) and _is_int(segment):
            index = int(segment)
            value = value[index] if -len(value) <= index < len(value) else _MISSING
        else:
            value = _MISSING
        if value is _MISSING:
            raise DataError(where, line, path, "missing")
    return value


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit()
