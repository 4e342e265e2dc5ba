"""Helpers shared by the test modules (tests/ is on sys.path, so `from helpers.support import ...`)."""
