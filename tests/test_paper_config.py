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


# ---------------------------------------------------------------- issue 13, item 8
def _paper():
    raw = PAPER.read_text()
    return raw, yaml.safe_load(raw)


def _line(raw: str, pattern: str) -> str:
    return next(ln for ln in raw.splitlines() if re.search(pattern, ln))


def test_dual_clip_is_the_recipes_and_bounds_negative_advantages_as_verl_does():
    import torch

    from aggbench.grid import cell_train_config, cells
    from aggbench.train.objective import pg_token_loss

    raw, exp = _paper()
    # issue 28, item 2: both pinned scripts set clip_ratio_c=10.0 (verl's own default is 3.0)
    assert exp["training"]["algorithm"]["dual_clip"] == 10.0
    line = _line(raw, r"^\s*dual_clip:")
    assert "[DAPO-verl] clip_ratio_c=10.0 in both scripts" in line and "default, actor.yaml, is 3.0" in line
    cfg = cell_train_config(exp, cells(exp)[0].id)
    assert cfg.algorithm.dual_clip == 10.0
    # the bound is verl's (core_algos.compute_policy_loss_vanilla), written out here on random tokens
    g = torch.Generator().manual_seed(0)
    logp, old = torch.randn(64, 8, generator=g), torch.randn(64, 8, generator=g)
    adv = torch.randn(64, 8, generator=g) * 2
    ratio = torch.exp(logp - old)
    clip1 = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - 0.2, 1 + 0.28))
    verl = torch.where(adv < 0, torch.minimum(-adv * 10.0, clip1), clip1)
    ours, _ = pg_token_loss(logp, old, adv, clip_low=0.2, clip_high=0.28, dual_clip=10.0)
    assert torch.allclose(ours, verl, atol=0, rtol=0)
    assert (verl != clip1).any()  # the bound binds somewhere on this batch


def test_qwen_models_stop_on_their_turn_tokens_in_evaluation_only():
    from aggbench.grid import cell_train_config, cells

    raw, exp = _paper()
    for name in ("qwen2.5-math-7b", "qwen3-1.7b"):
        assert exp["models"][name]["stop_tokens"] == ["<|im_end|>", "<|endoftext|>"], name
        cfg = cell_train_config(exp, next(c.id for c in cells(exp) if c.model == name))
        # issue 28, item 3: training's rollouts stop on the model's EOS only, as verl's vLLM rollout
        assert cfg.model.stop_tokens == [], name
    assert exp["training"]["stop_tokens"] == []
    head = raw[raw.index("\ntraining:\n") : raw.index("  stop_tokens: []\n")]
    assert "[DAPO-verl]" in head and "passes no stop strings or ids" in head
    assert "[Qwen-Math-eval]" in raw and "stop_token_ids 151645, 151643" in raw
    block = raw[: raw.index('stop_tokens: ["<|im_end|>", "<|endoftext|>"]\n')].splitlines()[-3:]
    assert any("[Qwen-Math-eval]" in ln for ln in block)


