"""A stage's own MLflow run: created by the driver, written to by rank 0 of the training workers.

    info = start_stage_run(tracking, run_dir, stage="pretrain", params=cfg, out_dir=out_dir)
    logger = RankZeroLogger(info if rank == 0 else None)      # in every Ray Train worker
    logger.log({"loss": 2.1}, step=10)
    logger.close()
    end_stage_run(info)                                        # FINISHED, or ended_status(exc)

The run id is kept in ``out_dir/mlflow_run.json``, so a resumed stage keeps logging into the run it
started. Other ranks get a logger that does nothing. MLflow trouble never stops training: a logger
that cannot send warns once, keeps the metrics and retries now and then; what it still could not
send at the end goes to ``out_dir/mlflow_pending.jsonl``, which the next start of the same stage
run (a re-run of the same command) sends first.
"""
from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.config import flatten, redacted, to_dict
from orchestrator.core.errors import ConfigError, sigterm_seen
from orchestrator.core.manifest import atomic_write_json, git_state
from orchestrator.track import TrackingConfig, effective_uri, param_value, quiet_run_links, sqlite_file
from orchestrator.track import schema as S
from orchestrator.track.experiments import ensure_experiment

log = logging.getLogger(__name__)

RUN_MARKER = "mlflow_run.json"
PENDING = "mlflow_pending.jsonl"
MAX_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit


def code_tags() -> dict[str, str]:
    """The code a run ran, as MLflow tags: the commit, whether the checkout had changes, and their hash."""
    state = git_state()
    tags = {S.GIT_COMMIT: state["git_commit"] or "unknown",
            S.GIT_DIRTY: "unknown" if state["git_dirty"] is None else str(state["git_dirty"]).lower()}
    if state.get("git_diff_sha256"):
        tags[S.GIT_DIFF] = state["git_diff_sha256"]
    return tags


def start_stage_run(tracking: TrackingConfig | None, run_dir: Path, *, stage: str, params: Any,
                    out_dir: Path, tags: dict[str, str] | None = None) -> dict | None:
    """Create (or reopen, on resume) the stage's run; returns {uri, run_id, pending}, or None when
    tracking is off or the store cannot be written (said once; the stage trains on).

    The run is a child of the run active in this process when it starts (e.g. an experiment's)."""
    if tracking is None or not tracking.enabled:
        return None
    import mlflow  # heavy: mlflow

    uri = effective_uri(tracking, run_dir)
    marker, pending = Path(out_dir) / RUN_MARKER, Path(out_dir) / PENDING
    try:
        mlflow.set_tracking_uri(uri)
        client = mlflow.MlflowClient(uri)
        experiment_id = ensure_experiment(uri, tracking.experiment, run_dir)
        if marker.is_file():
            recorded = json.loads(marker.read_text())
            if recorded.get("uri") in (uri, redacted(uri)) and _exists(client, recorded["run_id"]):
                run = client.get_run(recorded["run_id"])
                if run.info.status != "RUNNING":  # it trains (or ends) again: an interrupted attempt left it KILLED
                    client.update_run(recorded["run_id"], "RUNNING")
                if (parent := active_parent(uri)) and orphaned(client, run):
                    client.set_tag(recorded["run_id"], S.PARENT, parent)
                # a resumed stage repeats the steps after its last checkpoint: those it logged are not logged again
                logged = {m.key: m.step for m in run.data.to_proto().metrics}
                info = {"uri": uri, "run_id": recorded["run_id"], "pending": str(pending), "logged": logged}
                replay_pending(info)
                return info
        tags = {**code_tags(), **(tags or {}), S.KIND: stage}
        if parent := active_parent(uri):
            tags[S.PARENT] = parent
        run = client.create_run(experiment_id, run_name=run_name(stage, tags), tags=tags)
        values = _param_list(params)
        for start in range(0, len(values), 100):
            client.log_batch(run.info.run_id, params=values[start:start + 100])
    except Exception as exc:  # MLflow raises many types (HTTP, SQL, its own): none may stop training
        log.warning("MLflow: cannot start the %s run at %s (%s); the stage trains without it", stage, uri, exc)
        return None
    atomic_write_json(marker, {"run_id": run.info.run_id, "uri": redacted(uri)})  # no password in a file
    return {"uri": uri, "run_id": run.info.run_id, "pending": str(pending)}


