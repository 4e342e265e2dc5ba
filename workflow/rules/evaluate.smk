# Evaluation: `generate` samples one checkpoint on every benchmark with the model loaded once (a
# GPU job), `grade` scores one benchmark's samples (a CPU job). The step-0 base model is evaluated
# once per model, not once per cell, under results/base/{model}/.
#
#   results/runs/{cell}/samples/step_{N}/{bench}.jsonl      generate
#   results/runs/{cell}/eval/step_{N}/{bench}.jsonl         grade (+ {bench}.metrics.json)
#   results/base/{model}/samples/step_0/{bench}.jsonl       generate_base
#   results/base/{model}/eval/step_0/{bench}.jsonl          grade_base (+ .metrics.json)
#
# evaluation.greedy: the same generate job also decodes each problem once greedily (n=1, temperature
# 0) into samples/step_N/greedy/, and the same grade job grades them into eval/step_N/greedy/.


def _samples(prefix):
    out = [f"{prefix}/{b}.jsonl" for b in BENCHMARKS] + [f"{prefix}/generation.json"]
    if GREEDY:
        out += [f"{layout.greedy_dir(prefix)}/{b}.jsonl" for b in BENCHMARKS]
    return out


def _samples_in(prefix):
    """The grade job's inputs: the benchmark's samples, and its greedy samples when on."""
    out = {"samples": f"{prefix}/{{bench}}.jsonl"}
    if GREEDY:
        out["greedy"] = f"{layout.greedy_dir(prefix)}/{{bench}}.jsonl"
    return out


def _score():
    """The grade job's command: score the samples (the command as before the greedy protocol, so
    turning it off re-runs nothing) and, when on, the greedy samples in the same process."""
    cmd = "aggbench score --benchmark {wildcards.bench}"
    if not GREEDY:
        return cmd + " --samples {input} --out {output.graded} --workers {threads} --quiet > {log} 2>&1"
    cmd += " --samples {input.samples} --out {output.graded}"
    cmd += " --greedy-samples {input.greedy} --greedy-out {output.greedy_graded}"
    return cmd + " --workers {threads} --quiet > {log} 2>&1"


rule generate:
    input:
        # the segment's marker: the checkpoint itself is edited later by the trainer's retention
        segment_marker("{cell}", "{step}"),
        benchmark_lock(),
    output:
        _samples(samples_of(run_dir("{cell}"), "{step}")),
    log:
        f"{R}/logs/generate/{{cell}}/step_{{step}}.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/generate/{{cell}}/step_{{step}}.times.tsv",
    params:
        checkpoint=lambda wildcards: checkpoint_of(wildcards.cell, wildcards.step),
        out=lambda wildcards: samples_of(run_dir(wildcards.cell), wildcards.step),
        benchmarks=",".join(BENCHMARKS),
        fetched=benchmark_data(),
        options=lambda wildcards: generate_args(model_of_cell(wildcards)),
    threads: rule_threads("generate", model_of_cell)
    resources:
        **rule_resources("generate", model_of_cell),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS={threads}; "
        "aggbench generate --checkpoint {params.checkpoint} --benchmarks {params.benchmarks} "
        "--fetched {params.fetched:q} --out {params.out} {params.options} --quiet > {log} 2>&1"


rule generate_base:
    input:
        model=model_dir("{model}"),
        data=benchmark_lock(),
    output:
        _samples(samples_of(base_dir("{model}"), 0)),
    log:
        f"{R}/logs/generate_base/{{model}}.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/generate_base/{{model}}.times.tsv",
    params:
        out=lambda wildcards: samples_of(base_dir(wildcards.model), 0),
        benchmarks=",".join(BENCHMARKS),
        fetched=benchmark_data(),
        options=lambda wildcards: generate_args(wildcards.model),
    threads: rule_threads("generate_base", model_of_wildcard)
    resources:
        **rule_resources("generate_base", model_of_wildcard),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS={threads}; "
        "aggbench generate --checkpoint {input.model} --benchmarks {params.benchmarks} "
        "--fetched {params.fetched:q} --out {params.out} {params.options} --quiet > {log} 2>&1"


