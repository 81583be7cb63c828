"""A run directory's new SQLite store, made in milliseconds instead of seconds.

MLflow makes a new SQLite file by creating its tables and then running every schema migration it
has (about 60 in MLflow 3): 1.5 s on an idle laptop core, 4-5 s on a busy one, paid by every new
run directory and by every test that starts one. The result is the same empty store each time, so
the first new store this MLflow version makes is kept in the user's cache (``core.reuse.user_cache_dir``:
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
from pathlib import Path

from orchestrator.core.reuse import user_cache_dir

log = logging.getLogger(__name__)

SQLITE_PREFIX = "sqlite:///"


def sqlite_uri(path: str | Path) -> str:
    """The URI of the SQLite store in file ``path`` (made absolute)."""
    return SQLITE_PREFIX + str(Path(path).resolve())


def sqlite_file(uri: str) -> Path | None:
    """The file of a SQLite store's URI; None for any other store."""
    return Path(uri[len(SQLITE_PREFIX):]) if uri.startswith(SQLITE_PREFIX) else None


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
