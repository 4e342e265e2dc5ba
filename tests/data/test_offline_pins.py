"""Each shipped benchmark's offline copy is pinned by its spec's ``offline_sha256`` (and
LiveCodeBench's join file by ``offline_join.sha256``): another, damaged or truncated copy is refused
naming the pin, never read as a smaller benchmark. Against the real files in ../shared/data."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from aggbench.data import DataUnavailableError, load_benchmark, load_benchmark_spec


@pytest.mark.parametrize("name", ["math500", "aime24", "aime25", "olympiadbench", "minerva", "livecodebench"])
def test_an_offline_copy_that_is_not_the_pinned_file_is_refused(
    tmp_path: Path, shared_data: Path, name
) -> None:
    """Every benchmark with an offline copy pins its sha256 (PROVENANCE.md's): a truncated copy (its
    first half, cut at a line break, still valid JSONL) is refused naming the pin, never read as a
    smaller benchmark; the real copy reads as before."""
    spec = load_benchmark_spec(name)
    assert spec.offline_sha256 is not None and spec.offline_file is not None
    assert len(load_benchmark(name, data_dir=shared_data)) > 0  # the real file passes its pin
    data = tmp_path / "data"
    shutil.copytree(shared_data, data)
    copy = data / spec.offline_file
    copy.chmod(0o644)
    lines = copy.read_text().splitlines(keepends=True)
    copy.write_text("".join(lines[: len(lines) // 2]))
    with pytest.raises(
        DataUnavailableError, match=rf"{name}: .* the spec's offline_sha256 pins {spec.offline_sha256}"
    ):
        load_benchmark(name, data_dir=data)


def test_the_livecodebench_join_file_is_pinned_too(tmp_path: Path, shared_data: Path) -> None:
    spec = load_benchmark_spec("livecodebench")
    assert spec.offline_join is not None and spec.offline_join.sha256 is not None
    data = tmp_path / "data"
    shutil.copytree(shared_data, data)
    join = data / spec.offline_join.file
    join.chmod(0o644)
    join.write_text(join.read_text().replace("Return", "return", 1))  # one word changed, same rows
    with pytest.raises(DataUnavailableError, match=r"offline_join\.sha256 pins 6441538a"):
        load_benchmark("livecodebench", data_dir=data)


def test_a_source_with_another_row_count_than_expected_rows_is_refused(
    tmp_path: Path, shared_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``expected_rows`` checks what a pin cannot: a hub split or revision, or a damaged datasets
    cache. Here a spec without its offline pin (a user's copy of aime24's spec, as the hub path would
    be) reads a copy with one row dropped: load and fetch both refuse it, naming the field; the
    shipped specs' counts are their files' (every shipped copy loads: the pin test above)."""
    from aggbench.data import DataError
    from aggbench.data.fetch import FetchedDataError, fetch_benchmarks, records_file

    assert {n: load_benchmark_spec(n).expected_rows for n in ("math500", "aime24", "aime25")} == {
        "math500": 500,
        "aime24": 30,
        "aime25": 30,
    }
    specs = tmp_path / "specs"
    specs.mkdir()
    text = (Path(__file__).resolve().parents[2] / "configs/benchmarks/aime24.yaml").read_text()
    text = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("offline_sha256:"))
    (specs / "mine.yaml").write_text(text.replace("name: aime24", "name: mine"))
    monkeypatch.setenv("AGGBENCH_BENCHMARK_DIR", str(specs))
    data = tmp_path / "data"
    shutil.copytree(shared_data, data)
    copy = data / load_benchmark_spec("mine").offline_file
    copy.chmod(0o644)
    assert len(load_benchmark("mine", data_dir=data)) == 30  # the whole file: as expected
    # a copy fetched before the spec declared its count (here: the spec now says 31) is refused too
    fetched = tmp_path / "fetched_before"
    fetch_benchmarks(["mine"], fetched, data_dir=data, echo=lambda _line: None)
    spec_file = specs / "mine.yaml"
    spec_file.write_text(spec_file.read_text().replace("expected_rows: 30", "expected_rows: 31"))
    with pytest.raises(
        FetchedDataError, match=r"holds 30 records, but the spec's expected_rows is 31.*--refetch mine"
    ):
        fetch_benchmarks(["mine"], fetched, data_dir=data, echo=lambda _line: None)
    spec_file.write_text(spec_file.read_text().replace("expected_rows: 31", "expected_rows: 30"))
    copy.write_text("".join(copy.read_text().splitlines(keepends=True)[:-1]))  # the last row gone
    with pytest.raises(DataError, match=r"mine: 29 rows, but the spec's expected_rows is 30"):
        load_benchmark("mine", data_dir=data)
    assert len(load_benchmark("mine", data_dir=data, limit=5)) == 5  # a limit reads a part: no count
    root = tmp_path / "fetched"
    with pytest.raises(DataError, match=r"mine: 29 rows, but the spec's expected_rows is 30"):
        fetch_benchmarks(["mine"], root, data_dir=data, echo=lambda _line: None)
    assert not records_file(root, "mine").exists()  # nothing half-written kept
