"""Rebuild a sweep's ``results.json`` document from MLflow alone, and render the report from it.

This module reads; it never trains. It imports mlflow and ``orchestrator.report`` only (plus the
core error type), so a dashboard host needs no GPU stack and no access to the run directory
beyond the tracking store.

How a sweep is found and read (the contract with ``orchestrator.track.log_sweep``):

1. The sweep's parent run is the newest run of the experiment tagged
   ``orchestrator.kind = sweep`` (or the run named by ``run_id``).
2. Its ``results.json`` artifact (at the artifact root or in a sub-folder) is the document,
   taken as is.
3. Without that artifact, the document is rebuilt from the parent's direct child runs, one per
   (model, task), tagged ``model`` and ``task``, with param ``metric``, metrics ``test_mean``,
   ``test_sd``, ``dev_mean``, params ``selected.*`` and per-epoch ``curve.dev`` / ``curve.test``
   (step = epoch). A task's group and direction come from tags ``group`` and
   ``higher_is_better`` when logged, else from seed 000's BLUE grouping and the metric's name.
   The parent's ``<model>.total|clinical|biomedical`` metrics are used when present; otherwise
   they are the macro averages of the task means, as seed 000 defines them.
"""
from __future__ import annotations

import json
import logging
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.errors import InputError, OrchestratorError
from orchestrator.report.blue_table import GROUPS, validate_results, write_report

log = logging.getLogger(__name__)

KIND_TAG = "orchestrator.kind"
SWEEP_KIND = "sweep"
MODEL_TAG, TASK_TAG, GROUP_TAG, HIB_TAG = "model", "task", "group", "higher_is_better"
RESULTS_ARTIFACT = "results.json"
# Seed 000 (Tables 6, 7, A3): the clinical tasks of BLUE; every other BLUE task is biomedical.
CLINICAL_TASKS = frozenset({"medsts", "share/clefe", "shareclefe", "share-clefe", "i2b2", "i2b2-2010", "i2b2_2010",
                            "i2b2 2010", "mednli"})
LOWER_IS_BETTER = ("loss", "error", "mae", "mse", "rmse", "perplexity")


@dataclass(frozen=True)
class SweepResults:
    """A results document and where it came from (``source``: "artifact" or "metrics")."""

    results: dict
    run_id: str
    source: str
    tracking_uri: str


def default_tracking_uri(run_dir: str | Path) -> str:
    """The laptop default store of a run directory: ``sqlite:///<run_dir>/mlflow.db``."""
    return f"sqlite:///{(Path(run_dir) / 'mlflow.db').resolve()}"


def find_sweep_run(client, experiment: str, run_id: str | None = None):
    """The sweep's parent run: ``run_id`` if given, else the newest run tagged ``orchestrator.kind=sweep``."""
    if run_id:
        return client.get_run(run_id)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        raise OrchestratorError(f"MLflow experiment {experiment!r} not found at {client.tracking_uri} "
                                f"(experiments there: {', '.join(names) or 'none'})")
    runs = client.search_runs([exp.experiment_id], filter_string=f"tags.`{KIND_TAG}` = '{SWEEP_KIND}'",
                              order_by=["attributes.start_time DESC"], max_results=1)
    if not runs:
        raise OrchestratorError(f"experiment {experiment!r} at {client.tracking_uri} has no run tagged "
                                f"{KIND_TAG}={SWEEP_KIND}: has a sweep been logged there?")
    return runs[0]


def find_artifact(client, run_id: str, name: str = RESULTS_ARTIFACT, path: str | None = None,
                  depth: int = 3) -> str | None:
    """Artifact path of a file called ``name``: at this level first, then up to ``depth`` folders down."""
    entries = client.list_artifacts(run_id, path)
    for entry in entries:
        if not entry.is_dir and Path(entry.path).name == name:
            return entry.path
    if depth == 0:
        return None
    for entry in entries:
        if entry.is_dir:
            found = find_artifact(client, run_id, name, entry.path, depth - 1)
            if found:
                return found
    return None


