"""One builder per stage output across processes: a lock file beside the output.

``orchestrator.core.reuse.output_lock(out_dir)`` holds ``<parent>/.<name>.lock`` while the output
is built or checked for reuse: an exclusive ``flock`` on that file, which names its holder (pid,
host, start time, command). A second job on the same directory waits, saying for whom, then finds
the output finished and reuses it. It waits at most ``ORCH_LOCK_WAIT_S`` seconds (default
``DEFAULT_WAIT_S``; 0 refuses at once), then stops with ``OutputBusy`` naming the holder (the jobs
exit 2): a long pretraining is not waited for for hours by a copy started by mistake.

A lock whose holder is gone never blocks: the kernel releases a ``flock`` when its process dies
(kill -9 included), and the next job takes the file over, saying whose it was (and that the holder
is gone, when it ran on this host). ``flock`` also holds on NFS v4 across hosts. On a filesystem
that has no locks the output is built unlocked, with a warning, as before.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.errors import OrchestratorError

log = logging.getLogger(__name__)

WAIT_ENV = "ORCH_LOCK_WAIT_S"
DEFAULT_WAIT_S = 1800.0
POLL_S = 0.5
REMIND_S = 60.0


class OutputBusy(OrchestratorError):
    """Another job holds a stage output's lock for longer than this job waits."""


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (of any user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


#: The longest name part of a hidden sibling (``.<name>.lock``, ``.<name>.tmp-<host>-<pid>-<id>``) in bytes: a
#: folder may be named with 255 bytes, and its sibling's suffix would pass the file system's limit
SIBLING_STEM_BYTES = 150


def sibling_stem(name: str) -> str:
    """``name``, or when longer than ``SIBLING_STEM_BYTES`` its start and a hash of it (the same every time)."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= SIBLING_STEM_BYTES:
        return name
    start = raw[:SIBLING_STEM_BYTES - 13].decode("utf-8", "ignore")  # a character cut in two is dropped
    return f"{start}~{hashlib.sha256(raw).hexdigest()[:12]}"


def hidden_sibling(path: str | Path, suffix: str) -> Path:
    """``.<name><suffix>`` beside ``path`` (its lock, its temporary copies), within the file system's name limit
    whatever ``path``'s own name (an output named with 250 bytes failed with "File name too long")."""
    path = Path(path)
    return path.parent / f".{sibling_stem(path.name)}{suffix}"


def lock_path(out_dir: str | Path) -> Path:
    return hidden_sibling(out_dir, ".lock")


def wait_limit() -> float:
    text = os.environ.get(WAIT_ENV, "")
    try:
        return DEFAULT_WAIT_S if not text else max(0.0, float(text))
    except ValueError:
        raise OrchestratorError(f"{WAIT_ENV}={text!r}: expected a number of seconds") from None


def _holder(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _describe(holder: dict) -> str:
    if not holder.get("pid"):
        return "another job"
    return (f"pid {holder['pid']} on {holder.get('host', '?')} (since {holder.get('since', '?')}: "
            f"{holder.get('command', '')[:120]})")


def _acquire(out_dir: Path, wait_s: float) -> int | None:
    """The locked file's descriptor, once this process holds it; None where locks are unsupported."""
    path = lock_path(out_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = told = time.monotonic()
    waiting = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder, now = _holder(path), time.monotonic()
            if now - start >= wait_s:
                raise OutputBusy(f"{out_dir} is being built by {_describe(holder)}; waited {now - start:.0f} s "
                                 f"({WAIT_ENV}). Run this job again when that one has finished (its output "
                                 f"is then reused), or give this one another output directory") from None
            if not waiting or now - told >= REMIND_S:
                log.warning("%s %s is being built by %s (lock %s); waiting up to %.0f s (%s), then reusing it",
                            "still waiting:" if waiting else "waiting:", out_dir, _describe(holder), path, wait_s,
                            WAIT_ENV)
                waiting, told = True, now
            time.sleep(POLL_S)
            continue
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                log.warning("%s: this filesystem has no file locks (%s); building %s unlocked", path, exc, out_dir)
                return None
            raise
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:  # the holder we waited for removed the file as it let go: lock the new one
            os.close(fd)
            continue
        _take(fd, path, out_dir)
        return fd


def _take(fd: int, path: Path, out_dir: Path) -> None:
    """Write this process into the lock file, saying whose lock a dead job left there."""
    left = _holder(path)
    if left.get("pid"):
        gone = left.get("host") == socket.gethostname() and not pid_alive(int(left["pid"]))
        log.info("%s: taking over the lock left by %s%s", out_dir, _describe(left),
                 ", which is gone" if gone else "")
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S"),
              "command": " ".join(sys.argv)}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)


_DEPTH: dict[str, tuple[int | None, int]] = {}  # path -> (descriptor, depth) of the locks this process holds


@contextlib.contextmanager
def hold(out_dir: str | Path) -> Iterator[None]:
    """Hold ``out_dir``'s lock file for the block; re-entrant within the thread that holds it
    (``output_lock`` lets one thread of a process in at a time)."""
    out_dir = Path(out_dir).resolve()
    key = str(out_dir)
    if key in _DEPTH:
        fd, depth = _DEPTH[key]
        _DEPTH[key] = (fd, depth + 1)
    else:
        _DEPTH[key] = (_acquire(out_dir, wait_limit()), 1)
    try:
        yield
    finally:
        fd, depth = _DEPTH.pop(key)
        if depth > 1:
            _DEPTH[key] = (fd, depth - 1)
        elif fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(lock_path(out_dir))  # first, so a waiter that opened this file retries on a new one
            os.close(fd)
