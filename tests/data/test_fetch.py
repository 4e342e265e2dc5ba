"""Benchmark data for offline compute nodes (issue 24, item 1): `aggbench data fetch`.

The benchmarks are served by a FAKE of the Hugging Face hub (tests/helpers/fake_hub.py: a local
HTTP server answering the endpoints `datasets.load_dataset` calls) holding the real files of
../shared/data at the specs' pinned commits, and, for Minerva's pinned-URL source, the same server's
/raw/ path. `aggbench data fetch` runs as a subprocess with HF_ENDPOINT pointing there, so the code
under test is the code a login node runs. Shown: every benchmark of a small grid is written and
locked; a later fetch checks instead of downloading; a corrupted file is refused by its sha256 (on
load and on fetch) until --refetch; `aggbench generate` under HF_DATASETS_OFFLINE=1 reads the
fetched copy and reaches no server (and, as the control, fails without it).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
from aggbench.data.fetch import FetchedDataError, fetch_benchmarks, read_fetched, records_file, unfetched
from helpers.fake_hub import FakeHub, hub_env

REPO = Path(__file__).resolve().parents[2]
AGGBENCH = [sys.executable, "-m", "aggbench.cli"]


@pytest.fixture
def hub(shared_data: Path, tmp_path: Path):
    """The fake hub with MATH-500 and AIME 2024 at their specs' pinned commits and Minerva's file
    under /raw/; plus a benchmark dir whose minerva spec points its URL at that server."""
    repos = {}
    for name, file in (("math500", "math500/test.jsonl"), ("aime24", "aime24/test.jsonl")):
        spec = load_benchmark_spec(name)
        repos[spec.hub.id] = (
            spec.hub.revision,
            {"test.jsonl" if name == "math500" else "train.jsonl": (shared_data / file).read_bytes()},
        )
    fake = FakeHub(repos, raw={"minerva/test.jsonl": (shared_data / "minerva/test.jsonl").read_bytes()})
    fake.start()
    specs = tmp_path / "benchmarks"
    specs.mkdir()
    minerva = yaml.safe_load((REPO / "configs/benchmarks/minerva.yaml").read_text())
    minerva["url"]["url"] = f"{fake.endpoint}/raw/minerva/test.jsonl"  # same sha256 pin as shipped
    (specs / "minerva.yaml").write_text(yaml.safe_dump(minerva))
    yield fake, specs
    fake.stop()


def _env(fake: FakeHub, specs: Path, home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "AGGBENCH_DATA_DIR"}
    return {**env, **hub_env(fake.endpoint, home), "AGGBENCH_BENCHMARK_DIR": str(specs), **extra}


def _grid(tmp_path: Path) -> Path:
    exp = yaml.safe_load((REPO / "configs/smoke.yaml").read_text())
    exp["benchmarks"] = ["math500", "aime24", "minerva", "tiny_test"]
    exp["results_dir"] = str(tmp_path / "results")
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(exp))
    return path


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*AGGBENCH, *args], env=env, capture_output=True, text=True, timeout=600)


def test_fetch_writes_every_benchmark_of_a_small_grid_and_a_later_fetch_only_checks(
    hub, tmp_path, shared_data
):
    fake, specs = hub
    env = _env(fake, specs, tmp_path / "hf")
    proc = _run(["data", "fetch", "--config", str(_grid(tmp_path))], env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    root = tmp_path / "results" / "data" / "benchmarks"
    lock = json.loads((root / "lock.json").read_text())["benchmarks"]
    assert sorted(lock) == ["aime24", "math500", "minerva"]  # tiny_test is built in: nothing fetched
    assert "tiny_test: built in" in proc.stdout and proc.stdout.rstrip().endswith(
        f"OK: 4 benchmark(s) in {root}"
    )
    math500 = load_benchmark_spec("math500")
    assert lock["math500"]["source"] == f"hf://datasets/{math500.hub.id}@{math500.hub.revision}"
    assert lock["minerva"]["source"] == f"{fake.endpoint}/raw/minerva/test.jsonl"
    # through the hub at the pinned commit, not some other revision
    assert f"GET /datasets/{math500.hub.id}/resolve/{math500.hub.revision}/test.jsonl" in fake.requests

    for name, count in (("math500", 500), ("aime24", 30), ("minerva", 272)):
        assert lock[name]["records"] == count, name
        fetched, source = read_fetched(
            load_benchmark_spec(name) if name != "minerva" else _spec(specs, name), root
        )
        offline = load_benchmark(name, data_dir=shared_data)  # the same data read from ../shared/data
        assert [dict(r) for r in fetched] == [dict(r) for r in offline], name
        assert source.endswith(f"(fetched, sha256 {lock[name]['sha256'][:12]})")

    before = len(fake.requests)
    again = _run(["data", "fetch", "--config", str(_grid(tmp_path))], env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count("already fetched, sha256 checked") == 3
    assert not [r for r in fake.requests[before:] if "/resolve/" in r or "/raw/" in r]  # nothing downloaded
    assert json.loads((root / "lock.json").read_text())["benchmarks"] == lock


def _spec(specs: Path, name: str):
    return load_benchmark_spec(specs / f"{name}.yaml")


def test_a_corrupted_file_is_refused_by_its_sha256_until_refetched(hub, tmp_path):
    fake, specs = hub
    env = _env(fake, specs, tmp_path / "hf")
    root = tmp_path / "fetched"
    assert _run(["data", "fetch", "--benchmarks", "math500", "--out", str(root)], env).returncode == 0
    path = records_file(root, "math500")
    good = path.read_bytes()
    spec = load_benchmark_spec("math500")
    assert len(load_benchmark(spec, fetched=root)) == 500

    path.write_bytes(good.replace(b'"answer": "', b'"answer": "1', 1))  # one answer changed
    with pytest.raises(FetchedDataError, match=r"has sha256 [0-9a-f]{64}, but .*lock.json recorded") as err:
        load_benchmark(spec, fetched=root)
    assert "--refetch math500" in str(err.value)
    proc = _run(["data", "fetch", "--benchmarks", "math500", "--out", str(root)], env)
    assert proc.returncode == 1 and "the file changed or is corrupt" in proc.stderr
    assert proc.stderr.count("\n") <= 2, proc.stderr  # one line, no traceback

    proc = _run(["data", "fetch", "--benchmarks", "math500", "--out", str(root), "--refetch", "math500"], env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert path.read_bytes() == good
    assert len(load_benchmark(spec, fetched=root)) == 500


def test_generate_offline_reads_only_the_fetched_copy(hub, tmp_path, shared_data):
    from helpers.tiny_models import tiny_model_for_tests

    fake, specs = hub
    root = tmp_path / "fetched"
    env = _env(fake, specs, tmp_path / "hf")
    assert _run(["data", "fetch", "--benchmarks", "math500", "--out", str(root)], env).returncode == 0
    model = tiny_model_for_tests(tmp_path / "model")
    offline = {**env, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    shutil.rmtree(tmp_path / "hf")  # no hub cache to fall back on either
    args = ["generate", "--checkpoint", str(model), "--benchmarks", "math500", "--limit", "2", "--n", "1",
            "--max-tokens", "2", "--device", "cpu", "--quiet"]  # fmt: skip
    before = len(fake.requests)

    proc = _run([*args, "--fetched", str(root), "--out", str(tmp_path / "out")], offline)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((tmp_path / "out" / "generation.json").read_text())["benchmarks"]["math500"]
    assert info["n_problems"] == 2 and "(fetched, sha256 " in info["source"]
    ids = [json.loads(line)["id"] for line in (tmp_path / "out" / "math500.jsonl").read_text().splitlines()]
    first = [
        json.loads(line)["unique_id"]
        for line in (shared_data / "math500/test.jsonl").read_text().splitlines()[:2]
    ]
    assert sorted(set(ids)) == sorted(first)
    assert fake.requests[before:] == []  # nothing asked of any server

    # control: the same job without the fetched copy fails offline, naming the fix
    proc = _run([*args, "--out", str(tmp_path / "out2")], offline)
    assert proc.returncode == 1 and "could not load hf://datasets/HuggingFaceH4/MATH-500@" in proc.stderr


def test_a_benchmark_not_fetched_or_fetched_for_other_spec_data_is_refused(tmp_path, shared_data):
    """In process, from ../shared/data (the offline-file source): the lock is the gate."""
    root = tmp_path / "fetched"
    fetch_benchmarks(["aime24"], root, data_dir=shared_data, echo=lambda _line: None)
    assert unfetched(["aime24", "math500", "tiny_test"], root) == ["math500"]
    with pytest.raises(
        FetchedDataError, match=r"math500: not in the fetched benchmark data .* lists: aime24"
    ):
        load_benchmark("math500", fetched=root)
    spec = load_benchmark_spec("aime24")
    moved = spec.model_copy(update={"hub": spec.hub.model_copy(update={"revision": "0" * 40})})
    with pytest.raises(FetchedDataError, match=r"was fetched for other spec data .* --refetch aime24"):
        load_benchmark(moved, fetched=root)
    # the built-in task needs no data: the fetched directory is not consulted
    assert len(load_benchmark("tiny_test", fetched=root)) > 0
    with pytest.raises(FetchedDataError, match=r"--refetch math500: not among the benchmarks fetched"):
        fetch_benchmarks(["aime24"], root, refetch=["math500"], echo=lambda _line: None)


def test_public_tests_only_is_refused_unless_allowed(shared_data, tmp_path):
    """Issue 28, item 4(d): the offline LiveCodeBench copy has public tests only; the grid's fetch
    refuses it (nothing written, the message names the config key), and accepts it when allowed,
    recording the count in the lock."""
    root = tmp_path / "fetched"
    with pytest.raises(FetchedDataError, match="evaluation.allow_public_tests_only: true"):
        fetch_benchmarks(
            ["livecodebench"], root, data_dir=shared_data, echo=lambda _: None, allow_public_tests_only=False
        )
    assert not records_file(root, "livecodebench").exists()
    lock = fetch_benchmarks(["livecodebench"], root, data_dir=shared_data, echo=lambda _: None)
    entry = lock["livecodebench"]
    assert entry["public_tests_only"] == entry["records"] > 0
    # a copy fetched earlier (allowed then) is refused by a grid that does not allow it, also when
    # its lock predates the count
    with pytest.raises(FetchedDataError, match="fetched copy under .* has public tests only"):
        fetch_benchmarks(
            ["livecodebench"], root, data_dir=shared_data, echo=lambda _: None, allow_public_tests_only=False
        )
    lock_path = root / "lock.json"
    old_lock = json.loads(lock_path.read_text())
    old_lock["benchmarks"]["livecodebench"].pop("public_tests_only")
    lock_path.write_text(json.dumps(old_lock))
    with pytest.raises(FetchedDataError, match="has public tests only"):
        fetch_benchmarks(
            ["livecodebench"], root, data_dir=shared_data, echo=lambda _: None, allow_public_tests_only=False
        )
    records, _ = read_fetched(load_benchmark_spec("livecodebench"), root)
    assert len(records) == entry["records"] and all(r["public_tests_only"] for r in records)
