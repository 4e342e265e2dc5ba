"""The step's stages without a model (``aggbench.train.step``): ``score`` turns a hand-made
``SampledBatch`` into advantages, packed tensors and the loss mask; ``update`` and ``record`` run on
a two-parameter stand-in policy, so what flows between the stages is checked number by number."""

from __future__ import annotations

import math
from contextlib import nullcontext

import pytest
import torch

from aggbench.aggregation import resolve_instance
from aggbench.aggregation.advantages import get_advantage
from aggbench.rollout.base import Rollouts
from aggbench.train.parallel import Ranks
from aggbench.train.sampling import SampledBatch, SamplingStats
from aggbench.train.scoring import Scoring, score
from aggbench.train.step_log import RankPart, StepTiming, record
from aggbench.train.update import LossSettings, Policy, UpdateSettings, update

# two groups of two: lengths 2, 4 | 3, 6 (max_new_tokens 6: the last is truncated)
LENGTHS = [2, 4, 3, 6]
FINISHED = [True, True, True, False]
REWARDS = [1.0, 0.0, 1.0, 0.0]


def _sampled() -> SampledBatch:
    roll = Rollouts(
        prompt_ids=[[5, 6], [5, 6], [7], [7]],
        response_ids=[list(range(1, n + 1)) for n in LENGTHS],
        finished=list(FINISHED),
        texts=["a", "b", "c", "d"],
        group=[0, 0, 1, 1],
    )
    records = {0: {"prompt": "p0", "answer": "1"}, 1: {"prompt": "p1", "answer": "2"}}
    return SampledBatch(roll, records, list(REWARDS), SamplingStats(1, 2, 0, 2, 4))


def _scoring(**kw) -> Scoring:
    base = {"estimator": get_advantage("grpo"), "estimator_kwargs": {"std": "population", "eps": 0.0}}
    return Scoring(**{**base, "max_new_tokens": 6, "pad_id": 0, **kw})


def test_score_packs_and_computes_group_advantages():
    scored = score(_sampled(), _scoring())
    # population std of {1, 0} is 1/2: advantages +-1 in each group
    assert scored.advantages.tolist() == [1.0, -1.0, 1.0, -1.0]
    assert scored.advantages.dtype == torch.float64
    assert scored.group_ids.tolist() == [0, 0, 1, 1]
    assert scored.mask.sum(1).tolist() == LENGTHS
    assert scored.batch.input_ids.shape == (4, 2 + 6)  # prompt width 2, response width 6
    assert scored.batch.input_ids[2, :2].tolist() == [0, 7]  # prompts left-padded


def test_score_shapes_overlong_rewards_before_the_advantages():
    # buffer 2 of max 6: length 6 is 2 past the start (4) -> -penalty; length 4 -> 0
    scored = score(_sampled(), _scoring(overlong_buffer=2, overlong_penalty=0.5))
    shaped = torch.tensor([1.0, 0.0, 1.0, -0.5], dtype=torch.float64)
    expected = get_advantage("grpo")(shaped, torch.tensor([0, 0, 1, 1]), std="population", eps=0.0)
    assert torch.equal(scored.advantages, expected)
    assert scored.advantages[3] < -1.0 + 1e-12 and scored.advantages[0] == 1.0


def test_score_overlong_filter_takes_truncated_responses_out_of_the_loss():
    scored = score(_sampled(), _scoring(overlong_filter=True))
    assert scored.mask[3].sum() == 0 and scored.advantages[3] == 0.0
    assert scored.mask.sum(1).tolist()[:3] == LENGTHS[:3]
    assert scored.batch.response_mask[3].sum() == 6  # the packed batch keeps the response


