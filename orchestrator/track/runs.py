"""A stage's own MLflow run: created by the driver, written to by rank 0 of the training workers.

    info = start_stage_run(tracking, run_dir, stage="pretrain", params=cfg, marker=out_dir / "mlflow_run.json")
    logger = RankZeroLogger(info if rank == 0 else None)      # in every Ray Train worker
    logger.log({"loss": 2.1}, step=10)
    end_stage_run(info)

The run id is kept in ``marker`` beside the stage's output, so a resumed stage keeps logging into
the run it started. Other ranks get a logger that does nothing.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from orchestrator.core.config import flatten, to_dict
from orchestrator.core.manifest import atomic_write_json
from orchestrator.track import TrackingConfig
from orchestrator.track import schema as S
from orchestrator.track.experiments import ensure_experiment


def start_stage_run(tracking: TrackingConfig | None, run_dir: Path, *, stage: str, params: Any,
                    marker: Path) -> dict | None:
    """Create (or reopen, on resume) the stage's run; returns {uri, run_id}, or None when tracking is off.

    The run is a child of the run active in this process when it starts (e.g. an experiment's)."""
    if tracking is None or not tracking.enabled:
        return None
    import mlflow  # heavy: mlflow
    from mlflow.exceptions import MlflowException

    uri = tracking.resolve_uri(run_dir)
    mlflow.set_tracking_uri(uri)
    client = mlflow.MlflowClient(uri)
    experiment_id = ensure_experiment(uri, tracking.experiment, run_dir)
    if marker.is_file():
        run_id = json.loads(marker.read_text())["run_id"]
        try:
            client.get_run(run_id)
            return {"uri": uri, "run_id": run_id}
        except MlflowException:
            pass
    tags = {S.KIND: stage}
    parent = mlflow.active_run()
    if parent is not None:
        tags[S.PARENT] = parent.info.run_id
    run = client.create_run(experiment_id, run_name=stage, tags=tags)
    for key, value in flatten(to_dict(params)).items():
        client.log_param(run.info.run_id, key[:250], str(value)[:500])
    atomic_write_json(marker, {"run_id": run.info.run_id, "uri": uri})
    return {"uri": uri, "run_id": run.info.run_id}


def end_stage_run(info: dict | None, status: str = "FINISHED") -> None:
    if info:
        import mlflow  # heavy: mlflow

        mlflow.MlflowClient(info["uri"]).set_terminated(info["run_id"], status=status)


class RankZeroLogger:
    """Metrics into a stage's run from one worker; a logger built with ``None`` does nothing."""

    def __init__(self, info: dict | None):
        self.active = False
        if not info:
            return
        import mlflow  # heavy: mlflow

        self.client = mlflow.MlflowClient(info["uri"])
        self.run_id = info["run_id"]
        self.active = True

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.active:
            return
        from mlflow.entities import Metric  # heavy: mlflow

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in metrics.items()
                                                    if v is not None and math.isfinite(float(v))])
