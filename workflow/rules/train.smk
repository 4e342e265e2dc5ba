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


def train_inputs(wildcards):
    """The previous segment's marker, or (first segment) the model and the data."""
    model = model_of_cell(wildcards)
    steps = CHECKPOINT_STEPS[model]
    step = int(wildcards.step)
    if step not in steps:
        raise ValueError(
            f"step {step} is not a checkpoint step of cell {wildcards.cell} (checkpoint steps: {steps})"
        )
    i = steps.index(step)
    if i > 0:
        return {"previous": segment_marker(wildcards.cell, steps[i - 1])}
    return {"model": model_dir(model), "data": data_file(CELLS[wildcards.cell].dataset)}


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
    params:
        run_dir=lambda wildcards: run_dir(wildcards.cell),
        launch=train_launcher,
    threads: rule_threads("train", model_of_cell)
    resources:
        **rule_resources("train", model_of_cell),
    shell:
        "{JOB_ENV} export OMP_NUM_THREADS={threads}; "
        "{params.launch} train --config {input.cell} --out {params.run_dir} --until-step {wildcards.step} "
        "--quiet > {log} 2>&1"
