"""Grading model responses: math answers (:mod:`.math`), code (:mod:`.code`), worker pool (:mod:`.pool`).

Kept import-free: :mod:`.math` imports math-verify and sympy (about a second), so import it where
it is used.
"""
