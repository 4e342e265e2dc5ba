"""Evaluation benchmarks as data: one versioned YAML per benchmark, loaded into canonical records.

lm-eval's idea, kept small: a benchmark is a declarative spec (hub id + pinned revision + split, the
offline file name, a field mapping, the prompt template, the grader, sampling and metrics), not
code. :func:`load_benchmark_spec` finds and validates a spec; :func:`load_benchmark` turns it into
canonical records::

    math: {"id", "prompt", "answer", ["grading"], ["meta"]}     # prompt = the raw problem text
    code: {"id", "prompt", "tests", "starter_code", "func_name", "date", "public_tests_only"}
    evalplus: {"id", "prompt", "entry_point", "evalplus_dataset", "evalplus_hash", ...}

``prompt`` is always the raw problem; :meth:`BenchmarkSpec.render_prompt` applies the template.

Data: ``$AGGBENCH_DATA_DIR/<offline_file>`` overrides the hub (compute nodes may be offline);
otherwise ``datasets.load_dataset(hub.id, revision=hub.revision, split=hub.split)``. HumanEval+ and
MBPP+ (``evalplus:`` source, optional) load through evalplus's loaders instead
(:mod:`aggbench.data.evalplus_source`; offline: ``HUMANEVAL_OVERRIDE_PATH`` / ``MBPP_OVERRIDE_PATH``).
The shared machinery is in :mod:`aggbench.data.sources` (strict models, config lookup) and
:mod:`aggbench.data.rows` (row sources). ``holdout_of: <training dataset>`` is a selection split: the
problems that training set's ``holdout:`` keeps out of training (:mod:`aggbench.data.holdout`).
"""

from __future__ import annotations

import pickle
import re
import zlib
from collections.abc import Iterable, Iterator
from datetime import date, datetime, time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from aggbench.data.evalplus_source import EvalPlusSource
from aggbench.data.jsonl import DataError, get_field
from aggbench.data.rows import (
    as_answer,
    as_text,
    decode_lcb_tests,
    resolve_data_dir,
)
from aggbench.data.sources import (
    DataUnavailableError,
    FieldMap,
    OfflineJoin,
    SpecError,
    Strict,
    available_names,
    config_dirs,
)
from aggbench.data.spec import DataSpec, SpecRows, load_spec
from aggbench.graders import get_grader
from aggbench.metric_names import parse as parse_metric

BENCHMARK_DIR_ENV = "AGGBENCH_BENCHMARK_DIR"
_PLACEHOLDER = re.compile(r"\{(prompt|starter_code)\}")


class Sampling(Strict):
    n: int = Field(ge=1)
    temperature: float = Field(ge=0.0)
    top_p: float = Field(gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)  # 0 or -1: off
    max_tokens: int = Field(ge=1)


class DateWindow(Strict):
    """Half-open window ``[start, end)`` on the record's date; either end may be open."""

    start: date | None = None
    end: date | None = None

    @model_validator(mode="after")
    def _ordered(self) -> DateWindow:
        if self.start and self.end and self.start >= self.end:
            raise ValueError(f"start {self.start} must be before end {self.end}")
        return self

    def contains(self, when: datetime) -> bool:
        if self.start and when < datetime.combine(self.start, time()):
            return False
        return not (self.end and when >= datetime.combine(self.end, time()))


