"""The data package's modules: spec models and config lookup (aggbench.data.sources) apart from the
row sources (aggbench.data.rows), each under 500 lines; the built-in task is read directly."""

from __future__ import annotations

from pathlib import Path

import pytest

from aggbench.data import rows, sources
from aggbench.data.sources import BuiltinSource

DATA = Path(sources.__file__).resolve().parent


@pytest.mark.parametrize("module", sorted(p.name for p in DATA.glob("*.py")))
def test_every_data_module_stays_under_500_lines(module):
    assert len((DATA / module).read_text().splitlines()) < 500, module


def test_row_sources_live_in_rows_and_spec_models_in_sources():
    for name in ("offline_rows", "hub_rows", "url_rows", "builtin_rows", "as_text", "as_answer"):
        assert hasattr(rows, name) and not hasattr(sources, name), name
    for name in ("Strict", "FieldMap", "HubSource", "UrlSource", "BuiltinSource", "read_spec"):
        assert hasattr(sources, name), name


def test_builtin_rows_are_make_tasks_split_and_its_errors_are_its_own(monkeypatch):
    from aggbench.tiny.task import make_task

    train, test = make_task(seed=3, n_train=5, n_test=2)
    src = BuiltinSource(split="test", seed=3, n_train=5, n_test=2)
    assert [row for _w, _l, row in rows.builtin_rows(src)] == test
    assert [row for _w, _l, row in rows.builtin_rows(src.model_copy(update={"split": "train"}))] == train

    def broken(**kw):
        raise ImportError("a bug inside the task")

    # no guard turns a bug in the task into "data unavailable" (the task is part of the package)
    monkeypatch.setattr(rows, "make_task", broken)
    with pytest.raises(ImportError, match="a bug inside the task"):
        rows.builtin_rows(src)
