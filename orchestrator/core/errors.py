"""Errors that name what went wrong, where, and what was expected."""
from __future__ import annotations

import contextlib
import errno
import signal
import socket
import sys
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
    except SystemExit as exc:
        # Ray Train's handler ends a Ctrl-C'd ``fit`` with sys.exit(0) (1 in practice): to a caller from Python that
        # is an interrupt, which its ``except KeyboardInterrupt`` sees (it ended ``python -i``: probe L6). Ray's
        # SIGTERM handler exits with 15: a termination, left as it is
        if exc.code == 15 or sigterm_seen():
            raise
        raise KeyboardInterrupt from exc
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


def _carried(exc: BaseException, context: bool = False) -> list[BaseException]:
    """The exceptions a wrapper carries: Ray's ``RayTaskError.cause`` (the remote original), Ray Train's
    ``worker_failures`` and ``controller_failure``, else ``__cause__`` (and ``__context__`` with ``context``)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return [cause]
    found = [e for e in (getattr(exc, "worker_failures", None) or {}).values() if isinstance(e, BaseException)]
    found += [e for e in (getattr(exc, "controller_failure", None), exc.__cause__) if isinstance(e, BaseException)]
    if context and isinstance(exc.__context__, BaseException):
        found.append(exc.__context__)
    return found


def walk_exceptions(exc: BaseException, context: bool = False) -> Iterator[BaseException]:
    """``exc`` and what it carries, outermost first, each once."""
    seen, todo = set(), [exc]
    while todo:
        cur = todo.pop(0)
        if id(cur) not in seen:
            seen.add(id(cur))
            yield cur
            todo.extend(_carried(cur, context))


def raised_by_user_input(exc: BaseException) -> OrchestratorError | None:
    """The ``OrchestratorError`` (bad input or config) behind ``exc``, or None for a bug. A Ray task or
    actor that raised one reaches the driver wrapped (``RayTaskError``, whose text is the remote
    traceback: the original is its ``cause``), a Ray Train worker's in the run's ``worker_failures``,
    possibly under further wrappers."""
    for cur in walk_exceptions(exc):
        if isinstance(cur, OrchestratorError) and not isinstance(getattr(cur, "cause", None), BaseException):
            return cur  # the original: a wrapper that is also an instance of it has a cause
    return None


#: What the machine lacks, by errno: a user frees or raises it, it is not a bug of the job.
ENVIRONMENT_ERRNOS = {errno.ENOSPC: "no space left on the disk", errno.EDQUOT: "the disk quota is used up",
                      errno.EFBIG: "a file is larger than this shell allows (ulimit -f)",
                      errno.EROFS: "the file system is read-only", errno.EACCES: "permission denied",
                      errno.EPERM: "operation not permitted", errno.EMFILE: "too many open files (ulimit -n)",
                      errno.ENFILE: "too many open files on this machine",
                      errno.ENOTDIR: "not a directory (a part of the path is a file; HOME or TMPDIR?)"}
#: The same in the words of libraries that raise without an errno (Arrow, tokenizers' Rust, torch's C++).
_ENVIRONMENT_TEXTS = {"No space left on device": errno.ENOSPC, "Disk quota exceeded": errno.EDQUOT,
                      "File too large": errno.EFBIG, "Read-only file system": errno.EROFS,
                      "Too many open files": errno.EMFILE}


#: A Ray cluster lost mid-job (its head node stopped, the network cut), in the words of Ray's errors
_CLUSTER_LOST_TEXTS = ("GCS may have been killed", "Failed to connect to GCS")
CLUSTER_LOST = "the Ray cluster stopped answering (did its head node stop, or the network between them?)"


def gcs_unreachable() -> str | None:
    """The address of the Ray cluster this process is attached to when it no longer answers there, else None
    (no Ray, or it answers). Ray is looked up, not imported: a job without Ray has no cluster to lose."""
    ray = sys.modules.get("ray")
    try:
        address = ray.get_runtime_context().gcs_address if ray is not None and ray.is_initialized() else ""
    except Exception:  # noqa: BLE001 - Ray's own state: nothing to say about the cluster
        address = ""
    host, _, port = address.rpartition(":")
    if not port.isdigit():
        return None
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
    except OSError:
        return address
    return None


def raised_by_environment(exc: BaseException) -> tuple[int, str] | None:
    """(errno, what the machine lacks with the file it names) behind ``exc`` (``ENVIRONMENT_ERRNOS``), or
    None; found through the same wrappers as ``raised_by_user_input``, and the exceptions being handled when
    each was raised (a full disk's second failure, writing the log, hides its first)."""
    for cur in walk_exceptions(exc, context=True):
        code = cur.errno if isinstance(cur, OSError) else None
        first = str(cur).strip().splitlines()[0] if str(cur).strip() else ""
        if any(text in first for text in _CLUSTER_LOST_TEXTS):
            return errno.ECONNRESET, f"{CLUSTER_LOST}: {first[:300]}"
        if code == errno.ECONNRESET and CLUSTER_LOST in (cur.strerror or ""):  # worker_failure's
            return code, cur.strerror
        if code not in ENVIRONMENT_ERRNOS:
            code = next((c for text, c in _ENVIRONMENT_TEXTS.items() if text in first), None)
        if code is not None:
            where = getattr(cur, "filename", None)
            return code, f"{ENVIRONMENT_ERRNOS[code]}: " + (f"{where}" if where else first[:300])
    return None


def worker_failure(exc: BaseException, what: str) -> BaseException:
    """What a job raises for ``exc``, a failure of its Ray work: a worker's own ``OrchestratorError`` (one line),
    ``exc`` itself when what the machine lacks is behind it (the job names it), else ``"<what> failed: <exc>"``."""
    said = raised_by_user_input(exc)
    if said is not None:
        return said
    if raised_by_environment(exc) is not None:
        return exc
    if (lost := gcs_unreachable()) is not None:  # an actor's RpcError, not bad input (it was exit 2)
        return ConnectionResetError(errno.ECONNRESET, f"{CLUSTER_LOST} at {lost}; {what} stopped")
    return OrchestratorError(f"{what} failed: {exc}")

