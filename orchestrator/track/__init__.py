"""MLflow wiring: tracking config shared by every stage (rank 0 / driver only)."""
from __future__ import annotations

import logging
from dataclasses import dataclass

from orchestrator.core.config import field

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrackingConfig:
    tracking_uri: str = field("", help="MLflow tracking URI; empty = sqlite:///<run_dir>/mlflow.db "
                                       "(a server, e.g. http://head:5000, on a cluster)")
    experiment: str = field("bioptorch", help="MLflow experiment name")
    enabled: bool = field(True, help="log to MLflow at all")

    def resolve_uri(self, run_dir) -> str:
        from pathlib import Path

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
    from orchestrator.core.config import flatten

    out = {}
    for key, value in flatten(data, prefix).items():
        text = str(value)
        out[key[:250]] = text if len(text) <= MAX_PARAM_VALUE else text[:MAX_PARAM_VALUE - 3] + "..."
    return out


def log_params(params: dict[str, str]) -> None:
    import mlflow

    items = list(params.items())
    for start in range(0, len(items), MAX_PARAMS_PER_BATCH):
        mlflow.log_params(dict(items[start:start + MAX_PARAMS_PER_BATCH]))


def start_tracking(tracking: TrackingConfig, run_dir) -> str | None:
    """Point MLflow at the configured store (SQLite in the run directory by default) and make
    sure the experiment exists; returns the URI, or None when tracking is disabled."""
    if not tracking.enabled:
        return None
    import mlflow

    from orchestrator.track.experiments import ensure_experiment

    uri = tracking.resolve_uri(run_dir)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment_id=ensure_experiment(uri, tracking.experiment, run_dir))
    return uri


