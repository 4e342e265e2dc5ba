"""RL training datasets (configs/datasets): DAPO de-duplication and wrapper stripping, Polaris, tiny."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from aggbench.data import (
    DataError,
    SpecError,
    list_training_datasets,
    load_training_dataset,
    load_training_spec,
)

REPO = Path(__file__).resolve().parents[2]
DAPO_EVAL = "train/dapo17k/dapo_repo_eval_aime-2024_dapo_format.jsonl"  # 30 problems x 32 repeats
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "polaris_synthetic.jsonl"


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _dapo_spec(**update):
    """The shipped spec on the AIME file in DAPO's schema; without its holdout (256 problems, more
    than the file's 30: tests/data/test_holdout.py tests it) unless given."""
    update = {"offline_file": DAPO_EVAL, "holdout": None, **update}
    return load_training_spec("dapo17k").model_copy(update=update)


def test_every_dataset_yaml_validates() -> None:
    assert set(list_training_datasets()) >= {"dapo17k", "polaris", "tiny"}
    for name in ("dapo17k", "polaris", "tiny"):
        spec = load_training_spec(name)
        assert spec.name == name
        assert spec.hub is None or spec.hub.pinned, name  # every hub source at a commit


def test_dapo_dedupe_strips_the_instruction_and_keeps_ground_truths(shared_data: Path) -> None:
    shared = shared_data
    raw = _rows(shared / DAPO_EVAL)
    assert len(raw) == 960
    truth = {str(r["extra_info"]["index"]): r["reward_model"]["ground_truth"] for r in raw}
    problem = {str(r["extra_info"]["index"]): r["extra_info"]["raw_problem"] for r in raw}
    wrapped = {str(r["extra_info"]["index"]): r["prompt"][0]["content"] for r in raw}

    spec = _dapo_spec()
    records = load_training_dataset(spec, data_dir=shared)
    assert len(records) == 30
    assert sorted(r["id"] for r in records) == sorted(truth) and len(truth) == 30
    for r in records:
        assert set(r) == {"id", "prompt", "answer"}
        assert r["answer"] == truth[r["id"]]
        assert r["prompt"] == problem[r["id"]]  # the raw problem, recovered from the wrapper
        assert "Solve the following math problem" not in r["prompt"]
        assert "Remember to put your answer" not in r["prompt"]
        assert spec.render_prompt(r) == wrapped[r["id"]]  # the same template rebuilds the row
    assert records[0]["id"] == str(raw[0]["extra_info"]["index"])  # first occurrence order

    assert len(load_training_dataset(_dapo_spec(dedupe=False), data_dir=shared)) == 960
    assert len(load_training_dataset(spec, data_dir=shared, limit=7)) == 7


def test_dapo_row_outside_the_wrapper_is_an_error(tmp_path: Path) -> None:
    row = {
        "prompt": [{"role": "user", "content": "Just a bare problem"}],
        "reward_model": {"ground_truth": "3", "style": "rule-lighteval/MATH_v2"},
        "extra_info": {"index": "u-1"},
    }
    target = tmp_path / DAPO_EVAL
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError) as err:
        load_training_dataset(_dapo_spec(), data_dir=tmp_path)
    assert (err.value.line, err.value.field) == (1, "prompt.0.content")
    assert "does not match instruction_template" in str(err.value)


def test_dapo_conflicting_duplicate_warns_and_keeps_the_first(tmp_path: Path) -> None:
    spec = _dapo_spec()
    content = spec.render_prompt({"prompt": "What is 1+2?"})

    def row(index: str, answer: str) -> str:
        return json.dumps(
            {
                "prompt": [{"role": "user", "content": content}],
                "reward_model": {"ground_truth": answer},
                "extra_info": {"index": index},
            }
        )

    target = tmp_path / DAPO_EVAL
    target.parent.mkdir(parents=True)
    target.write_text("\n".join([row("a", "3"), row("b", "3"), row("c", "4")]) + "\n")
    with pytest.warns(UserWarning, match=r":3 repeats the problem of .*:1 with another answer"):
        records = load_training_dataset(spec, data_dir=tmp_path)
    assert records == [{"id": "a", "prompt": "What is 1+2?", "answer": "3"}]


