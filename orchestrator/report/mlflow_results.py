"""Rebuild a sweep's ``results.json`` document from MLflow alone, and render the report from it.

This module reads; it never trains. It imports mlflow and ``orchestrator.report`` only (plus the
core error type and the retrieval table's rendering), so a dashboard host needs no GPU stack and no
access to the run directory beyond the tracking store.

How a sweep is found and read (the contract with ``orchestrator.track.log_sweep``):

1. The sweep's parent run is the newest run of the experiment tagged
   ``orchestrator.kind = sweep`` (or the run named by ``run_id``).
2. Its ``results.json`` artifact (at the artifact root or in a sub-folder) is the document,
   taken as is.
3. Without that artifact, the document is rebuilt from the parent's direct child runs, one per
   (model, task), with the names of ``orchestrator.track.schema``: tags ``model``, ``task``,
   ``group`` and ``higher_is_better`` (as logged by the sweep: no task list is re-coded here),
   param ``metric``, metrics ``test_mean``, ``test_sd``, ``dev_mean``, ``n``, params
   ``selected.*`` and per-epoch ``curve.dev`` / ``curve.test`` (step = epoch). The summary scores
   are ``orchestrator.core.results.summarize`` of those cells, the one definition the sweep uses.
"""
from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import tempfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.core.config import redacted
from orchestrator.core.errors import ConfigError, InputError, OrchestratorError
from orchestrator.core.results import summarize, validate_results
from orchestrator.report.blue_table import write_report
from orchestrator.report.training_data import FILE as TRAINING_DATA
from orchestrator.report.training_data import UNAVAILABLE as TRAINING_UNAVAILABLE
from orchestrator.report.training_data import render_section as training_section
from orchestrator.retrieval.table import RESULTS as RETRIEVAL_RESULTS
from orchestrator.retrieval.table import render_section
from orchestrator.track import schema as S
from orchestrator.track import sqlite_file
from orchestrator.track.local_store import readable_store
from orchestrator.track.runs import of_run_dir

log = logging.getLogger(__name__)

#: The tables of an MLflow SQLite store that the report reads.
STORE_TABLES = ("experiments", "runs", "tags", "params", "metrics")


@dataclass(frozen=True)
class SweepResults:
    """A results document and where it came from (``source``: "artifact" or "metrics")."""

    results: dict
    run_id: str
    source: str
    tracking_uri: str


def find_sweep_run(client, experiment: str, run_id: str | None = None, run_dir: str | Path | None = None):
    """The sweep's parent run: ``run_id`` if given, else the run tagged ``orchestrator.kind=sweep`` that was
    logged last (``schema.NEWEST_FIRST``)."""
    if run_id:
        from mlflow.exceptions import MlflowException  # heavy: mlflow

        try:
            return client.get_run(run_id)
        except MlflowException as exc:
            if exc.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise
            raise ConfigError(f"run_id {run_id!r} not found at {client.tracking_uri} (leave run_id empty for the "
                              f"newest sweep run of experiment {experiment!r} there)") from None
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        names = [e.name for e in client.search_experiments()]
        raise OrchestratorError(f"MLflow experiment {experiment!r} not found at {client.tracking_uri} "
                                f"(experiments there: {', '.join(names) or 'none'})")
    sweeps = f"tags.`{S.KIND}` = '{S.KIND_SWEEP}'"
    if run_dir is not None:  # a store other run directories' sweeps share: this one's, by the tag each sweep has
        where = str(Path(run_dir).resolve())
        newest_first = client.search_runs([exp.experiment_id], filter_string=sweeps, max_results=1000,
                                          order_by=list(S.NEWEST_FIRST))
        mine, elsewhere = of_run_dir(newest_first, where)
        if mine:
            return mine[0]
        if elsewhere:  # sweeps of other run directories only (a store written before the tag: its newest sweep)
            raise OrchestratorError(f"experiment {experiment!r} at {client.tracking_uri} has no sweep of the run "
                                    f"directory {where}; its sweeps are of {', '.join(elsewhere[:5])}: give that "
                                    "run directory, or run_id for one sweep")
    runs = client.search_runs([exp.experiment_id], filter_string=sweeps,
                              order_by=list(S.NEWEST_FIRST), max_results=1)
    if not runs:
        raise OrchestratorError(f"experiment {experiment!r} at {client.tracking_uri} has no run tagged "
                                f"{S.KIND}={S.KIND_SWEEP}: has a sweep been logged there?")
    return runs[0]


