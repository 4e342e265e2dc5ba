"""Adding a variant: a user's rule in their own module plus one named instance in the config.

The plugin lives in a temporary folder beside the user's config (not in the repository, not on
PYTHONPATH), Snakemake runs in another folder, so a job's working directory is not the plugin's.
Checks: with the existing grid done (a real run, so Snakemake holds the provenance it compares),
`snakemake -n` schedules only the new cell's jobs (and the report, which gains a row); running it,
the new cell's train job imports the plugin and trains with it, its generate and score jobs import
it too (AGGBENCH_PLUGINS), and the tables gain its row.
"""

from __future__ import annotations

import json
import os
import textwrap

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PLUGIN = '''
"""A user's aggregation rule (test plugin): square-root length weighting."""
import json
import os
import sys

from torch import Tensor

from aggbench.aggregation import broadcast, check_inputs, register_rule, safe_reciprocal

if os.environ.get("WFTEST_PLUGIN_LOG"):  # who imported me, from where
    with open(os.environ["WFTEST_PLUGIN_LOG"], "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "cwd": os.getcwd(), "argv": sys.argv}) + "\\n")


@register_rule("wftest_sqrt_length", version="1")
def wftest_sqrt_length(mask: Tensor, advantages: Tensor, group_ids: Tensor) -> Tensor:
    """Square-root length: c_i = 1 / (N * sqrt(|o_i|)).

    mask: [B, T] bool; advantages: [B]; group_ids: [B] -> effective advantages [B, T].
    """
    m = check_inputs(mask, advantages, group_ids)
    coef = safe_reciprocal(m.sum(dim=1).sqrt()) / mask.shape[0]
    return broadcast(coef * advantages, m)
'''

NEW = "tiny__tiny__sqrtlen__s0"


def test_new_variant_schedules_only_its_cells_and_imports_in_jobs(wf, tmp_path, tiny_model):
    results = tmp_path / "results"
    work = tmp_path / "work"
    plug = tmp_path / "userdir"
    work.mkdir()
    plug.mkdir()
    (plug / "wftest_rules.py").write_text(textwrap.dedent(PLUGIN))
    over = {"aggregations": [{"name": "token"}]}
    old = wf.small_config(tmp_path / "old.yaml", results, over)
    new = wf.small_config(
        plug / "experiment.yaml",
        results,
        {
            "plugins": ["wftest_rules"],
            "aggregations": [*over["aggregations"], {"name": "sqrtlen", "rule": "wftest_sqrt_length"}],
        },
    )
    wf.populate_model(results, tiny_model)
    base = ["-s", str(wf.SNAKEFILE), "--cores", "2"]
    env = {
        "WFTEST_PLUGIN_LOG": str(tmp_path / "imports.jsonl"),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    assert str(plug) not in env["PYTHONPATH"]

    # ---- the existing grid, run for real (Snakemake records what each job ran with); a plugin
    # variable in the user's shell (verl's docs suggest one) does not reach a grid without plugins
    stray = {**os.environ, "AGGBENCH_PLUGINS": "no_such_plugin.py"}
    wf.run([*base, "--configfile", str(old)], cwd=work, env=stray)
    assert "sqrtlen" not in (results / "tables" / "last.md").read_text()

    # ---- the new instance: only its cell's jobs, plus the report that gains its row
    proc = wf.run([*base, "-n", "--configfile", str(new)], cwd=work, env=env)
    jobs = wf.jobs(proc.stdout)
    per_cell = [j for j in jobs if "cell" in j["wildcards"]]
    assert per_cell and {j["wildcards"]["cell"] for j in per_cell} == {NEW}, sorted(
        {j["wildcards"]["cell"] for j in per_cell}
    )
    counts = wf.job_counts(proc.stdout)
    # model and data are prepared already: the new cell's config, one segment, one evaluation
    assert counts == wf.expected_jobs(cells=1, segments=1, evaluations=1, prepare=False, fetch=False), counts

    # ---- run it: the new cell's jobs import the plugin (cwd = work, plugin beside the config, not
    # on the caller's PYTHONPATH) and train with its rule; the old cell is left alone; a new row
    proc = wf.run([*base, "--configfile", str(new)], cwd=work, env=env)
    ran = {j["wildcards"]["cell"] for j in wf.jobs(proc.stdout + proc.stderr) if "cell" in j["wildcards"]}
    assert ran == {NEW}, ran
    imports = [json.loads(line) for line in (tmp_path / "imports.jsonl").read_text().splitlines()]
    in_train = [i for i in imports if "train" in i["argv"]]
    assert in_train, imports
    assert all(i["cwd"] == str(work) and i["cwd"] != str(plug) for i in in_train), in_train
    # every aggbench job imports the config's plugins (AGGBENCH_PLUGINS from the workflow), so a
    # plugin grader a benchmark YAML names is known where the spec is read: generate and score too
    for command in ("generate", "score"):
        assert any(command in i["argv"] for i in imports), (command, imports)
    rows = [json.loads(line) for line in (results / "runs" / NEW / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all("agg/sqrtlen/weight_ratio" in r for r in rows)  # the run's own rule is diagnosed
    last = (results / "tables" / "last.md").read_text()
    assert "| token" in last.replace("**", "") and "| sqrtlen" in last.replace("**", ""), last
