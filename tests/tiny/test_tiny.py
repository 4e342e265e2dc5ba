"""The built-in tiny model, its tokenizer and the synthetic task (`aggbench prepare-model`, which
builds it: tests/cli/test_prepare_model.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from aggbench.tiny.task import (
    BOX,
    Problem,
    TaskConfig,
    extract_boxed,
    is_test_prompt,
    make_task,
    sample_problem,
    sft_examples,
    task_reward,
)
from helpers.tiny_models import tiny_model_for_tests

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from aggbench.tiny.model import (  # noqa: E402
    EOS,
    build_tiny_model,
    render_prompt,
    sample_responses,
    sft_warm_start,
)

# Worked by hand: in the map a>d b>f c>a d>h e>b f>c g>e h>g, 4 hops from g visit g>e, e>b, b>f,
# f>c, so the answer is c.
HAND_MAP = tuple(pair.split(">") for pair in ["a>d", "b>f", "c>a", "d>h", "e>b", "f>c", "g>e", "h>g"])
HAND = Problem(mapping=tuple(map(tuple, HAND_MAP)), start="g", hops=4)


def _load(model_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(model_dir), AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def untrained(tmp_path_factory) -> Path:
    return tiny_model_for_tests(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> tuple[Path, list[float]]:
    """A briefly warm-started model and its per-step losses (shared by several tests)."""
    out = build_tiny_model(tmp_path_factory.mktemp("warm") / "model", seed=0)
    losses = sft_warm_start(out, steps=30, batch_size=8, seed=0, progress=False)
    return out, losses


# --- model and tokenizer ---------------------------------------------------------------------


def test_loads_through_auto_classes_with_the_documented_shape(untrained):
    model, tok = _load(untrained)
    n_params = sum(p.numel() for p in model.parameters())
    assert 2_300_000 < n_params < 3_000_000
    assert model.config.hidden_size == 256 and model.config.num_hidden_layers == 4
    assert model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tok)
    assert model.generation_config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids(EOS)
    assert model.generation_config.pad_token_id == tok.pad_token_id != tok.eos_token_id


def test_text_round_trips_and_box_is_one_token(untrained):
    _, tok = _load(untrained)
    printable = "".join(chr(i) for i in range(32, 127))
    text = f"1) g>e\n\t{BOX}c}} and {BOX}12}}, x = {{3}}  " + printable
    ids = tok.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    tokens = tok.convert_ids_to_tokens(ids)
    assert tokens.count(BOX) == 2
    # every other character is its own token: 7 characters of each box collapse into one
    assert len(ids) == len(text) - 2 * (len(BOX) - 1)
    assert tokens[:3] == ["1", ")", " "]


def test_chat_template_renders_roles_and_generation_prompt(untrained):
    _, tok = _load(untrained)
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert text == "<|bos|><|system|>be brief<|eos|><|user|>hi<|eos|><|assistant|>"
    assert render_prompt(tok, "hi") == "<|bos|><|user|>hi<|eos|><|assistant|>"
    ids = tok.encode(render_prompt(tok, "hi"), add_special_tokens=False)
    assert len(ids) == 6  # bos, user, h, i, eos, assistant: role markers are single tokens
    with pytest.raises(Exception, match="role must be system, user or assistant"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_generate_stops_at_eos(warm):
    model_dir, _ = warm
    model, tok = _load(model_dir)
    prompts = [r["prompt"] for r in make_task(0, 0, 4)[1]]
    tok.padding_side = "left"
    rendered = [render_prompt(tok, p) for p in prompts for _ in range(4)]
    batch = tok(rendered, add_special_tokens=False, padding=True, return_tensors="pt")
    torch.manual_seed(0)
    out = model.generate(**batch, max_new_tokens=60)  # the saved generation config only
    response = out[:, batch["input_ids"].shape[1] :]
    stopped = 0
    for row in response.tolist():
        if tok.eos_token_id in row:
            after = row[row.index(tok.eos_token_id) + 1 :]
            assert all(t == tok.pad_token_id for t in after), row
            stopped += 1
    assert stopped > 0, "no response ended with eos after the warm start"
    assert response.shape[1] <= 60


def test_sample_responses_returns_one_text_and_length_per_sample(warm):
    model, tok = _load(warm[0])
    texts, lengths = sample_responses(
        model, tok, ["Map a>b b>a. From a, apply it 1 times."], n_samples=3, max_new_tokens=20, seed=0
    )
    assert len(texts) == len(lengths) == 3
    assert all(1 <= n <= 20 for n in lengths)
    # a length counts the eos; the decoded text drops it, so text tokens <= length
    for text, n in zip(texts, lengths, strict=True):
        assert len(tok.encode(text, add_special_tokens=False)) <= n


# --- the task --------------------------------------------------------------------------------


def test_hand_worked_problem():
    assert HAND.prompt == "Map a>d b>f c>a d>h e>b f>c g>e h>g. From g, apply it 4 times."
    assert HAND.answer == "c"
    assert HAND.guess_target() == "\\boxed{c}"
    assert HAND.worked_target(0) == "1) g>e\n2) e>b\n3) b>f\n4) f>c\n\\boxed{c}"
    assert HAND.worked_target(1).splitlines()[0] == "1) from g go to e"
    assert HAND.worked_target(2).splitlines()[3] == "step 4: the map sends f to c"
    assert task_reward(HAND.worked_target(2), HAND.answer) == 1.0


def test_sampled_maps_are_single_cycles():
    rng = random.Random(3)
    letters_seen = set()
    for _ in range(50):
        p = sample_problem(rng, TaskConfig(n_nodes=6, random_letters=True))
        image = dict(p.mapping)
        assert len(image) == 6 and sorted(image.values()) == sorted(image)  # a permutation
        assert [src for src, _ in p.mapping] == sorted(image)  # listed by source
        seen, node = set(), p.start
        for _ in range(6):
            seen.add(node)
            node = image[node]
        assert node == p.start and len(seen) == 6  # one cycle through all six letters
        assert p.answer != p.start  # hops < n_nodes never return to the start
        letters_seen |= seen
    assert len(letters_seen) > 20  # letters come from the whole alphabet


def test_task_is_deterministic_and_splits_are_disjoint():
    train_a, test_a = make_task(7, 300, 100)
    train_b, test_b = make_task(7, 300, 100)
    assert (train_a, test_a) == (train_b, test_b)
    train_c, test_c = make_task(8, 300, 100)
    assert train_c != train_a and test_c != test_a
    assert not {r["prompt"] for r in train_a} & {r["prompt"] for r in test_a}
    # splits are drawn from fixed parts of the problem space: no seed mixes them
    assert not {r["prompt"] for r in train_a} & {r["prompt"] for r in test_c}
    assert len({r["id"] for r in train_a + test_a}) == 400
    assert len({r["prompt"] for r in train_a}) == 300
    assert set(train_a[0]) == {"id", "prompt", "answer"}
    # the test split does not move when the training split grows
    assert make_task(7, 10, 100)[1] == test_a


def test_default_letters_and_a_too_small_space_is_a_clear_error():
    train, _ = make_task(0, 50, 0)
    assert all(r["prompt"].startswith("Map a>") and " f>" in r["prompt"] for r in train)
    # 5! cycles * 6 starts * 3 hop counts = 2160 problems, 1/8 of them for tests: 300 is too many
    with pytest.raises(ValueError, match="problem space is too small"):
        make_task(0, 0, 300)


def test_records_answers_match_their_prompts():
    train, test = make_task(1, 20, 20)
    for rec in train + test:
        # re-derive the answer by reading the prompt, independently of Problem.answer
        head, tail = rec["prompt"][len("Map ") :].split(". From ")
        edges = dict(pair.split(">") for pair in head.split())
        node, rest = tail.split(", apply it ")
        for _ in range(int(rest.split()[0])):
            node = edges[node]
        assert rec["answer"] == node


@pytest.mark.parametrize(
    ("response", "answer", "reward"),
    [
        ("1) g>e\n\\boxed{c}", "c", 1.0),
        ("\\boxed{ c }", "c", 1.0),
        ("\\boxed{d}", "c", 0.0),
        ("the answer is c", "c", 0.0),  # no box
        ("\\boxed{c} wait, \\boxed{d}", "c", 0.0),  # the last box wins
        ("\\boxed{d} no: \\boxed{c}", "c", 1.0),
        ("\\boxed{c} then \\boxed{d", "c", 0.0),  # an unclosed last box is no answer
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),  # nested braces
        ("\\boxed{}", "c", 0.0),
    ],
)
def test_task_reward(response, answer, reward):
    assert task_reward(response, answer) == reward


def test_extract_boxed_edge_cases():
    assert extract_boxed("x \\boxed{a{b}c} y") == "a{b}c"
    assert extract_boxed("nothing") is None
    assert extract_boxed("\\boxed{a") is None


# Tokens per worked line, counted by hand from the formats (one token per character, plus the
# newline): "1) g>e" = 6, "1) from g go to e" = 17, "step 1: the map sends g to e" = 28.
TOKENS_PER_HOP = {0: 7, 1: 18, 2: 29}


@pytest.mark.parametrize("verbosity", [0, 1, 2])
def test_sft_data_length_gap(untrained, verbosity):
    _, tok = _load(untrained)
    cfg = TaskConfig(verbosity=verbosity, min_hops=3, max_hops=5)
    rng = random.Random(0)

    def n_tokens(text: str) -> int:
        return len(tok.encode(text, add_special_tokens=False))

    for _ in range(30):
        p = sample_problem(rng, cfg)
        gap = n_tokens(p.worked_target(verbosity)) - n_tokens(p.guess_target())
        assert gap == TOKENS_PER_HOP[verbosity] * p.hops
    assert n_tokens(HAND.guess_target()) == 3  # "\boxed{", "c", "}"
    longest = Problem(mapping=HAND.mapping, start="a", hops=cfg.max_hops)
    assert cfg.max_response_tokens() == n_tokens(longest.worked_target(verbosity)) + 1  # + eos


def test_sft_examples_follow_the_worked_fraction_and_avoid_test_problems():
    cfg = TaskConfig(worked_fraction=0.25)
    examples = sft_examples(random.Random(0), cfg, 2000)
    worked = [e for e in examples if e[2] == "worked"]
    assert 0.21 < len(worked) / len(examples) < 0.29  # binomial sd ~0.01
    assert all(t.startswith(BOX) for _, t, s in examples if s == "guess")
    assert all(t.startswith("1) ") for _, t, s in worked)
    assert not any(is_test_prompt(p) for p, _, _ in examples)
    train, test = make_task(0, 500, 200)
    assert all(is_test_prompt(r["prompt"]) for r in test)
    assert not any(is_test_prompt(r["prompt"]) for r in train)


def test_warm_start_data_never_contains_test_problems_even_in_a_small_space():
    # 3 letters, 1 hop: C(26, 3) * 2 cycles * 3 starts = 15600 problems, so 3000 warm-start draws
    # and 300 test problems would share dozens of prompts if both came from the whole space
    cfg = TaskConfig(n_nodes=3, min_hops=1, max_hops=1, random_letters=True)
    _, test = make_task(0, 0, 300, cfg=cfg)
    examples = sft_examples(random.Random(0), cfg, 3000)
    assert not {r["prompt"] for r in test} & {p for p, _, _ in examples}
    assert all(
        s == "worked" for _, _, s in sft_examples(random.Random(0), TaskConfig(worked_fraction=1.0), 50)
    )


# --- warm start ------------------------------------------------------------------------------


def test_warm_start_reduces_loss(warm):
    _, losses = warm
    assert len(losses) == 30
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert first > 3.5  # near ln(vocab) = ln(106) ~ 4.7 at initialisation
    assert last < 0.6 * first


def test_warm_start_is_deterministic(tmp_path):
    def weights(name: str, seed: int) -> dict:
        d = build_tiny_model(tmp_path / name, seed=seed)
        sft_warm_start(d, steps=2, batch_size=4, seed=seed, progress=False)
        model, _ = _load(d)
        return {k: v.clone() for k, v in model.state_dict().items()}

    a, b, c = weights("a", 0), weights("b", 0), weights("c", 1)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_sft_loss_is_on_assistant_tokens_only(untrained):
    from aggbench.tiny.model import sft_batch

    _, tok = _load(untrained)
    examples = [(HAND.prompt, HAND.guess_target(), "guess"), (HAND.prompt, HAND.worked_target(0), "worked")]
    input_ids, attention_mask, labels = sft_batch(tok, examples)
    prompt_len = len(tok.encode(render_prompt(tok, HAND.prompt), add_special_tokens=False))
    for row, (_, target, _) in enumerate(examples):
        supervised = labels[row][labels[row] != -100].tolist()
        assert tok.decode(supervised, skip_special_tokens=False) == target + EOS
        assert (labels[row, :prompt_len] == -100).all()
        assert attention_mask[row].sum().item() == prompt_len + len(supervised)


def test_the_validation_split_is_held_out_and_apart_from_the_test_split():
    """tiny_val (configs/benchmarks/tiny_val.yaml), the selection split of evaluation.selection."""
    from aggbench.data.benchmarks import load_benchmark, load_benchmark_spec
    from aggbench.tiny.task import is_test_prompt, make_task, make_validation

    val = list(load_benchmark(load_benchmark_spec("tiny_val")))
    test = list(load_benchmark(load_benchmark_spec("tiny_test")))
    train, _ = make_task(0, 512, 64)
    assert len(val) == 64 and len({r["prompt"] for r in val}) == 64
    assert all(r["id"].startswith("tiny-validation-") and is_test_prompt(r["prompt"]) for r in val)
    assert not {r["prompt"] for r in val} & {r["prompt"] for r in test}
    assert not {r["prompt"] for r in val} & {r["prompt"] for r in train}
    assert [r["prompt"] for r in test] == [r["prompt"] for r in make_task(0, 512, 64)[1]]  # unchanged
    assert make_validation(0, 64, 64) == make_validation(0, 64, 64)  # deterministic
