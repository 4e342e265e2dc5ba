"""aggbench.layout: the one statement of where run files live (trainer, evaluator, ingest, rules)."""

from __future__ import annotations

from pathlib import Path

from aggbench import layout


def test_paths_of_a_cell_and_a_base_model():
    run = layout.run_dir("results", layout.cell_id("tiny", "tiny", "balanced", 0))
    assert run == Path("results/runs/tiny__tiny__balanced__s0")
    assert layout.checkpoint_dir(run, 4) == run / "checkpoints" / "step_4"
    assert layout.segment_marker(run, 4) == run / "segments" / "step_4.done"
    assert layout.samples_dir(run, 4) == run / "samples" / "step_4"
    assert layout.eval_metrics_file(run, 4, "math500") == run / "eval" / "step_4" / "math500.metrics.json"
    assert layout.eval_metrics_file(layout.base_dir("results", "tiny"), 0, "b") == Path(
        "results/base/tiny/eval/step_0/b.metrics.json"
    )
    # Snakemake wildcards pass through as names
    assert (
        str(layout.segment_marker(layout.run_dir("r", "{cell}"), "{step}"))
        == "r/runs/{cell}/segments/step_{step}.done"
    )


def test_complete_steps_count_only_committed_checkpoints(tmp_path):
    run = tmp_path / "runs" / "c"
    for step, complete in ((2, True), (10, True), (4, False)):
        d = layout.checkpoint_dir(run, step)
        d.mkdir(parents=True)
        if complete:
            (d / layout.COMPLETE).write_text(f"{step}\n")
    (layout.checkpoints_root(run) / "step_6.tmp-123").mkdir()  # an interrupted write
    assert layout.complete_steps(run) == [2, 10]  # numeric order, not string order
    assert layout.complete_steps(tmp_path / "nowhere") == []


def test_run_of_checkpoint_and_results_of(tmp_path):
    run = layout.run_dir(tmp_path, "c")
    ckpt = layout.checkpoint_dir(run, 8)
    ckpt.mkdir(parents=True)
    assert layout.run_of_checkpoint(ckpt) == (run.resolve(), 8)
    assert layout.run_of_checkpoint(tmp_path) is None  # a base model directory
    assert layout.results_of(run) == tmp_path.resolve()
    assert layout.results_of(layout.base_dir(tmp_path, "m")) == tmp_path.resolve()
    assert layout.results_of(tmp_path / "elsewhere") == (tmp_path / "elsewhere").resolve()
    assert layout.step_of("step_12") == 12 and layout.step_of("step_x") is None
