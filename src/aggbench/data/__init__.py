"""Declarative data: evaluation benchmarks (configs/benchmarks) and RL training sets (configs/datasets).

Both are YAML specs with a pinned hub id and revision and an offline override
(``$AGGBENCH_DATA_DIR/<offline_file>``); loaders return canonical ``{"id", "prompt", ...}`` records.
``datasets`` is imported only when the hub is actually used.
"""

from aggbench.data.benchmarks import (
    BenchmarkRecords,
    BenchmarkSpec,
    list_benchmarks,
    load_benchmark,
    load_benchmark_spec,
)
from aggbench.data.jsonl import DataError, iter_jsonl, write_jsonl
from aggbench.data.sources import DataUnavailableError, SpecError
from aggbench.data.training import (
    TrainingDatasetSpec,
    list_training_datasets,
    load_training_dataset,
    load_training_spec,
)

__all__ = [
    "BenchmarkRecords",
    "BenchmarkSpec",
    "DataError",
    "DataUnavailableError",
    "SpecError",
    "TrainingDatasetSpec",
    "iter_jsonl",
    "list_benchmarks",
    "list_training_datasets",
    "load_benchmark",
    "load_benchmark_spec",
    "load_training_dataset",
    "load_training_spec",
    "write_jsonl",
]
