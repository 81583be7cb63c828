"""MLflow wiring, for every stage: the tracking config, and the helpers every writer shares.

Logging happens from the driver or from rank 0 only. ``sweep`` logs a finished sweep,
``runs`` a stage's own run (pretraining), ``schema`` names everything they write.

MLflow is a side channel: training never stops or waits because of it. ``effective_uri`` checks
a tracking server once per process with a short timeout; when it does not answer, the run says so
once and logs to the run directory's own SQLite store instead (``mlflow ui`` opens it as usual),
so nothing is lost and nothing hangs on MLflow's retries. A server lost mid-run is handled by the
writers (``runs.RankZeroLogger`` buffers and writes what it could not send to a file it replays
later; a failed sweep log is re-sent by re-running the sweep).
"""
from __future__ import annotations

import base64
import logging
import os
import shlex
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.config import field, flatten, redacted
from orchestrator.core.errors import ConfigError
from orchestrator.track.caller import user_tracking_uri
from orchestrator.track.experiments import UI_ADDRESS, ensure_experiment
from orchestrator.track.local_store import (
    path_problem,
    relocate_artifacts,
    sqlite_file,
    sqlite_uri,
    start_local_store,
)

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 3.0
_EFFECTIVE: dict[str, str] = {}  # configured URI -> the URI this process logs to


@dataclass(frozen=True)
class TrackingConfig:
    tracking_uri: str = field("", help="MLflow tracking URI; empty = $MLFLOW_TRACKING_URI if set, else "
                                       "sqlite:///<run_dir>/mlflow.db (a server, e.g. http://head:5000, on a cluster)")
    experiment: str = field("bioptorch", help="MLflow experiment name")
    enabled: bool = field(True, help="log to MLflow at all")

    def resolve_uri(self, run_dir) -> str:
        """The configured store: ``tracking_uri``, else the user's $MLFLOW_TRACKING_URI (as it was when
        the job, or the workflow call, began: ``caller.user_tracking_uri``), else the run directory's SQLite file."""
        return self.tracking_uri or user_tracking_uri() or local_uri(run_dir)


def local_uri(run_dir) -> str:
    """The laptop default store of a run directory: ``sqlite:///<run_dir>/mlflow.db``."""
    return sqlite_uri(Path(run_dir) / "mlflow.db")


