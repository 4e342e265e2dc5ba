"""The warm start's skill phase on disk (`aggbench prepare-model tiny --skill-phase-only` and
`--skill-from`): a model finished from a saved skill phase in another process is the model a
plain `aggbench prepare-model tiny` writes, byte for byte, so the workflow may share the phase
between the lab's models (workflow/rules/prepare.smk) without changing any result."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("torch")

from aggbench.cli import main  # noqa: E402

STEPS = ["--sft-steps", "6", "--probe-prompts", "2", "--quiet"]


def _run(*args: str) -> None:
    res = CliRunner().invoke(main, ["prepare-model", *args])
    assert res.exit_code == 0, res.output


def _bytes(model_dir) -> bytes:
    return (model_dir / "model.safetensors").read_bytes()


def test_models_finished_from_a_shared_skill_phase_equal_plain_warm_starts(tmp_path):
    skill = tmp_path / "skill"
    _run("tiny", "--skill-phase-only", "--sft-steps", "6", "--out", str(skill), "--quiet")
    assert json.loads((skill / "skill_phase.json").read_text())["skill_steps"] == 3
    for knobs in ([], ["--gap", "negative", "--spread", "high"]):
        name = "-".join(knobs[1::2]) or "default"
        plain, shared = tmp_path / f"plain-{name}", tmp_path / f"shared-{name}"
        _run("tiny", *knobs, *STEPS, "--out", str(plain))
        _run("tiny", *knobs, *STEPS, "--skill-from", str(skill), "--out", str(shared))
        assert _bytes(shared) == _bytes(plain), name
        rec_plain, rec_shared = (json.loads((d / "aggbench_model.json").read_text()) for d in (plain, shared))
        assert rec_shared["probe"] == rec_plain["probe"]
        assert rec_shared["sft_final_loss"] == rec_plain["sft_final_loss"]
        assert rec_shared["skill_phase_from"] == "skill" and "skill_phase_from" not in rec_plain
        # the same request: a plain rerun into the shared directory is a no-op, and vice versa
        res = CliRunner().invoke(main, ["prepare-model", "tiny", *knobs, *STEPS[:2], "--out", str(shared)])
        assert res.exit_code == 0 and "already prepared" in res.output, res.output
    # the knobs do not enter the phase: its directory is unchanged by a second request
    _run("tiny", "--skill-phase-only", "--sft-steps", "6", "--out", str(skill), "--quiet")


def test_a_skill_phase_of_other_settings_is_refused_before_anything_is_written(tmp_path):
    skill = tmp_path / "skill"
    _run("tiny", "--skill-phase-only", "--sft-steps", "4", "--out", str(skill), "--quiet")
    out = tmp_path / "m"
    res = CliRunner().invoke(
        main, ["prepare-model", "tiny", *STEPS, "--skill-from", str(skill), "--out", str(out)]
    )
    assert res.exit_code == 1
    assert "--skill-from:" in res.output and "sft_steps: 4 -> 6" in res.output, res.output
    assert not out.exists() and not list(tmp_path.glob("m.tmp-*"))
    res = CliRunner().invoke(
        main, ["prepare-model", "tiny", "--skill-phase-only", "--sft-steps", "6", "--out", str(skill)]
    )
    assert res.exit_code == 1 and "another warm start's skill phase" in res.output, res.output
    not_a_phase = tmp_path / "empty"
    not_a_phase.mkdir()
    res = CliRunner().invoke(
        main, ["prepare-model", "tiny", *STEPS, "--skill-from", str(not_a_phase), "--out", str(out)]
    )
    assert res.exit_code == 1 and "is not a finished skill phase" in res.output, res.output
    res = CliRunner().invoke(main, ["prepare-model", "gpt2", "--skill-from", str(skill), "--out", str(out)])
    assert res.exit_code == 2 and "apply to 'tiny' only" in res.output, res.output


def test_the_warm_start_depends_on_the_thread_count_so_it_is_recorded(tmp_path):
    """torch splits a CPU reduction by thread, so the same warm start on 1 and on 2 threads can give
    other weights (it does on the Intel AVX512 machines CI has run on; on an AMD EPYC AVX2 one, on
    2026-12-07, the bytes were equal): the record says which (``sft_threads``) everywhere, and the
    workflow pins it (tests/workflow/test_lab_dag.py: `--cores 1` runs the prepare rules on the same
    2 threads)."""
    import torch

    from aggbench.environment import cpu_capability, cpu_model

    before = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            _run("tiny", *STEPS, "--probe-prompts", "0", "--out", str(tmp_path / f"t{threads}"))
    finally:
        torch.set_num_threads(before)
    records = [json.loads((tmp_path / f"t{t}" / "aggbench_model.json").read_text()) for t in (1, 2)]
    assert [r["sft_threads"] for r in records] == [1, 2]
    if _bytes(tmp_path / "t1") == _bytes(tmp_path / "t2"):  # the records above hold either way
        pytest.skip(
            f"on this CPU ({cpu_model()}, {cpu_capability()}) 1 and 2 threads trained the same bytes: "
            "the premise (a thread count changes the weights) is checked where it holds"
        )


def test_a_warm_start_of_another_thread_count_is_neither_reused_nor_continued(tmp_path):
    """The same request on another thread count would write other weights (the test above), so a
    directory, or a skill phase, trained on another count is refused with the count to set."""
    import torch

    before = torch.get_num_threads()
    skill, model = tmp_path / "skill", tmp_path / "m"
    try:
        torch.set_num_threads(1)
        _run("tiny", "--skill-phase-only", "--sft-steps", "6", "--out", str(skill), "--quiet")
        _run("tiny", *STEPS, "--probe-prompts", "0", "--out", str(model))
        assert json.loads((skill / "skill_phase.json").read_text())["threads"] == 1
        again = ["prepare-model", "tiny", *STEPS[:2], "--out", str(model)]
        res = CliRunner().invoke(main, again)
        assert res.exit_code == 0 and "already prepared" in res.output, res.output  # same count
        torch.set_num_threads(2)
        res = CliRunner().invoke(main, again)
        assert res.exit_code == 1, res.output
        assert "was trained on 1 torch threads and this process runs 2" in res.output, res.output
        assert "OMP_NUM_THREADS=1" in res.output and "--force" in res.output, res.output
        out = tmp_path / "continued"
        res = CliRunner().invoke(
            main, ["prepare-model", "tiny", *STEPS, "--skill-from", str(skill), "--out", str(out)]
        )
        assert res.exit_code == 1 and "was trained on 1 torch threads" in res.output, res.output
        assert not out.exists()
        res = CliRunner().invoke(  # the phase itself: not "already prepared" on 2 threads either
            main, ["prepare-model", "tiny", "--skill-phase-only", "--sft-steps", "6", "--out", str(skill)]
        )
        assert res.exit_code == 1 and "OMP_NUM_THREADS=1" in res.output, res.output
    finally:
        torch.set_num_threads(before)
