"""Selection splits held out of training (issue 27, item 3, the paper's half): a training spec's
``holdout: {n, seed}`` keeps n distinct problems out of training, and a benchmark with
``holdout_of`` evaluates exactly them, so the "selected" table chooses checkpoints on problems no
cell trained on and no table shows.

Real data: the shipped dapo17k spec on ../shared/data's AIME-2024 file in DAPO's schema (30 problems
x 32 repeats). Generated data: a small offline set with repeated problems, for what a repeat must do.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from aggbench.data import SpecError, load_benchmark, load_benchmark_spec, load_training_spec
from aggbench.data.fetch import FetchedDataError, fetch_benchmarks, read_fetched
from aggbench.data.grid_checks import load_data_specs, selection_problems
from aggbench.data.holdout import Holdout, load_holdout
from aggbench.data.training import load_training_dataset
from helpers.holdout_toy import toy_grid, toy_rows, write_specs

DAPO_EVAL = "train/dapo17k/dapo_repo_eval_aime-2024_dapo_format.jsonl"
MATH_TESTS = ["math500", "aime24", "aime25", "olympiadbench", "minerva"]


def test_the_holdout_leaves_training_and_is_exactly_the_selection_benchmark(toy: Path) -> None:
    spec = load_training_spec("toy")
    rows = toy_rows()
    train = load_training_dataset(spec)
    held, source = load_holdout(spec)
    held_texts = {r["prompt"] for r in held}
    assert len(held) == len(held_texts) == 3  # n distinct problems
    assert {r["prompt"] for r in train}.isdisjoint(held_texts)  # none of them is trained on
    # every row is in exactly one part: the training rows are all the others, repeats included
    assert len(train) == sum(r["problem"] not in held_texts for r in rows)
    assert {r["prompt"] for r in train} | held_texts == {r["problem"] for r in rows}
    assert "holdout of toy (n=3, seed=0)" in source and "toy.jsonl" in source
    # the benchmark evaluates exactly the held-out problems, with their answers, asked with \boxed
    bench = load_benchmark("toy_val")
    assert [r["prompt"] for r in bench] == [r["prompt"] for r in held]
    answers = {r["problem"]: r["answer"] for r in rows}
    assert all(r["answer"] == answers[r["prompt"]] for r in bench)
    assert bench.spec.render_prompt(bench[0]).endswith("put your final answer within \\boxed{}.")
    assert bench.spec.render_prompt(bench[0]).startswith(bench[0]["prompt"])


def test_a_repeated_problem_is_held_out_with_all_its_rows(tmp_path: Path, monkeypatch) -> None:
    # find a seed whose holdout contains the repeated problem, then check none of its 3 rows trains
    root = write_specs(tmp_path, rows=toy_rows())
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(root / "data"))
    repeated = "What is 5 + 5?"
    for seed in range(50):
        write_specs(root, seed=seed)
        spec = load_training_spec(root / "datasets" / "toy.yaml")
        held, _ = load_holdout(spec)
        if repeated in {r["prompt"] for r in held}:
            break
    else:
        pytest.fail("no seed in 0..49 held out the repeated problem")
    train = load_training_dataset(spec)
    assert repeated not in {r["prompt"] for r in train}
    assert len(train) == 22 - 3 - 2  # 22 rows: the 3 held-out problems and the 2 repeats leave
    assert [r["prompt"] for r in held].count(repeated) == 1  # one benchmark record per problem


def test_the_split_depends_on_the_problems_and_the_seed_not_on_the_row_order(toy: Path) -> None:
    spec = load_training_spec("toy")
    first = [r["prompt"] for r in load_holdout(spec)[0]]
    shuffled = toy_rows()
    random.Random(1).shuffle(shuffled)
    (toy / "data" / "toy.jsonl").write_text("".join(json.dumps(r) + "\n" for r in shuffled))
    assert [r["prompt"] for r in load_holdout(spec)[0]] == first
    others = {tuple(r["prompt"] for r in load_holdout(spec.model_copy(update={"holdout": h}))[0])
              for h in (spec.holdout.model_copy(update={"seed": s}) for s in (1, 2, 3))}  # fmt: skip
    assert any(set(o) != set(first) for o in others)  # the seed chooses another split
    # a limit cuts the training rows after the split: the holdout never changes with it
    limited = load_training_dataset(spec, limit=4)
    assert len(limited) == 4 and {r["prompt"] for r in limited}.isdisjoint(first)


def test_holdout_errors_name_the_field_and_the_fix(toy: Path) -> None:
    too_many = load_training_spec("toy").model_copy(update={"holdout": Holdout(n=20)})  # 20 distinct
    with pytest.raises(SpecError, match=r"holdout.n=20 would leave no problem to train on \(20 distinct"):
        load_training_dataset(too_many)
    bare = load_training_spec("toy").model_copy(update={"holdout": None})
    with pytest.raises(SpecError, match=r"has no holdout: add `holdout: \{n: N, seed: 0\}`"):
        load_holdout(bare)
    with pytest.raises(SpecError, match="holdout_of reads its training dataset's own source"):
        load_benchmark_spec(_with(toy, "toy_val", offline_file="x.jsonl"))
    with pytest.raises(SpecError, match="Input should be greater than or equal to 1"):
        load_training_spec(_with(toy / "datasets", "toy", holdout={"n": 0}, subdir=""))


def _with(root: Path, name: str, subdir: str = "benchmarks", **update) -> Path:
    """A copy of root/subdir/name.yaml with ``update`` applied, in a sibling folder."""
    folder = root / subdir if subdir else root
    data = {**yaml.safe_load((folder / f"{name}.yaml").read_text()), **update}
    out = root.parent / f"changed-{name}"
    out.mkdir(exist_ok=True)
    (out / f"{name}.yaml").write_text(yaml.safe_dump(data))
    return out / f"{name}.yaml"


def test_a_fetched_holdout_is_refused_once_the_training_spec_changes_its_holdout(toy: Path) -> None:
    root = toy / "fetched"
    lock = fetch_benchmarks(["toy_val"], root, echo=lambda _: None)
    assert lock["toy_val"]["records"] == 3 and lock["toy_val"]["source"].startswith("holdout of toy")
    rows, _ = read_fetched(load_benchmark_spec("toy_val"), root)
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in load_benchmark("toy_val")]
    write_specs(toy, seed=7)  # another split: the copy no longer holds the held-out problems
    with pytest.raises(FetchedDataError, match="toy_val"):
        read_fetched(load_benchmark_spec("toy_val"), root)


def test_the_shipped_dapo17k_holdout_on_real_rows(shared_data: Path) -> None:
    """The shipped spec's rule on the AIME-2024 file in DAPO's schema (30 problems x 32 rows), with
    n lowered to 5 (the shipped 256 is for the 17,398 problems of the real set)."""
    shipped = load_training_spec("dapo17k")
    assert shipped.holdout is not None and (shipped.holdout.n, shipped.holdout.seed) == (256, 0)
    spec = shipped.model_copy(
        update={"offline_file": DAPO_EVAL, "holdout": shipped.holdout.model_copy(update={"n": 5})}
    )
    train = load_training_dataset(spec, data_dir=shared_data)
    held, _ = load_holdout(spec, data_dir=shared_data)
    assert len(train) == 25 and len(held) == 5  # de-duplicated: one row per problem
    assert {r["prompt"] for r in train}.isdisjoint({r["prompt"] for r in held})
    raw = [json.loads(x) for x in (shared_data / DAPO_EVAL).read_text().splitlines() if x.strip()]
    truth = {r["extra_info"]["raw_problem"]: r["reward_model"]["ground_truth"] for r in raw}
    assert all(truth[r["prompt"]] == r["answer"] for r in held)  # raw problem, the recipe's answer
    assert all("Solve the following math problem" not in r["prompt"] for r in held)


def test_the_paper_selects_each_dataset_on_its_own_holdout(tmp_path: Path) -> None:
    """configs/paper.yaml: math test benchmarks are selected per training set on that set's held-out
    problems, LiveCodeBench on its earlier window; none of the three is a table column."""
    from aggbench import grid

    exp = grid.load_experiment(grid.REPO_ROOT / "configs" / "paper.yaml")
    exp["results_dir"] = str(tmp_path / "results")  # never the checkout's results/
    specs = load_data_specs(exp)
    assert selection_problems(exp, grid.selection(exp), specs) == []
    assert [specs.owner_of(b) and specs.owner_of(b).name for b in ("dapo17k_val", "polaris_val")] == [
        "dapo17k",
        "polaris",
    ]
    assert specs.owner_of("math500") is None and specs.owner_of("not_in_this_grid") is None
    assert specs.owner_of("livecodebench_val") is None  # a date window, not a holdout of a training set
    assert grid.test_benchmarks(exp) == [*MATH_TESTS, "livecodebench"]
    for dataset in ("dapo17k", "polaris"):
        chosen = grid.selection_for(exp, dataset)
        assert set(chosen) == set(grid.test_benchmarks(exp))
        assert {chosen[b] for b in MATH_TESTS} == {f"{dataset}_val"}
        assert load_benchmark_spec(f"{dataset}_val").holdout_of == dataset
        assert chosen["livecodebench"] == "livecodebench_val"
    val, test = load_benchmark_spec("livecodebench_val"), load_benchmark_spec("livecodebench")
    assert val.date_window.end == test.date_window.start  # the three months before, no overlap
    assert val.prompt_template == test.prompt_template and val.hub.revision == test.hub.revision
    assert val.hub.data_files == test.hub.data_files  # release_v5's files; each window keeps its rows


@pytest.mark.parametrize(
    ("selection", "message"),
    [
        ({"math500": "dapo17k_val"}, "'dapo17k_val' is held out of the training set 'dapo17k', but the cells of dataset 'polaris'"),
        ({"math500": {"dapo17k": "polaris_val", "polaris": "polaris_val"}}, "the cells of dataset 'dapo17k' train on 'dapo17k'"),
        ({"math500": {"dapo17k": "dapo17k_val"}}, "no selection benchmark for dataset 'polaris'"),
        ({"math500": {"dapo17k": "dapo17k_val", "polaris": "polaris_val", "gsm8k": "x"}}, "evaluation.selection.math500.gsm8k: no dataset 'gsm8k'"),
        ({"math500": {"dapo17k": "dapo17k_val", "polaris": "aime24"}, "aime24": "livecodebench_val"},
         "evaluation.selection.math500.polaris: 'aime24' is a test benchmark"),
    ],
)  # fmt: skip
def test_a_selection_that_could_have_been_trained_on_is_refused(
    selection: dict, message: str, tmp_path
) -> None:
    from aggbench import grid
    from aggbench.errors import InputError

    exp = grid.load_experiment(grid.REPO_ROOT / "configs" / "paper.yaml")
    exp["results_dir"] = str(tmp_path / "results")  # never the checkout's results/
    exp["evaluation"]["selection"] = selection
    found = selection_problems(exp, grid.selection(exp), load_data_specs(exp))
    assert any(message in p for p in found), found
    with pytest.raises(InputError, match="evaluation.selection"):
        grid.validate_experiment(exp)


def test_prepare_data_writes_the_training_rows_without_the_holdout(toy: Path, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from aggbench.cli import main

    out = tmp_path / "toy_train.jsonl"
    res = CliRunner().invoke(main, ["prepare-data", "toy", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "toy: 3 problems held out of training (holdout, seed 0)" in res.output
    written = [json.loads(x) for x in out.read_text().splitlines()]
    held = {r["prompt"] for r in load_holdout(load_training_spec("toy"))[0]}
    assert len(written) == len(load_training_dataset("toy")) and written
    assert not any(r["prompt"] in held for r in written)  # the toy spec's template is {prompt}


def test_a_training_file_prepared_from_other_spec_data_stops_the_grid(toy: Path, tmp_path: Path) -> None:
    """An existing results directory whose training file was prepared before the spec held problems
    out (or with another holdout, or other data fields) would train on the selection split, and
    Snakemake would not prepare it again: the config check (the Snakefile's, before any job)
    refuses it until it is."""
    from click.testing import CliRunner

    from aggbench import grid
    from aggbench.cli import main
    from aggbench.data.holdout import holdout_record_file
    from aggbench.layout import data_file

    exp = toy_grid(toy, tmp_path)
    grid.validate_experiment(exp)  # nothing prepared yet: nothing to compare
    prepared = data_file(exp["results_dir"], "toy")
    prepared.parent.mkdir(parents=True)
    rows = toy_rows()
    prepared.write_text(
        "".join(json.dumps({"prompt": r["problem"], "answer": r["answer"]}) + "\n" for r in rows)
    )
    with pytest.raises(
        grid.GridError, match=r"datasets.toy: .*toy.jsonl was prepared from other data"
    ) as err:
        grid.validate_experiment(exp)
    assert "prepared before holdouts existed" in str(err.value) and "Delete" in str(err.value)
    assert "retrain them" in str(err.value)
    res = CliRunner().invoke(main, ["prepare-data", "toy", "--out", str(prepared)])
    assert res.exit_code == 0, res.output
    assert json.loads(holdout_record_file(prepared).read_text())["holdout"] == {"n": 3, "seed": 0}
    grid.validate_experiment(exp)  # prepared from this spec: accepted
    write_specs(toy, seed=1)  # another holdout
    with pytest.raises(grid.GridError, match=r"holdout \{'n': 3, 'seed': 0\}"):
        grid.validate_experiment(exp)
    write_specs(toy)
    grid.validate_experiment(exp)
    spec = yaml.safe_load((toy / "datasets" / "toy.yaml").read_text())
    (toy / "datasets" / "toy.yaml").write_text(yaml.safe_dump({**spec, "dedupe": True}))  # other data
    with pytest.raises(grid.GridError, match="was prepared from other data of toy"):
        grid.validate_experiment(exp)


def test_problems_that_differ_only_in_spacing_or_unicode_form_are_one_problem(toy: Path) -> None:
    """Polaris is published with repeats (dedupe: false); a repeat that differs in whitespace or in
    Unicode form is the same problem, and leaves training with it."""
    rows = toy_rows()
    variants = [
        "  What is 7 + 7? ",
        "What is 7  +\n7?",
        "What is 7 \uff0b 7?",
    ]  # spaces, newline, fullwidth +
    rows += [{"uid": f"v{i}", "problem": text, "answer": "14"} for i, text in enumerate(variants)]
    for seed in range(100):
        write_specs(toy, seed=seed, rows=rows)
        held, _ = load_holdout(load_training_spec("toy"))
        if "What is 7 + 7?" in {r["prompt"] for r in held}:
            break
    else:
        pytest.fail("no seed in 0..99 held out problem 7")
    trained = {r["prompt"] for r in load_training_dataset("toy")}
    assert not trained & {"What is 7 + 7?", *variants}
    assert len(held) == 3  # one record for the four spellings


def test_a_same_named_copy_of_the_spec_with_other_data_cannot_select_on_the_holdout(
    toy: Path, tmp_path: Path
) -> None:
    """A grid whose dataset points at a copy named `toy` that holds nothing out trains on toy_val's
    problems: the config check compares the specs' data, not their names."""
    from aggbench import grid

    exp = toy_grid(toy, tmp_path)
    exp["benchmarks"] = ["tiny_test", "toy_val"]
    exp["evaluation"]["selection"] = {"tiny_test": "toy_val"}
    grid.validate_experiment(exp)
    copy = tmp_path / "copy"
    copy.mkdir()
    spec = yaml.safe_load((toy / "datasets" / "toy.yaml").read_text())
    (copy / "toy.yaml").write_text(yaml.safe_dump({k: v for k, v in spec.items() if k != "holdout"}))
    exp["datasets"] = {"toy": {"spec": str(copy / "toy.yaml")}}
    found = selection_problems(exp, grid.selection(exp), load_data_specs(exp))
    assert any("whose data or holdout differ (holdout n=3 seed=0 vs None)" in p for p in found), found


def test_a_holdout_is_paired_only_with_the_datasets_trained_on_exactly_its_set(toy: Path, tmp_path) -> None:
    """data.grid_checks.holdout_pairs is the one pairing rule: a holdout benchmark goes with the
    datasets trained on exactly its set (same name, data and holdout), not with a renamed copy of it
    nor a same-named copy holding out something else (selection_problems names those)."""
    from aggbench.data.grid_checks import holdout_pairs

    spec = yaml.safe_load((toy / "datasets" / "toy.yaml").read_text())
    (tmp_path / "renamed.yaml").write_text(yaml.safe_dump({**spec, "name": "renamed"}))
    (tmp_path / "reseeded.yaml").write_text(yaml.safe_dump({**spec, "holdout": {"n": 3, "seed": 9}}))
    exp = toy_grid(toy, tmp_path)
    exp["benchmarks"] = ["tiny_test", "toy_val"]
    exp["datasets"] = {
        "toy": {"spec": "toy"},
        "also_toy": {"spec": "toy"},
        "renamed": {"spec": str(tmp_path / "renamed.yaml")},
        "reseeded": {"spec": str(tmp_path / "reseeded.yaml")},
    }
    specs = load_data_specs(exp)
    assert [(b, owner.name, ds) for b, owner, ds in holdout_pairs(specs)] == [
        ("toy_val", "toy", "toy"),
        ("toy_val", "toy", "also_toy"),
    ]
    exp["evaluation"]["selection"] = {"tiny_test": "toy_val"}
    found = selection_problems(exp, {"tiny_test": "toy_val"}, specs)
    assert len(found) == 2 and all(
        p.startswith("evaluation.selection.tiny_test: 'toy_val' ") for p in found
    ), found
    assert "cells of dataset 'renamed' train on 'renamed'" in found[0]
    assert "dataset 'reseeded' trains on" in found[1] and "seed=9" in found[1]
    # the split check and grid check's warning use those pairs: every prepared file below left out
    # other problems (or recorded none), and only the paired datasets' files are named
    from aggbench.data.grid_checks import split_problems
    from aggbench.data.holdout import write_holdout_record
    from aggbench.layout import benchmark_data_dir, data_file
    from aggbench.plan.readiness import unchecked_splits

    fetched = benchmark_data_dir(exp["results_dir"])
    fetch_benchmarks(["toy_val"], fetched, echo=lambda _: None)
    prepared = {name: data_file(exp["results_dir"], name) for name in exp["datasets"]}
    for name, path in prepared.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"prompt": "What is 1 + 1?", "answer": "2"}) + "\n")
        write_holdout_record(path, specs.datasets[name], [{"prompt": "What is 1 + 1?"}])
    found = split_problems(specs, prepared, fetched)
    assert [p.split(":")[0] for p in found] == ["datasets.toy", "datasets.also_toy"], found
    for name, path in prepared.items():  # recorded before digests were kept
        write_holdout_record(path, specs.datasets[name])
    [warning] = unchecked_splits(exp)
    assert f"{prepared['toy']} (delete it" in warning and f"{prepared['also_toy']} (delete it" in warning
    assert "renamed" not in warning and "reseeded" not in warning


