# Training, one job per (cell, checkpoint step): each trains from the previous checkpoint to this
# one, so a SLURM walltime bounds a segment, and evaluation of early checkpoints starts while
# training goes on.
#
# The declared output is a marker touched after `aggbench train` succeeds, NOT the checkpoint
# directory: the trainer's retention policy edits older checkpoints (drops their optimizer state,
# or their weights when they are not evaluated), which Snakemake would read as changed outputs, and
# Snakemake deletes the declared outputs of a failed job, which must never be a checkpoint. The
# trainer itself resumes from the latest complete checkpoint, writes checkpoints atomically, and
# holds a lock on the run directory.
#
# A retrain stays segment by segment. When a finished segment's marker and checkpoint are deleted
# (a corrupt checkpoint, say), the trainer restarts from the latest checkpoint that still holds
# trainer state, often step 0 (retention keeps it in the latest one only). The segments after that
# step describe the attempt the restart discards, so they are trained again, one job each: rule
# restart writes segments/restart_K_from_step_S.stamp (the K-th retrain), and every segment after S
# takes the stamp as input, which Snakemake's own mtime rule then reruns in order. A stamp stays an
# input of those segments afterwards, so nothing reruns twice (the set of input files does not
# change); a later retrain from the same step is stamp K + 1, newer than their markers.


def train_inputs(wildcards):
    """The previous segment's marker, or (first segment) the model and the data; and the stamps of
    the retrains from a step before this segment's end (recorded, or about to start)."""
    model = model_of_cell(wildcards)
    steps = CHECKPOINT_STEPS[model]
    step = int(wildcards.step)
    if step not in steps:
        raise ValueError(
            f"step {step} is not a checkpoint step of cell {wildcards.cell} (checkpoint steps: {steps})"
        )
    i = steps.index(step)
    if i > 0:
        out = {"previous": segment_marker(wildcards.cell, steps[i - 1])}
    else:
        out = {"model": model_dir(model), "data": data_file(CELLS[wildcards.cell].dataset)}
    restarts = [(k, s) for k, s in restarts_of(wildcards.cell) if s < step]
    if restarts:
        out["restarts"] = [restart_stamp(wildcards.cell, k, s) for k, s in restarts]
    return out


@functools.cache
def restarts_of(cell):
    """(k, step) of this cell's retrains: the recorded ones and, when one is due now, the next
    (aggbench.layout.restart_step). Computed once per Snakemake invocation."""
    run = layout.run_dir(R, cell)
    done = layout.restart_stamps(run)
    due = layout.restart_step(run, CHECKPOINT_STEPS[CELLS[cell].model])
    return done + ([(len(done) + 1, due)] if due is not None else [])


def train_launcher(wildcards, threads):
    """`aggbench`, or torchrun with one process per GPU when the cell's train job asks for more than
    one (one node; the trainer shards the model with FSDP2, see aggbench.train.parallel), the job's
    threads split between the processes."""
    gpus = int(_resource_value("train", model_of_cell(wildcards), "gpus") or 0)
    if gpus <= 1:
        return "aggbench"
    return (
        f"OMP_NUM_THREADS={max(1, int(threads) // gpus)} "
        f"torchrun --standalone --nproc_per_node {gpus} -m aggbench.cli"
    )


localrules:
    restart,


rule restart:
    """Record a retrain from checkpoint step S: every later segment takes this stamp as input."""
    output:
        restart_stamp("{cell}", "{k}", "{step}"),
    log:
        f"{R}/logs/restart/{{cell}}/restart_{{k}}_from_step_{{step}}.log",
    run:
        why = (
            f"{wildcards.cell}: retrain {wildcards.k}, from step {wildcards.step}; the finished segments after it are "
            "trained again, one job each (their checkpoints belonged to the attempt this discards)\n"
        )
        write_text_atomic(output[0], why)
        Path(log[0]).write_text(why)


rule train:
    input:
        unpack(train_inputs),
        # ancient: a rewritten cell.yaml (e.g. a new tracking server) applies to the segments still
        # to run; it does not invalidate the trained ones (the trainer would not retrain them).
        cell=ancient(cell_config("{cell}")),
    output:
        touch(segment_marker("{cell}", "{step}")),
    log:
        f"{R}/logs/train/{{cell}}/step_{{step}}.log",
    benchmark:  # the job's wall time, CPU time and peak memory (benchmarks/cell_time.py)
        f"{R}/logs/train/{{cell}}/step_{{step}}.times.tsv",
    params:
        run_dir=lambda wildcards: run_dir(wildcards.cell),
        launch=train_launcher,
    threads: rule_threads("train", model_of_cell)
    resources:
        **rule_resources("train", model_of_cell),
    shell:
        # appended: a retry (a walltime stop, a node failure) keeps the earlier attempts' logs
        "{JOB_ENV} export OMP_NUM_THREADS={threads}; "
        'echo "== $(date -Is) attempt: train {wildcards.cell} to step {wildcards.step}" >> {log}; '
        "{params.launch} train --config {input.cell} --out {params.run_dir} --until-step {wildcards.step} "
        "--quiet >> {log} 2>&1"
