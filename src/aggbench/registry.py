"""A small named registry, shared by aggregation rules, advantage estimators and aux reducers.

verl's decorator-registry pattern (``@register_policy_loss("name")``) with three additions a user
adding their own entry needs: duplicate-name protection, errors that list the valid names with a
"did you mean" suggestion, and plugin loading by dotted module path, so a user's own module can
register entries without editing this package.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Generic, TypeVar

from aggbench.errors import InputError

T = TypeVar("T")


class RegistryError(InputError, ValueError):
    """A bad registry lookup or registration; the message names the valid choices."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest choice, or ``""`` when none is close."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""


class Registry(Generic[T]):
    """Maps names to entries of one kind (``kind`` is used in error messages)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, T] = {}

    def add(self, name: str, entry: T, *, same: Callable[[T, T], bool] | None = None) -> None:
        """Register ``entry`` under ``name``.

        Registering a different entry under a taken name is an error; re-registering the same one
        (``same(old, new)``, e.g. a plugin module imported twice) is a no-op.
        """
        if not isinstance(name, str) or not name or not name.replace("_", "a").replace("-", "a").isalnum():
            raise RegistryError(
                f"invalid {self.kind} name {name!r}: use letters, digits, '_' or '-' "
                "(names become parts of cell ids and file names)"
            )
        if name in self._entries:
            old = self._entries[name]
            if same is not None and same(old, entry):
                self._entries[name] = entry
                return
            raise RegistryError(
                f"{self.kind} {name!r} is already registered (by {_origin(old)}); "
                f"choose another name for {_origin(entry)}"
            )
        self._entries[name] = entry

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            valid = ", ".join(sorted(self._entries)) or "(none)"
            raise RegistryError(
                f"unknown {self.kind} {name!r}.{did_you_mean(name, self._entries)} Valid names: {valid}"
            ) from None

    def names(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def remove(self, name: str) -> None:
        """Unregister ``name`` (tests use this to clean up a temporary registration)."""
        self._entries.pop(name, None)


def _origin(entry: object) -> str:
    fn = getattr(entry, "fn", entry)
    module = getattr(fn, "__module__", "?")
    qualname = getattr(fn, "__qualname__", repr(fn))
    return f"{module}.{qualname}"


PLUGINS_ENV = "AGGBENCH_PLUGINS"


def env_plugins() -> list[str]:
    """The plugin modules ``$AGGBENCH_PLUGINS`` names (comma-separated; blanks dropped). The
    workflow sets it in every job, empty without plugins; ``aggbench`` commands and the verl
    adapter import these before anything looks up a registry."""
    return [p.strip() for p in os.environ.get(PLUGINS_ENV, "").split(",") if p.strip()]


def load_plugins(modules: Iterable[str], *, search_paths: Iterable[str | Path] = ()) -> list[str]:
    """Import user modules that register entries, by dotted path or by ``.py`` file path.

    ``search_paths`` are added to ``sys.path`` first (a SLURM job's working directory is not on
    it, so the workflow passes the repository root). Returns the imported module names.
    """
    for p in search_paths:
        p = str(Path(p).resolve())
        if p not in sys.path:
            sys.path.insert(0, p)
    loaded = []
    for spec in modules:
        if spec.endswith(".py"):
            path = Path(spec)
            if not path.is_file():
                raise RegistryError(
                    f"plugin file {spec!r} does not exist (a relative .py path is read from the working "
                    f"directory, {Path.cwd()}: give it from there or as an absolute path, or name the module "
                    f"({path.stem}), which the workflow also finds beside the config that names it)"
                )
            name = f"aggbench_plugin_{path.stem}"
            module_spec = importlib.util.spec_from_file_location(name, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[name] = module
            try:
                module_spec.loader.exec_module(module)
            except Exception as exc:
                sys.modules.pop(name, None)
                raise _import_failed(spec, exc) from exc
            loaded.append(name)
            continue
        try:
            importlib.import_module(spec)
        except ModuleNotFoundError as exc:
            if exc.name and spec.startswith(exc.name):
                raise RegistryError(
                    f"plugin module {spec!r} was not found on sys.path ({exc}); "
                    "give a dotted module path importable from the working directory, a path to a .py "
                    "file, or add its folder to PYTHONPATH"
                ) from exc
            raise _import_failed(spec, exc) from exc
        except Exception as exc:
            raise _import_failed(spec, exc) from exc
        loaded.append(spec)
    return loaded


def _import_failed(spec: str, exc: Exception) -> RegistryError:
    """``plugin X failed to import: ModuleNotFoundError: No module named 'y' (x.py:1)``: the error
    and where it happened (the innermost frame outside importlib), without the traceback. A
    RegistryError the plugin itself raised (a taken rule name) keeps its own message."""
    if isinstance(exc, RegistryError):
        return RegistryError(f"plugin {spec}: {exc}")
    where = ""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{_short(exc.filename)}:{exc.lineno}"
        detail = f"{exc.msg}"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
        if frames:
            where = f"{_short(frames[-1].filename)}:{frames[-1].lineno}"
        detail = str(exc)
    return RegistryError(
        f"plugin {spec} failed to import: {type(exc).__name__}: {detail}" + (f" ({where})" if where else "")
    )


def _short(filename: str) -> str:
    """``filename`` relative to the working directory when under it, else as it is."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return filename