class BenchmarkSpec(DataSpec):
    """One evaluation benchmark. See configs/benchmarks/*.yaml (common fields: :class:`DataSpec`)."""

    offline_join: OfflineJoin | None = None
    offline_public_tests_only: bool = False
    evalplus: EvalPlusSource | None = None  # HumanEval+/MBPP+ through evalplus's own loaders
    holdout_of: str | None = None  # a training dataset's held-out problems (its `holdout:`), for selection
    optional: bool = False  # not in the paper's default list (configs/paper.yaml); extra dependencies
    # the source's row count (before the date window and any limit): a hub, URL or offline source that
    # yields another is refused (a different split or revision, a damaged cache), as offline_sha256 pins a file
    expected_rows: int | None = Field(default=None, ge=1)
    answer_from: Literal["field", "boxed_in_solution"] = "field"
    date_window: DateWindow | None = None
    prompt_template: str = "{prompt}"
    prompt_template_starter_code: str | None = None  # used instead when a record has starter code
    sampling: Sampling
    metrics: list[str] = Field(min_length=1)

    @field_validator("prompt_template", "prompt_template_starter_code")
    @classmethod
    def _has_prompt(cls, value: str | None) -> str | None:
        if value is not None and "{prompt}" not in value:
            raise ValueError("the template must contain the placeholder {prompt}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> BenchmarkSpec:
        if (self.evalplus is not None) != (self.grader.entry.record == "evalplus"):
            raise ValueError("grader 'evalplus' and an `evalplus:` source (dataset, version) go together")
        if self.evalplus is not None:
            if self.hub or self.url or self.offline_file or self.builtin:
                raise ValueError("evalplus excludes hub, url, offline_file and builtin")
            self.fields = self.fields or FieldMap(id="task_id", prompt="prompt")
        if self.holdout_of is not None:
            if self.hub or self.url or self.offline_file or self.builtin or self.evalplus or self.fields:
                raise ValueError(
                    "holdout_of reads its training dataset's own source and fields: it excludes hub, url, "
                    "offline_file, builtin, evalplus and fields"
                )
            self.fields = FieldMap(id="id", prompt="prompt", answer="answer")  # the canonical records
        maps = self._check_sources(
            "hub, url, offline_file, builtin, evalplus or holdout_of",
            other_source=self.evalplus is not None or self.holdout_of is not None,
        )
        for label, fields in maps:
            _check_fields(label, fields, self.grader.name, self.answer_from)
            if self.date_window and not fields.date:
                raise ValueError("date_window needs fields.date (and hub.fields.date when given)")
        for metric in self.metrics:
            parsed = parse_metric(metric)
            if parsed is None:
                raise ValueError(f"metric {metric!r} is not one of avg@k, pass@k, maj@k")
            if parsed[1] > self.sampling.n:
                raise ValueError(f"metric {metric!r} needs k <= sampling.n ({self.sampling.n})")
        return self

    @property
    def task(self) -> str:
        return self.grader.name

    def with_date_window(self, start: date | str | None, end: date | str | None) -> BenchmarkSpec:
        """A validated copy with another date window (e.g. another LiveCodeBench release)."""
        data = self.model_dump()
        data["date_window"] = {"start": start, "end": end}
        spec = type(self).model_validate(data)
        spec._path = self._path
        return spec

    def render_prompt(self, record: dict[str, Any]) -> str:
        """The user-turn text for one record: the template with {prompt} (and {starter_code})."""
        template = self.prompt_template
        if self.prompt_template_starter_code and record.get("starter_code"):
            template = self.prompt_template_starter_code
        values = {"prompt": record["prompt"], "starter_code": record.get("starter_code") or ""}
        # One pass, so braces inside the problem text (LaTeX) are never re-substituted.
        return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _check_fields(label: str, fields: FieldMap, grader: str, answer_from: str) -> None:
    record = get_grader(grader).record
    if record == "tests":
        if not fields.tests:
            raise ValueError(f"{label}.tests is required for grader {grader!r}")
    elif record == "evalplus":
        return  # the evalplus loader maps its own fields
    elif answer_from == "boxed_in_solution":
        if not fields.solution:
            raise ValueError(f"{label}.solution is required for answer_from: boxed_in_solution")
    elif not fields.answer:
        raise ValueError(f"{label}.answer is required for grader {grader!r}")


def list_benchmarks() -> list[str]:
    """Names of the benchmarks found under ``$AGGBENCH_BENCHMARK_DIR`` and ``configs/benchmarks``."""
    return available_names(config_dirs("benchmarks", BENCHMARK_DIR_ENV))


def load_benchmark_spec(name_or_path: str | Path) -> BenchmarkSpec:
    """Find (path, or NAME under ``$AGGBENCH_BENCHMARK_DIR`` / ``configs/benchmarks``) and validate."""
    return load_spec(
        BenchmarkSpec, name_or_path, kind="benchmark", subdir="benchmarks", env_var=BENCHMARK_DIR_ENV
    )


# --------------------------------------------------------------------------- canonical records


class BenchmarkRecords(list):
    """``list[dict]`` of canonical records, plus where they came from and caveats for reports."""

    def __init__(self, records: Iterable[dict[str, Any]], *, spec: BenchmarkSpec, source: str) -> None:
        super().__init__(records)
        self.spec = spec
        self.source = source
        self.public_tests_only = any(r.get("public_tests_only") for r in self)
        self.notes = ["public tests only"] if self.public_tests_only else []


def load_benchmark(
    spec: BenchmarkSpec | str | Path,
    *,
    data_dir: str | Path | None = None,
    limit: int | None = None,
    fetched: str | Path | None = None,
) -> BenchmarkRecords:
    """Canonical records of one benchmark, its date window applied, the first ``limit``.

    ``fetched``: a fetched copy (:mod:`aggbench.data.fetch`), the only source read then (checked
    against its lock); else the offline file under the data dir if present, else the hub or URL.
    """
    if not isinstance(spec, BenchmarkSpec):
        spec = load_benchmark_spec(spec)
    if fetched is not None and spec.builtin is None:
        from aggbench.data.fetch import read_fetched

        rows, source = read_fetched(spec, fetched)
        records: Iterable[dict[str, Any]] = iter(rows)
    elif spec.evalplus is not None or spec.holdout_of is not None:
        records, source = iter_records(spec, data_dir)
    else:  # open_rows called here, so its warnings point at this function's caller
        opened = spec.open_rows(resolve_data_dir(data_dir), join=spec.offline_join)
        records, source = _canonical(spec, opened), opened.source
    out, read = [], 0
    for record in records:
        read += 1
        if spec.date_window and not spec.date_window.contains(datetime.fromisoformat(record["date"])):
            continue
        out.append(record)
        if limit is not None and len(out) >= limit:
            break
    else:  # read to the end: the count the spec expects
        check_row_count(spec, read, source)
    return BenchmarkRecords(out, spec=spec, source=source)


def check_row_count(spec: BenchmarkSpec, count: int, source: str) -> None:
    """Refuse a source that yields another number of rows than the spec's ``expected_rows``."""
    if spec.expected_rows is not None and count != spec.expected_rows:
        raise DataError(
            source,
            None,
            None,
            f"{spec.name}: {count} rows, but the spec's expected_rows is {spec.expected_rows}: another "
            "split, revision or file than the spec was written for, or a damaged download. Check the "
            "spec's source against its comments (delete a damaged datasets cache entry to download again)",
        )


def iter_records(
    spec: BenchmarkSpec, data_dir: str | Path | None = None
) -> tuple[Iterable[dict[str, Any]], str]:
    """Every canonical record of ``spec`` (no date window) from its first available source, and
    that source's name; records are mapped as they are read."""
    if spec.evalplus is not None:
        from aggbench.data.evalplus_source import load_records

        return load_records(spec.evalplus, name=spec.name)
    if spec.holdout_of is not None:
        from aggbench.data.holdout import load_holdout

        held, source = load_holdout(spec.holdout_of, data_dir=data_dir)
        keep = ("id", "prompt", "answer", "meta")
        return [{k: r[k] for k in keep if k in r} for r in held], source
    opened = spec.open_rows(resolve_data_dir(data_dir), join=spec.offline_join)
    return _canonical(spec, opened), opened.source


def _canonical(spec: BenchmarkSpec, opened: SpecRows) -> Iterator[dict[str, Any]]:
    public_only = opened.offline and spec.offline_public_tests_only
    for index, (where, line, row) in enumerate(opened.rows):
        yield to_record(
            spec, opened.fields, row, index=index, where=where, line=line, public_only=public_only
        )


def to_record(
    spec: BenchmarkSpec,
    fields: FieldMap,
    row: dict[str, Any],
    *,
    index: int,
    where: str,
    line: int,
    public_only: bool = False,
) -> dict[str, Any]:
    """Map one source row to the canonical record (errors name where/line/field)."""

    def get(path: str) -> Any:
        return get_field(row, path, where=where, line=line)

    record: dict[str, Any] = {
        "id": as_text(get(fields.id), where, line, fields.id) if fields.id else f"{spec.name}-{index}"
    }
    record["prompt"] = as_text(get(fields.prompt), where, line, fields.prompt)
    if spec.grader.entry.record == "tests":
        record.update(_code_fields(fields, row, get, where, line))
        record["public_tests_only"] = bool(public_only or row.get("_public_tests_only", False))
    elif spec.answer_from == "boxed_in_solution":
        record["answer"] = only_boxed(
            as_text(get(fields.solution), where, line, fields.solution), where, line, fields.solution
        )
    else:
        record["answer"] = as_answer(get(fields.answer), spec.answer_transform, where, line, fields.answer)
    if fields.date:
        record["date"] = _date(get(fields.date), where, line, fields.date).isoformat()
    if fields.grading:
        record["grading"] = {col.rsplit(".", 1)[-1]: get(col) for col in fields.grading}
    if fields.meta:
        record["meta"] = {col.rsplit(".", 1)[-1]: get(col) for col in fields.meta}
    return record


def only_boxed(text: str, where: str, line: int, field: str | None) -> str:
    """The content of the single ``\\boxed{...}`` in ``text`` (braces matched; exactly one required).

    Written here rather than taken from math-verify: its ``parse`` returns parsed sympy objects,
    while the loader needs the reference answer verbatim and must reject solutions with 0 or 2+ boxes.
    """
    starts = [m.end() for m in re.finditer(r"\\boxed\s*\{", text)]
    if len(starts) != 1:
        raise DataError(where, line, field, f"expected exactly one \\boxed{{...}}, found {len(starts)}")
    depth, i = 1, starts[0]
    while i < len(text) and depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    if depth:
        raise DataError(where, line, field, "\\boxed{ has no closing brace")
    return as_text(text[starts[0] : i - 1].strip(), where, line, field)


def _date(value: Any, where: str, line: int, field: str) -> datetime:
    if isinstance(value, datetime):
        return value.replace(tzinfo=None)
    if isinstance(value, date):
        return datetime.combine(value, time())
    try:
        return datetime.fromisoformat(str(value)).replace(tzinfo=None)
    except ValueError:
        raise DataError(where, line, field, f"expected an ISO date, got {value!r}") from None


def _code_fields(fields: FieldMap, row: dict[str, Any], get: Any, where: str, line: int) -> dict[str, Any]:
    assert fields.tests is not None
    tests = get(fields.tests)
    try:
        tests = decode_lcb_tests(tests) if isinstance(tests, str) else tests
    except (ValueError, zlib.error, pickle.UnpicklingError) as exc:
        raise DataError(where, line, fields.tests, f"cannot decode tests ({exc})") from None
    starter = get(fields.starter_code) if fields.starter_code else ""
    starter = starter or ""
    if not isinstance(tests, list) or not tests:
        raise DataError(where, line, fields.tests, "expected a non-empty list of tests")
    clean = []
    for k, test in enumerate(tests):
        if (
            not isinstance(test, dict)
            or not isinstance(test.get("input"), str)
            or not isinstance(test.get("output"), str)
        ):
            raise DataError(
                where, line, f"{fields.tests}.{k}", "expected {input: str, output: str, testtype}"
            )
        testtype = test.get("testtype") or ("functional" if starter else "stdin")
        if testtype not in ("stdin", "functional"):
            raise DataError(where, line, f"{fields.tests}.{k}.testtype", f"unknown test type {testtype!r}")
        clean.append({"input": test["input"], "output": test["output"], "testtype": testtype})
    func_name = (get(fields.func_name) if fields.func_name else None) or _first_def(starter)
    if any(t["testtype"] == "functional" for t in clean) and not func_name:
        raise DataError(
            where, line, fields.func_name or fields.starter_code, "functional tests need a function name"
        )
    return {"tests": clean, "starter_code": starter, "func_name": func_name}


def _first_def(starter_code: str) -> str | None:
    match = re.search(r"^\s*def\s+([A-Za-z_]\w*)\s*\(", starter_code, flags=re.MULTILINE)
    return match.group(1) if match else None


__all__ = [
    "BENCHMARK_DIR_ENV",
    "BenchmarkRecords",
    "BenchmarkSpec",
    "DataUnavailableError",
    "SpecError",
    "list_benchmarks",
    "load_benchmark",
    "load_benchmark_spec",
]