def test_polaris_synthetic_fixture_loads(tmp_path: Path) -> None:
    spec = load_training_spec("polaris").model_copy(update={"holdout": None})  # 6 rows: no 256 to hold out
    target = tmp_path / spec.offline_file
    target.parent.mkdir(parents=True)
    shutil.copy(FIXTURE, target)
    raw = _rows(FIXTURE)
    records = load_training_dataset(spec, data_dir=tmp_path)
    assert len(records) == len(raw) == 6
    assert [r["id"] for r in records[:2]] == ["polaris-0", "polaris-1"]
    for r, row in zip(records, raw, strict=True):
        assert (r["prompt"], r["answer"], r["meta"]) == (
            row["problem"],
            row["answer"],
            {"difficulty": row["difficulty"]},
        )
    assert spec.render_prompt(records[0]).startswith(raw[0]["problem"] + "\nPlease reason step by step")


def test_tiny_dataset_is_the_train_split(monkeypatch: pytest.MonkeyPatch) -> None:
    # a stub with make_task's signature (a (train, test) pair) stands in for the real task
    def make_task(seed: int, n_train: int, n_test: int):
        train = [{"id": f"tr{i}", "prompt": f"{i}+{seed}=", "answer": str(i + seed)} for i in range(n_train)]
        return train, [{"id": "te0", "prompt": "x", "answer": "y"}] * n_test

    monkeypatch.setattr("aggbench.data.rows.make_task", make_task)
    records = load_training_dataset("tiny")
    assert len(records) == 512
    assert records[3] == {"id": "tr3", "prompt": "3+0=", "answer": "3"}


def test_training_spec_errors(tmp_path: Path) -> None:
    text = (REPO / "configs/datasets/polaris.yaml").read_text()
    bad = tmp_path / "polaris.yaml"
    bad.write_text(text.replace("dedupe: false", "dedup: false"))
    with pytest.raises(SpecError, match="unknown key 'dedup'. Did you mean 'dedupe'?"):
        load_training_spec(bad)
    bad.write_text(text.replace("  answer: answer\n", "  answer: answer\n  tests: tests\n"))
    with pytest.raises(SpecError, match="maps only id, prompt, answer, meta"):
        load_training_spec(bad)
    with pytest.raises(SpecError, match="Did you mean 'polaris'"):
        load_training_spec("polars")


def test_tiny_dataset_with_the_real_task() -> None:
    from aggbench.tiny.task import make_task

    train, test = make_task(0, 512, 64)
    records = load_training_dataset("tiny")
    assert [r["id"] for r in records] == [t["id"] for t in train]
    assert {r["prompt"] for r in records}.isdisjoint({t["prompt"] for t in test})


DAPO_PIN = "65877096c24ffa7abc4e4fa5edb95cf3413a5674"


def test_dapo_from_the_hub_is_deduplicated(monkeypatch: pytest.MonkeyPatch) -> None:
    datasets = pytest.importorskip("datasets")
    monkeypatch.delenv("AGGBENCH_DATA_DIR", raising=False)
    spec = load_training_spec("dapo17k").model_copy(update={"holdout": None})  # 2 problems here

    def row(index: str, problem: str, answer: str) -> dict:
        return {
            "data_source": "math_dapo",
            "prompt": [{"content": spec.render_prompt({"prompt": problem}), "role": "user"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": answer, "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": index},
        }

    rows = [row("u1", "P1", "1"), row("u2", "P2", "2"), row("u1", "P1", "1"), row("u2", "P2", "2")]
    selected: list[list[str]] = []

    def load_dataset(path, name=None, *, revision=None, split=None, data_files=None):
        assert (path, revision, split) == ("BytedTsinghua-SIA/DAPO-Math-17k", DAPO_PIN, "train")
        ds = datasets.Dataset.from_list(rows)
        real_select = ds.select_columns
        ds.select_columns = lambda cols: selected.append(cols) or real_select(cols)
        return ds

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # pinned: no unpinned-revision warning
        records = load_training_dataset(spec)
    assert records == [
        {"id": "u1", "prompt": "P1", "answer": "1"},
        {"id": "u2", "prompt": "P2", "answer": "2"},
    ]
    assert selected == [["extra_info", "prompt", "reward_model"]]  # only the mapped columns are read
