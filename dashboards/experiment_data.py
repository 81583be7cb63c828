"""What the experiment page shows, read from MLflow alone: the experiment's arms and their status,
each arm's pretraining loss, the sweep's results and the paired differences against the baseline arm.

    exp = load_experiment("sqlite:///runs/exp/mlflow.db")          # the newest experiment in the store
    exp = load_experiment(uri, experiment_run_id="3f2a...")         # one experiment's parent run
    exp.arms["simpt"].loss, exp.results, exp.comparison

What is read (names from ``orchestrator.track.schema``): the experiment's parent run (tagged
``orchestrator.kind=experiment``; the newest one unless a run id is given) and its tags naming
the arms, the baseline and each arm's status; its children: each arm's pretraining run (tag
``arm``, per-step training loss), each arm's source scores (its selection run), the newest
retrieval run's results document, and the sweep's parent run, whose results document
``orchestrator.report.mlflow_results`` rebuilds; the differences are
``orchestrator.report.compare``'s and seed 004's analysis ``orchestrator.report.sources``'s.
``dashboards.experiment_page`` renders an ``Experiment``; this module renders nothing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.core.config import redacted
from orchestrator.core.errors import OrchestratorError
from orchestrator.track import schema as S
from orchestrator.track import sqlite_file
from orchestrator.track.runs import of_run_dir


@dataclass
class Arm:
    name: str
    kind: str = ""  # pretrain | random | model ("" when the store does not say)
    status: str = ""  # ok | failed | pending ("" when the store does not say)
    stage: str = ""  # the stage that failed
    error: str = ""
    pretrain_run: str = ""  # run id of its pretraining run, "" without one
    pretrain_status: str = ""  # FINISHED, FAILED, RUNNING ...
    loss: list[tuple[int, float]] = field(default_factory=list)  # (step, training loss)


@dataclass
class Experiment:
    tracking_uri: str
    run_id: str
    name: str
    status: str
    started: float | None  # seconds since the epoch
    baseline: str
    arms: dict[str, Arm]
    sweep_run: str = ""
    results: dict | None = None
    results_source: str = ""
    comparison: dict | None = None
    source_scores: dict[str, dict] = field(default_factory=dict)  # arm -> seed 004 scores (its selection run)
    retrieval: dict | None = None  # seed 002's retrieval results document (its newest retrieval run's)
    notes: list[str] = field(default_factory=list)  # what could not be shown, and why
    costs: dict[str, list[dict]] = field(default_factory=dict)  # arm (or the sweep) -> its stages' costs
    git_commit: str = ""


def check_store(tracking_uri: str) -> None:
    """A SQLite store must exist: MLflow would otherwise create an empty one and find nothing."""
    if (path := sqlite_file(tracking_uri)) is not None:
        if not path.is_file():
            raise OrchestratorError(f"no MLflow store at {tracking_uri} ({path} does not exist): give the "
                                    "mlflow.db of a run directory, e.g. sqlite:///runs/<name>/mlflow.db")


def find_experiment_run(client, run_id: str | None = None, run_dir: str | Path | None = None):
    """The experiment's parent run: ``run_id`` if given (it must be an experiment's), else the run of any MLflow
    experiment in the store tagged ``orchestrator.kind=experiment`` that was logged last (``schema.NEWEST_FIRST``);
    with ``run_dir`` (a store several run directories share), the last of that run directory's."""
    from mlflow.exceptions import MlflowException  # heavy: mlflow

    where = client.tracking_uri
    if run_id:
        try:
            run = client.get_run(run_id)
        except MlflowException as exc:
            raise OrchestratorError(f"run {run_id} not found at {where} ({exc.message})") from None
        kind = run.data.tags.get(S.KIND, "")
        if kind != S.KIND_EXPERIMENT:
            raise OrchestratorError(f"run {run_id} at {where} is not an experiment's parent run "
                                    f"({S.KIND}={kind or 'unset'}, expected {S.KIND_EXPERIMENT})")
        return run
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, filter_string=f"tags.`{S.KIND}` = '{S.KIND_EXPERIMENT}'",
                              order_by=list(S.NEWEST_FIRST), max_results=1000) if ids else []
    if run_dir is not None and runs:
        mine, elsewhere = of_run_dir(runs, run_dir)
        if not mine:
            raise OrchestratorError(f"no experiment run of the run directory {Path(run_dir).resolve()} at {where}"
                                    + (f"; its experiments are of {', '.join(elsewhere[:5])}: give that run "
                                       "directory, or --run-id" if elsewhere else ""))
        runs = mine
    if not runs:
        raise OrchestratorError(f"no experiment run at {where}: no run is tagged {S.KIND}={S.KIND_EXPERIMENT}. "
                                "An experiment is a jobs/blue_sweep.py run with arms: (docs/EXPERIMENTS.md); a "
                                "plain sweep's report is jobs/report.py")
    return runs[0]


