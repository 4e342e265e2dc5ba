# The report: `aggbench ingest` puts every run's files into MLflow (idempotent: training metrics
# that a live sync already logged are not logged twice; evaluation metrics are added at their
# training step), then `aggbench report` reads MLflow, checks it against the files, and writes the
# peak and last-step tables (Markdown, CSV, LaTeX) and plots under results/tables/.


rule report:
    input:
        experiment=f"{R}/experiment.yaml",
        trained=train_markers(),
        graded=grade_outputs(),
    output:
        report_outputs(),
        directory(report_plots()),
        # update(): the store is ingest's to fill, never Snakemake's to delete (not before the job,
        # not when it fails, which the check in the command below makes sure of); declared so that
        # a deleted store is rebuilt from the run files
        [update(f) for f in [local_store()] if f],
    log:
        f"{R}/logs/report.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/report.times.tsv",
    params:
        out=str(layout.tables_dir(R)),
    threads: rule_threads("report")
    resources:
        **rule_resources("report"),
    # The last line fails the job when the report did not write a declared output (experiment.yaml
    # describing another grid than this config, e.g. evaluation.extra_seeds added while the
    # .snakemake metadata that would rewrite experiment.yaml is missing). It must fail in the
    # command: Snakemake 9.27 drops the store's update() backup once the command exits 0 and then
    # deletes every output, the store included, on a MissingOutputException; a failing command gets
    # the store restored from that backup (tests/workflow/test_missing_files.py).
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS={threads}; "
        "( aggbench ingest --config {input.experiment} && "
        "aggbench report --config {input.experiment} --out {params.out} && "
        "for f in {output:q}; do [ -e \"$f\" ] || {{ echo \"aggbench report did not write $f, which "
        "this workflow declares: {input.experiment} describes another grid than the config; rewrite it with "
        "--forcerun experiment_config\" >&2; exit 1; }}; done ) > {log} 2>&1"