def log_stage_result(tracking: TrackingConfig | None, run_dir: Path, *, stage: str, params: Any,
                     metrics: dict[str, float], tags: dict[str, str], artifacts: Sequence[Path] = (),
                     series: Sequence[tuple[str, float, int]] = ()) -> str | None:
    """A finished stage's result as its own finished run, a child of the active run, with ``artifacts``
    (files) attached and ``series`` ((key, value, step): a loss curve) among its metrics. A run with the
    same parent, stage and ``tags`` is looked up first, so a re-run that reuses the output logs nothing
    again; one left unfinished (its process stopped between creating and ending it) is deleted and
    logged anew. Returns the run id, or None when tracking is
    off or the store fails (said: the work goes on)."""
    if tracking is None or not tracking.enabled:
        return None
    import mlflow  # heavy: mlflow
    from mlflow.entities import Metric

    uri = effective_uri(tracking, run_dir)
    tags = {**tags, S.KIND: stage}
    if parent := active_parent(uri):
        tags[S.PARENT] = parent
    try:
        client = mlflow.MlflowClient(uri)
        experiment_id = ensure_experiment(uri, tracking.experiment, run_dir)
        query = " and ".join(f"tags.`{k}` = '{v}'" for k, v in sorted(tags.items()))
        found = client.search_runs([experiment_id], filter_string=query, max_results=100)
        if done := [r for r in found if r.info.status == "FINISHED"]:
            return done[0].info.run_id
        for half_logged in found:
            client.delete_run(half_logged.info.run_id)
        run = client.create_run(experiment_id, run_name=run_name(stage, tags), tags=tags)
        now = int(time.time() * 1000)
        values = _param_list(params)
        scores = [Metric(k, float(v), now, 0) for k, v in metrics.items() if math.isfinite(float(v))]
        for start in range(0, max(len(values), len(scores)), 100):
            client.log_batch(run.info.run_id, params=values[start:start + 100], metrics=scores[start:start + 100])
        steps = [Metric(k, float(v), now, step) for k, v, step in series]
        for start in range(0, len(steps), MAX_METRICS_PER_BATCH):
            client.log_batch(run.info.run_id, metrics=steps[start:start + MAX_METRICS_PER_BATCH])
        for path in artifacts:
            client.log_artifact(run.info.run_id, str(path))
        client.set_terminated(run.info.run_id, "FINISHED")
    except Exception as exc:  # see start_stage_run
        log.warning("MLflow: could not log the %s run at %s (%s)", stage, uri, exc)
        return None
    return run.info.run_id


def log_recorded_run(tracking: TrackingConfig | None, run_dir: Path, *, stage: str, out_dir: Path, params: Any,
                     history: Sequence[dict], tags: dict[str, str]) -> str | None:
    """A reused stage output's run, logged from what the output recorded (``params``; ``history``, its per-step
    rows, as metrics at their steps), tagged ``S.REUSED``, into this job's store when that holds no live FINISHED
    run of it: neither the run its ``RUN_MARKER`` names nor one an earlier reuse logged there (found by ``tags``,
    as ``log_stage_result`` finds a result). A re-run into another store, or after the user deleted the run,
    showed no run of the stage, and the experiment page no loss curve (probe M3). Returns the run id (None:
    nothing to log, tracking off, or the store failed)."""
    if tracking is None or not tracking.enabled:
        return None
    uri = effective_uri(tracking, run_dir)
    if (run := _recorded_here(out_dir, uri)) is not None:
        import mlflow  # heavy: mlflow

        if (parent := active_parent(uri)) and orphaned(mlflow.MlflowClient(uri), run):  # its experiment run was deleted
            set_run_tags(uri, run.info.run_id, {S.PARENT: parent})
        return None
    series = [(k, float(v), row["step"]) for row in history for k, v in row.items()  # as RankZeroLogger logs
              if k != "step" and v is not None and math.isfinite(float(v))]
    return log_stage_result(tracking, run_dir, stage=stage, params=params, metrics={},
                            tags={**tags, S.REUSED: "true"}, series=series)


def _recorded_here(out_dir: Path, uri: str):
    """The run ``out_dir``'s ``RUN_MARKER`` names, if it is in the store at ``uri``, live and FINISHED; else None."""
    marker = Path(out_dir) / RUN_MARKER
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8")) if marker.is_file() else {}
        if recorded.get("uri") not in (uri, redacted(uri)):
            return None
        import mlflow  # heavy: mlflow

        run = mlflow.MlflowClient(uri).get_run(recorded["run_id"])
        return run if run.info.lifecycle_stage == "active" and run.info.status == "FINISHED" else None
    except Exception as exc:  # a bad marker, a run not in this store: there is none here
        log.debug("MLflow: the run recorded in %s is not in %s (%s)", marker, redacted(uri), exc)
        return None