def load_results(tracking_uri: str, experiment: str = "bioptorch", run_id: str | None = None) -> SweepResults:
    """The results document of a sweep, from its artifact or else from its child runs' metrics."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    parent = find_sweep_run(client, experiment, run_id)
    pid = parent.info.run_id
    artifact = find_artifact(client, pid)
    if artifact:
        with tempfile.TemporaryDirectory() as tmp:
            local = Path(client.download_artifacts(pid, artifact, tmp))
            try:
                results = json.loads(local.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise InputError(f"{tracking_uri} run {pid} artifact {artifact}", f"invalid JSON: {exc.msg}",
                                 line=exc.lineno, expected="the results.json document") from None
        validate_results(results, f"{tracking_uri} run {pid} artifact {artifact}")
        return SweepResults(results, pid, "artifact", tracking_uri)
    log.info("run %s has no %s artifact: rebuilding from child-run metrics", pid, RESULTS_ARTIFACT)
    results = results_from_children(client, parent)
    return SweepResults(results, pid, "metrics", tracking_uri)


def results_from_children(client, parent) -> dict:
    """Rebuild the results document from the (model, task) child runs of ``parent``."""
    pid = parent.info.run_id
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.`mlflow.parentRunId` = '{pid}'",
                                  max_results=5000)
    where = f"{client.tracking_uri} run {pid}"
    models: list[str] = []
    tasks: dict[str, dict] = {}
    cells: dict[str, dict[str, dict]] = {}
    for child in sorted(children, key=lambda r: r.info.start_time or 0):
        tags, metrics, params = child.data.tags, child.data.metrics, child.data.params
        if MODEL_TAG not in tags or TASK_TAG not in tags or "test_mean" not in metrics:
            continue
        model, task = tags[MODEL_TAG], tags[TASK_TAG]
        if model not in models:
            models.append(model)
        if task not in tasks:
            metric = params.get("metric", tags.get("metric", ""))
            tasks[task] = {"name": task, "metric": metric, "group": _group(task, tags.get(GROUP_TAG), where),
                           "higher_is_better": _higher_is_better(metric, tags.get(HIB_TAG))}
        cells.setdefault(model, {})[task] = {
            "mean": metrics["test_mean"], "sd": metrics.get("test_sd"),
            "n": int(metrics["n"]) if "n" in metrics else None, "dev_mean": metrics.get("dev_mean"),
            "selected": {k.split(".", 1)[1]: _number(v) for k, v in params.items() if k.startswith("selected.")},
            "curve": _curve(client, child.info.run_id),
        }
    if not cells:
        raise InputError(where, "no results.json artifact and no child run carrying "
                                f"{MODEL_TAG!r}/{TASK_TAG!r} tags and a test_mean metric",
                         expected="a sweep logged by orchestrator.track")
    summary = summarize(list(tasks.values()), cells)
    for model, row in summary.items():  # the sweep's own summary metrics, when it logged them
        for key in row:
            logged = parent.data.metrics.get(f"{model}.{key}")
            if logged is not None:
                row[key] = logged
    results = {"tasks": list(tasks.values()), "models": models, "cells": cells, "summary": summary}
    validate_results(results, where)
    return results


def summarize(tasks: list[dict], cells: dict[str, dict[str, dict]]) -> dict[str, dict[str, float | None]]:
    """Total = macro average of the task means; clinical / biomedical = averages within each group."""
    out = {}
    for model, row in cells.items():
        def avg(names: list[str]) -> float | None:
            values = [row[n]["mean"] for n in names if n in row and row[n]["mean"] is not None]
            return statistics.fmean(values) if values and len(values) == len(names) else None

        out[model] = {"total": avg([t["name"] for t in tasks]),
                      **{g: avg([t["name"] for t in tasks if t["group"] == g]) for g in GROUPS}}
    return out


def regenerate_report(out_dir: Path, tracking_uri: str, experiment: str = "bioptorch", run_id: str | None = None,
                      title: str | None = None) -> dict[str, Path]:
    """Read a sweep back from MLflow and write the report (md, html, png, curves) into ``out_dir``."""
    found = load_results(tracking_uri, experiment, run_id)
    log.info("sweep run %s: results from its %s", found.run_id, found.source)
    return write_report(found.results, out_dir, title=title or f"BLUE results (MLflow run {found.run_id[:8]})",
                        source=f"{tracking_uri} run {found.run_id}")


def _curve(client, run_id: str) -> list[dict[str, Any]]:
    points: dict[int, dict[str, Any]] = {}
    for split in ("dev", "test"):
        for m in client.get_metric_history(run_id, f"curve.{split}"):
            points.setdefault(m.step, {"epoch": m.step})[split] = m.value
    return [points[e] for e in sorted(points)]


def _group(task: str, tagged: str | None, where: str) -> str:
    if tagged:
        if tagged not in GROUPS:
            raise InputError(where, f"task {task!r} is tagged {GROUP_TAG}={tagged!r}", expected=" or ".join(GROUPS))
        return tagged
    return "clinical" if task.lower() in CLINICAL_TASKS else "biomedical"


def _higher_is_better(metric: str, tagged: str | None) -> bool:
    if tagged is not None:
        return tagged.strip().lower() not in ("false", "0", "no")
    return not any(word in metric.lower() for word in LOWER_IS_BETTER)


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
