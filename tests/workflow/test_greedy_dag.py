"""evaluation.greedy through Snakemake (issue 28, item 4(b)): the same generate and grade jobs write
the greedy n=1 protocol beside the sampled one, for the cell and the base model, and the report
writes its tables under tables/greedy/ from the values the grade jobs computed."""

from __future__ import annotations

import json

from helpers.report_fixtures import md_rows


def test_greedy_protocol_runs_in_the_evaluation_jobs_and_reaches_its_tables(wf, tmp_path, tiny_model):
    results = tmp_path / "results"
    over = {"evaluation": {"greedy": True, "base_model": True}}
    config = wf.small_config(tmp_path / "greedy.yaml", results, over)
    wf.populate_model(results, tiny_model)
    proc = wf.run(["--cores", "2", "--configfile", str(config), "--directory", str(tmp_path)])
    counts = {j["rule"] for j in wf.jobs(proc.stdout + proc.stderr)}
    # no job of its own: the greedy decode is in generate, its grading in grade
    assert counts == {
        "prepare_data",
        "fetch_benchmarks",
        "experiment_config",
        "cell_config",
        "train",
        "generate",
        "generate_base",
        "grade",
        "grade_base",
        "report",
        "all",
    }, counts

    cell = results / "runs" / "tiny__tiny__balanced__s0"
    base = results / "base" / "tiny"
    greedy = {}
    for where, step in ((cell, 2), (base, 0)):
        rows = [
            json.loads(x) for x in (where / "samples" / f"step_{step}" / "greedy" / "tiny_test.jsonl").open()
        ]
        assert [r["sample"] for r in rows] == [0, 0, 0, 0]  # 4 problems, one greedy decode each
        sampled = (where / "samples" / f"step_{step}" / "tiny_test.jsonl").read_text().splitlines()
        assert len(sampled) == 4 * 2
        metrics = json.loads(
            (where / "eval" / f"step_{step}" / "greedy" / "tiny_test.metrics.json").read_text()
        )
        assert metrics["n_samples"] == 1
        greedy[step] = 100 * metrics["avg@1"]

    last = md_rows((results / "tables" / "greedy" / "last.md").read_text(), "last evaluated step")
    assert last["balanced"][0] == "2"  # the cell's last step
    assert last["balanced"][1].replace("*", "").split()[0] == f"{greedy[2]:.1f}"
    assert last["base (step 0)"][1].replace("*", "").split()[0] == f"{greedy[0]:.1f}"
    # the sampled tables are avg@2's, as without the greedy protocol
    assert "avg@2 in %" in (results / "tables" / "last.md").read_text()

    # everything is up to date: a second run has nothing to do
    again = wf.run(["-n", "--configfile", str(config), "--directory", str(tmp_path)])
    assert "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]
