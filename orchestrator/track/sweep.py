"""A finished sweep into MLflow: a parent run, a child per (model, task), a nested run per trial."""
from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from orchestrator.core.config import is_number
from orchestrator.core.reuse import content_key
from orchestrator.track import MAX_PARAMS_PER_BATCH, TrackingConfig, flat_params, log_params, start_tracking
from orchestrator.track import schema as S
from orchestrator.track.runs import MAX_METRICS_PER_BATCH, add_run_dir, code_tags, orphaned, started_run

log = logging.getLogger(__name__)



def sweep_fingerprint(config, model_tags: dict[str, dict[str, str]]) -> str:
    """What makes two sweeps the same sweep for MLflow: the resolved configuration and the
    models compared (names, directories, manifest hashes)."""
    return content_key({"config": config, "models": model_tags})


def _find_parent(experiment: str, fingerprint: str) -> str | None:
    import mlflow  # heavy: mlflow

    runs = mlflow.search_runs(experiment_names=[experiment], output_format="list",
                              filter_string=f"tags.`{S.SWEEP_FINGERPRINT}` = '{fingerprint}'",
                              order_by=["attributes.start_time ASC"])
    return runs[0].info.run_id if runs else None


def _children(parent_id: str) -> list:
    import mlflow  # heavy: mlflow

    exp = mlflow.get_run(parent_id).info.experiment_id
    return mlflow.search_runs(experiment_ids=[exp], output_format="list",
                              filter_string=f"tags.`{S.PARENT}` = '{parent_id}'")


def _delete_tree(run_id: str) -> None:
    """Mark a (model, task) run and its trial runs deleted (MLflow's soft delete); a run left
    RUNNING by a crash is ended KILLED first, so no run of the tree still looks live."""
    from mlflow.tracking import MlflowClient  # heavy: mlflow

    client = MlflowClient()
    for child in [*_children(run_id), client.get_run(run_id)]:
        if child.info.status == "RUNNING":
            client.set_terminated(child.info.run_id, "KILLED")
        client.delete_run(child.info.run_id)


def _complete(run, digest: str) -> bool:
    """A (model, task) run is complete when it carries this cell's digest, the marker set last
    (``_log_cell``), after its trial runs and the run itself have ended FINISHED."""
    return run.data.tags.get(S.CELL_DIGEST) == digest and run.info.status == "FINISHED"


