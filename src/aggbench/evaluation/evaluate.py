"""``aggbench evaluate``: generate + score every benchmark of one checkpoint, then log the metrics
to the cell's MLflow run at the checkpoint's training step (one model load for all benchmarks)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aggbench import environment
from aggbench.evaluation.generate import generate_benchmarks
from aggbench.evaluation.mlflow import log_eval_metrics
from aggbench.evaluation.options import GenerateOptions
from aggbench.evaluation.score import EvaluationError, score_benchmark, write_json
from aggbench.layout import greedy_dir, is_base_dir


def evaluate_checkpoint(
    checkpoint: str | Path,
    benchmarks: Sequence[str],
    out_dir: str | Path,
    step: int,
    *,
    options: GenerateOptions | None = None,
    samples_dir: str | Path | None = None,
    workers: int | None = None,
    run_dir: str | Path | None = None,
    cell_id: str | None = None,
    tracking_uri: str | None = None,
    experiment: str = "aggbench",
    track: bool = True,
) -> dict[str, Any]:
    """generate + score every benchmark of one checkpoint, then log to MLflow at ``step``.

    Writes ``out_dir/{benchmark}.jsonl``, ``.metrics.json`` and ``out_dir/evaluation.json``
    (samples under ``samples_dir``, default ``out_dir/samples``); with ``options.greedy`` the greedy
    protocol's files under ``out_dir/greedy/`` too, its metrics as each benchmark's ``greedy`` entry
    (``metric_names.eval_metric_values`` logs them as ``greedy@1``). Returns evaluation.json's content.
    """
    options = options or GenerateOptions()
    out_dir = Path(out_dir)
    samples_dir = Path(samples_dir) if samples_dir else out_dir / "samples"
    if track and run_dir is None:
        raise EvaluationError(
            "MLflow logging needs the cell's run directory: give --run-dir (or --no-tracking)"
        )
    generation = generate_benchmarks(checkpoint, benchmarks, samples_dir, options)
    metrics = {}
    for bench in generation["benchmarks"]:
        metrics[bench] = score_benchmark(
            bench,
            samples_dir / f"{bench}.jsonl",
            out_dir / f"{bench}.jsonl",
            workers=workers,
            progress=options.progress,
        )
    for bench in generation.get("greedy", {}).get("benchmarks", {}):  # the greedy n=1 protocol
        metrics[bench]["greedy"] = score_benchmark(
            bench,
            greedy_dir(samples_dir) / f"{bench}.jsonl",
            greedy_dir(out_dir) / f"{bench}.jsonl",
            workers=workers,
            progress=options.progress,
        )
    result: dict[str, Any] = {
        "checkpoint": str(checkpoint),
        "step": int(step),
        "samples_dir": str(samples_dir.resolve()),
        "metrics": metrics,
    }
    if track:
        assert run_dir is not None
        cell = cell_id or Path(run_dir).resolve().name
        result["mlflow"] = {
            "cell_id": cell,
            **log_eval_metrics(
                run_dir,
                cell,
                step,
                metrics,
                tracking_uri=tracking_uri,
                experiment=experiment,
                finish=is_base_dir(run_dir),  # a base model's run: nothing else is logged to it
            ),
        }
    result["environment"] = environment.describe()  # what these numbers were computed on
    write_json(out_dir / "evaluation.json", result)
    return result