def sweep_fingerprint(config, model_tags: dict[str, dict[str, str]]) -> str:
    """What makes two sweeps the same sweep for MLflow: the resolved configuration and the
    models compared (names, directories, manifest hashes)."""
    import hashlib
    import json

    blob = json.dumps({"config": config, "models": model_tags}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _metric_key(text: str) -> str:
    """MLflow metric names allow letters, digits, _ - . / and spaces."""
    import re

    return re.sub(r"[^A-Za-z0-9_./ -]+", "_", text)


def _find_parent(experiment: str, fingerprint: str) -> str | None:
    import mlflow

    runs = mlflow.search_runs(experiment_names=[experiment], output_format="list",
                              filter_string=f"tags.`orchestrator.sweep_fingerprint` = '{fingerprint}'",
                              order_by=["attributes.start_time ASC"])
    return runs[0].info.run_id if runs else None


def _children(parent_id: str) -> list:
    import mlflow

    exp = mlflow.get_run(parent_id).info.experiment_id
    return mlflow.search_runs(experiment_ids=[exp], output_format="list",
                              filter_string=f"tags.mlflow.parentRunId = '{parent_id}'")


def _delete_tree(run_id: str) -> None:
    """Mark a (model, task) run and its trial runs deleted (MLflow's soft delete)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    for child in _children(run_id):
        client.delete_run(child.info.run_id)
    client.delete_run(run_id)


def log_sweep(tracking: TrackingConfig, run_dir, *, name: str, config, results: dict, records: list[dict],
              model_tags: dict[str, dict[str, str]], artifacts: list, log_predictions: bool = True) -> str | None:
    """Driver-side MLflow logging of a finished sweep: a parent run, a child run per
    (model, task) with the selected setting, test mean/sd and (NER) per-tag scores, and a
    nested run per trial with per-epoch train loss and dev/test metrics (and its test
    predictions). Returns the parent id.

    Re-running the same sweep (same ``sweep_fingerprint``) reuses its parent run: a (model,
    task) child whose cell and trials are unchanged is kept as it is; a changed one is replaced
    (the old child and its trial runs are soft-deleted), so the parent never holds duplicates."""
    if start_tracking(tracking, run_dir) is None:
        return None
    import mlflow

    from orchestrator.core.manifest import git_commit

    by_cell: dict[tuple[str, str], list[dict]] = {}
    for rec in records:
        by_cell.setdefault((rec["trial"]["model_name"], rec["task"]), []).append(rec)
    metric_of = {t["name"]: t["metric"] for t in results["tasks"]}
    fingerprint = sweep_fingerprint(config, model_tags)
    existing = _find_parent(tracking.experiment, fingerprint)
    if existing:
        log.info("sweep: reusing MLflow parent run %s (sweep fingerprint %s)", existing, fingerprint)
    tags = {"git_commit": git_commit() or "unknown", "orchestrator.kind": "sweep",
            "orchestrator.sweep_fingerprint": fingerprint}
    with mlflow.start_run(run_id=existing, run_name=None if existing else f"sweep:{name}", tags=tags) as parent:
        if not existing:
            log_params(flat_params(config))
        for model, summary in results["summary"].items():
            for key, value in summary.items():
                if value is not None:
                    mlflow.log_metric(_metric_key(f"{model}.{key}"), value)
        for path in artifacts:
            mlflow.log_artifact(str(path))
        old = {(r.data.tags.get("model"), r.data.tags.get("task")): r for r in _children(parent.info.run_id)
               if r.data.tags.get("orchestrator.kind") == "model_task"} if existing else {}
        for (model, task), recs in sorted(by_cell.items()):
            cell = results["cells"].get(model, {}).get(task)
            digest = _cell_digest(cell, recs)
            previous = old.get((model, task))
            if previous is not None and previous.data.tags.get("orchestrator.cell_digest") == digest:
                continue
            if previous is not None:
                _delete_tree(previous.info.run_id)
            _log_cell(model, task, cell, recs, metric_of.get(task, ""), digest,
                      {"orchestrator.kind": "model_task", "model": model, "task": task, **model_tags.get(model, {})},
                      log_predictions)
        return parent.info.run_id


def _cell_digest(cell: dict | None, recs: list[dict]) -> str:
    import hashlib
    import json

    blob = json.dumps({"cell": cell, "trials": sorted(r.get("fingerprint", r["trial_id"]) for r in recs)},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _log_cell(model: str, task: str, cell: dict | None, recs: list[dict], metric: str, digest: str,
              tags: dict[str, str], log_predictions: bool) -> None:
    import mlflow

    with mlflow.start_run(run_name=f"{model}/{task}", nested=True, tags={**tags, "orchestrator.cell_digest": digest}):
        mlflow.log_params({"model": model, "task": task, "metric": metric})
        if cell:
            mlflow.log_params({"selected.learning_rate": cell["selected"]["learning_rate"],
                               "selected.epochs": cell["selected"]["epochs"]})
            mlflow.log_metrics({"test_mean": cell["mean"], "test_sd": cell["sd"], "dev_mean": cell["dev_mean"]})
            for point in cell["curve"]:
                mlflow.log_metrics({"curve.dev": point["dev"], "curve.test": point["test"]}, step=point["epoch"])
            if cell.get("per_tag"):
                mlflow.log_metrics({_metric_key(f"per_tag.{tag}.{k}"): v for tag, row in cell["per_tag"].items()
                                    for k, v in row.items()})
                mlflow.log_dict(cell["per_tag"], "per_tag.json")
            mlflow.log_dict(cell, "selection.json")
        for rec in sorted(recs, key=lambda r: r["trial_id"]):
            _log_trial(rec, tags, log_predictions)


def _log_trial(rec: dict, tags: dict[str, str], log_predictions: bool) -> None:
    import mlflow

    trial = rec["trial"]
    with mlflow.start_run(run_name=rec["trial_id"], nested=True, tags={**tags, "orchestrator.kind": "trial"}):
        log_params(flat_params({k: v for k, v in trial.items() if k not in ("model_dir", "data_dir")}))
        for row in rec["epochs"]:
            mlflow.log_metrics({k: v for k, v in row.items() if k != "epoch"}, step=row["epoch"])
        mlflow.log_metrics({"seconds": rec["seconds"]})
        if log_predictions and rec.get("predictions"):
            mlflow.log_dict(rec["predictions"], "predictions.json")
