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


_UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")


def not_utf8(exc: UnicodeDecodeError, *, of: str = "the file") -> str:
    """One phrase for text that is not UTF-8, with the fix: the first bad byte, where it sits in the
    bytes that were decoded (``exc.object``: the whole file for ``Path.read_text``, one line for a
    line-by-line reader; ``of`` names which), and whether they start with a UTF-16 byte-order mark,
    as Windows PowerShell's ``>`` writes. Every reader of a user's text file raises its own error
    class with this phrase, so the four kinds of file say it the same way."""
    raw = bytes(exc.object)
    byte = raw[exc.start : exc.start + 1].hex()
    hint = (
        "; it looks like UTF-16, which Windows PowerShell's `>` writes"
        if raw.startswith(_UTF16_MARKS)
        else ""
    )
    return f"not UTF-8 text (byte 0x{byte} at byte {exc.start + 1} of {of}{hint}); save it as UTF-8"
