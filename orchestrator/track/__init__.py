"""MLflow wiring, for every stage: the tracking config, and the helpers every writer shares.

Logging happens from the driver or from rank 0 only. ``sweep`` logs a finished sweep,
``runs`` a stage's own run (pretraining), ``schema`` names everything they write.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.config import field, flatten
from orchestrator.track.experiments import ensure_experiment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrackingConfig:
    tracking_uri: str = field("", help="MLflow tracking URI; empty = sqlite:///<run_dir>/mlflow.db "
                                       "(a server, e.g. http://head:5000, on a cluster)")
    experiment: str = field("bioptorch", help="MLflow experiment name")
    enabled: bool = field(True, help="log to MLflow at all")

    def resolve_uri(self, run_dir) -> str:

        # Deliberately not $MLFLOW_TRACKING_URI: mlflow.set_tracking_uri() exports it, so any
        # earlier stage in this process would silently redirect the next run's store.
        if self.tracking_uri:
            return self.tracking_uri
        return f"sqlite:///{(Path(run_dir) / 'mlflow.db').resolve()}"


# ------------------------------------------------------------------------------------ helpers
MAX_PARAM_VALUE = 500  # MLflow 3 allows 6000 chars; shorter keeps the UI readable
MAX_PARAMS_PER_BATCH = 100  # MLflow's log_batch limit


def flat_params(data, prefix: str = "") -> dict[str, str]:
    """Nested config -> {'a.b': 'value'} within MLflow's key and value limits."""
    out = {}
    for key, value in flatten(data, prefix).items():
        text = str(value)
        out[key[:250]] = text if len(text) <= MAX_PARAM_VALUE else text[:MAX_PARAM_VALUE - 3] + "..."
    return out


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

    uri = tracking.resolve_uri(run_dir)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=ensure_experiment(uri, tracking.experiment, run_dir))
    return uri
