"""Every seed the project derives from a run's seed, in one place, each a pure function of its
inputs: what a stream depends on is what it is a function of (never of which other work runs
beside it). The multipliers are large odd constants that keep the derived seeds of neighbouring
inputs apart; they are part of the reproducibility contract, so changing one changes results.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Hashable


def benchmark(seed: int, name: str) -> int:
    """Evaluation: the seed of one benchmark, independent of which other benchmarks run with it."""
    return (seed * 1_000_003 + zlib.crc32(name.encode())) % (2**31)


def eval_chunk(benchmark_seed: int, chunk: int) -> int:
    """Evaluation: the generate call of one chunk of a benchmark's prompts."""
    return benchmark_seed + chunk


def epoch_order(seed: int, epoch: int) -> int:
    """Training: the permutation of the dataset in one epoch (the prompt stream every step and every
    dynamic-sampling refill reads on from, ``train.batching.PromptStream``)."""
    return seed * 100_003 + epoch


def rollout_call(seed: int, step: int, round_: int, rank: int) -> int:
    """Training: one generate call of a rank (all its prompts of a step's sampling round)."""
    return seed * 1_000_003 + step * 101 + round_ + rank * 7_919_000_003


def prompt_group(seed: int, step: int, round_: int, key: Hashable) -> int:
    """Training, ``rollout.seeding: prompt``: one prompt group, from its position ``key`` in the
    step, so rollouts do not depend on how prompts are split over ranks (56 bits)."""
    digest = hashlib.sha256(repr((seed, step, round_, key)).encode()).digest()
    return int.from_bytes(digest[:7], "little")


def random_reward(seed: int, step: int, round_: int, key: Hashable) -> int:
    """Training, ``dataset.grader: random``: the reward stream of one prompt group (its place in
    the step, as :func:`prompt_group`), apart from the generation's own stream (56 bits)."""
    digest = hashlib.sha256(repr(("random_reward", seed, step, round_, key)).encode()).digest()
    return int.from_bytes(digest[:7], "little")


def request(call_seed: int, position: int) -> int:
    """Rollout engines: the prompt at ``position`` of a generate call seeded with ``call_seed``.

    vLLM seeds child sample j of a request with ``seed + j``, so one seed for a whole call would make
    the j-th samples of all its prompts share a noise stream, and consecutive seeds would share G - 1
    streams. Per-prompt seeds are therefore hashed (56 bits): their runs of G never overlap in practice.
    """
    digest = hashlib.sha256(repr(("request", call_seed, position)).encode()).digest()
    return int.from_bytes(digest[:7], "little")
