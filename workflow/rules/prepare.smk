# Local rules: they run where Snakemake runs (a login node), because compute nodes are often
# offline. They fetch everything from the hub; every job after them runs with HF_HUB_OFFLINE=1.


localrules:
    prepare_skill_phase,
    prepare_model,
    prepare_data,
    fetch_benchmarks,
    experiment_config,
    cell_config,


rule prepare_skill_phase:
    """The first half of a tiny warm start (worked answers only, no lab knobs), once for the models
    that share it (the lab's four settings); each continues from it in its own job (`--skill-from`).
    """
    output:
        directory(skill_phase_dir("{key}")),
    log:
        f"{R}/logs/prepare_skill_phase/{{key}}.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/prepare_skill_phase/{{key}}.times.tsv",
    params:
        args=lambda wildcards: skill_phase_args(wildcards.key),
    threads: WARM_START_THREADS  # for the scheduler; the job runs on exactly this many (see common.smk)
    shell:
        f"{{ENV}} export OMP_NUM_THREADS={WARM_START_THREADS}; "
        "aggbench prepare-model tiny --skill-phase-only {params.args} --out {output} --quiet > {log} 2>&1"


def prepare_model_inputs(wildcards):
    """The shared skill phase a tiny model continues from, if it shares one."""
    key = skill_phase_of(wildcards.model)
    return {"skill": skill_phase_dir(key)} if key else {}


rule prepare_model:
    """The model directory: the built-in tiny model (warm-started), a hub snapshot, or a copy.

    `aggbench prepare-model` builds it in DIR.tmp-<pid> and renames it, so a killed job leaves no
    directory that looks finished.
    """
    input:
        unpack(prepare_model_inputs),
    output:
        directory(model_dir("{model}")),
    log:
        f"{R}/logs/prepare_model/{{model}}.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/prepare_model/{{model}}.times.tsv",
    params:
        args=lambda wildcards: prepare_model_args(wildcards.model),
    threads: WARM_START_THREADS  # the tiny model's warm start (see common.smk); a hub download ignores it
    shell:
        f"{{ENV}} export OMP_NUM_THREADS={WARM_START_THREADS}; "
        "aggbench prepare-model {params.args} --out {output} --quiet > {log} 2>&1"


rule prepare_data:
    """A training dataset as canonical JSONL ($AGGBENCH_DATA_DIR overrides the hub)."""
    output:
        data_file("{dataset}"),
    log:
        f"{R}/logs/prepare_data/{{dataset}}.log",
    params:
        spec=lambda wildcards: config["datasets"][wildcards.dataset]["spec"],
        limit=lambda wildcards: (
            f"--limit {config['datasets'][wildcards.dataset]['limit']}"
            if config["datasets"][wildcards.dataset].get("limit")
            else ""
        ),
    shell:
        "{ENV} aggbench prepare-data {params.spec:q} --out {output} {params.limit} > {log} 2>&1"


rule fetch_benchmarks:
    """Every benchmark of the grid at its pinned revision, with each file's sha256 in lock.json.

    The generate jobs read only this copy (`aggbench generate --fetched`), checked against the lock;
    a later run checks the files instead of fetching them again (`aggbench data fetch`).
    """
    output:
        # update(): Snakemake deletes a job's outputs before running it again (a benchmark added
        # changes params), and a rerun without the lock would fetch and lock anew whatever it read;
        # kept, the rerun checks each fetched file against it (tests/workflow/test_fetch_rule.py)
        update(benchmark_lock()),
    log:
        f"{R}/logs/fetch_benchmarks.log",
    params:
        benchmarks=",".join(BENCHMARKS),
        out=benchmark_data(),
        # the offline LiveCodeBench copy has public tests only: refused unless the config allows it
        public=(
            "--allow-public-tests-only"
            if EVAL.get("allow_public_tests_only")
            else "--refuse-public-tests-only"
        ),
    shell:
        "{ENV} aggbench data fetch --benchmarks {params.benchmarks} --out {params.out:q} {params.public} > {log} 2>&1"


rule experiment_config:
    """The effective experiment (config file + --config overrides + schema defaults) as a file.

    `aggbench ingest` and `aggbench report` read it, so they see exactly the grid that ran. It is
    rewritten when the config changes (the params), which re-runs only the report.
    """
    output:
        f"{R}/experiment.yaml",
    log:
        f"{R}/logs/experiment_config.log",
    params:
        experiment=experiment_json(),
    run:
        write_text_atomic(output[0], yaml.safe_dump(json.loads(params.experiment), sort_keys=False))
        Path(log[0]).write_text(f"wrote {output[0]}\n")


rule cell_config:
    """One cell's resolved training config, the input of `aggbench train`.

    Written in-process from the validated config (which includes --config overrides such as
    results_dir); equivalent to `aggbench grid cell --config ... --cell ... --out ...`. Rewritten
    only when this cell's own config changes (params.signature), so adding cells leaves the others
    alone.
    """
    output:
        cell_config("{cell}"),
    log:
        f"{R}/logs/cell_config/{{cell}}.log",
    params:
        signature=lambda wildcards: cell_signature(wildcards.cell),
    run:
        cfg = grid.cell_train_config(config, wildcards.cell)
        write_text_atomic(output[0], yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        Path(log[0]).write_text(f"{wildcards.cell}: config {params.signature} -> {output[0]}\n")
