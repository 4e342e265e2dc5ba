"""Under dynamic sampling each rank refills only its own zero-variance groups, so in one step the
ranks call the rollout engine a different number of times (one call per sampling round). That is
why the vLLM engine must not run in vLLM's lockstep data-parallel mode, where every rank has to
call ``generate`` together (aggbench.rollout.vllm). Shown here on the loop's own sampling code for
two ranks of one step, with a counting engine and a reward that makes rank 0's groups constant."""

from __future__ import annotations

from aggbench.config import TrainConfig
from aggbench.tiny.model import build_tiny_model
from aggbench.train import parallel
from aggbench.train.sampling import Sampler, sample
from helpers.sampling_fakes import CountingEngine, Ordered


def test_ranks_make_different_numbers_of_generate_calls_in_one_step(tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "m"))
    # 4 prompts, 2 ranks (rank r holds positions r, r + 2); "flat" answers give a constant reward
    records = [{"id": str(i), "prompt": f"{i} + 1", "answer": a} for i, a in enumerate(["flat", "mixed"] * 8)]
    cfg = TrainConfig.model_validate(
        {
            "model": {"name": "tiny", "path": str(tmp_path / "m")},
            "dataset": {"name": "tiny", "path": str(tmp_path / "d.jsonl")},
            "algorithm": {
                "prompts_per_step": 4,
                "group_size": 2,
                "dynamic_sampling": True,
                "dynamic_sampling_max_rounds": 1,
            },
        }
    )

    def reward(texts, answers):  # "mixed": one right, one wrong per group; "flat": all wrong
        return [float(a == "mixed" and i % 2 == 0) for i, a in enumerate(answers)]

    stream = Ordered(len(records), 0)  # the step's prompts 0..3: even "flat" (rank 0), odd "mixed" (rank 1)
    calls = {}
    for rank in (0, 1):
        engine = CountingEngine()
        slots = parallel.Ranks(rank, 2).my_groups(4)
        sample(Sampler(cfg, engine, tok, records, reward, {}, rank), stream=stream, slots=slots, step=1)
        calls[rank] = engine.calls
    # rank 1's groups all have reward variance: one round; rank 0 refills its constant groups once
    assert calls == {0: 2, 1: 1}
