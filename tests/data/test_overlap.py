"""Verbatim overlap of selection splits and training files with test benchmarks
(``data.overlap.shared_problems``), on real rows from ../shared/data: the report notes each
(selection, test) pair that shares problems under the selected table
(tests/report/test_selected_table.py covers the note), and each (training set, test) pair under
every table of its blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from aggbench.data import load_benchmark
from aggbench.data.fetch import fetch_benchmarks

DAPO_EVAL = "train/dapo17k/dapo_repo_eval_aime-2024_dapo_format.jsonl"


def test_a_holdout_drawn_from_aime_problems_is_found_to_hold_aime24s(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """data.overlap.shared_problems on real rows: a training set built from DAPO's AIME-2024 file (its
    problems are AIME 2024's, in DAPO's schema and instruction) holds 5 out; fetched beside aime24 (from
    ../shared/data's AIME-2024 file) all 5 are found in aime24, none in MATH-500; a benchmark that was
    not fetched is left out rather than counted as sharing none."""
    from aggbench.data.overlap import shared_problems

    shipped = yaml.safe_load(
        (Path(__file__).parents[2] / "configs" / "datasets" / "dapo17k.yaml").read_text()
    )
    root = tmp_path / "specs"
    (root / "datasets").mkdir(parents=True)
    (root / "benchmarks").mkdir()
    spec = {**shipped, "name": "dapoaime", "offline_file": DAPO_EVAL, "holdout": {"n": 5, "seed": 0}}
    (root / "datasets" / "dapoaime.yaml").write_text(yaml.safe_dump(spec))
    val = yaml.safe_load(
        (Path(__file__).parents[2] / "configs" / "benchmarks" / "dapo17k_val.yaml").read_text()
    )
    (root / "benchmarks" / "dapoaime_val.yaml").write_text(
        yaml.safe_dump({**val, "name": "dapoaime_val", "holdout_of": "dapoaime"})
    )
    monkeypatch.setenv("AGGBENCH_DATASET_DIR", str(root / "datasets"))
    monkeypatch.setenv("AGGBENCH_BENCHMARK_DIR", str(root / "benchmarks"))
    from aggbench.cli.report import _overlaps
    from aggbench.layout import benchmark_data_dir

    results = tmp_path / "results"
    fetched = benchmark_data_dir(results)
    fetch_benchmarks(
        ["dapoaime_val", "aime24", "math500"], fetched, data_dir=shared_data, echo=lambda _: None
    )
    pairs = [("dapoaime_val", "aime24"), ("dapoaime_val", "math500"), ("dapoaime_val", "olympiadbench")]
    got = shared_problems(pairs, fetched)
    assert got[("dapoaime_val", "aime24")] == 5 and got[("dapoaime_val", "math500")] == 0
    assert "olympiadbench: not in the fetched copy" in got[("dapoaime_val", "olympiadbench")]
    # the report's reading of a grid's selections: (selection, test) pairs, per dataset too
    selection = {"aime24": "dapoaime_val", "math500": {"dapoaime": "dapoaime_val"}}
    exp = {
        "results_dir": str(results),
        "benchmarks": ["dapoaime_val", "aime24", "math500"],
        "datasets": {"dapoaime": {}},
        "evaluation": {"selection": selection},
    }
    chosen, trained = _overlaps(exp)
    assert chosen == {("dapoaime_val", "aime24"): 5, ("dapoaime_val", "math500"): 0}
    missing = "no prepared file data/dapoaime.jsonl in the results directory"  # relative: same everywhere
    assert trained == {("dapoaime", "aime24"): missing, ("dapoaime", "math500"): missing}


def test_date_windowed_splits_of_one_fetched_file_are_compared_within_their_windows(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two windows of the shipped LiveCodeBench spec (as livecodebench and livecodebench_val are) are
    fetched as the same rows (a fetch keeps no window); each is read in its own date window, so two
    disjoint windows share no problem although their files are the same, and a window inside another
    shares all of its own."""
    from aggbench.data.fetch import records_file
    from aggbench.data.overlap import shared_problems

    shipped = yaml.safe_load(
        (Path(__file__).parents[2] / "configs" / "benchmarks" / "livecodebench.yaml").read_text()
    )
    windows = {"lcb_early": ("2024-08-01", "2024-11-01"), "lcb_late": ("2024-11-01", "2025-02-01")}
    windows["lcb_all"] = ("2024-08-01", "2025-02-01")
    for name, (start, end) in windows.items():
        spec = {**shipped, "name": name, "date_window": {"start": start, "end": end}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("AGGBENCH_BENCHMARK_DIR", str(tmp_path))
    fetched = tmp_path / "fetched"
    fetch_benchmarks(
        list(windows), fetched, data_dir=shared_data, allow_public_tests_only=True, echo=lambda _: None
    )
    files = {n: records_file(fetched, n).read_text() for n in windows}
    assert files["lcb_early"] == files["lcb_late"] == files["lcb_all"]
    early = len(load_benchmark("lcb_early", fetched=fetched))
    got = shared_problems([("lcb_early", "lcb_late"), ("lcb_early", "lcb_all")], fetched)
    assert got == {("lcb_early", "lcb_late"): 0, ("lcb_early", "lcb_all"): early} and early > 0


def test_a_prepared_training_file_is_compared_with_the_tests_on_its_bare_problems(
    shared_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training set built from DAPO's AIME-2024 file with 5 problems held out: prepare-data wraps
    every problem in DAPO's instruction, which is taken off again. Of the other 25 problems, 24 are
    aime24's verbatim and the 25th is too, reworded: DAPO's copy of the torus problem ("Torus
    $\\mathcal T$ is the surface ... When a sphere of radius $11$ rests inside") is not aime24's text
    ("Torus $T$ ... (so like a donut)"), which a verbatim match cannot find. None is MATH-500's. A file
    prepared under another template is a reason, not a count."""
    from click.testing import CliRunner

    from aggbench.cli import main
    from aggbench.cli.report import _overlaps
    from aggbench.data import load_training_spec
    from aggbench.data.overlap import TrainingFile, shared_problems
    from aggbench.layout import benchmark_data_dir, data_file

    shipped = yaml.safe_load(
        (Path(__file__).parents[2] / "configs" / "datasets" / "dapo17k.yaml").read_text()
    )
    (tmp_path / "datasets").mkdir()
    spec = {**shipped, "name": "dapoaime", "offline_file": DAPO_EVAL, "holdout": {"n": 5, "seed": 0}}
    (tmp_path / "datasets" / "dapoaime.yaml").write_text(yaml.safe_dump(spec))
    monkeypatch.setenv("AGGBENCH_DATASET_DIR", str(tmp_path / "datasets"))
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(shared_data))
    results = tmp_path / "results"
    prepared = data_file(results, "dapoaime")
    res = CliRunner().invoke(main, ["prepare-data", "dapoaime", "--out", str(prepared)])
    assert res.exit_code == 0, res.output
    first = json.loads(prepared.read_text().splitlines()[0])["prompt"]
    assert first.startswith("Solve the following math problem step by step.")  # wrapped, as trained on
    fetched = benchmark_data_dir(results)
    fetch_benchmarks(["aime24", "math500"], fetched, data_dir=shared_data, echo=lambda _: None)
    exp = {
        "results_dir": str(results),
        "benchmarks": ["aime24", "math500"],
        "datasets": {"dapoaime": {"spec": "dapoaime"}, "unprepared": {"spec": "dapoaime"}},
        "evaluation": {},
    }
    _, got = _overlaps(exp)
    assert got[("dapoaime", "aime24")] == 24 and got[("dapoaime", "math500")] == 0
    assert got[("unprepared", "aime24")] == "no prepared file data/unprepared.jsonl in the results directory"
    # a file prepared under another template, a row without a text prompt: reasons naming the line
    other = TrainingFile(
        "dapoaime",
        prepared,
        load_training_spec("dapoaime").model_copy(update={"instruction_template": "Q: {prompt}"}),
    )
    [why] = shared_problems([(other, "aime24")], fetched).values()
    assert (
        why.startswith(f"{prepared}:1: field 'prompt': does not match instruction_template")
        and "prepare it again" in why
    )
    for bad, what in (
        ({"answer": "1"}, "expected text, got NoneType"),
        ({"prompt": [1]}, "expected text, got list"),
    ):
        broken = tmp_path / "broken.jsonl"
        broken.write_text(prepared.read_text().splitlines()[0] + "\n" + json.dumps(bad) + "\n")
        side = TrainingFile("dapoaime", broken, load_training_spec("dapoaime"))
        assert (
            shared_problems([(side, "aime24")], fetched)[side, "aime24"]
            == f"{broken}:2: field 'prompt': {what}"
        )
