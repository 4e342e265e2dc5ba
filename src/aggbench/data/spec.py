"""What every data spec shares: a benchmark (:class:`~aggbench.data.benchmarks.BenchmarkSpec`) and
an RL training set (:class:`~aggbench.data.training.TrainingDatasetSpec`) have the same identity,
data sources (built-in task, offline file under ``$AGGBENCH_DATA_DIR``, pinned hub copy or pinned
URL), field map,
chat settings and grader, are found and validated the same way (:func:`load_spec`), and read their
rows from the first source available in the same order (:meth:`DataSpec.open_rows`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypeVar

from pydantic import Field, PrivateAttr, field_validator

from aggbench.data.rows import (
    Row,
    builtin_rows,
    hub_rows,
    offline_path,
    offline_rows,
    top_columns,
    url_rows,
)
from aggbench.data.sources import (
    DATA_DIR_ENV,
    BuiltinSource,
    DataUnavailableError,
    FieldMap,
    Grader,
    HubSource,
    OfflineJoin,
    Strict,
    UrlSource,
    check_relative,
    check_sha256,
    looks_like_path,
    read_spec,
    resolve_config,
)


class SpecRows(NamedTuple):
    """Rows of the source a spec was read from. source: ``builtin:tiny``, the offline file's path or
    ``hf://datasets/ID@REVISION`` or the pinned URL; fields: the field map for those rows (the hub's
    own where it has one); offline: True for the offline file."""

    rows: Iterator[Row]
    source: str
    fields: FieldMap
    offline: bool


class DataSpec(Strict):
    """The fields and checks common to benchmark and training-set specs (subclassed, never used alone)."""

    name: str
    version: int = Field(ge=1)
    description: str = ""
    hub: HubSource | None = None
    url: UrlSource | None = None
    offline_file: str | None = None
    # the offline file's sha256 (PROVENANCE of the copy): another, damaged or truncated file is refused
    offline_sha256: str | None = None
    builtin: BuiltinSource | None = None
    fields: FieldMap | None = None
    answer_transform: Literal["none", "integer"] = "none"
    system_prompt: str | None = None
    use_chat_template: bool = True
    grader: Grader

    _path: Path | None = PrivateAttr(default=None)

    @field_validator("offline_file")
    @classmethod
    def _relative(cls, value: str | None) -> str | None:
        return check_relative(value)

    @field_validator("offline_sha256")
    @classmethod
    def _hex(cls, value: str | None) -> str | None:
        return check_sha256(value)

    def _check_sources(self, sources: str, *, other_source: bool = False) -> list[tuple[str, FieldMap]]:
        """The source checks every spec makes (called from the subclass's model validator).

        builtin excludes hub, url and offline_file and defaults the field map to the task's own
        columns; without builtin (or the subclass's ``other_source``), hub, url or offline_file is
        required, as is a field map. Returns ``[(label, field map)]`` for ``fields`` and
        ``hub.fields`` where given.
        """
        if self.builtin is not None:
            if self.hub or self.url or self.offline_file:
                raise ValueError("builtin excludes hub, url and offline_file")
            self.fields = self.fields or FieldMap(id="id", prompt="prompt", answer="answer")
        elif self.hub is None and self.url is None and self.offline_file is None and not other_source:
            raise ValueError(f"give at least one data source: {sources}")
        if self.fields is None:
            raise ValueError("fields is required (the mapping to the canonical record)")
        maps = (("fields", self.fields), ("hub.fields", self.hub.fields if self.hub else None))
        return [(label, fields) for label, fields in maps if fields is not None]

    @property
    def source_path(self) -> Path | None:
        """The YAML file this spec was read from (None when built in code)."""
        return self._path

    def render_prompt(self, record: dict[str, Any]) -> str:  # pragma: no cover - every subclass has one
        raise NotImplementedError

    def render_messages(self, record: dict[str, Any]) -> list[dict[str, str]]:
        """Chat messages (system prompt if any, then the user turn) for a chat template."""
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*messages, {"role": "user", "content": self.render_prompt(record)}]

    def open_rows(self, root: Path | None, *, join: OfflineJoin | None = None) -> SpecRows:
        """Rows from the first available source: builtin, else ``root/offline_file`` (with ``join``),
        else the hub, else the pinned URL; :class:`DataUnavailableError` naming
        ``$AGGBENCH_DATA_DIR`` when none is.
        (The source functions warn with stacklevel 4: at the caller of the spec's loader.)"""
        fields = self.fields
        assert fields is not None  # set by the validator
        if self.builtin is not None:
            return SpecRows(builtin_rows(self.builtin), "builtin:tiny", fields, False)
        online = self.hub is not None or self.url is not None
        path = offline_path(root, self.offline_file, name=self.name, has_online=online)
        if path is not None:
            assert root is not None and self.offline_file is not None
            rows = offline_rows(root, self.offline_file, join, sha256=self.offline_sha256, name=self.name)
            return SpecRows(rows, str(path), fields, True)
        if self.hub is not None:
            fields = self.hub.fields or fields
            rows = hub_rows(
                self.hub,
                name=self.name,
                offline_file=self.offline_file,
                columns=top_columns(fields),
                data_dir=root,
            )
            return SpecRows(rows, f"hf://datasets/{self.hub.id}@{self.hub.revision}", fields, False)
        if self.url is not None:
            rows = url_rows(self.url, name=self.name, offline_file=self.offline_file, data_dir=root)
            return SpecRows(rows, self.url.url, fields, False)
        raise DataUnavailableError(
            f"{self.name}: no hub or URL source, and the offline file {self.offline_file!r} was not found under "
            f"${DATA_DIR_ENV} ({DATA_DIR_ENV} is {repr(str(root)) if root else 'unset'}). "
            f"Set {DATA_DIR_ENV} to the directory that holds {self.offline_file}."
        )


D = TypeVar("D", bound=DataSpec)


def load_spec(cls: type[D], name_or_path: str | Path, *, kind: str, subdir: str, env_var: str) -> D:
    """Find (a path, or NAME under ``$env_var`` then ``configs/<subdir>``) and validate one spec; a
    spec found by NAME must carry that name."""
    path = resolve_config(name_or_path, kind=kind, subdir=subdir, env_var=env_var)
    expect = None if looks_like_path(name_or_path) else path.stem
    return read_spec(cls, path, kind=kind, expect_name=expect)
