"""The holdout split checked by its problems (issue 27, item 3): prepare-data and the holdout
benchmark's fetch read the training set's rows separately, so each records a digest of the problems
it held out; whichever job runs second compares them (they may run at once), and so does the config
check. Split from tests/data/test_holdout.py (the split itself and the selection checks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from aggbench.data import SpecError, load_benchmark_spec, load_training_spec
from aggbench.data.fetch import fetch_benchmarks, read_fetched
from aggbench.data.holdout import load_holdout
from helpers.holdout_toy import toy_grid, toy_rows, write_specs


def test_a_training_file_and_holdout_fetch_that_read_other_rows_are_refused(
    toy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holdout benchmark's fetch and prepare-data read the training set's rows separately: with
    another data directory for one (or a newer offline file), the held-out problems differ and the
    selection split's problems can be in training, while both spec hashes agree. Each records a
    digest of its held-out problems; whichever job runs second refuses (prepare-data writes no file,
    the fetch locks nothing), the config check refuses a pair that differs, and following the fix
    the messages give clears it. A lock or record without a digest (written before) is not compared."""
    from click.testing import CliRunner

    from aggbench import grid
    from aggbench.cli import main
    from aggbench.data.fetch import lock_file, read_lock
    from aggbench.data.holdout import held_digest, holdout_record_file
    from aggbench.layout import benchmark_data_dir, data_file

    exp = toy_grid(toy, tmp_path)
    exp["benchmarks"] = ["tiny_test", "toy_val"]
    config = tmp_path / "grid.yaml"
    config.write_text(yaml.safe_dump(exp))
    fetched, prepared = benchmark_data_dir(exp["results_dir"]), data_file(exp["results_dir"], "toy")
    held = load_holdout(load_training_spec("toy"))[0]
    texts = {r["prompt"] for r in held}
    other = tmp_path / "other-data"  # a newer offline file elsewhere, without those problems
    other.mkdir()
    (other / "toy.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in toy_rows() if r["problem"] not in texts)
    )

    def prepare(data_dir: Path):
        monkeypatch.setenv("AGGBENCH_DATA_DIR", str(data_dir))
        return CliRunner().invoke(main, ["prepare-data", "toy", "--out", str(prepared)])

    # the fetch first, then prepare-data on other rows: refused, nothing written
    fetch_benchmarks(["toy_val"], fetched, echo=lambda _: None)
    entry = read_lock(fetched)["toy_val"]
    assert (entry["holdout_of"], entry["held_digest"]) == ("toy", held_digest(held))
    res = prepare(other)
    assert res.exit_code != 0 and "left out other problems of toy" in res.output, res.output
    assert "--refetch toy_val" in res.output and not prepared.exists()
    # prepare-data first, then the fetch on other rows: refused, the benchmark not locked
    lock_file(fetched).unlink()
    assert prepare(other).exit_code == 0
    monkeypatch.setenv("AGGBENCH_DATA_DIR", str(toy / "data"))
    with pytest.raises(SpecError, match=r"left out other problems of toy .* than benchmark toy_val holds"):
        fetch_benchmarks(["toy_val"], fetched, echo=lambda _: None)
    assert "toy_val" not in read_lock(fetched)
    # a pair that differs anyway (a file prepared elsewhere and copied in): the config check, which
    # the Snakefile and `aggbench report` (through load_experiment) run, refuses it
    record = json.loads(holdout_record_file(prepared).read_text())
    prepared.unlink()
    fetch_benchmarks(["toy_val"], fetched, echo=lambda _: None)
    assert prepare(toy / "data").exit_code == 0
    holdout_record_file(prepared).write_text(json.dumps(record))
    with pytest.raises(grid.GridError, match=r"datasets.toy: .*left out other problems") as err:
        grid.validate_experiment(exp)
    assert f"holds (digest {held_digest(held)}" in str(err.value) and "--refetch toy_val" in str(err.value)
    with pytest.raises(grid.GridError, match="left out other problems"):
        grid.load_experiment(config)
    # the fix, as the message says: delete the prepared file and refetch (the record may stay)
    prepared.unlink()
    fetch_benchmarks(["toy_val"], fetched, refetch=["toy_val"], echo=lambda _: None)
    grid.validate_experiment(exp)
    assert prepare(toy / "data").exit_code == 0
    grid.validate_experiment(exp)
    assert {json.loads(x)["prompt"] for x in prepared.read_text().splitlines()}.isdisjoint(texts)
    # written before digests were kept: not compared, and `aggbench grid check` warns that nothing is
    from aggbench.data.fetch import _write_lock
    from aggbench.plan.readiness import unchecked_splits

    assert unchecked_splits(exp) == []
    holdout_record_file(prepared).write_text(json.dumps({**record, "held_digest": None}))
    grid.validate_experiment(exp)
    [warning] = unchecked_splits(exp)
    assert warning.startswith("benchmark toy_val (holdout of toy): written before held-out digests")
    assert f"{prepared} (delete it" in warning and "--refetch" not in warning
    lock = read_lock(fetched)
    del lock["toy_val"]["held_digest"]
    _write_lock(fetched, lock)
    assert "--refetch toy_val" in unchecked_splits(exp)[0]