def log_sweep(tracking: TrackingConfig, run_dir, *, name: str, config, results: dict, records: list[dict],
              model_tags: dict[str, dict[str, str]], artifacts: list, log_predictions: bool = True,
              exports: dict[str, dict[str, dict]] | None = None, selected: dict[str, dict] | None = None) -> str | None:
    """Driver-side MLflow logging of a finished sweep: a parent run, a child run per
    (model, task) with the selected setting, test mean/sd and (NER) per-tag scores, and a
    nested run per trial with per-epoch train loss and dev/test metrics (and its test
    predictions). Returns the parent id. Names: ``orchestrator.track.schema``.

    Re-running the same sweep (same ``sweep_fingerprint``) reuses its parent run: a (model,
    task) child whose cell and trials are unchanged and completely logged is kept as it is; a
    changed one, or one half-logged by a process that died, is replaced (the old child and its
    trial runs are ended KILLED if still RUNNING, and soft-deleted), so the parent never holds
    duplicates and every kept trial run is FINISHED with its metrics.
    ``exports`` (model -> task -> exports.json entry) tags each exported cell's run with where its
    fine-tuned model is (``S.EXPORT_DIR``, ``S.EXPORT_TRIAL``), kept children included. ``selected`` (trial id ->
    epoch, dev, test: ``sweep.selection.selected_answers``) marks the trials behind each cell's selected setting
    (``S.SELECTED_TRIAL``) with the scores the selection used (``S.SELECTED_EPOCH``, ``S.SELECTED_DEV``,
    ``S.SELECTED_TEST``); their ``dev`` and ``test`` are the last epoch's, MLflow's latest step (probe M9).
    A reopened parent gets a summary metric again only where its value changed (probe M13), and, when the run
    that was its parent is deleted, the active run as its parent (probe M10)."""
    if start_tracking(tracking, run_dir) is None:
        return None
    import mlflow  # heavy: mlflow
    from mlflow.tracking import MlflowClient  # heavy: mlflow

    by_cell: dict[tuple[str, str], list[dict]] = {}
    for rec in records:
        by_cell.setdefault((rec["trial"]["model_name"], rec["task"]), []).append(rec)
    task_of = {t["name"]: t for t in results["tasks"]}
    fingerprint = sweep_fingerprint(config, model_tags)
    existing = _find_parent(tracking.experiment, fingerprint)
    if existing:
        log.info("sweep: reusing MLflow parent run %s (sweep fingerprint %s)", existing, fingerprint)
    here = str(Path(run_dir).resolve())
    tags = {**code_tags(), S.KIND: S.KIND_SWEEP, S.SWEEP_FINGERPRINT: fingerprint, S.RUN_DIR: here}
    # under an experiment's run (active in this process) the sweep parent is its child
    nested = mlflow.active_run() is not None
    before = {}
    if existing:
        run = MlflowClient().get_run(existing)
        before = run.data.metrics
        if nested and orphaned(MlflowClient(), run):
            tags[S.PARENT] = mlflow.active_run().info.run_id
    with started_run(run_id=existing, run_name=None if existing else f"sweep:{name}", tags=tags,
                          nested=nested) as parent:
        if not existing:
            log_params(flat_params(config))
        if existing:  # the same sweep logged from another run directory: both find it
            add_run_dir(parent, here)
        summary = {S.summary_metric(model, key): value for model, row in results["summary"].items()
                   for key, value in row.items() if is_number(value, finite=False)}
        _log_batch(parent.info.run_id, metrics=[(k, v, 0) for k, v in summary.items() if not _same(before.get(k), v)])
        for path in artifacts:
            mlflow.log_artifact(str(path))
        old: dict[tuple[str, str], list] = {}
        for r in _children(parent.info.run_id) if existing else []:
            if r.data.tags.get(S.KIND) == S.KIND_MODEL_TASK:
                old.setdefault((r.data.tags.get(S.MODEL), r.data.tags.get(S.TASK)), []).append(r)
        cell_runs = {}
        for (model, task), recs in sorted(by_cell.items()):
            cell = results["cells"].get(model, {}).get(task)
            digest = _cell_digest(cell, recs)
            previous = old.get((model, task), [])
            kept = next((r for r in previous if _complete(r, digest)), None)
            for r in previous:  # a changed cell, or one half-logged when the logging process died
                if r is not kept:
                    _delete_tree(r.info.run_id)
            if kept is not None:
                cell_runs[(model, task)] = kept.info.run_id
                continue
            info = task_of[task]
            cell_runs[(model, task)] = _log_cell(
                model, task, cell, recs, info["metric"], digest,
                {S.KIND: S.KIND_MODEL_TASK, S.MODEL: model, S.TASK: task, S.GROUP: info["group"],
                 S.HIGHER_IS_BETTER: S.bool_tag(info["higher_is_better"]), **model_tags.get(model, {})},
                log_predictions, selected or {})
        _tag_exports(cell_runs, exports or {})
        return parent.info.run_id


def _tag_exports(cell_runs: dict[tuple[str, str], str], exports: dict[str, dict[str, dict]]) -> None:
    from mlflow.tracking import MlflowClient  # heavy: mlflow

    client = MlflowClient()
    for model, tasks in exports.items():
        for task, entry in tasks.items():
            run_id = cell_runs.get((model, task))
            if run_id is not None:
                client.set_tag(run_id, S.EXPORT_DIR, entry["dir"])
                client.set_tag(run_id, S.EXPORT_TRIAL, entry["trial_id"])


def _cell_digest(cell: dict | None, recs: list[dict]) -> str:
    return content_key({"cell": cell, "trials": sorted(r.get("fingerprint", r["trial_id"]) for r in recs)})


def _same(old: float | None, new: float) -> bool:
    return old is not None and (old == new or (math.isnan(old) and math.isnan(new)))


def _log_cell(model: str, task: str, cell: dict | None, recs: list[dict], metric: str, digest: str,
              tags: dict[str, str], log_predictions: bool, selected: dict[str, dict]) -> str:
    """Log one (model, task) run and its trial runs; its ``S.CELL_DIGEST`` is set last, once all of
    them have ended FINISHED: a run without it (the logging process died) is replaced by a re-run."""
    import mlflow  # heavy: mlflow
    from mlflow.tracking import MlflowClient  # heavy: mlflow

    with started_run(run_name=f"{model}/{task}", nested=True, tags=tags) as run:
        params, metrics = {S.MODEL: model, S.TASK: task, S.METRIC: metric}, []
        if cell:
            params.update({S.SELECTED_PREFIX + k: v for k, v in cell["selected"].items()})
            params.update({S.EDGE_PREFIX + k: v for k, v in (cell.get("edge") or {}).items()})
            metrics += [(k, v, 0) for k, v in ((S.TEST_MEAN, cell["mean"]), (S.TEST_SD, cell["sd"]),
                                               (S.DEV_MEAN, cell.get("dev_mean")), (S.N, cell.get("n")),
                                               (S.DEV_TIED, 1.0 if cell.get("dev_tied") else None),
                                               (S.TEST_SAMPLE, cell.get("test_sample")))
                        if v is not None]
            params.update(_per_seed(cell, metrics))
            metrics += [(f"{S.CUT_PREFIX}{split}{suffix}", c[key], 0) for split, c in (cell.get("cut") or {}).items()
                        for key, suffix in (("cut", ""), ("of", S.CUT_OF))]
            # an early-stopped cell's curve has dev only
            metrics += [(name, point[split], point["epoch"]) for point in cell["curve"]
                        for split, name in (("dev", S.CURVE_DEV), ("test", S.CURVE_TEST)) if split in point]
            metrics += [(S.per_tag_metric(tag, k), v, 0) for tag, row in (cell.get("per_tag") or {}).items()
                        for k, v in row.items()]
        _log_batch(run.info.run_id, params, metrics)
        if cell:
            if cell.get("per_tag"):
                mlflow.log_dict(cell["per_tag"], "per_tag.json")
            mlflow.log_dict(cell, "selection.json")
        for rec in sorted(recs, key=lambda r: r["trial_id"]):
            _log_trial(rec, tags, log_predictions, selected.get(rec["trial_id"]) if cell else None)
    MlflowClient().set_tag(run.info.run_id, S.CELL_DIGEST, digest)
    return run.info.run_id


