"""Errors that name what went wrong, where, and what was expected."""
from __future__ import annotations

from pathlib import Path


class OrchestratorError(Exception):
    """Base class: a failure the user can act on (jobs print it and exit non-zero)."""


class ConfigError(OrchestratorError):
    """A configuration value or key is invalid."""


class InputError(OrchestratorError):
    """Bad input data: names the file, the line (1-based, when known) and what was expected."""

    def __init__(self, path: str | Path, message: str, line: int | None = None, expected: str | None = None):
        self.path = str(path)
        self.message = message
        self.line = line
        self.expected = expected
        where = self.path if line is None else f"{self.path}:{line}"
        text = f"{where}: {message}"
        if expected:
            text += f" (expected {expected})"
        super().__init__(text)

    def __reduce__(self):
        # Rebuild from the constructor's arguments so the error survives a Ray task boundary.
        return (type(self), (self.path, self.message, self.line, self.expected))
