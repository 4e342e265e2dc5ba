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


def _segments(run: Path, *, markers: list[int], checkpoints: dict[int, bool]) -> None:
    """Finished segment markers, and committed checkpoints {step: holds trainer state}."""
    for step in markers:
        layout.segment_marker(run, step).parent.mkdir(parents=True, exist_ok=True)
        layout.segment_marker(run, step).touch()
    for step, state in checkpoints.items():
        d = layout.checkpoint_dir(run, step)
        d.mkdir(parents=True)
        (d / layout.COMPLETE).write_text("{}\n")
        if state:
            (d / layout.STATE_FILE).write_bytes(b"state")


def test_a_retrain_that_discards_finished_segments_is_due_from_the_latest_resumable_step(tmp_path):
    """restart_step: when the first unfinished segment would start from a checkpoint earlier than its
    own start, the segments in between belong to the attempt it discards (the rules retrain them)."""
    ends = [4, 8, 12]
    fresh = tmp_path / "fresh"
    assert layout.restart_step(fresh, ends) is None  # nothing trained: the first segment runs
    killed = tmp_path / "killed"  # killed inside segment 12: resumes from 8, its own start
    _segments(killed, markers=[4, 8], checkpoints={4: False, 8: True})
    assert layout.restart_step(killed, ends) is None
    done = tmp_path / "done"
    _segments(done, markers=[4, 8, 12], checkpoints={4: False, 8: False, 12: True})
    assert layout.restart_step(done, ends) is None
    # segment 12's marker and checkpoint deleted; retention had dropped the state of 4 and 8
    deleted = tmp_path / "deleted"
    _segments(deleted, markers=[4, 8], checkpoints={4: False, 8: False})
    assert layout.restart_step(deleted, ends) == 0
    # segment 8 deleted while 4 still holds its state (keep_weights all, or an older retention)
    partial = tmp_path / "partial"
    _segments(partial, markers=[4, 12], checkpoints={4: True, 12: False})
    assert layout.restart_step(partial, ends) is None  # 8 starts from 4, its own start
    # a marker deleted alone, the checkpoint intact: that segment reruns (the trainer has nothing
    # to do), nothing before it
    marker_only = tmp_path / "marker_only"
    _segments(marker_only, markers=[4, 8], checkpoints={12: True})
    assert layout.restart_step(marker_only, ends) is None
    # recorded retrains are listed in order, from their stamps
    for k, s in ((2, 0), (1, 8), (10, 0)):
        layout.restart_stamp(deleted, k, s).write_text("")
    assert layout.restart_stamps(deleted) == [(1, 8), (2, 0), (10, 0)]  # numeric order of k
    assert layout.restart_stamps(fresh) == []