rule grade:
    input:
        **_samples_in(samples_of(run_dir('{cell}'), '{step}')),
    output:
        **grade_files(run_dir("{cell}"), "{step}", "{bench}"),
    log:
        f"{R}/logs/grade/{{cell}}/step_{{step}}/{{bench}}.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/grade/{{cell}}/step_{{step}}/{{bench}}.times.tsv",
    threads: rule_threads("grade", model_of_cell)
    resources:
        **rule_resources("grade", model_of_cell),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS=1; "
        + _score()


rule grade_base:
    input:
        **_samples_in(samples_of(base_dir('{model}'), 0)),
    output:
        **grade_files(base_dir("{model}"), 0, "{bench}"),
    log:
        f"{R}/logs/grade_base/{{model}}/{{bench}}.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/grade_base/{{model}}/{{bench}}.times.tsv",
    threads: rule_threads("grade_base", model_of_wildcard)
    resources:
        **rule_resources("grade_base", model_of_wildcard),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS=1; "
        + _score()


# evaluation.extra_seeds: the same checkpoint sampled again under another evaluation seed, into
# samples/step_N/eval_seed_K/ and graded into eval/step_N/eval_seed_K/, for the report's variance
# decomposition (aggbench.report.variance: training seed vs evaluation sampling vs problems).


rule generate_eval_seed:
    input:
        segment_marker("{cell}", "{step}"),
        benchmark_lock(),
    output:
        [f"{layout.eval_seed_dir(samples_of(run_dir('{cell}'), '{step}'), '{eseed}')}/{b}.jsonl" for b in BENCHMARKS],
        f"{layout.eval_seed_dir(samples_of(run_dir('{cell}'), '{step}'), '{eseed}')}/generation.json",
    log:
        f"{R}/logs/generate/{{cell}}/step_{{step}}_eval_seed_{{eseed}}.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/generate/{{cell}}/step_{{step}}_eval_seed_{{eseed}}.times.tsv",
    params:
        checkpoint=lambda wildcards: checkpoint_of(wildcards.cell, wildcards.step),
        out=lambda wildcards: layout.eval_seed_dir(samples_of(run_dir(wildcards.cell), wildcards.step), wildcards.eseed),
        benchmarks=",".join(BENCHMARKS),
        fetched=benchmark_data(),
        options=lambda wildcards: eval_seed_args(model_of_cell(wildcards), wildcards.eseed),
    threads: rule_threads("generate", model_of_cell)
    resources:
        **rule_resources("generate", model_of_cell),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS={threads}; "
        "aggbench generate --checkpoint {params.checkpoint} --benchmarks {params.benchmarks} "
        "--fetched {params.fetched:q} --out {params.out} {params.options} --quiet > {log} 2>&1"


rule grade_eval_seed:
    input:
        f"{layout.eval_seed_dir(samples_of(run_dir('{cell}'), '{step}'), '{eseed}')}/{{bench}}.jsonl",
    output:
        **dict(zip(("graded", "metrics"), eval_seed_files(run_dir("{cell}"), "{step}", "{bench}", "{eseed}"))),
    log:
        f"{R}/logs/grade/{{cell}}/step_{{step}}/eval_seed_{{eseed}}/{{bench}}.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/grade/{{cell}}/step_{{step}}/eval_seed_{{eseed}}/{{bench}}.times.tsv",
    threads: rule_threads("grade", model_of_cell)
    resources:
        **rule_resources("grade", model_of_cell),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS=1; "
        "aggbench score --benchmark {wildcards.bench} --samples {input} --out {output.graded} "
        "--workers {threads} --quiet > {log} 2>&1"
