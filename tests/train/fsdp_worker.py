"""Run under torchrun: the real trainer (``aggbench.train.loop.train``) on several cells, one after another.

Usage: torchrun --nproc_per_node N fsdp_worker.py PLAN.json RESULT.json
PLAN.json is a list of runs: {"config": cell YAML, "out": run dir, "until": step or null,
"slip": bool, "expect_error": bool, "count_generate": bool}. ``slip`` re-creates the mean-vs-sum
mistake for that run: FSDP2 keeps its default gradient reduction (the mean over ranks) because
``sum_gradients`` does nothing. A run with ``expect_error`` records the error's type and message instead of failing.
``count_generate`` counts this rank's rollout-engine ``generate`` calls per step and writes them
to ``out/generate_calls.rank{R}.json`` ({step: calls}), and the groups this rank trains on per step
to ``out/groups_held.rank{R}.json``.
Rank 0 writes {out: "ok" | "<ErrorType>: message"} to RESULT.json.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch.distributed as dist

import aggbench.train.parallel.fsdp
import aggbench.train.sampling
import aggbench.train.step
from aggbench.config import load_train_config
from aggbench.train.loop import train


def main() -> None:
    plan, result_path = json.loads(Path(sys.argv[1]).read_text()), sys.argv[2]
    # one group for every run (train() joins it, does not end it); a collective that does not pair
    # up fails within minutes instead of hanging for gloo's default 30
    dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=3))
    results = {}
    honest = aggbench.train.parallel.fsdp.sum_gradients
    generate = aggbench.train.sampling.generate
    gather = aggbench.train.step.sample
    for run in plan:
        if run.get("slip"):
            aggbench.train.parallel.fsdp.sum_gradients = lambda module: None  # FSDP2's default: the mean
        calls: dict[int, int] = {}
        held: dict[int, int] = {}
        if run.get("count_generate"):

            def holding(sampler, *, step, _held=held, **kw):
                out = gather(sampler, step=step, **kw)
                _held[step] = len(set(out.rollouts.group))  # the groups this rank trains on
                return out

            aggbench.train.step.sample = holding

            def counting(sampler, ids, *, step, _calls=calls, **kw):
                engine = sampler.engine
                real = engine.generate

                def counted(*a, **kw):
                    _calls[step] = _calls.get(step, 0) + 1
                    return real(*a, **kw)

                engine.generate = counted
                try:
                    return generate(sampler, ids, step=step, **kw)
                finally:
                    del engine.generate  # back to the class's method

            aggbench.train.sampling.generate = counting
        try:
            train(load_train_config(run["config"]), run["out"], until_step=run.get("until"), quiet=True)
            results[run["out"]] = "ok"
        except Exception as exc:
            if not run.get("expect_error"):
                raise
            results[run["out"]] = f"{type(exc).__name__}: {exc}"
        finally:
            aggbench.train.parallel.fsdp.sum_gradients = honest
            aggbench.train.sampling.generate = generate
            aggbench.train.step.sample = gather
        if run.get("count_generate"):
            out = Path(run["out"]) / f"generate_calls.rank{dist.get_rank()}.json"
            out.write_text(json.dumps(calls))
            (Path(run["out"]) / f"groups_held.rank{dist.get_rank()}.json").write_text(json.dumps(held))
    if dist.get_rank() == 0:
        with open(result_path, "w") as fh:
            json.dump(results, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
