"""A local MLflow store keeps its artifacts inside the run directory, not in ./mlruns."""
from __future__ import annotations

import mlflow

from orchestrator.track.experiments import ensure_experiment


def test_local_store_artifacts_stay_in_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where MLflow's default ./mlruns would otherwise go
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    uri = f"sqlite:///{run_dir / 'mlflow.db'}"
    exp_id = ensure_experiment(uri, "bioptorch", run_dir)
    assert ensure_experiment(uri, "bioptorch", run_dir) == exp_id  # idempotent
    client = mlflow.MlflowClient(uri)
    run = client.create_run(exp_id)
    client.log_text(run.info.run_id, "hello", "note.txt")
    assert (run_dir / "mlartifacts" / run.info.run_id / "artifacts" / "note.txt").read_text() == "hello"
    assert not (tmp_path / "mlruns").exists()