def load_experiment(tracking_uri: str, experiment_run_id: str | None = None, *, n_boot: int = 10000,
                    run_dir: str | Path | None = None) -> Experiment:
    """Everything the page shows, from the store at ``tracking_uri`` (``run_dir``: the experiment of that run
    directory, in a store several share)."""
    from mlflow import MlflowClient  # heavy: mlflow

    check_store(tracking_uri)
    client = MlflowClient(tracking_uri)
    parent = find_experiment_run(client, experiment_run_id, run_dir)
    pid, tags, params = parent.info.run_id, parent.data.tags, parent.data.params
    children = client.search_runs([parent.info.experiment_id], filter_string=f"tags.`{S.PARENT}` = '{pid}'",
                                  order_by=list(S.NEWEST_FIRST), max_results=5000)
    pretrains = [r for r in children if r.data.tags.get(S.KIND) == S.KIND_PRETRAIN]
    scores: dict[str, dict] = {}
    sweeps = [r for r in children if r.data.tags.get(S.KIND) == S.KIND_SWEEP]
    for run in children:  # newest first: an arm keeps its newest scores
        arm = run.data.tags.get(S.ARM)
        if run.data.tags.get(S.KIND) == S.KIND_SELECTION and arm and arm not in scores:
            scores[arm] = S.read_source_metrics(run.data.metrics)
    # orchestrator.workflows.blue_sweep names the run "experiment:<run_name>"
    name = (parent.info.run_name or pid[:8]).removeprefix(f"{S.KIND_EXPERIMENT}:")
    exp = Experiment(tracking_uri=tracking_uri, run_id=pid, name=name,
                     status=parent.info.status, started=(parent.info.start_time or 0) / 1000 or None,
                     baseline=tags.get(S.BASELINE_TAG) or params.get(S.BASELINE, ""), arms=_arms(tags, params),
                     costs=S.read_cost_tags(tags))
    for run in pretrains:  # newest first: an arm keeps its newest pretraining run
        name = run.data.tags.get(S.ARM)
        if not name:
            continue
        arm = exp.arms.setdefault(name, Arm(name))
        if not arm.pretrain_run:
            arm.pretrain_run, arm.pretrain_status = run.info.run_id, run.info.status
            arm.kind = arm.kind or "pretrain"
            arm.loss = _history(client, run.info.run_id, S.PRETRAIN_LOSS)
    logged = tags.get(S.SWEEP_RUN)  # the sweep the experiment's last run logged, wherever MLflow keeps it
    if logged and logged not in {r.info.run_id for r in sweeps}:
        from mlflow.exceptions import MlflowException  # heavy: mlflow

        try:
            sweeps.insert(0, client.get_run(logged))
        except MlflowException:  # deleted since: the newest child, as before
            pass
    sweeps.sort(key=lambda r: r.info.run_id != logged)  # it first; the others newest first
    if sweeps:
        _load_sweep(exp, sweeps[0], n_boot=n_boot)
        if len(sweeps) > 1:
            shown = "the one its last run logged" if sweeps[0].info.run_id == logged else "the newest"
            exp.notes.append(f"{len(sweeps)} sweeps ran under this experiment (its sweep settings changed between "
                             f"runs): {shown}, run {sweeps[0].info.run_id[:8]}, is shown")
    else:
        exp.notes.append("no sweep under this experiment yet: the table, the differences and the fine-tuning "
                         "curves appear once the arms' models are fine-tuned")
    for model in (exp.results or {}).get("models", []):
        arm = exp.arms.get(model)
        if arm is not None and not arm.status:
            arm.status = "ok"  # an older run without status tags: in the sweep, so it finished
    exp.source_scores = scores
    retrievals = [r for r in children if r.data.tags.get(S.KIND) == S.KIND_RETRIEVAL]
    if retrievals:  # newest first: every arm's encoder is in one output, whose document each run carries
        from orchestrator.report.mlflow_results import retrieval_results  # heavy: numpy

        exp.retrieval = retrieval_results(client, retrievals[0], exp.notes)
    if scores and exp.comparison is not None:
        from orchestrator.report.sources import source_correlations  # heavy: scipy

        exp.comparison["sources"] = source_correlations(exp.comparison, scores)
    if not exp.baseline and exp.arms:
        exp.baseline = next(iter(exp.arms))
    return exp


