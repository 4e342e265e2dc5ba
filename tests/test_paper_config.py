"""configs/paper.yaml's settings against the public sources they cite, with their labels kept.

Overlong shaping (issue 13, item 3): DAPO's verifier gives +1 / -1 and its soft overlong penalty
reaches overlong_penalty_factor 1.0 at the max length, half the correct/incorrect gap. aggbench's
graders give 0 / 1, so the same strength is a penalty of 0.5.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from aggbench.train.batching import soft_overlong_penalty

PAPER = Path(__file__).resolve().parents[1] / "configs" / "paper.yaml"


def test_overlong_penalty_has_dapos_strength_relative_to_the_reward_gap():
    raw = PAPER.read_text()
    cfg = yaml.safe_load(raw)
    for name, model in cfg["models"].items():
        ov = model["training"]["algorithm"]["overlong"]
        max_new = model["training"]["sampling"]["max_new_tokens"]
        assert ov["penalty"] == 0.5, name
        worst = soft_overlong_penalty([max_new], max_new, ov["buffer"], ov["penalty"])[0]
        gap = 1.0 - 0.0  # aggbench: correct 1, wrong 0
        dapo = 1.0 / (1.0 - (-1.0))  # DAPO: factor 1.0 against the +1 / -1 gap of 2
        assert -worst / gap == dapo, name
    # the source label stays with the number
    labels = re.findall(
        r"#.*\[DAPO-verl\].*(?:\n\s*#.*)*\n\s*algorithm: \{overlong: \{buffer: \d+, penalty: 0\.5\}", raw
    )
    assert len(labels) == 2 and all("+1/-1" in block for block in labels)


def test_max_prompt_tokens_fit_the_context_and_name_the_overlong_filter():
    """Issue 13, item 6: each model's prompt budget, its label, and what happens to a longer prompt
    (dropped before training, as verl's data.filter_overlong_prompts; tests/train/test_overlong_prompts.py)."""
    raw = PAPER.read_text()
    cfg = yaml.safe_load(raw)
    expected = {"qwen2.5-math-7b": (1024, 3072), "qwen3-1.7b": (2048, 8192)}
    for name, model in cfg["models"].items():
        s = model["training"]["sampling"]
        assert (s["max_prompt_tokens"], s["max_new_tokens"]) == expected[name], name
        assert s["max_prompt_tokens"] + s["max_new_tokens"] <= model["max_context"], name
    # the source label stays with the number, and the comment above it names the filter
    blocks = re.findall(
        r"((?:\s*#.*\n)+)\s*sampling: \{max_prompt_tokens: (\d+), max_new_tokens: \d+\}\s*# (\[assumed\])",
        raw,
    )
    assert [int(b[1]) for b in blocks] == [1024, 2048]
    for comment, _value, _label in blocks:
        assert "max_prompt_tokens: [assumed]" in comment and "dropped before" in comment
        assert "filter_overlong_prompts" in comment
    # the value reaches the cell config the trainer filters with
    from aggbench.grid import cell_train_config, cells, load_experiment

    exp = load_experiment(PAPER)
    got = {c.model: cell_train_config(exp, c.id).sampling.max_prompt_tokens for c in cells(exp)}
    assert got == {name: v[0] for name, v in expected.items()}
