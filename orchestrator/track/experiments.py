"""Experiments that keep their artifacts with the run.

MLflow's default artifact root for a SQLite store is ./mlruns under the *current directory*, so
artifacts of a run directory's store would land wherever the job was started. A local store gets
its artifacts in <run_dir>/mlartifacts; a remote server keeps its own artifact root.
"""
from __future__ import annotations

from pathlib import Path


def ensure_experiment(uri: str, name: str, run_dir: str | Path | None) -> str:
    """The id of experiment ``name`` at ``uri``, created (artifacts beside a local store) if absent."""
    import mlflow  # heavy: mlflow

    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    artifact_location = None
    if uri.startswith("sqlite:") and run_dir is not None:
        artifact_location = (Path(run_dir).resolve() / "mlartifacts").as_uri()
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except mlflow.exceptions.MlflowException:
        # Another process created it between our lookup and create.
        return client.get_experiment_by_name(name).experiment_id