def run_name(stage: str, tags: dict[str, str]) -> str:
    """A stage run's name: the stage, and the arm it belongs to (every pretraining run was named "pretrain": M13)."""
    return f"{stage}:{tags[S.ARM]}" if tags.get(S.ARM) else stage


def orphaned(client, run) -> bool:
    """Whether the parent ``run`` names was deleted (or is gone): a re-run of its experiment made a new experiment
    run, which then showed no children while the reused runs stayed under the deleted one (probe M10)."""
    parent = run.data.tags.get(S.PARENT)
    return bool(parent) and not _exists(client, parent)


def _param_list(params: Any) -> list:
    """A config as MLflow params, within MLflow's key and value limits (a cut value ends "...": probe M7)."""
    from mlflow.entities import Param  # heavy: mlflow

    return [Param(key[:250], param_value(value)) for key, value in flatten(to_dict(params)).items()]


def ended_status(exc: BaseException) -> str:
    """How a run that ``exc`` stopped ends in MLflow: KILLED when the user stopped it (Ctrl-C, SIGTERM's
    ``Terminated``, or the ``SystemExit`` Ray's handlers raise for either), FAILED for an error, so that MLflow's
    "Failed" filter finds real failures only (probe M4)."""
    return "KILLED" if isinstance(exc, (KeyboardInterrupt, SystemExit)) or sigterm_seen() else "FAILED"


def end_stage_run(info: dict | None, status: str = "FINISHED") -> None:
    if not info:
        return
    import mlflow  # heavy: mlflow

    try:
        mlflow.MlflowClient(info["uri"]).set_terminated(info["run_id"], status=status)
    except Exception as exc:  # see start_stage_run
        log.warning("MLflow: could not mark run %s %s (%s)", info["run_id"], status, exc)


def recorded_run_unfinished(out_dir: Path, uri: str = "") -> bool:
    """Whether the MLflow run a stage output records (``RUN_MARKER``) is still open or ended otherwise than
    FINISHED: its job was stopped after the output was written and before the run ended. False when the
    output records no run, or its store does not answer (nothing to mend from here). ``uri``: the store
    this job logs to, asked in place of the recorded one when that is it, its password left out."""
    marker = Path(out_dir) / RUN_MARKER
    if not marker.is_file():
        return False
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
        import mlflow  # heavy: mlflow

        store = uri if uri and recorded["uri"] in (uri, redacted(uri)) else recorded["uri"]
        if (database := sqlite_file(store)) is not None and not database.is_file():
            return False  # the output was moved from there (asking would make an empty store at the old place)
        return mlflow.MlflowClient(store).get_run(recorded["run_id"]).info.status != "FINISHED"
    except Exception as exc:  # see start_stage_run: a bad marker or an unreachable store
        log.debug("MLflow: cannot read the run recorded in %s (%s)", marker, exc)
        return False


def _exists(client, run_id: str) -> bool:
    from mlflow.exceptions import MlflowException  # heavy: mlflow

    try:  # a run the user deleted is not written to (MLflow refuses): the stage starts a new one
        return client.get_run(run_id).info.lifecycle_stage == "active"
    except MlflowException:
        return False


def replay_pending(info: dict) -> int:
    """Send the metrics a logger kept in ``info['pending']``; the file goes once they are sent."""
    path = Path(info.get("pending") or "")
    if not path.is_file():
        return 0
    from mlflow.entities import Metric  # heavy: mlflow

    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    logger = RankZeroLogger({**info, "pending": None})
    logger.queue = [Metric(r["key"], r["value"], r["timestamp"], r["step"]) for r in rows]
    if logger.flush(force=True):
        path.unlink()
        log.info("MLflow: sent %d metrics kept from an earlier attempt (%s)", len(rows), path)
    return len(rows)


