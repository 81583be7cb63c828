"""What a run shows on the terminal, and the log file that keeps everything else.

    with run_log(run_dir / "logs" / "job.log"):   # orchestrator.core.runtime.ray_session(log_file=...)
        ... Ray, Tune, the stages ...

Inside ``run_log`` the process's own stdout and stderr (file descriptors 1 and 2: Python, Ray's C++
core, Tune's tables, tensorboardX's notices, and every Ray worker's output that Ray forwards to the
driver) go to the log file. The terminal keeps only: the project's own log records (INFO and up,
from code under this repository; any library's ERROR), the lines a Ray worker marks for it
(``worker_line``: pretraining's phase lines and progress), and ``progress`` lines (on a terminal one
line that updates in place, elsewhere a plain line each time). ``set_verbose(True)`` (a job's
``--verbose``) turns this off: everything goes to the terminal, as Ray prints it.

The CLI (``orchestrator.core.cli``) sets the verbosity; the runtime (``orchestrator.core.runtime``)
opens the log file around a run's Ray session. Nothing else redirects output.
"""
from __future__ import annotations

import collections
import contextlib
import errno
import logging
import os
import stat
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from orchestrator.core.config import redacted
from orchestrator.core.errors import ConfigError

#: A Ray worker's line that the driver shows on the terminal (``worker_line``), and one that updates
#: the progress line. Both stay in the log file as printed.
CONSOLE_TAG, PROGRESS_TAG = "[console] ", "[progress] "
#: Where a run's log file goes, under its run directory.
LOG_PATH = Path("logs") / "job.log"
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2]) + os.sep


class _TerminalFormat(logging.Formatter):
    """``12:03:04 message``; a warning or an error says so (the log file keeps the logger names)."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return f"{self.formatTime(record, '%H:%M:%S')} {level}{text}"


_FORMAT = _TerminalFormat("%(message)s")

_lock = threading.RLock()
_verbose = False
_terminal: TextIO | None = None  # the terminal while a run's output goes to its log file
_open_line = False  # a progress line is on the terminal without its newline (a TTY)
_log_file: TextIO | None = None
#: A job's log line (``run_job``'s logging.basicConfig, and the closing lines copied to its log file)
LOG_LINE, LOG_TIME = "%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"
_trailing: logging.Handler | bool = False  # a job's (run_job's): after a run_log ends, its closing lines too


def redact_log_records() -> None:
    """From now on, every log record of this process whose message holds a URL's user part (a tracking URI's
    password) carries the message with it replaced (``core.config.redacted``): on the terminal, in the log
    file and in any handler a library adds."""
    make = logging.getLogRecordFactory()
    if getattr(make, "redacts", False):
        return

    def redacting(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # a record whose arguments do not fit its format: logging reports it when emitted
            return record
        if "@" in message and "://" in message:
            record.msg, record.args = redacted(message), ()
        return record

    redacting.redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(redacting)


def set_verbose(on: bool) -> None:
    """``--verbose``: every line on the terminal, no redirection (the run's log file is not written)."""
    global _verbose
    _verbose = bool(on)
    if not _verbose:  # MLflow's artifact download bar (the experiment page reads artifacts) is a library's own
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def capturing() -> bool:
    """True while a run's output goes to its log file (the terminal shows the concise lines only)."""
    return _terminal is not None


def updating() -> bool:
    """True when progress lines update in place: the run's terminal is a TTY."""
    term = _terminal
    return term is not None and term.isatty()


def due(since_s: float, done: int, total: int, *, every_s: float = 30.0, share: float = 0.05,
        at_most_s: float = 600.0) -> bool:
    """Whether a plain progress line is due: ``since_s`` seconds and ``done`` units since the last one.
    At least ``every_s`` apart, and then only after ``share`` of the ``total`` or ``at_most_s``: a phase
    or a sweep prints about 20 lines, and a long one a line every 10 minutes more."""
    return since_s >= every_s and (done >= share * total or since_s >= at_most_s)


def _write(text: str, *, update: bool = False) -> None:
    """One line on the terminal; ``update`` rewrites the progress line in place on a TTY."""
    global _open_line
    term = _terminal
    if term is None:
        return
    with _lock:
        tty = term.isatty()
        if update and tty:
            term.write("\r\033[K" + text)
            _open_line = True
        else:
            term.write(("\n" if _open_line else "") + text + "\n")
            _open_line = False
        term.flush()


def progress(text: str) -> None:
    """A progress line: on a TTY one line updated in place, elsewhere a plain line. Also in the log
    file (or, without one, a log record)."""
    if _terminal is None:
        logging.getLogger("progress").info("%s", text)
        return
    line = time.strftime("%H:%M:%S ") + text
    _write(line, update=True)
    log_file = _log_file
    if log_file is not None:
        with _lock:
            log_file.write(line + "\n")


def worker_line(text: str, *, is_progress: bool = False) -> None:
    """In a Ray worker: a line the driver shows on its terminal (through Ray's log forwarding);
    ``is_progress`` makes it update the progress line. Without a driver that captures, a plain print."""
    print((PROGRESS_TAG if is_progress else CONSOLE_TAG) + text, flush=True)


class _TerminalHandler(logging.Handler):
    """The project's records (and any ERROR) on the terminal; a progress line is ended first."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _write(self.format(record))
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def _for_terminal(record: logging.LogRecord) -> bool:
    if record.levelno >= logging.ERROR:
        return True
    return record.levelno >= logging.INFO and (record.pathname or "").startswith(_PROJECT_ROOT)


#: The last marked lines shown: Ray Train's workers can deliver lines twice, a pair of them too (a phase's last
#: progress line and its "stopped by" line came twice each). A worker's lines carry steps and times, so the same
#: text among the last few is a repeat.
_last_forwarded: collections.deque = collections.deque(maxlen=8)


#: Ray's own lines that say a job waits for a node (its autoscaler's, Ray Train's): shown on the terminal too, at
#: most every ``WAIT_EVERY_S`` each, where only the log file had them and the terminal went silent for good
WAIT_SIGNS = ("No available node types can fulfill resource request", "WorkerGroupStartupTimeoutError")
WAIT_EVERY_S = 300.0
_last_wait: dict[str, float] = {}


def _forward(data: dict) -> None:
    """Ray's log forwarding (driver side): the lines workers marked for the terminal, and Ray's waits."""
    for line in data.get("lines", ()):
        sign = next((s for s in WAIT_SIGNS if s in line), None)
        if sign is not None:
            now = time.monotonic()
            with _lock:
                due = now - _last_wait.get(sign, -WAIT_EVERY_S) >= WAIT_EVERY_S
                if due:
                    _last_wait[sign] = now
            if due:
                _write(time.strftime("%H:%M:%S ") + "waiting (Ray): " + line.strip()[:300])
            continue
        for tag, update in ((PROGRESS_TAG, True), (CONSOLE_TAG, False)):
            at = line.find(tag)
            if at >= 0:
                text = line[at + len(tag):]
                with _lock:
                    if text in _last_forwarded:
                        break
                    _last_forwarded.append(text)
                _write(time.strftime("%H:%M:%S ") + text, update=update)
                break


def _dispatcher():
    """Ray's driver-side dispatcher of forwarded worker output (a private API: without it the
    workers' marked lines are in the log file only)."""
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher  # heavy: ray
    except ImportError:  # pragma: no cover - a Ray without it
        return None
    return global_worker_stdstream_dispatcher


def _open_log(path: Path) -> TextIO:
    """``path`` opened to append, never through a link, nor in a folder that is a link or another user's: a
    log beside an output in a shared folder (``/tmp``) could be a link someone planted to a file of yours."""
    folder = path.parent
    info = os.lstat(folder)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
        whose = "a link" if stat.S_ISLNK(info.st_mode) else f"another user's (uid {info.st_uid})"
        raise ConfigError(f"{folder}: the job's log folder is {whose}; give an output folder of yours")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path}: the job's log file is a link; remove it, or give another output folder"
                              ) from None
        raise
    return os.fdopen(fd, "a", encoding="utf-8", buffering=1)


