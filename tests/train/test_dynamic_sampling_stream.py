"""Dynamic sampling on the loop's own sampling code (``aggbench.train.sampling``), with a fake engine:
refills read the next unread prompts of the epoch stream (without replacement, as verl's
dataloader), and what the filter dropped is counted before it drops it."""

from __future__ import annotations

import pytest

from aggbench.config import TrainConfig
from aggbench.tiny.model import build_tiny_model
from aggbench.train.batching import PromptStream, prompt_indices
from aggbench.train.sampling import Sampler, sample
from helpers.sampling_fakes import CountingEngine, Ordered
from helpers.trainer_support import train_config


class Grader:
    """Reward by the record's kind: "mixed": first response right, the rest wrong; "solved": all
    right; "flat": all wrong. Records which records each call graded (one call per round)."""

    def __init__(self) -> None:
        self.rounds: list[list[int]] = []

    def __call__(self, texts, answers):
        self.rounds.append(sorted({int(a.split(":")[1]) for a in answers}))
        out, seen = [], set()
        for a in answers:
            kind = a.split(":")[0]
            first = a not in seen
            seen.add(a)
            out.append(float(kind == "solved" or (kind == "mixed" and first)))
        return out


def _records(kinds: list[str]) -> list[dict]:
    return [{"id": str(i), "prompt": f"{i} + 1", "answer": f"{k}:{i}"} for i, k in enumerate(kinds)]


def _cfg(tmp_path, **algorithm) -> TrainConfig:
    return train_config(
        {
            "model": {"name": "tiny", "path": str(tmp_path / "m")},
            "dataset": {"name": "tiny", "path": str(tmp_path / "d.jsonl")},
            "algorithm": {"prompts_per_step": 4, "group_size": 2, "dynamic_sampling": True, **algorithm},
        }
    )


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(build_tiny_model(tmp_path_factory.mktemp("tok") / "m"))


def test_refills_read_the_next_unread_prompts_and_the_filter_is_counted_before(tmp_path, tok):
    # positions 0-3: the step's prompts; 4-7 and 8-11: the blocks of refill rounds 1 and 2
    kinds = ["solved", "mixed", "solved", "mixed"] + ["flat", "flat", "mixed", "mixed"] + ["mixed"] * 4
    grader = Grader()
    stream = Ordered(len(kinds), 0)
    cfg = _cfg(tmp_path, dynamic_sampling_max_rounds=3)
    got = sample(
        Sampler(cfg, CountingEngine(), tok, _records(kinds), grader),
        stream=stream,
        slots=[0, 1, 2, 3],
        step=1,
    )
    recs, rewards, stats = got.records, got.rewards, got.stats
    # round 0 keeps 1 and 3; round 1 refills the 2 missing from the next block (4, 5: both flat);
    # round 2 from the block after (8, 9). No prompt is drawn twice, none from elsewhere.
    assert grader.rounds == [[0, 1, 2, 3], [4, 5], [8, 9]]
    assert sorted(int(r["id"]) for r in recs.values()) == [1, 3, 8, 9]
    assert stats.rounds == 3
    assert stats.groups_sampled == 8 and stats.groups_filtered == 4  # 0, 2 (solved), 4, 5 (flat)
    # before the filter: round 0's 8 responses, 2 + 1 + 2 + 1 right; after it 4 of 8
    assert (stats.correct, stats.responses) == (6, 8)
    assert sum(rewards) / len(rewards) == 0.5
    assert stream.cursor == 0  # the caller moves it on (by the rounds of the rank that ran most)


def test_without_dynamic_sampling_nothing_is_filtered(tmp_path, tok):
    kinds = ["solved", "mixed", "flat", "mixed"]
    cfg = _cfg(tmp_path, dynamic_sampling=False)
    sampler = Sampler(cfg, CountingEngine(), tok, _records(kinds), Grader())
    got = sample(sampler, stream=Ordered(4, 0), slots=[0, 1, 2, 3], step=1)
    recs, rewards, stats = got.records, got.rewards, got.stats
    assert len(recs) == 4 and len(rewards) == 8
    assert (stats.rounds, stats.groups_sampled, stats.groups_filtered) == (1, 4, 0)
    assert (stats.correct, stats.responses) == (4, 8)


def test_an_epoch_of_steps_draws_every_prompt_at_most_once(tmp_path, tok):
    """Steps read on from the cursor (moved by the rounds each ran): within an epoch, refills and
    the steps' own prompts never repeat a prompt (before, refills were drawn with replacement)."""
    import random

    rnd = random.Random(5)
    n = 64
    kinds = [rnd.choice(["flat", "mixed", "mixed", "solved"]) for _ in range(n)]
    cfg = _cfg(tmp_path, dynamic_sampling_max_rounds=2)
    stream = PromptStream(n, seed=11)
    drawn: list[int] = []
    while stream.cursor + 3 * 4 <= n:  # steps that stay inside the first epoch
        grader = Grader()
        sampler = Sampler(cfg, CountingEngine(), tok, _records(kinds), grader)
        stats = sample(sampler, stream=stream, slots=[0, 1, 2, 3], step=1).stats
        drawn += [i for r in grader.rounds for i in r]
        stream.advance(stats.rounds, 4)
    assert len(drawn) > 20 and len(drawn) == len(set(drawn))
    assert set(drawn) <= set(stream.take(0, stream.cursor))  # all from the stream's positions read


def test_prompt_stream_matches_the_step_slices_without_dynamic_sampling():
    s = PromptStream(10, seed=3)
    whole = s.take(0, 30)
    assert sorted(whole[:10]) == list(range(10)) and sorted(whole[10:20]) == list(range(10))
    for step in (1, 2, 3, 4, 7):
        assert prompt_indices(10, 4, 3, step) == whole[(step - 1) * 4 : step * 4]
    s.advance(3, 4)
    assert s.block(0, 4) == whole[12:16] and s.block(1, 4) == whole[16:20]
