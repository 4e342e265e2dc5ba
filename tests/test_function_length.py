"""No function in src/aggbench is over 80 lines unless docs/architecture.md names it, with the reason.

A function's length is ``end_lineno - lineno + 1`` of its ``def`` (decorators excluded; a nested
function counts inside its parent and on its own). The exceptions are the list items of the
architecture page's "Functions over 80 lines" section, one per line::

    - `grading.pool.GradingPool.map` (102 lines): why it stays whole

named ``module.qualname`` with the module relative to ``aggbench`` (an ``aggbench.`` prefix is
allowed). A listed function that is no longer over the limit, or no longer exists, fails too, so
the list stays true to the code.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "aggbench"
DOC = ROOT / "docs" / "architecture.md"
LIMIT = 80
SECTION = "## Functions over 80 lines"
# what holds statements (if/for/while/with/try bodies, except clauses, match cases)
STATEMENT_LISTS = (ast.stmt, ast.excepthandler, ast.match_case)
ENTRY = re.compile(r"^- `(?:aggbench\.)?([\w.]+)` \((\d+) lines\)")


def function_lengths(package: Path) -> dict[str, int]:
    """``module.qualname`` -> lines, for every function and method under ``package``."""
    out: dict[str, int] = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        stack: list[tuple[ast.AST, str]] = [(tree, module)]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    name = f"{prefix}.{child.name}" if prefix else child.name
                    if not isinstance(child, ast.ClassDef):
                        # the longest of same-named defs (a property's getter and setter, an if/else pair)
                        out[name] = max(out.get(name, 0), child.end_lineno - child.lineno + 1)
                    stack.append((child, name))
                elif isinstance(child, STATEMENT_LISTS):  # a def is a statement: skip expressions
                    stack.append((child, prefix))
    return out


def listed(doc: str) -> dict[str, int]:
    """The section's entries: ``module.qualname`` -> the length it states."""
    start = doc.find(f"\n{SECTION}\n")
    assert start >= 0, f"docs/architecture.md has no {SECTION!r} section"
    end = doc.find("\n## ", start + 1)
    section = doc[start : end if end >= 0 else len(doc)]
    return {m[1]: int(m[2]) for m in map(ENTRY.match, section.splitlines()) if m}


def violations(package: Path, doc: str, limit: int = LIMIT) -> tuple[dict[str, int], list[str]]:
    """(functions over ``limit`` that the section does not name, names it lists that are not over)."""
    lengths, named = function_lengths(package), listed(doc)
    unnamed = {f: n for f, n in sorted(lengths.items()) if n > limit and f not in named}
    stale = sorted(f for f in named if lengths.get(f, 0) <= limit)
    return unnamed, stale


def test_no_function_over_80_lines_is_left_unnamed():
    unnamed, stale = violations(PACKAGE, DOC.read_text(encoding="utf-8"))
    assert not unnamed, (
        f"functions over {LIMIT} lines: {unnamed}; split them into named parts, or name each in "
        f"docs/architecture.md's {SECTION!r} section as - `module.function` (N lines): why it stays whole"
    )
    assert not stale, (
        f"docs/architecture.md lists functions that are not over {LIMIT} lines (remove them): {stale}"
    )


def _function(name: str, body_lines: int, indent: str = "", decorated: bool = False) -> str:
    """Source of a function whose def spans 2 + body_lines lines (a decorator line not counted)."""
    lines = ["@staticmethod"] if decorated else []
    lines += [f"def {name}():", '    """doc"""', *(f"    x{i} = {i}" for i in range(body_lines))]
    return "".join(f"{indent}{line}\n" for line in lines)


def test_a_planted_long_function_is_reported(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text(_function("fits", LIMIT - 2))  # exactly 80 lines
    (package / "sub" / "mod.py").write_text(
        _function("long", LIMIT - 1)  # 81 lines
        + "\n\nclass C:\n"
        + _function("method", LIMIT - 1, indent="    ", decorated=True)
        + "\n\ntry:\n    import nothing_here\nexcept ImportError:\n"
        + _function("fallback", LIMIT - 1, indent="    ")  # a def inside an except clause
    )
    assert function_lengths(package) == {
        "fits": 80,
        "sub.mod.long": 81,
        "sub.mod.C.method": 81,
        "sub.mod.fallback": 81,
    }
    empty = f"# Page\n\n{SECTION}\n\nNone.\n\n## Next\n\n- `sub.mod.long` (81 lines): not in the section\n"
    unnamed = {"sub.mod.C.method": 81, "sub.mod.fallback": 81, "sub.mod.long": 81}
    assert violations(package, empty) == (unnamed, [])
    named = (
        f"# Page\n\n{SECTION}\n\n- `sub.mod.long` (81 lines): reason\n"
        "- `aggbench.sub.mod.C.method` (81 lines): reason\n- `sub.mod.fallback` (81 lines): reason\n"
        "- `fits` (80 lines): no longer over\n- `sub.mod.gone` (90 lines): removed\n"
    )
    assert violations(package, named) == ({}, ["fits", "sub.mod.gone"])
    with pytest.raises(AssertionError, match="no '## Functions over 80 lines' section"):
        violations(package, "# Page\n")
