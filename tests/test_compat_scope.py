"""The modules behind tests/grading, tests/report and tests/data import without transformers.

`make test-compat` (the unit tests once more with the older transformers the `gpu` extra needs)
leaves those three suites out because they never touch transformers. This keeps that true: every
module they exercise is imported in a fresh interpreter where `import transformers` fails.
"""

from __future__ import annotations

from pathlib import Path

from helpers.support import import_without

SRC = Path(__file__).resolve().parents[1] / "src" / "aggbench"
MODULES = sorted(
    {f"aggbench.grading.{p.stem}" for p in (SRC / "grading").glob("*.py") if p.stem != "__init__"}
    | {f"aggbench.data.{p.stem}" for p in (SRC / "data").glob("*.py") if p.stem != "__init__"}
    | {f"aggbench.report.{p.stem}" for p in (SRC / "report").glob("*.py") if p.stem != "__init__"}
    | {
        "aggbench.cli.grade",
        "aggbench.cli.report",
        "aggbench.evaluation.metrics",
        "aggbench.tracking",
        "aggbench.evaluation.score",
    }
)


def test_compat_skipped_suites_import_without_transformers(tmp_path):
    proc = import_without(tmp_path, "transformers", MODULES)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout.strip()) == len(MODULES) >= 20, proc.stdout