def find_artifact(client, run_id: str, name: str = S.RESULTS_ARTIFACT, path: str | None = None,
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


def load_results(tracking_uri: str, experiment: str = "bioptorch", run_id: str | None = None,
                 run_dir: str | Path | None = None) -> SweepResults:
    """The results document of a sweep, from its artifact or else from its child runs' metrics."""
    from mlflow import MlflowClient  # heavy: mlflow

    if (database := sqlite_file(tracking_uri)) is not None:
        check_sqlite_store(database)
    client = MlflowClient(tracking_uri)
    parent = find_sweep_run(client, experiment, run_id, run_dir)
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
    log.info("run %s has no %s artifact: rebuilding from child-run metrics", pid, S.RESULTS_ARTIFACT)
    results = results_from_children(client, parent)
    return SweepResults(results, pid, "metrics", tracking_uri)


def check_sqlite_store(database: Path) -> None:
    """Refuse a SQLite store that is missing, empty or not MLflow's, looking at it read-only: MLflow
    would create a missing or empty file and migrate it into a new store, and a report never writes
    into what it reads (nor does a dry run)."""
    expected = "a run's mlflow.db as MLflow writes it"
    if database.is_dir():
        raise InputError(database, "is a directory, not a file", expected=expected)
    if not database.is_file():
        raise InputError(database, "MLflow store not found", expected=expected)
    if database.stat().st_size == 0:
        raise InputError(database, "empty, not an MLflow store", expected=expected)
    read_only = f"file:{urllib.parse.quote(str(database.resolve()))}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(read_only, uri=True)) as db:
            tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        raise InputError(database, f"not an MLflow SQLite store ({exc})", expected=expected) from None
    if missing := [table for table in STORE_TABLES if table not in tables]:
        raise InputError(database, f"not an MLflow store: SQLite without the table(s) {', '.join(missing)}",
                         expected=expected)


def _cut(metrics: dict[str, float]) -> dict:
    """A cell's ``cut`` (inputs cut at max_seq_length per split) from its run's ``cut.<split>`` metrics."""
    cut = {k[len(S.CUT_PREFIX):]: {"cut": int(v), "of": int(metrics.get(k + S.CUT_OF, 0))} for k, v in metrics.items()
           if k.startswith(S.CUT_PREFIX) and not k.endswith(S.CUT_OF)}
    return {"cut": cut} if cut else {}


def _prefixed(params: dict[str, str], prefix: str) -> dict[str, str]:
    """The params named ``prefix<key>``, by key (``selected.epochs`` -> ``epochs``)."""
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def results_from_children(client, parent) -> dict:
    """Rebuild the results document from the (model, task) child runs of ``parent``."""
    pid = parent.info.run_id
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.`{S.PARENT}` = '{pid}'",
                                  max_results=5000)
    where = f"{client.tracking_uri} run {pid}"
    models: list[str] = []
    tasks: dict[str, dict] = {}
    cells: dict[str, dict[str, dict]] = {}
    for child in sorted(children, key=lambda r: r.info.start_time or 0):
        tags, metrics, params = child.data.tags, child.data.metrics, child.data.params
        if tags.get(S.KIND) != S.KIND_MODEL_TASK or S.TEST_MEAN not in metrics:
            continue
        missing = [t for t in (S.MODEL, S.TASK, S.GROUP, S.HIGHER_IS_BETTER) if t not in tags]
        if missing:
            raise InputError(f"{where} child {child.info.run_id}", f"(model, task) run lacks tags {missing}",
                             expected="a sweep logged by orchestrator.track (group and direction are tags)")
        model, task, edge = tags[S.MODEL], tags[S.TASK], _prefixed(params, S.EDGE_PREFIX)
        if model not in models:
            models.append(model)
        if task not in tasks:
            tasks[task] = {"name": task, "metric": params.get(S.METRIC, ""), "group": tags[S.GROUP],
                           "higher_is_better": S.read_bool_tag(tags[S.HIGHER_IS_BETTER])}
        cells.setdefault(model, {})[task] = {
            "mean": metrics[S.TEST_MEAN], "sd": metrics.get(S.TEST_SD),
            "n": int(metrics[S.N]) if S.N in metrics else None, "dev_mean": metrics.get(S.DEV_MEAN),
            "selected": {k: _number(v) for k, v in _prefixed(params, S.SELECTED_PREFIX).items()},
            "curve": _curve(client, child.info.run_id),
            **({"dev_tied": True} if metrics.get(S.DEV_TIED) else {}),
            **({"edge": edge} if edge else {}),
            **({"test_sample": int(metrics[S.TEST_SAMPLE])} if metrics.get(S.TEST_SAMPLE) else {}),
            **_cut(metrics),
            **_seed_scores(client, child.info.run_id, params, metrics),
        }
    if not cells:
        raise InputError(where, "no results.json artifact and no (model, task) child run with a test_mean metric",
                         expected="a sweep logged by orchestrator.track")
    task_list = list(tasks.values())
    results = {"tasks": task_list, "models": models, "cells": cells, "summary": summarize(task_list, cells)}
    validate_results(results, where)
    return results


