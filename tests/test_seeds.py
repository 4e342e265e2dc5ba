"""Golden values of every seed aggbench.seeds derives: they are part of the reproducibility contract
(a checkpointed run resumed under a new commit must draw the same prompts and samples), so a change
to any derivation must fail here. The numbers were computed once from the code and are literals.

Arguments are of the kinds the callers pass: benchmark names (evaluation.generate), chunk indices,
epochs (train.batching), step / sampling round / rank (train.sampling), the prompt-group keys
("p", position) for a step's prompts and ("r", position) for dynamic-sampling refills, and the
call seeds rollout_call and eval_chunk hand to the engines' per-prompt ``request``."""

from __future__ import annotations

import inspect

import pytest

from aggbench import seeds

GOLDEN = [
    ("benchmark", (0, "tiny_test"), 809414492),
    ("benchmark", (1, "tiny_test"), 810414495),
    ("benchmark", (0, "math500"), 492476003),
    ("benchmark", (7, "aime24"), 776453766),
    ("benchmark", (12345, "livecodebench"), 1146296918),
    ("eval_chunk", (492476003, 0), 492476003),
    ("eval_chunk", (492476003, 3), 492476006),
    ("epoch_order", (0, 0), 0),
    ("epoch_order", (0, 1), 1),
    ("epoch_order", (1, 0), 100003),
    ("epoch_order", (42, 3), 4200129),
    ("rollout_call", (0, 1, 0, 0), 101),
    ("rollout_call", (0, 1, 1, 0), 102),
    ("rollout_call", (0, 2, 0, 1), 7919000205),
    ("rollout_call", (3, 5, 2, 1), 7922000519),
    ("rollout_call", (42, 10, 0, 3), 23799001145),
    ("prompt_group", (0, 1, 0, ("p", 0)), 65353288355814747),
    ("prompt_group", (0, 1, 0, ("p", 1)), 64580631974815882),
    ("prompt_group", (0, 1, 1, ("r", 0)), 64168669872589689),
    ("prompt_group", (0, 2, 0, ("p", 0)), 69069167823230586),
    ("prompt_group", (1, 1, 0, ("p", 0)), 10273809799702560),
    ("prompt_group", (3, 7, 2, ("r", 5)), 39640486176198094),
    ("random_reward", (0, 1, 0, ("p", 0)), 71156766644857772),
    ("random_reward", (0, 1, 1, ("r", 0)), 66532040236984252),
    ("random_reward", (3, 7, 2, ("r", 5)), 10321462392194567),
    ("request", (101, 0), 13154307667845458),  # rollout_call(0, 1, 0, 0), its first prompt
    ("request", (101, 1), 34008442361608238),
    ("request", (102, 0), 64317515627755225),
    ("request", (492476006, 0), 52991097422397127),  # eval_chunk(benchmark(0, "math500"), 3)
    ("request", (0, 0), 20703522903282131),
    ("request", (65353288355814747, 3), 43911868621062774),
]


@pytest.mark.parametrize(
    ("name", "args", "expected"), GOLDEN, ids=[f"{n}{a!r}".replace(" ", "") for n, a, _ in GOLDEN]
)
def test_derived_seed_is_its_golden_value(name, args, expected):
    assert getattr(seeds, name)(*args) == expected


def test_every_seed_function_has_golden_values():
    public = {
        name
        for name, fn in vars(seeds).items()
        if inspect.isfunction(fn) and fn.__module__ == seeds.__name__ and not name.startswith("_")
    }
    assert public == {name for name, _, _ in GOLDEN}
    assert all(sum(n == name for n, _, _ in GOLDEN) >= 2 for name in public)