def probe(uri: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the store at ``uri`` answers, else why not. A server is asked for /health; a
    SQLite file needs a directory it can be created in; other schemes are left to MLflow."""
    if uri.startswith(("http://", "https://")):
        parts = urllib.parse.urlsplit(uri)
        request = urllib.request.Request(ui_address(uri) + "/health")  # the server's address, credentials apart
        if parts.username is not None:  # http://user:password@host: as MLflow sends it (urllib would take
            # "user" for the host's name)
            user = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            request.add_header("Authorization", "Basic " + base64.b64encode(user.encode()).decode())
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return None if response.status == 200 else f"HTTP {response.status}"
        except (OSError, urllib.error.URLError) as exc:
            return str(getattr(exc, "reason", exc))
    if (database := sqlite_file(uri)) is not None:
        if (unusable := path_problem(database)) is not None:
            return unusable
        parent = database.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        return None if os.access(parent, os.W_OK) else f"{parent} is not writable"
    if urllib.parse.urlsplit(uri).scheme in ("", "file") and \
            os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
        # MLflow 3 refuses a file store: the run logged nowhere, exit 0, its summary naming the empty store
        return ("it is a file store, which MLflow 3 keeps in maintenance mode and refuses unless "
                "MLFLOW_ALLOW_FILE_STORE=true; sqlite:///<folder>/mlflow.db is its successor")
    return None


def quiet_run_links(uri: str) -> None:
    """For a store whose URI holds a password: MLflow prints "View run <name> at: <the URI>/..." as each run
    on a server ends, the password with it (44 times into a sweep's logs/job.log: a probe, session 49). The
    job's summary says where the runs are."""
    if redacted(uri) != uri:
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


def ui_command(uri: str) -> str:
    """The shell command that opens the store at ``uri`` in MLflow's UI, on loopback (quoted: a run directory
    may hold spaces or ``#``). A tracking server serves its own UI: its address is said instead (``mlflow ui``
    on an http store fails: a probe, session 49)."""
    if uri.startswith(("http://", "https://")):
        return f"the server's own UI, at {ui_address(uri)}"
    return f"mlflow ui --backend-store-uri {shlex.quote(uri)} --host 127.0.0.1 --port 5000"


def ui_address(uri: str) -> str:
    """Where a browser opens the UI of the store at ``uri``: a server's own address (without its credentials),
    else the address ``ui_command``'s local UI listens on."""
    if not uri.startswith(("http://", "https://")):
        return UI_ADDRESS
    parts = urllib.parse.urlsplit(uri)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl().rstrip("/")


def check_local_store(uri: str) -> None:
    """ConfigError when ``uri`` is a SQLite store that SQLite cannot open wherever it is (its path's length):
    MLflow would retry for about 100 s at every stage and the run would log nowhere."""
    if (database := sqlite_file(uri)) is not None and (problem := path_problem(database)) is not None:
        raise ConfigError(f"MLflow's store {database}: {problem}")


def effective_uri(tracking: TrackingConfig, run_dir) -> str:
    """The store this process logs to: the configured one when it answers (checked once, with a
    short timeout), else the run directory's SQLite store, with one warning. A SQLite store that
    does not exist yet is made from a kept empty one (``local_store``: milliseconds, not seconds)."""
    configured = tracking.resolve_uri(run_dir)
    quiet_run_links(configured)
    if configured not in _EFFECTIVE:
        problem = probe(configured)
        _EFFECTIVE[configured] = configured
        if problem is not None:
            fallback = local_uri(run_dir)
            check_local_store(fallback)
            log.warning("MLflow at %s does not answer (%s): this run logs to %s instead and trains on "
                        "(open it with: %s)", redacted(configured), problem, fallback, ui_command(fallback))
            _EFFECTIVE[configured] = fallback
    check_local_store(_EFFECTIVE[configured])
    if (database := sqlite_file(_EFFECTIVE[configured])) is not None:
        relocate_artifacts(database)
    start_local_store(_EFFECTIVE[configured])
    return _EFFECTIVE[configured]


# ------------------------------------------------------------------------------------ helpers
MAX_PARAM_VALUE = 500  # MLflow 3 allows 6000 chars; shorter keeps the UI readable
MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit


def param_value(value) -> str:
    """A param's value as MLflow gets it: redacted, and cut to ``MAX_PARAM_VALUE`` with "..." saying it was cut
    (the whole config is the run's ``chain_config.json``)."""
    text = redacted(str(value))
    return text if len(text) <= MAX_PARAM_VALUE else text[:MAX_PARAM_VALUE - 3] + "..."


def flat_params(data, prefix: str = "") -> dict[str, str]:
    """Nested config -> {'a.b': 'value'} within MLflow's key and value limits."""
    return {key[:250]: param_value(value) for key, value in flatten(data, prefix).items()}


def log_params(params: dict[str, str]) -> None:
    import mlflow  # heavy: mlflow

    items = list(params.items())
    for start in range(0, len(items), MAX_PARAMS_PER_BATCH):
        mlflow.log_params(dict(items[start:start + MAX_PARAMS_PER_BATCH]))


def start_tracking(tracking: TrackingConfig, run_dir) -> str | None:
    """Point MLflow at the configured store (SQLite in the run directory by default) and make
    sure the experiment exists; returns the URI, or None when tracking is disabled."""
    if not tracking.enabled:
        return None
    import mlflow  # heavy: mlflow

    uri = effective_uri(tracking, run_dir)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=ensure_experiment(uri, tracking.experiment, run_dir))
    return uri