def retrieval_results(client, run, notes: list[str]) -> dict | None:
    """The results document (``results.json``) a retrieval run carries as an artifact, checked against
    the run's own metrics; None, with a line in ``notes`` saying why, when it cannot be read or
    disagrees with them."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            doc = json.loads(Path(client.download_artifacts(run.info.run_id, RETRIEVAL_RESULTS, tmp)).read_text())
        except Exception as exc:  # a store whose artifacts are gone, or a run logged without them
            notes.append(f"cross-lingual retrieval run {run.info.run_id[:8]}: its {RETRIEVAL_RESULTS} could not be "
                         f"read ({type(exc).__name__}): no retrieval table")
            return None
    model = run.data.tags.get(S.MODEL, "")
    logged = S.read_retrieval_metrics(run.data.metrics)
    if not isinstance(doc, dict) or any(not isinstance(doc.get(k), dict) or doc[k].get(model) != v
                                        for k, v in logged.items()):
        notes.append(f"cross-lingual retrieval run {run.info.run_id[:8]}: its {RETRIEVAL_RESULTS} does not match "
                     "its metrics: no retrieval table")
        return None
    return doc


def experiment_retrieval(client, sweep, notes: list[str]) -> dict | None:
    """The retrieval results of the experiment a sweep ran in (seed 002, Table 6): the newest
    retrieval run among the children of the sweep's parent run; None for a sweep of its own, or an
    experiment without retrieval."""
    parent = sweep.data.tags.get(S.PARENT)
    if not parent:
        return None
    query = f"tags.`{S.PARENT}` = '{parent}' and tags.`{S.KIND}` = '{S.KIND_RETRIEVAL}'"
    runs = client.search_runs([sweep.info.experiment_id], filter_string=query,
                              order_by=list(S.NEWEST_FIRST), max_results=1)
    return retrieval_results(client, runs[0], notes) if runs else None


def regenerate_report(out_dir: Path, tracking_uri: str, experiment: str = "bioptorch", run_id: str | None = None,
                      title: str | None = None, baseline: str | None = None,
                      source_scores: dict[str, dict] | None = None, run_dir: str | Path | None = None
                      ) -> dict[str, Path]:
    """Read a sweep back from MLflow and write the report (md, html, png, curves) into ``out_dir``;
    with ``baseline``, also the paired differences against that model (``write_report``), with
    ``source_scores`` seed 004's correlation of the source measures with the gains, and for a sweep
    of an experiment with cross-lingual retrieval, its tables, and its table of what each pretraining arm trained
    on (as the experiment's own report has them; where the experiment run holds none, a note says it is not
    available)."""
    from mlflow import MlflowClient  # heavy: mlflow

    with readable_store(tracking_uri) as readable:  # a run directory moved elsewhere: where its artifacts are now
        found = load_results(readable, experiment, run_id, run_dir)
        log.info("sweep run %s: results from its %s", found.run_id, found.source)
        client = MlflowClient(readable)
        notes: list[str] = []
        sweep = client.get_run(found.run_id)
        retrieval = experiment_retrieval(client, sweep, notes)
        experiment_run = _experiment_of(client, sweep)
        trained_on = training_data(client, experiment_run, notes) if experiment_run is not None else None
    if experiment_run is not None:  # an experiment's sweep: its report's title and baseline, as the job wrote them
        title = title or f"Experiment {experiment_run.info.run_name.removeprefix(S.KIND_EXPERIMENT + ':')}"
        arm = experiment_run.data.tags.get(S.BASELINE_TAG) or experiment_run.data.params.get(S.BASELINE)
        if baseline is None and arm in found.results["models"]:
            baseline = arm
            log.info("report: paired differences against %s, the experiment's baseline (baseline= for another)", arm)
    return write_report(found.results, out_dir, title=title or f"BLUE results (MLflow run {found.run_id[:8]})",
                        source=f"{redacted(tracking_uri)} run {found.run_id}", baseline=baseline,
                        source_scores=source_scores,
                        notes=notes, sections=([training_section(trained_on)] if trained_on else [])
                        + ([render_section(retrieval)] if retrieval else []),
                        documents={TRAINING_DATA: trained_on} if trained_on else None)


def training_data(client, experiment_run, notes: list[str]) -> list[dict] | None:
    """The rows of "what each pretraining arm trained on" the experiment's report carries (``report/`` +
    ``training_data.json`` on its run, from the arms' instances manifests, which are not read from here); None,
    with a line in ``notes`` saying the table is not available, where the run holds none (an experiment from
    before the table, or a store whose artifacts are gone) or not a list of rows."""
    run_id = experiment_run.info.run_id
    with tempfile.TemporaryDirectory() as tmp:
        try:
            rows = json.loads(Path(client.download_artifacts(run_id, f"report/{TRAINING_DATA}", tmp)).read_text())
        except Exception as exc:  # no such artifact (MLflow raises its own types), or not JSON
            notes.append(TRAINING_UNAVAILABLE.format(why=f"the experiment run {run_id[:8]} holds no readable "
                                                         f"report/{TRAINING_DATA} ({type(exc).__name__}), and the "
                                                         "arms' instances manifests are not read from MLflow"))
            return None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "arm" in r for r in rows):
        notes.append(TRAINING_UNAVAILABLE.format(why=f"the experiment run {run_id[:8]}'s report/{TRAINING_DATA} "
                                                     "is not a list of rows"))
        return None
    return rows


def _experiment_of(client, sweep):
    """The experiment run ``sweep`` is a child of, or None (a sweep of its own, or a parent that is not one)."""
    parent = sweep.data.tags.get(S.PARENT)
    if not parent:
        return None
    try:
        run = client.get_run(parent)
    except Exception:  # deleted, or another store's: a sweep report without the experiment's defaults
        return None
    return run if run.data.tags.get(S.KIND) == S.KIND_EXPERIMENT else None


def _seed_scores(client, run_id: str, params: dict, metrics: dict) -> dict[str, Any]:
    """A cell's ``test_scores`` and ``seeds`` (and ``folds``) from its per-seed metric, when the sweep logged
    one score for each of its n (a report rebuilt without them has no paired differences)."""
    if S.TEST_SCORE not in metrics or S.SEEDS not in params:
        return {}
    history = {m.step: m.value for m in client.get_metric_history(run_id, S.TEST_SCORE)}
    scores = [history[step] for step in sorted(history)]
    if len(scores) != int(metrics.get(S.N, -1)):
        return {}
    try:
        seeds = json.loads(params[S.SEEDS])
    except json.JSONDecodeError:
        return {}
    out = {"test_scores": scores, "seeds": seeds}
    return {**out, "folds": int(metrics[S.FOLDS])} if S.FOLDS in metrics else out


def _curve(client, run_id: str) -> list[dict[str, Any]]:
    points: dict[int, dict[str, Any]] = {}
    for split, name in (("dev", S.CURVE_DEV), ("test", S.CURVE_TEST)):
        for m in client.get_metric_history(run_id, name):
            points.setdefault(m.step, {"epoch": m.step})[split] = m.value
    return [points[e] for e in sorted(points)]


def _number(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text
