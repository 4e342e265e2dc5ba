"""The base class of every bad-input error; imports nothing, so every part of aggbench may import it.

Under :class:`InputError` belongs what a user can fix: a config, option, file, row, model directory,
device or data source that cannot be used, a run directory another job holds (its lock). The message
names the file, line or key and the fix, in one line where it can. The command line prints such an
error as ``Error: <message>`` with exit status 1 and no traceback (``aggbench.cli.common.click_error``);
anything else is a bug and ends with its traceback. Each subclass keeps its builtin base too
(``ValueError``, ``RuntimeError``), so callers that catch those still do.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad input a user can fix (see the module docstring); subclasses also derive from a builtin
    error (ValueError, RuntimeError)."""