class RankZeroLogger:
    """Metrics into a stage's run from one worker; a logger built with ``None`` does nothing.

    Sending failures are said once; the metrics are kept and sent with a later call (at most one
    attempt per ``retry_s`` while the store is down), and ``close`` writes what is left to the
    pending file."""

    def __init__(self, info: dict | None, retry_s: float = 60.0):
        self.active = bool(info)
        self.queue: list = []
        self.retry_s = retry_s
        self.down_since: float | None = None
        self.warned = False
        self.logged: dict[str, int] = (info or {}).get("logged") or {}  # the last step of each metric already logged
        if not info:
            return
        import mlflow  # heavy: mlflow

        quiet_run_links(info["uri"])  # a worker's MLflow prints the URI as a run ends
        self.client = mlflow.MlflowClient(info["uri"])
        self.run_id = info["run_id"]
        self.pending = Path(info["pending"]) if info.get("pending") else None

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.active:
            return
        from mlflow.entities import Metric  # heavy: mlflow

        now = int(time.time() * 1000)
        self.queue += [Metric(k, float(v), now, step) for k, v in metrics.items()
                       if v is not None and math.isfinite(float(v)) and step > self.logged.get(k, -1)]
        self.flush()

    def flush(self, force: bool = False) -> bool:
        """Send the queue; True when it is empty afterwards."""
        if not self.queue:
            return True
        if self.down_since is not None and not force and time.monotonic() - self.down_since < self.retry_s:
            return False
        try:
            while self.queue:
                self.client.log_batch(self.run_id, metrics=self.queue[:MAX_METRICS_PER_BATCH])
                del self.queue[:MAX_METRICS_PER_BATCH]
        except Exception as exc:  # MLflow raises many types; logging must never stop training
            if not self.warned:
                log.warning("MLflow: logging to run %s failed (%s); training goes on, the metrics are kept and "
                            "sent when the store answers again", self.run_id, exc)
                self.warned = True
            self.down_since = time.monotonic()
            return False
        if self.down_since is not None:
            log.info("MLflow answers again: the kept metrics were sent")
            self.down_since = None
        return True

    def close(self) -> None:
        """A last attempt; what is still unsent goes to the pending file (sent by the next start)."""
        if not self.active or self.flush(force=True) or self.pending is None:
            return
        with open(self.pending, "a", encoding="utf-8") as f:
            for m in self.queue:
                f.write(json.dumps({"key": m.key, "value": m.value, "timestamp": m.timestamp, "step": m.step}) + "\n")
        log.warning("MLflow: %d metrics could not be sent; they are kept in %s and sent when the same command "
                    "runs again", len(self.queue), self.pending)
        self.queue = []


@contextlib.contextmanager
def parent_run(tracking: TrackingConfig | None, run_dir: Path, *, kind: str, key: str, name: str,
               params: dict[str, Any] | None = None) -> Iterator[str | None]:
    """An active parent run for everything started inside the block (stage runs and the sweep
    become its children); the same ``key`` reopens the run an earlier attempt created, so a re-run
    never leaves a second parent. Yields the run id, or None when tracking is off or the store
    fails (said once: the work goes on without it). Ends FINISHED, else as ``ended_status`` says (KILLED
    on an interrupt, FAILED on an error)."""
    if tracking is None or not tracking.enabled:
        yield None
        return
    import mlflow  # heavy: mlflow

    uri = effective_uri(tracking, run_dir)
    try:
        mlflow.set_tracking_uri(uri)
        experiment_id = ensure_experiment(uri, tracking.experiment, run_dir)
        found = mlflow.MlflowClient(uri).search_runs([experiment_id], filter_string=f"tags.`{S.EXPERIMENT_KEY}` = "
                                                                                    f"'{key}'", max_results=1)
        existing = found[0].info.run_id if found else None
        run = mlflow.start_run(run_id=existing, experiment_id=experiment_id, run_name=None if existing else name,
                               tags={S.KIND: kind, S.EXPERIMENT_KEY: key})
        add_run_dir(run, run_dir)  # a page of one run directory finds its experiment in a store several share
        if not existing and params:
            mlflow.log_params({k[:250]: param_value(v) for k, v in params.items()})
    except ConfigError:  # the store's state the user must change (a deleted experiment): said before any work
        raise
    except Exception as exc:  # MLflow raises many types (HTTP, SQL, its own): none may stop the work
        log.warning("MLflow: cannot start the %s run at %s (%s); the work goes on without it", kind, uri, exc)
        yield None
        return
    _OPEN_PARENTS.append((uri, run.info.run_id))
    try:
        yield run.info.run_id
    except BaseException as exc:
        _end_active(ended_status(exc))
        raise
    finally:
        _OPEN_PARENTS.remove((uri, run.info.run_id))
    _end_active("FINISHED")


