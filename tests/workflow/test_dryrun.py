"""`snakemake -n` lists exactly the jobs the grid implies, with each rule's resources from the config."""

from __future__ import annotations

import time

from aggbench.grid import job_counts, load_experiment


def test_paper_grid_dry_run_lists_exactly_the_expected_jobs(wf, tmp_path):
    t0 = time.monotonic()
    proc = wf.run(["-n", "--configfile", str(wf.PAPER), "--config", f"results_dir={tmp_path / 'results'}"])
    elapsed = time.monotonic() - t0
    counts = wf.job_counts(proc.stdout)

    # By hand: 2 models x 2 datasets x 3 rules x 1 seed = 12 cells. Checkpoints every 25 of 200 steps
    # = 8 train segments per cell; evaluation every 25 steps = steps 25..200 = 8 per cell; nine
    # benchmarks graded per evaluated checkpoint (the six test benchmarks and the three selection
    # splits); the base model sampled once per model (2) and graded on 9 benchmarks each (18).
    cells = 2 * 2 * 3 * 1
    expected = {
        "prepare_model": 2,
        "prepare_data": 2,
        "fetch_benchmarks": 1,
        "experiment_config": 1,
        "cell_config": cells,
        "train": cells * (200 // 25),
        "generate": cells * 8,
        "grade": cells * 8 * 9,
        "generate_base": 2,
        "grade_base": 2 * 9,
        "report": 1,
        "all": 1,
    }
    assert expected["train"] == 96 and expected["generate"] == 96 and expected["grade"] == 864
    assert counts == expected, proc.stdout[-3000:]

    # ... and the same numbers as the grid module, which `aggbench grid check` prints
    grid = job_counts(load_experiment(wf.PAPER))
    for rule in (
        "prepare_model",
        "prepare_data",
        "fetch_benchmarks",
        "train",
        "generate",
        "grade",
        "generate_base",
        "grade_base",
    ):
        assert counts[rule] == grid[rule], rule
    assert counts["cell_config"] == grid["cells"]

    # Resources come from the config, per model: 8 GPUs to train Qwen2.5-Math-7B, 4 for Qwen3-1.7B,
    # and grade jobs get the config's 16 CPUs (and no GPU).
    jobs = wf.jobs(proc.stdout)
    train = {j["wildcards"]["cell"].split("__")[0]: j["resources"] for j in jobs if j["rule"] == "train"}
    assert train["qwen2.5-math-7b"]["gpu"] == "8" and train["qwen2.5-math-7b"]["mem_mb"] == "480000"
    assert train["qwen2.5-math-7b"]["runtime"] == "1440" and train["qwen2.5-math-7b"]["cpus_per_task"] == "32"
    assert train["qwen3-1.7b"]["gpu"] == "4" and train["qwen3-1.7b"]["mem_mb"] == "240000"
    grade = next(j for j in jobs if j["rule"] == "grade")["resources"]
    assert grade["cpus_per_task"] == "16" and grade["mem_mb"] == "32000" and "gpu" not in grade
    # a job on several GPUs is one node's processes (torchrun --standalone): SLURM gets --nodes=1
    assert train["qwen2.5-math-7b"]["nodes"] == "1" and train["qwen3-1.7b"]["nodes"] == "1"
    assert "nodes" not in grade
    one_gpu = [j["resources"] for j in jobs if j["rule"] == "generate" and j["resources"].get("gpu") == "1"]
    assert one_gpu and all("nodes" not in r for r in one_gpu)

    # a dry run writes nothing under results_dir
    assert not (tmp_path / "results").exists()
    # a few seconds, most of it importing torch to validate the rules: printed, never asserted
    # (a test does not pass or fail on wall-clock time)
    print(f"paper dry run: {sum(counts.values())} jobs in {elapsed:.1f} s")


def test_default_config_is_the_smoke_grid(wf, tmp_path):
    """Without --configfile the Snakefile runs configs/smoke.yaml: 3 rules x 12 steps, checkpoints
    every 4 -> 3 segments per cell, each evaluated, on one benchmark, plus the base model."""
    proc = wf.run(["-n", "--quiet", "rules", "--config", f"results_dir={tmp_path / 'results'}"])
    counts = wf.job_counts(proc.stdout)
    want = wf.expected_jobs(cells=3, segments=3, evaluations=3, benchmarks=1, base_model=True)
    assert want["train"] == 9 and want["grade"] == 9 and want["grade_base"] == 1  # the shape, by hand
    assert counts == want, proc.stdout[-3000:]


def test_paper_commands_carry_the_model_overrides_and_stop_tokens(wf, tmp_path):
    """models.<m>.config_overrides reaches `aggbench prepare-model` (issue 13, item 4: the 7B's
    max_position_embeddings 32768, as verl's DAPO 7B math recipe sets it) and models.<m>.stop_tokens
    reaches every `aggbench generate` (item 8: Qwen's turn tokens, as Qwen2.5-Math's evaluation)."""
    proc = wf.run(
        ["-n", "-p", "--configfile", str(wf.PAPER), "--config", f"results_dir={tmp_path / 'results'}"]
    )
    lines = proc.stdout.splitlines()
    cmd = next(ln for ln in lines if "aggbench prepare-model Qwen/Qwen2.5-Math-7B" in ln)
    assert "--config-override max_position_embeddings=32768" in cmd
    fetch = next(ln for ln in lines if "aggbench data fetch" in ln)
    assert (
        "--refuse-public-tests-only" in fetch
    )  # issue 28, item 4(d): evaluation.allow_public_tests_only false
    generate = [ln for ln in lines if "aggbench generate" in ln]
    assert len(generate) == 98  # 96 checkpoints + 2 base models
    assert all("--stop-token '<|im_end|>' --stop-token '<|endoftext|>'" in ln for ln in generate)
    # issue 28, item 4(a): the 7B's evaluation prompt is Qwen2.5-Math's own format; Qwen3's is not
    qwen7b = [ln for ln in generate if "qwen2.5-math-7b" in ln]
    assert len(qwen7b) == 49
    assert all("--prompt-format qwen25-math-cot --prompt-format lcb-codeqwen" in ln for ln in qwen7b)
    assert not [ln for ln in generate if "qwen2.5-math-7b" not in ln and "--prompt-format" in ln]
    # item 4(c): Qwen3's generate jobs sample as its non-thinking mode recommends
    qwen3 = [ln for ln in generate if "qwen3-1.7b" in ln]
    assert len(qwen3) == 49 and all("--temperature 0.7 --top-p 0.8 --top-k 20" in ln for ln in qwen3)
    assert not [ln for ln in qwen7b if "--top-k" in ln]
    # item 5: every generate job caps budgets at its model's context (32,768 for both paper models)
    assert all("--max-context 32768" in ln for ln in generate)
    # item 4(b): every generate job also decodes greedily, and every grade job scores both protocols
    assert all(ln.count("--greedy") == 1 for ln in generate)
    grade = [ln for ln in lines if "aggbench score" in ln]
    assert len(grade) == 96 * 9 + 2 * 9
    for ln in grade:
        assert ln.count("aggbench score") == 1 and ln.count("/greedy/") == 2, ln
        assert "--greedy-samples" in ln and "--greedy-out" in ln, ln


def test_extra_evaluation_seeds_add_one_generate_and_grade_per_evaluated_checkpoint(wf, tmp_path):
    """evaluation.extra_seeds (the variance decomposition's second evaluation seed): cells only, the
    same counts as grid.job_counts, sampled with --seed K into eval_seed_K/, no greedy decode again."""
    over = {"seeds": [0, 1], "evaluation": {"extra_seeds": [1], "greedy": True}}
    config = wf.write_config(tmp_path / "c.yaml", {**over, "results_dir": str(tmp_path / "r")})
    proc = wf.run(["-n", "-p", "--configfile", str(config)])
    counts = wf.job_counts(proc.stdout)
    grid = job_counts(load_experiment(config))
    assert counts["generate_eval_seed"] == grid["generate_eval_seed"] == 6 * 3  # 6 cells x 3 evaluations
    assert counts["grade_eval_seed"] == grid["grade_eval_seed"] == 6 * 3
    commands = [
        line for line in proc.stdout.splitlines() if "aggbench generate" in line and "eval_seed_1" in line
    ]
    assert len(commands) == 18 and all("--seed 1 " in c and "--greedy" not in c for c in commands)
    assert "tables/variance.md" in proc.stdout
