"""Experiments that keep their artifacts with the run and open on their runs in the MLflow UI.

MLflow's default artifact root for a SQLite store is ./mlruns under the *current directory*, so
artifacts of a run directory's store would land wherever the job was started. A SQLite store gets
its artifacts in ``mlartifacts/`` beside its file: ``<run_dir>/mlartifacts`` for a run directory's own
store; beside a store several runs share (``tracking.tracking_uri``), not in the run directory of
whichever job created the experiment first, which deleting that run directory took from every other
run (a probe, session 46). A remote server keeps its own artifact root.

MLflow 3's UI opens an experiment without a kind on its GenAI overview (traces); every experiment
this project creates or logs into is marked a model-training experiment, so that the UI's experiment
list opens it on the runs table and the compare view. A direct link to an experiment is another matter:
MLflow 3.17's UI keeps one GenAI / model-training switch for the whole browser (in its local storage,
GenAI at first) and ignores the tag there, so ``ui_url`` names the model-training view in the link.
"""
from __future__ import annotations

from pathlib import Path

from orchestrator.core.config import redacted
from orchestrator.core.errors import ConfigError
from orchestrator.track import schema as S
from orchestrator.track.local_store import sqlite_file


def ensure_experiment(uri: str, name: str, run_dir: str | Path | None) -> str:
    """The id of experiment ``name`` at ``uri``, created (artifacts beside a SQLite store's file; ``run_dir``'s
    ``mlartifacts/`` where the store is no file) if absent, and tagged a model-training experiment."""
    import mlflow  # heavy: mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        artifact_location = None
        database = sqlite_file(uri)
        if database is not None and str(database) != ":memory:":
            artifact_location = (database.resolve().parent / "mlartifacts").as_uri()
        elif uri.startswith("sqlite:") and run_dir is not None:  # in memory
            artifact_location = (Path(run_dir).resolve() / "mlartifacts").as_uri()
        try:
            client.create_experiment(name, artifact_location=artifact_location,
                                     tags={S.EXPERIMENT_KIND: S.MODEL_TRAINING})
        except mlflow.exceptions.MlflowException:
            pass  # another process created it between our lookup and create
        experiment = client.get_experiment_by_name(name)
    if experiment.lifecycle_stage == "deleted":  # MLflow refuses every run in it: the job logged nothing, exit 0
        raise ConfigError(f"MLflow experiment {name!r} at {redacted(uri)} is deleted: restore it (mlflow experiments "
                          f"restore --experiment-id {experiment.experiment_id}, with MLFLOW_TRACKING_URI set to that "
                          "store) or log into another (tracking.experiment=NAME)")
    if experiment.tags.get(S.EXPERIMENT_KIND) != S.MODEL_TRAINING:
        client.set_experiment_tag(experiment.experiment_id, S.EXPERIMENT_KIND, S.MODEL_TRAINING)
    return experiment.experiment_id


#: The address ``mlflow ui --host 127.0.0.1 --port 5000`` serves.
UI_ADDRESS = "http://127.0.0.1:5000"


def ui_url(experiment_id: str, address: str = UI_ADDRESS) -> str:
    """The MLflow UI's page of experiment ``experiment_id``'s runs table (tests/test_mlflow_ui.py opens
    it in headless Chromium), whatever view the browser had last."""
    return f"{address.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def experiment_id_of(uri: str, name: str) -> str:
    """The id of experiment ``name`` at ``uri``, or "" when there is no store (tracking off: ``uri`` "")
    or it cannot say (the job's summary then points at the UI's home page)."""
    if not uri:
        return ""
    import mlflow  # heavy: mlflow

    if (database := sqlite_file(uri)) is not None and not database.is_file():
        return ""  # nothing was logged; asking would create the file
    try:
        experiment = mlflow.MlflowClient(uri).get_experiment_by_name(name)
    except Exception:  # MLflow raises many types (HTTP, SQL, its own); the job has finished
        return ""
    return experiment.experiment_id if experiment is not None else ""