def test_a_holdout_benchmark_of_a_set_without_holdout_or_of_no_set_is_refused(toy, tmp_path) -> None:
    from aggbench import grid

    exp = toy_grid(toy, tmp_path)
    bench = yaml.safe_load((toy / "benchmarks" / "toy_val.yaml").read_text())
    for of, message in (("tiny", "benchmarks: bad_val is holdout_of 'tiny', which holds nothing out"),
                        ("nosuch", "benchmarks: bad_val is holdout_of 'nosuch': unknown training dataset")):  # fmt: skip
        (toy / "benchmarks" / "bad_val.yaml").write_text(
            yaml.safe_dump({**bench, "name": "bad_val", "holdout_of": of})
        )
        exp["benchmarks"] = ["tiny_test", "bad_val"]
        with pytest.raises(grid.GridError, match=message):
            grid.validate_experiment(exp)


def test_a_stale_fetched_copy_stops_the_grid_before_any_job(toy: Path, tmp_path: Path) -> None:
    """Snakemake does not rerun fetch_benchmarks when a spec changes; every generate job would fail
    on the copy: the config check says so first, with the refetch command."""
    from aggbench import grid
    from aggbench.layout import benchmark_data_dir

    exp = toy_grid(toy, tmp_path)
    exp["benchmarks"] = ["tiny_test", "toy_val"]
    fetch_benchmarks(["toy_val"], benchmark_data_dir(exp["results_dir"]), echo=lambda _: None)
    grid.validate_experiment(exp)
    write_specs(toy, seed=5)
    with pytest.raises(
        grid.GridError, match=r"holdout_of toy: that training set's data or holdout changed"
    ) as err:
        grid.validate_experiment(exp)
    assert "--refetch toy_val" in str(err.value)