def _arms(tags: dict[str, str], params: dict[str, str]) -> dict[str, Arm]:
    """The arms in config order with their status, from the parent's tags (or, for a run logged
    before those tags existed, the arm names its params hold)."""
    names = [n for n in tags.get(S.ARMS, "").split(",") if n]
    if not names:  # params arm.<name>.<key>: an arm without overrides is only found by its runs
        names = list(dict.fromkeys(k[len(S.ARM_PARAM_PREFIX):].split(".")[0] for k in params
                                   if k.startswith(S.ARM_PARAM_PREFIX)))
    arms = {}
    for name in names:
        got = {f: tags.get(S.arm_tag(name, f), "") for f in S.ARM_FIELDS}
        arms[name] = Arm(name, kind=got["kind"], status=got["status"], stage=got["stage"], error=got["error"])
    return arms


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    """A metric per step (the last value logged at a step wins: a resumed run logs some steps again)."""
    by_step: dict[int, tuple[int, float]] = {}
    for m in client.get_metric_history(run_id, key):
        if math.isfinite(m.value) and (m.step not in by_step or m.timestamp >= by_step[m.step][0]):
            by_step[m.step] = (m.timestamp, m.value)
    return [(step, by_step[step][1]) for step in sorted(by_step)]


def _load_sweep(exp: Experiment, sweep, *, n_boot: int) -> None:
    from orchestrator.report.compare import paired_differences  # heavy: numpy, scipy
    from orchestrator.report.mlflow_results import load_results
    from orchestrator.report.replicates import replicate_differences

    exp.sweep_run = sweep.info.run_id
    exp.git_commit = sweep.data.tags.get(S.GIT_COMMIT, "")
    try:
        found = load_results(exp.tracking_uri, run_id=exp.sweep_run)
    except OrchestratorError as exc:
        exp.notes.append(f"the sweep's results could not be read: {exc}")
        return
    exp.results, exp.results_source = found.results, found.source
    models = found.results["models"]
    if exp.baseline not in models:
        exp.notes.append(f"the baseline arm {exp.baseline!r} has no results: no paired differences")
    elif len(models) < 2:
        exp.notes.append("one model only: no paired differences")
    else:
        exp.comparison = paired_differences(found.results, exp.baseline, n_boot=n_boot,
                                            source=f"{redacted(exp.tracking_uri)} run {exp.sweep_run}")
        replicates = replicate_differences(found.results, exp.comparison)
        if replicates is not None:  # arms replicated at other pretraining seeds: as the report's comparison.json
            exp.comparison["replicates"] = replicates
