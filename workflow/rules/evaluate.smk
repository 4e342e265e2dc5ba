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
        f"{R}/runs/{{cell}}/segments/step_{{step}}.done",
    output:
        _samples(f"{R}/runs/{{cell}}/samples/step_{{step}}"),
    log:
        f"{R}/logs/generate/{{cell}}/step_{{step}}.log",
    params:
        checkpoint=lambda wildcards: f"{run_dir(wildcards.cell)}/checkpoints/step_{wildcards.step}",
        out=lambda wildcards: f"{run_dir(wildcards.cell)}/samples/step_{wildcards.step}",
        benchmarks=",".join(BENCHMARKS),
        options=lambda wildcards: generate_args(model_of_cell(wildcards)),
    threads: rule_threads("generate", model_of_cell)
    resources:
        **rule_resources("generate", model_of_cell),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS={threads}; "
        "aggbench generate --checkpoint {params.checkpoint} --benchmarks {params.benchmarks} "
        "--out {params.out} {params.options} --quiet > {log} 2>&1"


rule generate_base:
    input:
        f"{R}/models/{{model}}",
    output:
        _samples(f"{R}/base/{{model}}/samples/step_0"),
    log:
        f"{R}/logs/generate_base/{{model}}.log",
    params:
        out=lambda wildcards: f"{R}/base/{wildcards.model}/samples/step_0",
        benchmarks=",".join(BENCHMARKS),
        options=lambda wildcards: generate_args(wildcards.model),
    threads: rule_threads("generate_base", model_of_wildcard)
    resources:
        **rule_resources("generate_base", model_of_wildcard),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS={threads}; "
        "aggbench generate --checkpoint {input} --benchmarks {params.benchmarks} "
        "--out {params.out} {params.options} --quiet > {log} 2>&1"


rule grade:
    input:
        f"{R}/runs/{{cell}}/samples/step_{{step}}/{{bench}}.jsonl",
    output:
        graded=f"{R}/runs/{{cell}}/eval/step_{{step}}/{{bench}}.jsonl",
        metrics=f"{R}/runs/{{cell}}/eval/step_{{step}}/{{bench}}.metrics.json",
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
        f"{R}/base/{{model}}/samples/step_0/{{bench}}.jsonl",
    output:
        graded=f"{R}/base/{{model}}/eval/step_0/{{bench}}.jsonl",
        metrics=f"{R}/base/{{model}}/eval/step_0/{{bench}}.metrics.json",
    log:
        f"{R}/logs/grade_base/{{model}}/{{bench}}.log",
    threads: rule_threads("grade_base", model_of_wildcard)
    resources:
        **rule_resources("grade_base", model_of_wildcard),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS=1; "
        "aggbench score --benchmark {wildcards.bench} --samples {input} --out {output.graded} "
        "--workers {threads} --quiet > {log} 2>&1"
