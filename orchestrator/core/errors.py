"""Errors that name what went wrong, where, and what was expected."""
from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
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


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or ``kill``'s stop), raised in the main thread as a Ctrl-C is: ``with`` blocks
    and ``finally`` clauses run (a scoring's temporary copy of its source is removed, locks and MLflow runs
    are closed), and the job says so and exits 143 (``orchestrator.core.cli.run_job``)."""


def raise_on_sigterm() -> None:
    """Make SIGTERM raise ``Terminated`` in this process's main thread (elsewhere, a no-op: only the main
    thread may set a handler). Python's default ends the process without a word or a clean-up, and
    ``ray.init`` replaces it with ``sys.exit(15)``: call this again after Ray starts."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminated)


@contextlib.contextmanager
def keep_sigint_handler() -> Iterator[None]:
    """This process's SIGINT handler back after the block (in the main thread). Ray Train's ``fit`` installs its
    own, which asks the run's controller to abort, and leaves it: a Ctrl-C in the sweep after pretraining went
    to a finished run's controller and was lost, and the job ran on."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


_SIGTERM_SEEN = []


def sigterm_seen() -> bool:
    """Whether this process got a SIGTERM: a library that catches the ``Terminated`` and raises its own
    ``KeyboardInterrupt`` (Ray Tune does) still ends the job as terminated."""
    return bool(_SIGTERM_SEEN)


def _terminated(signum, frame) -> None:
    _SIGTERM_SEEN.append(signum)
    raise Terminated()
