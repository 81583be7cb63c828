"""``jobs/retrieval.py``: cross-lingual retrieval of an encoder not fine-tuned (seed 002, Table 6).

    run(RetrievalConfig(models={"minilm": dir}, texts={"en": "xquad.en.json", "de": "xquad.de.json"}))

The evaluation itself (parallel text read and aligned, one Ray task per model and language side,
precision@k, the tables, one MLflow run per model) is ``orchestrator.retrieval.stage.retrieval_stage``,
which an experiment's ``retrieval:`` section runs too. This module adds what the job alone needs: its
run directory, MLflow store and Ray address (``RetrievalConfig``), its dry run and its printed result.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from orchestrator.core.config import field
from orchestrator.core.console import LOG_PATH
from orchestrator.core.errors import ConfigError
from orchestrator.core.reuse import made_under_at, reusable
from orchestrator.retrieval.config import RetrievalSpec
from orchestrator.retrieval.stage import (
    STAGE,
    TABLE_HTML,
    TABLE_MD,
    check_model,
    load_sets,
    plan_sets,
    retrieval_key,
    retrieval_stage,
    scores_only,
)
from orchestrator.retrieval.table import RESULTS, render_text
from orchestrator.track import TrackingConfig, effective_uri, ui_command
from orchestrator.track.caller import mlflow_state_kept


@dataclasses.dataclass(frozen=True)
class RetrievalConfig(RetrievalSpec):
    run_dir: str = field("runs/retrieval", help="run directory: retrieval/ (results.json, table.{txt,md,html}, "
                                                "manifest.json; reused when models, text and settings are unchanged) "
                                                "and the MLflow store mlflow.db")
    tracking: TrackingConfig = field(default_factory=TrackingConfig, help="MLflow tracking")
    ray_address: str = field("", help="Ray cluster address; empty = RAY_ADDRESS or a cluster head if present, else an "
                                      "embedded local Ray on 127.0.0.1")
    num_cpus: int = field(0, help="CPUs for the embedded local Ray (0 = all)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_cpus < 0:
            raise ConfigError(f"num_cpus must be >= 0 (0 = all), got {self.num_cpus}")


@dataclasses.dataclass(frozen=True)
class RetrievalResult:
    out_dir: Path
    results: dict
    tracking_uri: str

    def summary(self) -> str:
        lines = [render_text(self.results).rstrip("\n"), "", f"tables  : {self.out_dir / TABLE_MD}, "
                                                               f"{self.out_dir / TABLE_HTML}",
                 f"results : {self.out_dir / RESULTS}"]
        if self.tracking_uri:
            lines.append(f"MLflow  : {ui_command(self.tracking_uri)}")
        lines.append(json.dumps(scores_only(self.results), sort_keys=False))
        return "\n".join(lines)


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: RetrievalConfig) -> RetrievalResult:
    """``python jobs/retrieval.py``: every model on every language pair; the table printed, then the scores as JSON."""
    run_dir = Path(cfg.run_dir).resolve()
    out, results = retrieval_stage(cfg, cfg.models, lambda key: run_dir / STAGE, cfg.tracking, run_dir,
                                   ray_address=cfg.ray_address or None, num_cpus=cfg.num_cpus or None,
                                   log_file=run_dir / LOG_PATH)
    uri = effective_uri(cfg.tracking, run_dir) if cfg.tracking.enabled else ""
    return RetrievalResult(out, results, uri)


def plan(cfg: RetrievalConfig) -> str:
    """Dry run: models hold a config, weights and a tokenizer; every text file parses and the sides align."""
    if not cfg.models:
        raise ConfigError("retrieval: no models: give --model NAME=DIR (models.NAME=DIR)")
    if not cfg.enabled:
        raise ConfigError("retrieval: no text: give --text LANG=FILE twice or more, or --pair SRC-TGT=FILE.tsv")
    lines = []
    for name, path in cfg.models.items():
        info = check_model(name, path)
        lines.append(f"model {name}: {path} ({info['model_type']}, {info['layers']} layers, hidden {info['hidden']}, "
                     f"{info['max_position_embeddings']} positions)")
    sets = load_sets(cfg)
    lines += plan_sets(cfg, sets)
    run_dir = Path(cfg.run_dir).resolve()
    reused = reusable(run_dir / STAGE, retrieval_key(cfg, cfg.models))
    state = "reused" + made_under_at(run_dir / STAGE) if reused else "build"
    sides = sum(len(s.languages) for s in sets)
    lines.append(f"output: {run_dir / STAGE} ({state}); {len(cfg.models) * sides} embedding task(s) on Ray")
    return "\n".join(lines)
