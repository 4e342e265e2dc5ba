# Evaluation: `generate` samples one checkpoint on every benchmark with the model loaded once (a
# GPU job), `grade` scores one benchmark's samples (a CPU job). The step-0 base model is evaluated
# once per model, not once per cell, under results/base/{model}/.
#
#   results/runs/{cell}/samples/step_{N}/{bench}.jsonl      generate
#   results/runs/{cell}/eval/step_{N}/{bench}.jsonl         grade (+ {bench}.metrics.json)
#   results/base/{model}/samples/step_0/{bench}.jsonl       generate_base
#   results/base/{model}/eval/step_0/{bench}.jsonl          grade_base (+ .metrics.json)


def _samples(prefix):
    return [f"{prefix}/{b}.jsonl" for b in BENCHMARKS] + [f"{prefix}/generation.json"]


rule generate:
    input:
        # the segment's marker: the checkpoint itself is edited later by the trainer's retention
        segment_marker("{cell}", "{step}"),
        benchmark_lock(),
    output:
        _samples(samples_of(run_dir("{cell}"), "{step}")),
    log:
        f"{R}/logs/generate/{{cell}}/step_{{step}}.log",
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
        f"{samples_of(run_dir('{cell}'), '{step}')}/{{bench}}.jsonl",
    output:
        graded=eval_of(run_dir("{cell}"), "{step}", "{bench}")[0],
        metrics=eval_of(run_dir("{cell}"), "{step}", "{bench}")[1],
    log:
        f"{R}/logs/grade/{{cell}}/step_{{step}}/{{bench}}.log",
    threads: rule_threads("grade", model_of_cell)
    resources:
        **rule_resources("grade", model_of_cell),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS=1; "
        "aggbench score --benchmark {wildcards.bench} --samples {input} --out {output.graded} "
        "--workers {threads} --quiet > {log} 2>&1"


rule grade_base:
    input:
        f"{samples_of(base_dir('{model}'), 0)}/{{bench}}.jsonl",
    output:
        graded=eval_of(base_dir("{model}"), 0, "{bench}")[0],
        metrics=eval_of(base_dir("{model}"), 0, "{bench}")[1],
    log:
        f"{R}/logs/grade_base/{{model}}/{{bench}}.log",
    threads: rule_threads("grade_base", model_of_wildcard)
    resources:
        **rule_resources("grade_base", model_of_wildcard),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS=1; "
        "aggbench score --benchmark {wildcards.bench} --samples {input} --out {output.graded} "
        "--workers {threads} --quiet > {log} 2>&1"
