"""Model config overrides (issue 13, item 4): verl's DAPO 7B math recipes raise Qwen2.5-Math-7B's
``max_position_embeddings`` from 4096 to 32768 ("modify ... config.json ... after downloading") and
train with 2,048-token prompts, 8,192-token responses and a 4,096-token overlong buffer.

aggbench writes ``models.<m>.config_overrides`` into the prepared directory's config.json, the one
directory the trainer, both rollout engines and the evaluator load (the real-vLLM half of this is in
tests/rollout/test_vllm_real.py; the override recorded, and refused when it names no field, in
tests/cli/test_prepare_model.py); these tests show it carried by training's checkpoints, seen by
the evaluator, and that a model whose positions are too few for the sampling lengths is refused
before training instead of run past its positions.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from aggbench.cli import main
from aggbench.config import load_train_config
from aggbench.evaluation.context import model_context
from aggbench.modeldir import ModelDirError, apply_config_overrides
from aggbench.train.loop import train
from helpers.trainer_support import write_cell

ROOT = Path(__file__).resolve().parents[1]
PAPER = ROOT / "configs" / "paper.yaml"
LONG = {"sampling.max_prompt_tokens": 256, "sampling.max_new_tokens": 300}  # 556 > tiny's 512 positions


def test_trainer_refuses_too_few_positions_and_trains_with_the_override(
    tmp_path, tiny_sft_model, tiny_train_data
):
    cell = write_cell(tmp_path / "cell.yaml", tiny_sft_model, tiny_train_data, steps=1, every=1)
    cfg = load_train_config(cell, {"tracking.enabled": False, "device": "cpu", **LONG})
    with pytest.raises(ModelDirError, match=r"max_position_embeddings 512.*= 556.*config_overrides"):
        train(cfg, tmp_path / "refused", quiet=True)
    assert not (tmp_path / "refused" / "checkpoints").exists()

    raised = tmp_path / "raised"
    shutil.copytree(tiny_sft_model, raised)
    assert apply_config_overrides(raised, {"max_position_embeddings": 1024}) == {
        "max_position_embeddings": 512
    }
    cell = write_cell(tmp_path / "cell2.yaml", raised, tiny_train_data, steps=1, every=1)
    cfg = load_train_config(cell, {"tracking.enabled": False, "device": "cpu", **LONG})
    run = tmp_path / "run"
    train(cfg, run, quiet=True)
    step1 = run / "checkpoints" / "step_1"
    # the checkpoint (what the evaluator and a resume load) keeps the raised positions
    assert json.loads((step1 / "config.json").read_text())["max_position_embeddings"] == 1024
    assert model_context(step1) == 1024


def test_paper_grid_uses_the_7b_recipe_lengths_and_positions_with_labels():
    raw = PAPER.read_text()
    exp = yaml.safe_load(raw)
    m = exp["models"]["qwen2.5-math-7b"]
    assert m["config_overrides"] == {"max_position_embeddings": 32768}
    assert m["max_context"] == 32768
    assert m["training"]["sampling"] == {"max_prompt_tokens": 2048, "max_new_tokens": 8192}
    assert m["training"]["algorithm"]["overlong"]["buffer"] == 4096
    assert "[DAPO-verl-7B]" in raw and "max_position_embeddings=32768" in raw
    for key in ("config_overrides:", "sampling: {max_prompt_tokens: 2048"):
        line = next(ln for ln in raw.splitlines() if ln.strip().startswith(key))
        block = raw[: raw.index(line) + len(line)].splitlines()[-3:]
        assert any("[DAPO-verl-7B]" in ln for ln in block), key
    # `aggbench plan` plans the new lengths
    plan = subprocess.run(
        [str(Path(sys.executable).with_name("aggbench")), "plan", str(PAPER)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert plan.returncode == 0, plan.stderr
    line = next(ln for ln in plan.stdout.splitlines() if "train job: 8 GPUs" in ln)
    assert re.search(r"prompt <= 2048 \+ response <= 8192 tokens", line)


def test_grid_check_refuses_a_context_beyond_the_overridden_positions(tmp_path):
    exp = yaml.safe_load(PAPER.read_text())
    exp["results_dir"] = str(tmp_path / "results")
    exp["models"]["qwen2.5-math-7b"]["config_overrides"] = {"max_position_embeddings": 8192}
    cfg = tmp_path / "paper.yaml"
    cfg.write_text(yaml.safe_dump(exp))
    res = CliRunner().invoke(main, ["grid", "check", "--config", str(cfg)])
    assert res.exit_code != 0
    assert "max_context 32768 exceeds the config_overrides.max_position_embeddings 8192" in res.output