class _Tiny(torch.nn.Module):
    """A causal LM stand-in: logits = embedding of the current token (vocab 8, no hidden state)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(8, 8, dtype=torch.float64)
        torch.nn.init.normal_(self.emb.weight, generator=torch.Generator().manual_seed(0))

    def forward(self, input_ids, attention_mask=None, position_ids=None, **_):
        return type("Out", (), {"logits": self.emb(input_ids)})()


def _policy() -> Policy:
    model = _Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the update must not move the weights
    return Policy(model, None, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda k: 1.0), nullcontext)


def test_update_then_record_carry_the_trained_rules_weights():
    scored = score(_sampled(), _scoring())
    rule = resolve_instance({"name": "token"})
    settings = UpdateSettings(LossSettings(micro_batch_size=3), ppo_epochs=1, mini_batches=1)
    totals = update(_policy(), scored, rule=rule, settings=settings, ranks=Ranks())
    assert totals.updates == 1 and totals.tokens == sum(LENGTHS)
    assert totals.view.mask.sum(1).tolist() == LENGTHS
    assert torch.equal(totals.view.advantages, scored.advantages)
    assert totals.behaviour.shape == scored.mask.shape
    # on-policy, ratio 1: the PG loss is -sum(eff) = -(sum over tokens of A / 15)
    assert totals.pg_loss == pytest.approx(-(2 - 4 + 3 - 6) / 15)
    part = RankPart(REWARDS, FINISHED, LENGTHS, totals.unit_loss, [], SamplingStats(1, 2, 0, 2, 4))
    row = record(step=3, parts=[part], rule=rule, totals=totals, timing=StepTiming(1.0, 3.0), lr=0.5)
    assert (row["step"], row["lr"], row["accuracy"], row["response/truncated_frac"]) == (3, 0.5, 0.5, 0.25)
    assert row["tokens_per_s"] == pytest.approx(15 / 4.0)
    # token aggregation: each sign's weight is its token share (positives 2 + 3 of 15 tokens)
    assert row["agg/token/weight_pos"] == pytest.approx(5 / 15)
    assert row["agg/token/weight_neg"] == pytest.approx(10 / 15)
    # the trained rule's diagnostic PG loss is the loss its update computed (ratio 1: unit loss -sign)
    assert row["agg/token/pg_loss"] == pytest.approx(row["loss/pg"])
    assert math.isfinite(row["agg/balanced/weight_ratio"])
    # the trained rule's own values under fixed names: token's, not balanced's counterfactual ones
    for key in ("weight_pos", "weight_neg", "weight_ratio", "pg_loss"):
        assert row[f"train/{key}"] == row[f"agg/token/{key}"], key
    assert row["train/weight_ratio"] == pytest.approx(0.5)


def test_record_counts_filtered_responses_at_their_own_length():
    """With the overlong filter on, the truncated response leaves the loss (its mask row is empty)
    but not the length statistics: ``len/*`` describe what was sampled, as without the filter."""
    rule = resolve_instance({"name": "token"})
    settings = UpdateSettings(LossSettings(micro_batch_size=3), ppo_epochs=1, mini_batches=1)
    rows = {}
    for on in (False, True):
        scored = score(_sampled(), _scoring(overlong_filter=on))
        totals = update(_policy(), scored, rule=rule, settings=settings, ranks=Ranks())
        part = RankPart(REWARDS, FINISHED, LENGTHS, totals.unit_loss, [], SamplingStats(1, 2, 0, 2, 4))
        rows[on] = record(step=1, parts=[part], rule=rule, totals=totals, timing=StepTiming(1.0, 1.0), lr=0.5)
    assert totals.tokens == 2 + 4 + 3  # the filter took the truncated response's 6 tokens out of the loss
    assert rows[True]["len/mean"] == rows[False]["len/mean"] == pytest.approx(sum(LENGTHS) / 4)
    assert rows[True]["len/cv"] == rows[False]["len/cv"]
    # within group 1 (lengths 3, 6): population CV 1.5 / 4.5; group 0 (2, 4): 1 / 3
    assert rows[True]["len/cv_within"] == pytest.approx((1 / 3 + 1.5 / 4.5) / 2)
    # the filtered response's advantage is 0: it leaves the sign split, not the pooled lengths
    assert rows[True]["len/neg_mean"] == pytest.approx(4.0)
    assert rows[False]["len/neg_mean"] == pytest.approx(5.0)