def _other_rows_dir(tmp_path: Path) -> Path:
    """An offline toy.jsonl without the problems the toy spec holds out: another split."""
    held = {r["prompt"] for r in load_holdout(load_training_spec("toy"))[0]}
    other = tmp_path / "other-data"
    other.mkdir()
    (other / "toy.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in toy_rows() if r["problem"] not in held)
    )
    return other


def test_prepare_data_and_the_fetch_running_at_once_cannot_both_pass_another_split(
    toy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """prepare_data and fetch_benchmarks are independent local jobs, so they can run at once: each
    writes its record before its last check, so one of them sees the other's. A fetch that locks
    inside prepare-data's write is seen by prepare-data (its file and record removed, nothing
    trains); a prepare-data inside the fetch's commit is seen by the fetch (its entry and file
    removed, nothing evaluates)."""
    from click.testing import CliRunner

    import aggbench.data.fetch as fetch_mod
    from aggbench.cli import main
    from aggbench.data.fetch import read_lock, records_file
    from aggbench.data.holdout import holdout_record_file
    from aggbench.layout import benchmark_data_dir, data_file

    results = tmp_path / "results"
    fetched, prepared = benchmark_data_dir(results), data_file(results, "toy")
    prepared.parent.mkdir(parents=True)
    other = _other_rows_dir(tmp_path)
    default = toy / "data"

    def prepare_on(data_dir: Path):
        monkeypatch.setenv("AGGBENCH_DATA_DIR", str(data_dir))
        return CliRunner().invoke(main, ["prepare-data", "toy", "--out", str(prepared)])

    # 1. the fetch (default rows) locks while prepare-data (other rows) writes its file
    import aggbench.data as data_mod

    real_write = data_mod.write_jsonl

    def write_then_fetch(*args, **kwargs):
        n = real_write(*args, **kwargs)
        fetch_benchmarks(["toy_val"], fetched, data_dir=default, echo=lambda _: None)
        return n

    monkeypatch.setattr(data_mod, "write_jsonl", write_then_fetch)
    res = prepare_on(other)
    assert res.exit_code != 0 and "left out other problems of toy" in res.output, res.output
    assert not prepared.exists() and not holdout_record_file(prepared).exists()
    assert "toy_val" in read_lock(fetched)  # the fetch ran first to its end: it saw no record
    monkeypatch.setattr(data_mod, "write_jsonl", real_write)

    # 2. prepare-data (other rows) runs to its end while the fetch (default rows) commits its copy
    fetch_mod.lock_file(fetched).unlink()
    real_lock = fetch_mod._lock

    def prepare_then_lock(*args, **kwargs):
        assert prepare_on(other).exit_code == 0  # no lock entry yet: it passes
        return real_lock(*args, **kwargs)

    monkeypatch.setattr(fetch_mod, "_lock", prepare_then_lock)
    with pytest.raises(SpecError, match="left out other problems of toy"):
        fetch_benchmarks(["toy_val"], fetched, data_dir=default, echo=lambda _: None)
    assert "toy_val" not in read_lock(fetched) and not records_file(fetched, "toy_val").exists()


def test_records_of_another_version_of_the_spec_are_not_compared(
    toy: Path, tmp_path: Path, monkeypatch
) -> None:
    """A lock entry or prepared record written from other spec data (the holdout edited since, a
    benchmark the grid no longer has) is another split on purpose: the jobs compare only records of
    the same spec data, so an edited spec is prepared and fetched again without a false refusal."""
    from click.testing import CliRunner

    from aggbench.cli import main
    from aggbench.layout import benchmark_data_dir, data_file

    results = tmp_path / "results"
    fetched, prepared = benchmark_data_dir(results), data_file(results, "toy")
    prepared.parent.mkdir(parents=True)
    fetch_benchmarks(["toy_val"], fetched, echo=lambda _: None)
    write_specs(toy, n=4)  # the holdout edited: toy_val's lock entry is of the old split
    res = CliRunner().invoke(main, ["prepare-data", "toy", "--out", str(prepared)])
    assert res.exit_code == 0, res.output
    write_specs(toy, n=3)  # and back: the prepared record (n=4) is of another split than the fetch's
    fetch_benchmarks(["toy_val"], fetched, refetch=["toy_val"], echo=lambda _: None)


def test_a_refused_refetch_keeps_the_copy_it_had(toy: Path, tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from aggbench.cli import main
    from aggbench.layout import benchmark_data_dir, data_file

    results = tmp_path / "results"
    fetched, prepared = benchmark_data_dir(results), data_file(results, "toy")
    prepared.parent.mkdir(parents=True)
    fetch_benchmarks(["toy_val"], fetched, echo=lambda _: None)
    assert CliRunner().invoke(main, ["prepare-data", "toy", "--out", str(prepared)]).exit_code == 0
    before, _ = read_fetched(load_benchmark_spec("toy_val"), fetched)
    with pytest.raises(SpecError, match="left out other problems of toy"):
        fetch_benchmarks(
            ["toy_val"], fetched, data_dir=_other_rows_dir(tmp_path), refetch=["toy_val"], echo=print
        )
    assert read_fetched(load_benchmark_spec("toy_val"), fetched)[0] == before  # checked against its lock