def test_evaluation_sampling_and_model_choices_name_their_sources():
    raw, exp = _paper()
    for bench in exp["benchmarks"]:
        text = (PAPER.parent / "benchmarks" / f"{bench}.yaml").read_text()
        spec = yaml.safe_load(text)["sampling"]
        assert (spec["temperature"], spec["top_p"]) == (0.6, 0.95), bench
        before = text[: text.index("\nsampling:")].splitlines()[-2:]
        assert "Sampling source" in before[0] and "DeepSeek-R1" in before[0], bench
        assert "n and max_tokens [assumed]" in before[0], bench  # neither comes from the paper
        assert "unknown" in before[1] and f"{spec['max_tokens']} tokens here" in before[1], bench
    assert "Evaluation sampling is each benchmark's YAML" in raw
    # Qwen3-1.7B: the post-trained model in non-thinking mode, both choices labelled
    q3 = exp["models"]["qwen3-1.7b"]
    assert q3["source"] == "Qwen/Qwen3-1.7B" and q3["enable_thinking"] is False
    head = raw[raw.index("  qwen3-1.7b:") : raw.index("enable_thinking: false")]
    assert "Qwen/Qwen3-1.7B-Base is the alternative" in head and "non-thinking mode" in head
    # issue 28, item 4(c): Qwen3 is evaluated with its non-thinking mode's own recommendation
    assert q3["evaluation_sampling"] == {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
    label = raw[raw.index("enable_thinking: false") : raw.index("evaluation_sampling:")]
    assert (
        "[Qwen3]" in label and "non-thinking" in label and "7a2f61ffc7a20d47efcd2bf97f6f2bf52729042e" in label
    )
    assert "evaluation_sampling" not in exp["models"]["qwen2.5-math-7b"]
    assert exp["training"]["sampling"]["top_k"] == -1


def test_training_and_evaluation_answer_formats_are_both_graded():
    """DAPO-17k trains with its "Answer:" instruction, the benchmarks ask for \\boxed{}: the math
    grader that scores both reads either format, so neither is graded on format."""
    from aggbench.data.benchmarks import load_benchmark_spec
    from aggbench.data.training import load_training_spec
    from aggbench.grading.math import grade_math

    raw, exp = _paper()
    dapo = load_training_spec(exp["datasets"]["dapo17k"]["spec"])
    assert "Answer:" in dapo.instruction_template and dapo.grader.name == "math"
    for bench in ("math500", "aime24", "aime25"):
        spec = load_benchmark_spec(bench)
        assert "\\boxed{}" in spec.prompt_template and spec.grader.name == "math", bench
    assert grade_math("so 6 * 7 = 42.\nAnswer: 42", "42").correct
    assert grade_math("so 6 * 7 = 42, and the answer is \\boxed{42}.", "42").correct
    assert not grade_math("so 6 * 7 = 41.\nAnswer: 41", "42").correct
    assert "Answer format:" in raw and "[assumed: the paper's prompts are unknown]" in raw


def test_dapo17k_trains_on_the_recipes_reward_and_logs_its_disagreement_with_math():
    """Issue 28, item 1: DAPO-17k's training reward is the recipe's (verl math_dapo, grader `dapo`),
    labelled with its source and version; `math` runs beside it on the same rollouts, compared
    only; Polaris keeps its spec's grader, labelled assumed."""
    from aggbench.grid import cell_train_config, cells

    raw, exp = _paper()
    assert exp["datasets"]["dapo17k"] == {"spec": "dapo17k", "reward": "dapo", "compare_reward": "math"}
    assert exp["datasets"]["polaris"] == {"spec": "polaris"}
    label = raw[raw.index("# Training reward.") : raw.index("datasets:\n")]
    for phrase in (
        "[DAPO-verl] reward_model.reward_manager=dapo",
        "math_dapo.py",
        "[verl-0.9.1]",
        "b178a3cd5",
    ):
        assert phrase in label, phrase
    assert "polaris: its spec's grader, `math` [assumed" in label
    # the pinned recipe's own math_dapo lacks the box fallback 0.9.1 has: the label says so
    assert "The pinned recipe commit 246cac4 (and main at b178a3cd5) lacks that box" in label
    by_dataset = {}
    for c in cells(exp):
        cfg = cell_train_config(exp, c.id)
        by_dataset.setdefault(c.dataset, set()).add((cfg.dataset.grader, cfg.dataset.compare_grader))
    assert by_dataset == {"dapo17k": {("dapo", "math")}, "polaris": {("math", None)}}


def test_max_prompt_tokens_fit_the_context_and_name_the_overlong_filter():
    """Issue 13, item 6: each model's prompt budget, its label, and what happens to a longer prompt
    (dropped before training, as verl's data.filter_overlong_prompts; tests/train/test_overlong_prompts.py)."""
    raw = PAPER.read_text()
    cfg = yaml.safe_load(raw)
    expected = {"qwen2.5-math-7b": (2048, 8192), "qwen3-1.7b": (2048, 8192)}  # the 7B recipe's
    for name, model in cfg["models"].items():
        s = model["training"]["sampling"]
        assert (s["max_prompt_tokens"], s["max_new_tokens"]) == expected[name], name
        assert s["max_prompt_tokens"] + s["max_new_tokens"] <= model["max_context"], name
    # the source label stays with the number, and the comment above it names the filter
    blocks = re.findall(
        r"((?:\s*#.*\n)+)\s*sampling: \{max_prompt_tokens: (\d+), max_new_tokens: \d+\}\s*# (\[DAPO-verl-7B\])",
        raw,
    )
    assert [int(b[1]) for b in blocks] == [2048, 2048]
    for comment, _value, _label in blocks:
        assert "max_prompt_tokens" in comment and "[assumed" in comment and "dropped before" in comment
        assert "filter_overlong_prompts" in comment
    # the value reaches the cell config the trainer filters with
    from aggbench.grid import cell_train_config, cells, load_experiment

    exp = load_experiment(PAPER)
    got = {c.model: cell_train_config(exp, c.id).sampling.max_prompt_tokens for c in cells(exp)}
    assert got == {name: v[0] for name, v in expected.items()}


def test_dynamic_sampling_rounds_count_as_verls_max_num_gen_batches():
    """verl stops after max_num_gen_batches generation rounds in all (10 in the DAPO recipe);
    aggbench's dynamic_sampling_max_rounds counts the rounds after the first, so the recipe's 10 is 9."""
    raw, exp = _paper()
    assert exp["training"]["algorithm"]["dynamic_sampling_max_rounds"] == 9
    line = _line(raw, r"^\s*dynamic_sampling_max_rounds:")
    assert "[DAPO-verl-32B]" in line and "max_num_gen_batches=10" in line


def test_one_pinned_recipe_names_each_settings_file():
    """Issue 28, item 2: the legend pins verl's recipe/dapo to one commit and names which script
    each tag means; the values that differ between the scripts carry the tag of the one they
    come from (dynamic sampling: the 32B script; lengths, steps: the 7B math script)."""
    raw, exp = _paper()
    legend = raw[: raw.index("experiment:")]
    assert "recipe/dapo at commit 246cac4ca6b0e3ce1009bc48aaa798689e0600af" in legend
    assert "[DAPO-verl-32B] = recipe/dapo/run_dapo_qwen2.5_32b.sh" in legend
    assert "[DAPO-verl-7B] = recipe/dapo/test_dapo_7b_math.sh" in legend
    algo = exp["training"]["algorithm"]
    assert algo["total_steps"] == 200 and "[DAPO-verl-7B] total_training_steps=200" in _line(
        raw, r"total_steps:"
    )
    assert algo["dynamic_sampling"] is True
    assert "[DAPO-verl-32B] enable_filter_groups=True" in _line(raw, r"^\s*dynamic_sampling:")
    assert "top_k=-1" in _line(raw, r"^\s*sampling: \{temperature")
    for model in exp["models"].values():
        assert model["training"]["sampling"] == {"max_prompt_tokens": 2048, "max_new_tokens": 8192}
    # evaluation every 25 = checkpoint.every, labelled with the recipe's test_freq it departs from
    assert exp["evaluation"]["every"] == exp["training"]["checkpoint"]["every"] == 25
    head = raw[raw.index("\nevaluation:\n") : raw.index("  every: 25\n")]
    assert "[assumed] every 25 = checkpoint.every" in head and "test_freq=10" in head
    doc = (PAPER.parents[1] / "docs" / "aggregations.md").read_text()
    assert "246cac4ca6b0e3ce1009bc48aaa798689e0600af" in doc and "run_dapo_qwen2.5_32b.sh" in doc


def test_scope_labels_claim_the_paper_only_where_it_says_so_and_the_rule_docs_are_current():
    """Issue 28, item 6: token and sequence run at the mini-batch as the recipe's verl token-mean
    (labelled so, with the group-scope ablation named); balanced at the group [paper]. The rule
    table in docs/aggregations.md names each rule's registered version, and every instance in
    its explain output is registered."""
    from aggbench.aggregation.contract import builtin_instances, get_rule, rule_names

    raw, exp = _paper()
    assert [a["name"] for a in exp["aggregations"]] == ["token", "sequence", "balanced"]
    for name in ("token", "sequence"):
        line = _line(raw, rf"^\s*- name: {name}\b")
        assert "mini-batch scope" in line and "[DAPO-verl]" in line and "[paper]" not in line, line
    assert "group scope [paper]" in _line(raw, r"^\s*- name: balanced\b")
    assert "loss_agg_mode=token-mean" in raw and "the scope ablation below runs the per-group reading" in raw
    assert {a["name"] for a in exp["ablations"]["aggregations"]} >= {"token_group", "sequence_group"}

    doc = (PAPER.parents[1] / "docs" / "aggregations.md").read_text()
    table = re.findall(r"^\| `(\w+)` \(v(\d+)\) \|", doc, flags=re.M)
    assert {name for name, _ in table} == set(rule_names())
    for name, version in table:
        assert get_rule(name).version == version, name
    summary = doc[doc.rindex("== summary: total weight per advantage sign") :]
    shown = re.findall(r"^  (\w+) +[\d.]+ +[\d.]+ +[\d.]+$", summary[: summary.index("```")], flags=re.M)
    assert shown and set(shown) <= set(builtin_instances()), shown


def test_training_stop_tokens_reach_the_trainer_apart_from_evaluations():
    """training.stop_tokens (and a model's training override) set the rollouts' stops; the model's
    evaluation stop_tokens never do."""
    import copy

    from aggbench.grid import cell_train_config, cells

    _, exp = _paper()
    exp = copy.deepcopy(exp)
    exp["training"]["stop_tokens"] = ["<|im_end|>"]
    exp["models"]["qwen3-1.7b"]["training"]["stop_tokens"] = ["<|endoftext|>"]
    stops = {c.model: cell_train_config(exp, c.id).model.stop_tokens for c in cells(exp)}
    assert stops == {"qwen2.5-math-7b": ["<|im_end|>"], "qwen3-1.7b": ["<|endoftext|>"]}


def test_the_7b_evaluates_on_qwen_math_evals_own_prompt_and_livecodebench_on_its_own():
    """Issue 28, item 4(a)/(d): the 7B's math prompt is Qwen2.5-Math's format (tests/evaluation/
    test_prompt_formats.py renders it byte for byte), labelled with the pinned source; Qwen3 keeps
    the chat template; LiveCodeBench has its own system prompt."""
    from aggbench.data.benchmarks import load_benchmark_spec

    raw, exp = _paper()
    assert exp["models"]["qwen2.5-math-7b"]["prompt_format"] == ["qwen25-math-cot", "lcb-codeqwen"]
    assert "prompt_format" not in exp["models"]["qwen3-1.7b"]
    head = raw[raw.index("  qwen2.5-math-7b:") : raw.index("prompt_format: [qwen25-math-cot")]
    assert "[Qwen-Math-eval]" in head and 'PROMPT_TEMPLATES["qwen25-math-cot"]' in head
    assert "[LCB]" in head and "CodeQwenInstruct" in head and "28fef95e" in head
    q3 = raw[raw.index("  qwen3-1.7b:") : raw.index("evaluation_sampling:")]
    assert "[LCB]" in q3 and "[assumed: lcb_runner sends its raw string" in q3
    assert "28fef95ea8c9f7a547c8329f2cd3d32b92c1fa24" in raw[: raw.index("experiment: paper")]
    assert "a45202bd16f1ec06f433442dc1152d0074773465" in raw
    text = (PAPER.parent / "benchmarks" / "livecodebench.yaml").read_text()
    assert load_benchmark_spec("livecodebench").system_prompt == "You are a helpful assistant."
    assert "28fef95ea8c9f7a547c8329f2cd3d32b92c1fa24" in text and "SYSTEM_MESSAGE_CODEQWEN" in text
    # 4(d): the offline public-tests-only copy is refused unless the config says so
    assert exp["evaluation"]["allow_public_tests_only"] is False
    assert "public tests only" in raw[raw.index("\nevaluation:\n") : raw.index("allow_public_tests_only")]


def test_the_greedy_row_is_qwen_math_evaluations_protocol():
    """Issue 28, item 4(b): a greedy n=1 row beside avg@k, labelled with the source's script and commit
    (its decoding: tests/evaluation/test_greedy_protocol.py; its tables: tests/report/test_report_greedy.py)."""
    raw, exp = _paper()
    assert exp["evaluation"]["greedy"] is True
    label = raw[raw.index("allow_public_tests_only: false") : raw.index("  greedy: true")]
    assert "[Qwen-Math-eval]" in label and "evaluation/sh/eval.sh" in label
    assert "a45202bd16f1ec06f433442dc1152d0074773465" in label
    assert "--temperature 0 --n_sampling 1" in label and "[assumed]" in label
