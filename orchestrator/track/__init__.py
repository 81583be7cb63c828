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

    uri = tracking.resolve_uri(run_dir)
    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(tracking.experiment)
    return uri


def log_sweep(tracking: TrackingConfig, run_dir, *, name: str, config, results: dict, records: list[dict],
              model_tags: dict[str, dict[str, str]], artifacts: list, log_predictions: bool = True) -> str | None:
    """Driver-side MLflow logging of a finished sweep: a parent run, a child run per
    (model, task) with the selected setting and test mean/sd, and a nested run per trial with
    per-epoch train loss and dev/test metrics (and its test predictions). Returns the parent id."""
    if start_tracking(tracking, run_dir) is None:
        return None
    import mlflow

    from orchestrator.core.manifest import git_commit

    by_cell: dict[tuple[str, str], list[dict]] = {}
    for rec in records:
        by_cell.setdefault((rec["trial"]["model_name"], rec["task"]), []).append(rec)
    metric_of = {t["name"]: t["metric"] for t in results["tasks"]}
    with mlflow.start_run(run_name=f"sweep:{name}", tags={"git_commit": git_commit() or "unknown",
                                                          "orchestrator.kind": "sweep"}) as parent:
        log_params(flat_params(config))
        for model, summary in results["summary"].items():
            for key, value in summary.items():
                if value is not None:
                    mlflow.log_metric(f"{model}.{key}", value)
        for path in artifacts:
            mlflow.log_artifact(str(path))
        for (model, task), recs in sorted(by_cell.items()):
            cell = results["cells"].get(model, {}).get(task)
            tags = {"orchestrator.kind": "model_task", "model": model, "task": task, **model_tags.get(model, {})}
            with mlflow.start_run(run_name=f"{model}/{task}", nested=True, tags=tags):
                mlflow.log_params({"model": model, "task": task, "metric": metric_of.get(task, "")})
                if cell:
                    mlflow.log_params({"selected.learning_rate": cell["selected"]["learning_rate"],
                                       "selected.epochs": cell["selected"]["epochs"]})
                    mlflow.log_metrics({"test_mean": cell["mean"], "test_sd": cell["sd"], "dev_mean": cell["dev_mean"]})
                    for point in cell["curve"]:
                        mlflow.log_metrics({"curve.dev": point["dev"], "curve.test": point["test"]},
                                           step=point["epoch"])
                    mlflow.log_dict(cell, "selection.json")
                for rec in sorted(recs, key=lambda r: r["trial_id"]):
                    _log_trial(rec, tags, log_predictions)
        return parent.info.run_id


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
