"""A bad config stops `snakemake` before any job, naming the key and what is allowed there.

The Snakefile's check is ``aggbench.grid.validate_experiment`` on the config Snakemake read, so its
messages (a misspelled key, an unknown rule or benchmark, a negative step count, a missing model
directory) are checked on the validator directly; Snakemake runs only for what it alone reports (a
config file that is not YAML, or not a mapping) and to show a bad config stops a real run first."""

from __future__ import annotations

import pytest
import yaml

from aggbench.grid import GridError, validate_experiment

# (case, change to the smoke config, strings the error must contain: the key, and allowed values)
CASES = [
    (
        "misspelled top-level key",
        lambda c: c.__setitem__("seedz", c.pop("seeds")),
        ["seedz", "allowed keys", "seeds", "benchmarks"],
    ),
    (
        "misspelled evaluation key",
        lambda c: c["evaluation"].__setitem__("evrey", c["evaluation"].pop("every")),
        ["evaluation", "evrey", "allowed keys", "every", "base_model"],
    ),
    (
        "misspelled training key",
        lambda c: c["training"]["algorithm"].__setitem__("lrr", c["training"]["algorithm"].pop("lr")),
        ["algorithm.lrr", "allowed keys", "lr", "total_steps"],
    ),
    (
        "unknown aggregation rule",
        lambda c: c["aggregations"].append({"name": "tokne"}),
        ["aggregations[3]", "tokne", "token", "balanced", "sequence"],
    ),
    (
        "unknown benchmark",
        lambda c: c.__setitem__("benchmarks", ["tiny_test", "math5000"]),
        ["benchmarks", "math5000", "math500", "aime24", "tiny_test"],
    ),
    (
        "negative step count",
        lambda c: c["training"]["checkpoint"].__setitem__("every", -4),
        ["training.checkpoint.every", "-4", "minimum of 1"],
    ),
    (
        "missing model path",
        lambda c: c["models"].__setitem__("tiny", {"source": "/nonexistent/aggbench-model", "path": True}),
        ["models.tiny.source", "/nonexistent/aggbench-model", "does not exist"],
    ),
]


@pytest.mark.parametrize(("case", "change", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_config_is_refused_with_a_message_naming_key_and_allowed_values(
    wf, tmp_path, monkeypatch, case, change, expected
):
    monkeypatch.chdir(wf.REPO)  # where Snakemake runs the Snakefile (plugins are looked up there)
    cfg = yaml.safe_load(wf.SMOKE.read_text())
    change(cfg)
    cfg["results_dir"] = str(tmp_path / "results")  # as the dry run's --config results_dir=...
    with pytest.raises(GridError) as err:
        validate_experiment(cfg)
    out = str(err.value)
    for s in expected:
        assert s in out, f"{case}: {s!r} not in the error message:\n{out[-3000:]}"


# (case, change, the one line the error must hold, what must not be in it): issue 26's review found
# the list of benchmarks printed twice, a garbled "invalid config training config of cell" prefix,
# a bare regex for a benchmark given as a path, and allowed keys without a suggestion
WORDED = [
    (
        "misspelled key gets a suggestion",
        lambda c: c.__setitem__("aggregatons", c.pop("aggregations")),
        "(top level): unknown key(s) 'aggregatons' ('aggregatons' -> did you mean 'aggregations'?); allowed keys:",
        None,
    ),
    (
        "benchmark given as a path",
        lambda c: c.__setitem__("benchmarks", ["data/math500.jsonl"]),
        "benchmarks.0: 'data/math500.jsonl' is not a benchmark name (letters, digits, _ and - only): name a "
        "benchmark YAML of configs/benchmarks/",
        "does not match",
    ),
    (
        "negative learning rate",
        lambda c: c["training"]["algorithm"].__setitem__("lr", -1e-4),
        "training.algorithm.lr: Input should be greater than 0 (the training config of cell tiny__tiny__",
        "invalid config training config",
    ),
]


@pytest.mark.parametrize(("case", "change", "line", "absent"), WORDED, ids=[c[0] for c in WORDED])
def test_bad_config_messages_are_worded_for_the_user(wf, tmp_path, monkeypatch, case, change, line, absent):
    monkeypatch.chdir(wf.REPO)
    cfg = yaml.safe_load(wf.SMOKE.read_text())
    change(cfg)
    cfg["results_dir"] = str(tmp_path / "results")
    with pytest.raises(GridError) as err:
        validate_experiment(cfg)
    lines = str(err.value).splitlines()
    assert any(entry.strip().startswith(line) for entry in lines), f"{case}:\n{err.value}"
    assert absent is None or absent not in str(err.value), f"{case}:\n{err.value}"


def test_an_unknown_benchmark_lists_the_known_ones_once(wf, tmp_path, monkeypatch):
    monkeypatch.chdir(wf.REPO)
    cfg = yaml.safe_load(wf.SMOKE.read_text())
    cfg["benchmarks"] = ["math_500"]
    cfg["results_dir"] = str(tmp_path / "results")
    with pytest.raises(GridError) as err:
        validate_experiment(cfg)
    out = str(err.value)
    assert "unknown benchmark 'math_500'. Did you mean 'math500'?" in out
    assert out.count("aime24") == 1 and out.count("'math_500'") == 1, out


# (case, config file text, what Snakemake says): it reads the file before the Snakefile's check runs
# (snakemake.common.configfile drops the YAML error's line and column: `aggbench grid check --config
# FILE` shows them, tests/cli/test_cli_errors_config.py)
UNREADABLE = [
    (
        "not YAML",
        "experiment: x\nseeds: [0\nbenchmarks: [tiny_test]\n",
        "Config file is not valid JSON or YAML",
    ),
    ("not a mapping", "- 1\n", "Config file must be given as JSON or YAML with keys at top level"),
]


@pytest.mark.parametrize(("case", "text", "expected"), UNREADABLE, ids=[c[0] for c in UNREADABLE])
def test_unreadable_config_file_stops_the_dry_run_before_any_job(wf, tmp_path, case, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    proc = wf.run(
        ["-n", "--configfile", str(path), "--config", f"results_dir={tmp_path / 'results'}"], check=False
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"{case}: snakemake accepted the config\n{out[-2000:]}"
    assert expected in out, f"{case}: {expected!r} not in the error message:\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]
    # stopped while reading the config: no job was even planned
    assert "Job stats" not in out and "Building DAG of jobs" not in out, out[-2000:]


def test_bad_config_starts_no_job_in_a_real_run(wf, tmp_path):
    """The Snakefile's check through Snakemake itself: a real run with a bad key prints the
    validator's message, plans no job and writes nothing at all."""
    cfg = yaml.safe_load(wf.SMOKE.read_text())
    cfg["aggregations"][0]["rule"] = "no_such_rule"
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    results = tmp_path / "results"
    proc = wf.run(
        [
            "-s",
            str(wf.SNAKEFILE),
            "--cores",
            "1",
            "--configfile",
            str(path),
            "--config",
            f"results_dir={results}",
        ],
        cwd=tmp_path,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "no_such_rule" in out
    assert not results.exists(), sorted(p.name for p in results.rglob("*"))
    # the Snakefile's check stopped it while reading the config: no job was even planned
    assert "Job stats" not in out and "Building DAG of jobs" not in out, out[-2000:]