@contextlib.contextmanager
def started_run(**kwargs) -> Iterator:
    """``mlflow.start_run(**kwargs)``, ended as ``ended_status`` says when the block raises: MLflow's own ends
    a run FAILED on an interrupt too."""
    import mlflow  # heavy: mlflow

    with mlflow.start_run(**kwargs) as run:
        try:
            yield run
        except BaseException as exc:
            _end_active(ended_status(exc))  # (MLflow's exit then leaves the ended run alone)
            raise


def run_dirs(run) -> set[str]:
    """The run directories that logged the sweep or experiment ``run`` (``S.RUN_DIR``, a line each: run
    directories whose sweeps or experiments were the same, in a store they share, share one run)."""
    return set(filter(None, (run.data.tags.get(S.RUN_DIR) or "").split("\n")))


def add_run_dir(run, run_dir: str | Path) -> None:
    """Name ``run_dir`` among the run directories of ``run``, the active run (``run_dirs``; all of them while the
    tag holds them, else this one)."""
    import mlflow  # heavy: mlflow

    here, dirs = str(Path(run_dir).resolve()), run_dirs(run)
    if here not in dirs:
        joined = "\n".join(sorted(dirs | {here}))
        mlflow.set_tag(S.RUN_DIR, joined if len(joined) <= S.MAX_TAG_CHARS else here)


def of_run_dir(runs: list, run_dir: str | Path) -> tuple[list, list[str]]:
    """(those of ``runs`` that ``run_dir`` logged, in their order; the run directories of all of them)."""
    here = str(Path(run_dir).resolve())
    return [r for r in runs if here in run_dirs(r)], sorted(set().union(*map(run_dirs, runs)))


#: (store, run id) of the parent runs ``parent_run`` holds open in this process, innermost last: MLflow's active
#: run is the opening thread's only, so an experiment's arms built at once (``arm_concurrency``, each in its own
#: thread) made their pretraining runs without a parent (a probe, session 46)
_OPEN_PARENTS: list[tuple[str, str]] = []


def active_parent(uri: str) -> str | None:
    """The run a stage's run at ``uri`` is a child of: this thread's active run, else the innermost parent run open
    in this process at that store."""
    import mlflow  # heavy: mlflow

    if (run := mlflow.active_run()) is not None:
        return run.info.run_id
    return next((run_id for store, run_id in reversed(_OPEN_PARENTS) if store == uri), None)


def attach_files(uri: str, run_id: str | None, paths: Sequence[Path], folder: str | None = None) -> None:
    """Files (a run's resolved config, its report) as artifacts of a run, under ``folder``, so that MLflow alone
    holds what reproduces and shows the run; does nothing without a run, and MLflow trouble is only said."""
    if not (uri and run_id):
        return
    import mlflow  # heavy: mlflow

    try:
        client = mlflow.MlflowClient(uri)
        for path in paths:
            if Path(path).is_file():
                client.log_artifact(run_id, str(path), folder)
    except Exception as exc:  # see start_stage_run
        log.warning("MLflow: could not attach files to run %s (%s)", run_id, exc)


def set_run_tags(uri: str, run_id: str | None, tags: dict[str, str]) -> None:
    """Set (or update) tags of a run; does nothing without a run, and MLflow trouble is only said
    (a warning): the work goes on, as everywhere in this module."""
    if not (uri and run_id and tags):
        return
    import mlflow  # heavy: mlflow
    from mlflow.entities import RunTag

    try:
        mlflow.MlflowClient(uri).log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
    except Exception as exc:  # see start_stage_run
        log.warning("MLflow: could not tag run %s (%s)", run_id, exc)


def _end_active(status: str) -> None:
    import mlflow  # heavy: mlflow

    try:
        mlflow.end_run(status)
    except Exception as exc:  # the store went away meanwhile: the run's status stays as it was
        log.warning("MLflow: cannot end the run (%s)", exc)


def log_step_metrics(metrics: dict[str, float], step: int) -> None:
    """Metrics of the active run (a ``parent_run``) at ``step``, e.g. one cycle of an iterative job;
    a metric that already has that step (a re-run reopening the parent) is not logged again. Nothing
    without an active run, and MLflow trouble is only said (the work goes on)."""
    import mlflow  # heavy: mlflow

    run = mlflow.active_run()
    if run is None:
        return
    try:
        client = mlflow.MlflowClient()
        todo = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))
                and all(h.step != step for h in client.get_metric_history(run.info.run_id, k))}
        if todo:
            mlflow.log_metrics(todo, step=step)
    except Exception as exc:  # see start_stage_run
        log.warning("MLflow: could not log step %d (%s)", step, exc)