@contextlib.contextmanager
def run_log(path: str | Path) -> Iterator[Path | None]:
    """This process's stdout and stderr (and the Ray output forwarded to them) into ``path``
    (appended), the terminal keeping the concise lines; yields ``path``. With ``--verbose``, or
    inside another ``run_log``, it changes nothing and yields None."""
    global _terminal, _open_line, _log_file
    if _verbose or _terminal is not None:
        yield None
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    log_file = _open_log(path)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    terminal = os.fdopen(os.dup(saved[1]), "w", encoding="utf-8", errors="replace", buffering=1)
    handler = _TerminalHandler(logging.INFO)
    handler.addFilter(_for_terminal)
    handler.setFormatter(_FORMAT)
    root = logging.getLogger()
    dispatcher = _dispatcher()
    with _lock:
        os.dup2(log_file.fileno(), 1)
        os.dup2(log_file.fileno(), 2)
        _terminal, _open_line, _log_file = terminal, False, log_file
        _last_forwarded.clear()  # a repeat is within one run: a second run in this process shows its own lines
    root.addHandler(handler)
    if dispatcher is not None:
        dispatcher.add_handler("orchestrator_console", _forward)
    try:
        yield path
    finally:
        if dispatcher is not None:
            dispatcher.remove_handler("orchestrator_console")
        root.removeHandler(handler)
        sys.stdout.flush()
        sys.stderr.flush()
        with _lock:
            if _open_line:
                terminal.write("\n")
            _terminal, _open_line, _log_file = None, False, None
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
        terminal.close()
        log_file.close()
        for fd in saved:
            os.close(fd)
        if _trailing is not False:
            with contextlib.suppress(OSError, ConfigError):  # the closing lines are a copy: never a failure
                _trail(path)


def keep_closing_lines() -> None:
    """For a job (``run_job``): once its run's log file is let go, the job's closing lines (the experiment
    page, "finished in", the summary: ``end_trail``) still go to it, so it holds every line the terminal showed."""
    global _trailing
    _trailing = True


def _trail(path: Path) -> None:
    global _trailing
    if isinstance(_trailing, logging.Handler):
        logging.getLogger().removeHandler(_trailing)
        _trailing.close()
    handler = logging.StreamHandler(_open_log(path))
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter(LOG_LINE, LOG_TIME))
    logging.getLogger().addHandler(handler)
    _trailing = handler


def end_trail(text: str = "") -> None:
    """Append ``text`` (the job's summary or error) to the log file of the job's run that ended last, and stop
    copying the job's lines there."""
    global _trailing
    handler, _trailing = _trailing, False
    if not isinstance(handler, logging.StreamHandler):
        return
    logging.getLogger().removeHandler(handler)
    if text:
        handler.stream.write(text.rstrip("\n") + "\n")
    handler.stream.close()
    handler.close()
