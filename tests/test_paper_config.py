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