def _per_seed(cell: dict, metrics: list) -> dict[str, str]:
    """A cell's test score per seed (per fold), added to ``metrics``, and its seeds as a param, for a report
    rebuilt from metrics alone (its paired differences need them: ``report.mlflow_results``)."""
    scores, seeds = cell.get("test_scores") or [], json.dumps(cell.get("seeds") or [])
    if not scores or None in scores or len(seeds) > 500:  # 500: the longest param value this project logs
        return {}
    metrics += [(S.TEST_SCORE, float(score), step) for step, score in enumerate(scores)]
    metrics += [(S.FOLDS, float(cell["folds"]), 0)] if cell.get("folds") else []
    return {S.SEEDS: seeds}


def _log_batch(run_id: str, params: dict | None = None, metrics: list[tuple] = ()) -> None:
    """A run's params and (key, value, step) metrics in as few calls as MLflow takes (``log_batch``: at most 100
    params and 1000 entries a call): one per epoch and per kind made logging a 70-run sweep take 37 s (probe M12)."""
    from mlflow.entities import Metric, Param  # heavy: mlflow
    from mlflow.tracking import MlflowClient  # heavy: mlflow

    now = int(time.time() * 1000)
    todo_params = [Param(k, str(v)) for k, v in (params or {}).items()]
    todo_metrics = [Metric(k, v, now, step) for k, v, step in metrics]
    client = MlflowClient()
    while todo_params or todo_metrics:
        batch_params, todo_params = todo_params[:MAX_PARAMS_PER_BATCH], todo_params[MAX_PARAMS_PER_BATCH:]
        room = MAX_METRICS_PER_BATCH - len(batch_params)
        client.log_batch(run_id, metrics=todo_metrics[:room], params=batch_params)
        todo_metrics = todo_metrics[room:]


def _log_trial(rec: dict, tags: dict[str, str], log_predictions: bool, selected: dict | None) -> None:
    """One trial's run: its params and every metric in one ``log_batch`` (two past 100 params), its predictions.
    Its params ``model`` and ``task`` are those of its (model, task) run, so one ``search_runs`` filter finds both
    (the trial's own ``task``, the file stem, is ``task_stem``; probe M8)."""
    import mlflow  # heavy: mlflow

    params = {k: v for k, v in rec["trial"].items() if k not in ("model_dir", "data_dir", "task")}
    params.update({S.MODEL: rec["trial"]["model_name"], S.TASK: rec["task"]})
    if "task" in rec["trial"]:
        params[S.TASK_STEM] = rec["trial"]["task"]
    tags = {**tags, S.KIND: S.KIND_TRIAL, S.SELECTED_TRIAL: S.bool_tag(selected is not None)}
    with started_run(run_name=rec["trial_id"], nested=True, tags=tags) as run:
        metrics = [(k, v, row["epoch"]) for row in rec["epochs"] for k, v in row.items() if k != "epoch"]
        if selected is not None:
            metrics += [(S.SELECTED_EPOCH, selected["epoch"], 0), (S.SELECTED_DEV, selected["dev"], 0),
                        (S.SELECTED_TEST, selected["test"], 0)]
        metrics.append(("seconds", rec["seconds"], 0))
        if "early_stopping" in rec:  # its test metric sits at the step of the best dev epoch
            metrics += [(S.BEST_EPOCH, rec["early_stopping"]["best_epoch"], 0),
                        (S.STOPPED_EPOCH, rec["early_stopping"]["stopped_epoch"], 0)]
        _log_batch(run.info.run_id, flat_params(params), metrics)
        if log_predictions and rec.get("predictions"):
            mlflow.log_dict({"test_ids": rec.get("test_ids"), "by_epoch": rec["predictions"]}, "predictions.json")
