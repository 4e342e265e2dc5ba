"""What benchmark and training-set specs share (aggbench.data.spec.DataSpec): the same source checks
with the same messages, the same chat messages, and the same offline-first row sources."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from pydantic import ValidationError

from aggbench.data import BenchmarkSpec, DataUnavailableError, TrainingDatasetSpec
from aggbench.data.benchmarks import load_benchmark
from aggbench.data.training import load_training_dataset

HUB = {"id": "org/set", "revision": "a" * 40, "split": "test"}
FIELDS = {"id": "k", "prompt": "q", "answer": "a"}
BASE = {
    BenchmarkSpec: {
        "name": "b", "version": 1, "grader": {"name": "math"}, "metrics": ["avg@1"],
        "sampling": {"n": 1, "temperature": 0.0, "top_p": 1.0, "max_tokens": 8},
    },
    TrainingDatasetSpec: {"name": "t", "version": 1, "grader": {"name": "math"}},
}  # fmt: skip
LOADERS = {BenchmarkSpec: load_benchmark, TrainingDatasetSpec: load_training_dataset}
BUILTIN = {"split": "train", "n_train": 4, "n_test": 2}
SPECS = pytest.mark.parametrize("cls", [BenchmarkSpec, TrainingDatasetSpec], ids=["benchmark", "training"])


def make(cls, **extra):
    return cls.model_validate({**BASE[cls], **extra})


@SPECS
@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"fields": FIELDS}, "give at least one data source: hub, url, offline_file"),
        ({"offline_file": "x.jsonl"}, "fields is required (the mapping to the canonical record)"),
        ({"builtin": BUILTIN, "offline_file": "x.jsonl"}, "builtin excludes hub, url and offline_file"),
        ({"offline_file": "/abs/x.jsonl", "fields": FIELDS}, "must be a path relative to $AGGBENCH_DATA_DIR"),
    ],
    ids=["no-source", "no-fields", "builtin-and-file", "absolute-file"],
)
def test_the_shared_source_checks_say_the_same_thing(cls, extra, message):
    with pytest.raises(ValidationError) as err:
        make(cls, **extra)
    assert message in str(err.value)


@SPECS
def test_builtin_defaults_the_field_map_and_chat_messages_carry_the_system_prompt(cls):
    spec = make(cls, builtin=BUILTIN, system_prompt="Be brief.")
    assert (spec.fields.id, spec.fields.prompt, spec.fields.answer) == ("id", "prompt", "answer")
    messages = spec.render_messages({"prompt": "1+1="})
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert messages[1]["role"] == "user" and "1+1=" in messages[1]["content"]
    assert make(cls, builtin=BUILTIN).render_messages({"prompt": "2+2="})[0]["role"] == "user"


@SPECS
def test_offline_file_first_then_the_error_names_the_data_dir(cls, tmp_path: Path, monkeypatch):
    monkeypatch.delenv("AGGBENCH_DATA_DIR", raising=False)
    spec = make(cls, offline_file="sub/x.jsonl", fields=FIELDS)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "x.jsonl").write_text(json.dumps({"k": "p1", "q": "1+1=", "a": "2"}) + "\n")
    records = LOADERS[cls](spec, data_dir=tmp_path)
    assert [(r["id"], r["prompt"], r["answer"]) for r in records] == [("p1", "1+1=", "2")]
    with pytest.raises(DataUnavailableError, match=r"AGGBENCH_DATA_DIR is unset.*holds sub/x.jsonl"):
        LOADERS[cls](spec)


@SPECS
def test_a_missing_offline_file_warns_at_the_callers_line(cls, tmp_path: Path, monkeypatch):
    """The hub fallback's warning points at the code that called the loader, not at aggbench."""

    def no_hub(*_args, **_kwargs):
        raise DataUnavailableError("no hub here")

    monkeypatch.setattr("aggbench.data.spec.hub_rows", no_hub)
    spec = make(cls, offline_file="x.jsonl", hub=HUB, fields=FIELDS)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(DataUnavailableError):
        warnings.simplefilter("always")
        LOADERS[cls](spec, data_dir=tmp_path)
    [w] = [w for w in caught if "not found under the offline data dir" in str(w.message)]
    assert Path(w.filename) == Path(__file__)


def test_a_spec_path_that_is_a_directory_or_missing_says_which(tmp_path: Path):
    from aggbench.data import load_training_spec
    from aggbench.data.sources import SpecError

    with pytest.raises(SpecError, match="is a directory, not a YAML file"):
        load_training_spec(str(tmp_path))
    with pytest.raises(SpecError, match="does not exist"):
        load_training_spec(str(tmp_path / "nope.yaml"))
