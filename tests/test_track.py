"""MLflow wiring: a local store keeps its artifacts in the run directory, and MLflow trouble never
stops or stalls training (issue 12)."""
from __future__ import annotations

import logging
import os
import time

import mlflow
import pytest

from orchestrator.track.experiments import ensure_experiment


def test_local_store_artifacts_stay_in_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where MLflow's default ./mlruns would otherwise go
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    uri = f"sqlite:///{run_dir / 'mlflow.db'}"
    exp_id = ensure_experiment(uri, "bioptorch", run_dir)
    assert ensure_experiment(uri, "bioptorch", run_dir) == exp_id  # idempotent
    client = mlflow.MlflowClient(uri)
    # the MLflow UI opens a model-training experiment on its runs, not on the GenAI traces overview
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"
    older = client.create_experiment("made-elsewhere")
    ensure_experiment(uri, "made-elsewhere", run_dir)
    assert client.get_experiment(older).tags["mlflow.experimentKind"] == "custom_model_development"
    run = client.create_run(exp_id)
    client.log_text(run.info.run_id, "hello", "note.txt")
    assert (run_dir / "mlartifacts" / run.info.run_id / "artifacts" / "note.txt").read_text() == "hello"
    assert not (tmp_path / "mlruns").exists()


# --------------------------------------------------------------------------- MLflow as a side channel
def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens once the socket is closed


@pytest.fixture
def fast_failing_mlflow(monkeypatch):
    """MLflow's HTTP client retries for minutes by default; the tests do not wait for that."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")


def test_an_unreachable_server_falls_back_to_the_run_directory_store_with_one_warning(tmp_path, caplog):
    from orchestrator.track import TrackingConfig, effective_uri, local_uri, probe

    url = f"http://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    assert "refused" in probe(url).lower()
    tracking = TrackingConfig(tracking_uri=url)
    with caplog.at_level(logging.WARNING, logger="orchestrator.track"):
        assert effective_uri(tracking, tmp_path) == local_uri(tmp_path)
        assert effective_uri(tracking, tmp_path) == local_uri(tmp_path)  # decided once per process
    assert time.monotonic() - start < 10
    warnings = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(warnings) == 1 and "mlflow ui --backend-store-uri" in warnings[0].getMessage()


def test_user_mlflow_tracking_uri_is_honoured(tmp_path):
    """$MLFLOW_TRACKING_URI set by the user (read once when the job starts) is the store when the
    config names none (issue 12: it was ignored)."""
    import subprocess
    import sys

    from conftest import ROOT

    store = f"sqlite:///{tmp_path / 'mine.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, str(ROOT / "jobs" / "blue_sweep.py"), "--dry-run",
                          f"runs_root={tmp_path / 'runs'}"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"tracking: {store} (experiment 'bioptorch') answers" in res.stdout


def test_a_logger_whose_server_is_gone_warns_once_keeps_the_metrics_and_sends_them_later(
        tmp_path, caplog, fast_failing_mlflow):
    from orchestrator.track.runs import RankZeroLogger, replay_pending

    pending = tmp_path / "mlflow_pending.jsonl"
    down = RankZeroLogger({"uri": f"http://127.0.0.1:{_closed_port()}", "run_id": "r", "pending": str(pending)},
                          retry_s=0.0)
    with caplog.at_level(logging.WARNING, logger="orchestrator.track.runs"):
        for step in range(1, 4):
            down.log({"loss": 10.0 - step, "lr": 1e-3}, step)  # never raises
        down.close()
    assert len([r for r in caplog.records if "logging to run r failed" in r.getMessage()]) == 1
    assert len(pending.read_text().splitlines()) == 6
    # the store answers again: the kept metrics go to the run
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = mlflow.MlflowClient(uri).create_run(ensure_experiment(uri, "x", tmp_path))
    assert replay_pending({"uri": uri, "run_id": run.info.run_id, "pending": str(pending)}) == 6
    history = mlflow.MlflowClient(uri).get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 9.0), (2, 8.0), (3, 7.0)]
    assert not pending.exists()
