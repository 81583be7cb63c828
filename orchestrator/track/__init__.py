"""MLflow wiring: tracking config shared by every stage (rank 0 / driver only)."""
from __future__ import annotations

from dataclasses import dataclass

from orchestrator.core.config import field


@dataclass(frozen=True)
class TrackingConfig:
    tracking_uri: str = field("", help="MLflow tracking URI; empty = sqlite:///<run_dir>/mlflow.db "
                                       "(a remote server, e.g. http://head:5000, on a cluster)")
    experiment: str = field("bioptorch", help="MLflow experiment name")
    enabled: bool = field(True, help="log to MLflow at all")

    def resolve_uri(self, run_dir) -> str:
        from pathlib import Path

        if self.tracking_uri:
            return self.tracking_uri
        return f"sqlite:///{(Path(run_dir) / 'mlflow.db').resolve()}"
