"""A run directory's new SQLite store, made in milliseconds instead of seconds.

MLflow makes a new SQLite file by creating its tables and then running every schema migration it
has (about 60 in MLflow 3): 1.5 s on an idle laptop core, 4-5 s on a busy one, paid by every new
run directory and by every test that starts one. The result is the same empty store each time, so
the first new store this MLflow version makes is kept in the user's cache (``core.manifest.user_cache_dir``:
``$ORCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/bioptorch-orchestrator``, else ``~/.cache/...``) and later new
stores start as a copy of it. What in an empty store depends on where and when it was made, the artifact location
of MLflow's "Default" experiment (``<working directory>/mlruns/0``) and its times, is set in the
copy as MLflow would have set it. Anything unexpected (no cache directory, a copy that fails)
leaves the file for MLflow to make as before.
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.manifest import user_cache_dir

log = logging.getLogger(__name__)

SQLITE_PREFIX = "sqlite:///"


#: What SQLAlchemy reads as URL syntax in a store URI's path (a query, a fragment, an escape); escaped, they
#: reach SQLite but MLflow 3 makes the escaped name's folder beside the store (``_make_parent_dirs_if_sqlite``)
URI_SPECIAL = "?#%"
#: The longest file name SQLite's unix VFS opens (SQLITE_MAX_PATHNAME); a longer one fails as "unable to open"
SQLITE_MAX_PATH_BYTES = 512


def sqlite_uri(path: str | Path) -> str:
    """The URI of the SQLite store in file ``path`` (made absolute)."""
    return SQLITE_PREFIX + str(Path(path).resolve())


def sqlite_file(uri: str) -> Path | None:
    """The file of a SQLite store's URI; None for any other store."""
    return Path(uri[len(SQLITE_PREFIX):]) if uri.startswith(SQLITE_PREFIX) else None


def path_problem(database: Path) -> str | None:
    """Why MLflow cannot keep a SQLite store at ``database`` whatever the disk allows, or None: a folder
    named ``a?b`` put the store in a file ``a`` beside it, ``%41`` in one named with ``A``."""
    if found := sorted(set(URI_SPECIAL) & set(str(database.resolve()))):
        return (f"its path holds {' and '.join(repr(c) for c in found)}, which MLflow's SQLite address reads as "
                "URL syntax (the store would be another file): use a run directory without them, or a tracking "
                "server (tracking.tracking_uri), or tracking.enabled=false")
    size = len(os.fsencode(database.resolve()))
    if size >= SQLITE_MAX_PATH_BYTES:
        return (f"its path is {size} bytes and SQLite opens at most {SQLITE_MAX_PATH_BYTES - 1}: use a shorter "
                "run directory (runs_root, out_dir), or a tracking server (tracking.tracking_uri)")
    return None


def _stale_locations(db: sqlite3.Connection, here: Path) -> list[tuple[int, str]]:
    """(experiment id, artifact location) of the experiments whose ``.../mlartifacts`` folder is gone."""
    stale = []
    for experiment_id, old in db.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall():
        if (old or "").startswith("file://") and old.endswith("/mlartifacts") and old != here.resolve().as_uri():
            if not Path(urllib.parse.unquote(urllib.parse.urlsplit(old).path)).exists():
                stale.append((experiment_id, old))
    return stale


def relocate_artifacts(database: Path, here: Path | None = None) -> int:
    """A run directory moved elsewhere keeps its MLflow artifacts: its store names them by absolute location
    (``file:///old/run/mlartifacts``), where new runs would write (recreating the old folder) and a report
    would find nothing. Experiments whose artifact folder is gone while ``here`` (``mlartifacts`` beside the
    store) exists are pointed at it, and their runs too (MLflow has no call for it: its tables are updated,
    as ``start_local_store`` does). A copy (both folders there) and a store that run directories share are
    left alone. Returns the number of experiments moved."""
    here = here or database.parent / "mlartifacts"
    if not database.is_file() or not here.is_dir():
        return 0
    new = here.resolve().as_uri()
    with contextlib.closing(sqlite3.connect(database, timeout=30)) as db, db:
        stale = _stale_locations(db, here)
        for experiment_id, old in stale:
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (new, experiment_id))
            db.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
                       "WHERE experiment_id = ? AND substr(artifact_uri, 1, ?) = ?",
                       (new, len(old) + 1, experiment_id, len(old), old))
    if stale:
        log.info("MLflow store %s: %d experiment(s) moved with their run directory to %s", database, len(stale), here)
    return len(stale)


@contextlib.contextmanager
def readable_store(uri: str) -> Iterator[str]:
    """``uri`` to read from; for a SQLite store moved with its run directory (``relocate_artifacts``), a
    temporary copy whose artifact locations are where they are now: a report reads a moved run directory
    whole (it found no results artifact, and left tables out) and never writes into the store it reads."""
    database = sqlite_file(uri)
    here = database.parent / "mlartifacts" if database is not None else None
    if database is None or not database.is_file() or not here.is_dir():
        yield uri
        return
    read_only = f"file:{urllib.parse.quote(str(database.resolve()))}?mode=ro"
    with contextlib.closing(sqlite3.connect(read_only, uri=True)) as src:
        moved = bool(_stale_locations(src, here))
    if not moved:
        yield uri
        return
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "mlflow.db"
        with contextlib.closing(sqlite3.connect(read_only, uri=True)) as src, \
                contextlib.closing(sqlite3.connect(copy)) as dst:
            src.backup(dst)
        relocate_artifacts(copy, here)
        yield sqlite_uri(copy)


def cache_dir() -> Path:
    return user_cache_dir()


def _template(mlflow_version: str) -> Path:
    """The empty store of this MLflow version, made once (by MLflow itself) and kept."""
    path = cache_dir() / f"mlflow-{mlflow_version}-empty.db"
    if path.is_file():
        return path
    import mlflow  # heavy: mlflow

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        made = Path(tmp) / "empty.db"
        mlflow.MlflowClient(SQLITE_PREFIX + str(made)).search_experiments()
        with contextlib.suppress(FileExistsError):  # another process kept its own first: the same file
            os.link(made, path)
    return path


def default_artifact_location() -> str:
    """Where MLflow puts a new SQLite store's "Default" experiment: ./mlruns/0 from where it runs."""
    return str(Path("mlruns").resolve() / "0")


def start_local_store(uri: str) -> None:
    """Make the SQLite store at ``uri`` from the kept empty one when the file does not exist yet;
    any other URI, or an existing file, is left alone."""
    target = sqlite_file(uri)
    if target is None or target.exists() or not target.parent.is_dir():
        return
    try:
        import mlflow  # heavy: mlflow

        template = _template(mlflow.__version__)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            copy = Path(tmp) / target.name
            shutil.copyfile(template, copy)
            with contextlib.closing(sqlite3.connect(copy)) as db, db:
                now_ms = int(time.time() * 1000)
                db.execute("UPDATE experiments SET artifact_location = ?, creation_time = ?, last_update_time = ? "
                           "WHERE experiment_id = 0", (default_artifact_location(), now_ms, now_ms))
            with contextlib.suppress(FileExistsError):  # made meanwhile by another process: keep that one
                os.link(copy, target)
    except Exception as exc:  # an optimisation only: MLflow makes the file as it always did
        log.debug("new MLflow store %s left to MLflow (%s)", target, exc)
