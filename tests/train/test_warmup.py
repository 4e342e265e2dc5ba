"""Learning-rate warmup counts rollout steps, as verl's actor scheduler does (stepped once per
rollout step however many mini-batches it has), with verl's factor current_step / warmup: rollout
step s trains at lr * min(1, (s - 1) / warmup), the first at lr 0. configs/paper.yaml's 10 warmup
steps therefore mean the recipe's 10 rollout steps, not 10 of its 16 mini-batches of step 1."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from aggbench.train.loop import train
from helpers.trainer_support import cell_config, metrics_rows

LR = 1e-3


def _cfg(tmp_path, model, data):
    cell = {"steps": 3, "every": 1, "mini_batches": 2, "warmup_steps": 2, "lr": LR}
    return cell_config(
        tmp_path / "cell.yaml", model, data, overrides={"tracking.enabled": False, "device": "cpu"}, **cell
    )


def test_warmup_is_per_rollout_step_from_lr_zero_and_survives_a_resume(
    tmp_path, tiny_sft_model, tiny_train_data
):
    cfg = _cfg(tmp_path, tiny_sft_model, tiny_train_data)
    whole = tmp_path / "whole"
    train(cfg, whole, quiet=True)
    lrs = [r["lr"] for r in metrics_rows(whole)]
    assert lrs == pytest.approx([0.0, LR / 2, LR], abs=1e-15)  # the lr each step trained at
    # lr 0 moves nothing: step 1's weights are the start's, bit for bit (Adam's moments did update)
    start = AutoModelForCausalLM.from_pretrained(tiny_sft_model).state_dict()
    step1 = AutoModelForCausalLM.from_pretrained(whole / "checkpoints" / "step_1").state_dict()
    assert all(torch.equal(start[k], step1[k]) for k in start)
    # a resume continues the schedule where it was
    part = tmp_path / "part"
    train(cfg, part, until_step=1, quiet=True)
    train(cfg, part, quiet=True)
    assert [r["lr"] for r in metrics_rows(part)] == lrs


def test_paper_warmup_keeps_its_source_and_unit():
    raw = (Path(__file__).resolve().parents[2] / "configs" / "paper.yaml").read_text()
    line = next(ln for ln in raw.splitlines() if re.match(r"\s*warmup_steps:", ln))
    assert re.match(r"\s*warmup_steps: 10\s+#", line)
    assert "[DAPO-verl]" in line and "rollout steps" in line and "lr 0" in line
