"""The BLUE fine-tuning sweep on Ray Tune: trials -> selection -> results.json -> MLflow.

    result = run_sweep(cfg, {"ours": Path("runs/x/pretrain/final")}, out_dir, tracking, run_dir)

Restore: each finished trial leaves ``out_dir/trials/<trial_id>.json`` (written atomically by
the driver when the trial's last result arrives, with what the trial cost: ``orchestrator.sweep.cost``).
Re-running the same sweep skips every trial whose record exists with the same settings fingerprint and
runs only the rest; the sweep's cost sums its trials' recorded costs.

With ``sweep.export_best`` the selected model of each (model, task) of those tasks is then trained
once more and written to ``out_dir/exports/`` (``orchestrator.sweep.export``), listed in exports.json.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from orchestrator.core.artifacts import usable_positions
from orchestrator.core.config import is_number, to_dict
from orchestrator.core.cost import COST_FIELD, duration
from orchestrator.core.errors import ConfigError, InputError, OrchestratorError
from orchestrator.core.manifest import atomic_write_json, write_manifest
from orchestrator.core.reuse import made_under_each, model_identity, output_lock
from orchestrator.core.runtime import check_fits, generators_kept, possible_gpus, ray_session, tune_loggers
from orchestrator.finetune.readers import CV_SPLIT_SEED, document_split, read_split
from orchestrator.finetune.spec import load_task
from orchestrator.finetune.tokenizer import write_worker_tokenizers
from orchestrator.finetune.trial import (
    BUNDLED_PRECISIONS,
    TrialSpec,
    group_trials,
    mark_encoded,
    model_dir_ok,
    prune_encoded,
)
from orchestrator.pretrain.config import PretrainConfig, read_hf_config
from orchestrator.sweep.config import SweepConfig
from orchestrator.sweep.cost import shares, slots_held, sweep_cost, trial_cost
from orchestrator.sweep.export import export_entry, export_run, export_tasks, finished, plan_exports
from orchestrator.sweep.order import estimated_work, longest_first, split_reader
from orchestrator.sweep.selection import build_results, edge_warning, selected_answers
from orchestrator.sweep.space import (
    LOCATION_FIELDS,
    TASK_DATA,
    SearchSpace,
    Variant,
    build_trials,
    epoch_grid,
    space_tasks,
    task_data_dir,
    task_data_identity,
    task_files,
    tracked_config,
    trial_fingerprint,
)
from orchestrator.track import TrackingConfig
from orchestrator.track import schema as S
from orchestrator.track.caller import stage_call
from orchestrator.track.sweep import log_sweep

log = logging.getLogger(__name__)


@dataclasses.dataclass
class SweepResult:
    results: dict
    out_dir: Path
    ran: int
    skipped: int
    parent_run_id: str | None = None
    exports: dict[str, dict[str, dict]] = dataclasses.field(default_factory=dict)  # exports.json
    exported: int = 0  # exports trained by this call (the others were reused)

    def summary(self) -> str:
        lines = [f"sweep: {self.ran} trial(s) run, {self.skipped} finished trial(s) skipped; "
                 f"results in {self.out_dir / 'results.json'}"]
        for model, s in self.results["summary"].items():
            parts = [f"{k} {v:.3f}" for k, v in s.items() if is_number(v, finite=False)]  # not "partial"
            lines.append(f"  {model}: " + ", ".join(parts))
        n = sum(len(tasks) for tasks in self.exports.values())
        if n:
            lines.append(f"  {n} selected model(s) exported ({self.exported} trained now): "
                         f"{self.out_dir / 'exports.json'}")
        return "\n".join(lines)


def check_model_fits(name: str, space: SearchSpace, *, model_dir: str | Path | None = None,
                     planned: int | None = None) -> None:
    """The space fits model ``name``, read from its config.json once: its ``max_seq_length`` within the model's
    position embeddings (BERT's 512; a small model's may be fewer: a longer input has no position to embed) and its
    ``reinit_layers`` within the model's layers; every trial would fail on either. A model not built yet is checked
    against ``planned``, the positions its pretraining config gives it (``planned_positions``), and its layers by
    the sweep before its first trial."""
    config = read_hf_config(Path(model_dir)) if model_dir is not None and model_dir_ok(model_dir) else None
    if config is not None:
        source: str | Path = Path(model_dir) / "config.json"
        positions = usable_positions(config)  # RoBERTa's 514 hold 512 tokens
    else:
        positions, source = planned, "pretrain.model.max_position_embeddings"
    if isinstance(positions, int) and space.max_seq_length > positions:
        raise ConfigError(f"search space max_seq_length {space.max_seq_length} is above model {name}'s "
                          f"{positions} positions ({source}): set the search space's max_seq_length <= {positions}")
    layers, most = (config or {}).get("num_hidden_layers"), max(space.reinit_choices)
    if isinstance(layers, int) and most > layers:
        raise ConfigError(f"search space reinit_layers {most} is more than model {name}'s {layers} layers "
                          f"({source}): set reinit_layers <= {layers}")


def _reinit_text(choices: tuple[int, ...]) -> str:
    """The dry run's words for the layers re-initialised ("" for none)."""
    if len(choices) > 1:
        return f"; the top {list(choices)} layers re-initialised (an axis, selected on dev)"
    return f"; the top {choices[0]} layer(s) re-initialised" if choices[0] else ""


def planned_positions(pretrain: PretrainConfig) -> int | None:
    """The positions of the model ``pretrain`` builds; with ``model.init_from``, that model's (None when it
    cannot be read: the sweep checks the built model before its first trial)."""
    if not pretrain.model.init_from:
        return pretrain.model.max_position_embeddings
    init = Path(pretrain.model.init_from)
    return usable_positions(read_hf_config(init)) if model_dir_ok(init) else None


def plan_sweep(cfg: SweepConfig, models: dict[str, Path], planned: dict[str, int] | None = None) -> str:
    """Dry run: the space resolves, every task file parses, every model directory loads; a model an earlier
    stage builds is checked against ``planned``, its positions (``pretrain.model.max_position_embeddings``)."""
    space = cfg.space
    stop = space.early_stopping
    lines = [f"search space {cfg.search_space}: lr {list(space.learning_rates)} x seeds {list(space.seeds)}, "
             f"batch {space.batch_size if isinstance(space.batch_size, int) else list(space.batch_size)}, "
             f"max_seq_length {space.max_seq_length}"
             + (f"; early stopping on dev, patience {stop.patience}, up to {stop.max_epochs} epochs" if stop.on
                else "")
             + _reinit_text(space.reinit_choices)]
    for name, path in models.items():
        ok = model_dir_ok(path)
        check_model_fits(name, space, model_dir=path, planned=(planned or {}).get(name))
        lines.append(f"model {name}: {path}" + ("" if ok else "  (not built yet: produced by an earlier stage)"))
    for task, spec in space_tasks(space).items():
        data_dir = task_data_dir(cfg, task, spec)
        flat = dataclasses.replace(spec, dir="")
        sizes = {split: len(read_split(flat, data_dir, split)) for split in spec.file_splits}
        if spec.resplit:
            sizes = {s: len(x) for s, x in document_split(read_split(flat, data_dir, "all"), spec.resplit,
                                                           spec.group_separator, CV_SPLIT_SEED).items()}
        if spec.cv_folds:
            sizes["cv_folds"] = spec.cv_folds
        lines.append(f"task {spec.name} ({spec.family}, {spec.metric}, {spec.group}): {data_dir} "
                     f"{sizes}" + ("" if stop.on else f"; epochs {list(epoch_grid(space, task, spec))}"))
    trials = build_trials(cfg, space, models)
    for task in dict.fromkeys(t.task for t in trials):  # each task as its trials will load it
        load_task(task)
    lines.append(f"{len(trials)} trial(s) (one per model x task x lr x [batch x] seed [x fold]; "
                 + ("each stops on dev)" if stop.on else "epochs shared within a trial)"))
    if cfg.bundle_learning_rates != "off" and (len(space.learning_rates) > 1
                                               or (cfg.bundle_seeds and len(space.seeds) > 1)):
        lines.append(_plan_bundles(cfg, trials, len(models)))
    lines.append("Ray trials start " + ("longest first, by work estimated from each task's splits and epochs"
                                        if cfg.order == "longest_first" else "in the grid's order") + " (sweep.order)")
    if cfg.export_best:
        lines.append(f"then export the selected model ({cfg.export_seed} seed) of each model x "
                     f"{export_tasks(cfg.export_best, space_tasks(space), cfg.KEY)}")
    return "\n".join(lines)


def _record_path(trials_dir: Path, trial_id: str) -> Path:
    return trials_dir / f"{trial_id}.json"


#: A record's field: the ``LOCATION_FIELDS`` its fingerprint was computed at, kept once its trial's inputs moved
FINGERPRINTED_AT = "fingerprinted_at"


def _finished(trials_dir: Path, trial: TrialSpec) -> dict | None:
    """The trial's record when it answers the trial as it stands: the same fingerprint, and the task's
    split files as they were when it trained. A record kept before the files' hashes were (no
    ``task_data``) is taken as answering the files as they are now, which it then records.

    A run directory copied or moved elsewhere (its model's path changed, the model not) keeps its trials:
    the fingerprint is compared at the paths the record was made at (``trial_fingerprint(located_at=)``),
    and the record then names the trial's paths as they are now (an export reads the model from there),
    those it was fingerprinted at kept beside them (``FINGERPRINTED_AT``), its fingerprint unchanged."""
    path = _record_path(trials_dir, trial.trial_id)
    if not path.is_file():
        return None
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    recorded = rec.get(FINGERPRINTED_AT) or rec.get("trial") or {}
    here = {field: getattr(trial, field) for field in LOCATION_FIELDS}
    at = recorded if all(field in recorded for field in LOCATION_FIELDS) else here
    if rec.get("fingerprint") != trial_fingerprint(trial, located_at=at):
        return None
    data = task_data_identity(trial)
    if rec.get(TASK_DATA, data) != data:
        return None
    if TASK_DATA not in rec or any((rec.get("trial") or {}).get(field) != value for field, value in here.items()):
        rec[TASK_DATA] = data
        if at != here:
            rec[FINGERPRINTED_AT] = {field: at[field] for field in LOCATION_FIELDS}
            rec["trial"] = {**(rec.get("trial") or {}), **here}
        atomic_write_json(path, rec)
    return rec


def _tune_trainable(config: dict) -> None:
    """Runs in a Ray worker: the real loop for one trial or a bundle of trials that differ only in their
    learning rate (``orchestrator.finetune.bundle``), reporting to Tune once, at its end: each report stops
    the trial until the driver asks for the next result (Tune's function API), and no scheduler or search
    here reads the epochs on the way. That report carries the trials' records (every evaluated epoch, the
    predictions) so the driver can persist them (the driver's callback takes them out of the result before Tune
    keeps it: ``_record_writer``), the trials' ids, when the Ray trial began and ended in this worker, how long its
    trials trained and when the worker process started (``benchmarks/sweep_overhead.py`` reads them from Tune's
    result.json).
    Those three times are on ``time.monotonic``'s clock, which every process of a host shares and the wall
    clock's steps (an NTP correction, a VM's clock catching up) do not move: comparable between the processes
    of one host."""
    from ray import tune  # heavy: ray

    from orchestrator.finetune.bundle import run_bundle  # heavy: torch

    started = time.monotonic()
    trials = [TrialSpec(**{**t, "eval_epochs": tuple(t["eval_epochs"])}) for t in config["bundle"]["trials"]]
    records = run_bundle(trials)
    tune.report({"epoch": max(r["epochs"][-1]["epoch"] for r in records), "records": json.dumps(records),
                 "trial_ids": [r["trial_id"] for r in records],
                 "run_seconds": sum(r["seconds"] for r in records), "trial_started": started,
                 "trial_ended": time.monotonic(), "worker_started": _process_started()})


def _process_started() -> float:
    """When this process started, on ``time.monotonic``'s clock: the monotonic now less the process's age. On
    Linux the age is the time since boot less the process's start in clock ticks since boot (to 10 ms);
    elsewhere the wall clock less psutil's start time, which on Linux adds its boot time's whole seconds
    (about 1 s too old, measured) and the wall clock's steps since boot."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, AttributeError, ValueError, IndexError):  # no procfs or CLOCK_BOOTTIME: macOS
        age = time.time() - psutil.Process().create_time()
    return time.monotonic() - age


class SweepProgress:
    """The sweep's progress line: trials done of the total, elapsed, an estimate of the time left, and
    the best dev score so far of the task whose trial just ended. On a terminal it updates at every
    trial; elsewhere (a log, a pipe) when a line is due (``orchestrator.core.console.due``: at least
    ``every_s`` apart, about 20 a sweep) and at the last trial.

    The time left is counted from each trial's estimated ``work`` by trial id (``sweep.order.estimated_work``:
    trials of unequal length, the longest first), by trial counts where a trial's work is unknown. Once a
    Ray trial whose start was seen (``start``) has ended (``finish``), it is the work left, less what the
    running Ray trials have done by now, over the rate of the slots: the work of the ended Ray trials over
    their time, times the Ray trials that run at once. Without that, it is the elapsed time x the work
    left / the work done, which says far too much while the first trials of many running at once end:
    8 bundles sharing an H200 said "about 29m23s left" at 5 of 90 trials, with 1 min 31 s left."""

    def __init__(self, total: int, every_s: float = 30.0, work: dict[str, float] | None = None):
        self.total, self.every_s, self.done, self.last_done = total, every_s, 0, 0
        self.started = self.last = time.monotonic()
        self.best: dict[str, tuple[float, str]] = {}  # task -> (best dev, model)
        known = work is not None and len(work) == total and all(0 < w < math.inf for w in work.values())
        self.work = work if known else None
        self.work_total, self.work_done = sum(work.values()) if known else 0.0, 0.0
        self.running: dict[str, tuple[float, float]] = {}  # Ray trial -> (started, its trials' work)
        self.ended_work, self.ended_s, self.slots = 0.0, 0.0, 0  # ended Ray trials' work and time; most at once

    def start(self, key: str, trial_ids: list[str], now: float | None = None) -> None:
        """A Ray trial of ``trial_ids`` (a bundle: several) started."""
        if self.work is not None:
            self.running[key] = (time.monotonic() if now is None else now,
                                 sum(self.work.get(i, 0.0) for i in trial_ids))
            self.slots = max(self.slots, len(self.running))

    def finish(self, key: str, now: float | None = None) -> None:
        """A Ray trial whose start was seen ended (call it before ``add`` of its records)."""
        if key in self.running:
            began, work = self.running.pop(key)
            self.ended_work += work
            self.ended_s += (time.monotonic() if now is None else now) - began

    def _left(self, now: float) -> float:
        elapsed = now - self.started
        if self.work is None or self.work_done <= 0:
            return elapsed / self.done * (self.total - self.done)
        left = max(0.0, self.work_total - self.work_done)
        if self.ended_work <= 0 or self.ended_s <= 0:
            return elapsed / self.work_done * left
        rate = self.ended_work / self.ended_s  # the work one slot does in a second
        in_flight = sum(min(work, rate * (now - began)) for began, work in self.running.values())
        waiting = left - sum(work for _, work in self.running.values())  # not started yet
        slots = self.slots if waiting > 0 else len(self.running)
        return max(0.0, left - in_flight) / (rate * max(slots, 1))

    def add(self, record: dict) -> str | None:
        """Count a finished trial's record; returns the line when one is due."""
        from orchestrator.core.console import due, progress, updating  # the terminal's progress line
        from orchestrator.finetune.metrics import METRICS

        self.done += 1
        if self.work is not None:
            self.work_done += self.work.get(record.get("trial_id", ""), 0.0)
        task, model = record.get("task", "?"), record.get("trial", {}).get("model_name", "?")
        devs = [row["dev"] for row in record.get("epochs", []) if isinstance(row.get("dev"), int | float)]
        higher = METRICS.get(record["metric"]).higher_is_better if record.get("metric") in METRICS else True
        if devs:
            dev = max(devs) if higher else min(devs)
            old = self.best.get(task)
            if old is None or (dev > old[0] if higher else dev < old[0]):
                self.best[task] = (dev, model)
        now = time.monotonic()
        if not updating() and self.done < self.total and not due(now - self.last, self.done - self.last_done,
                                                                   self.total, every_s=self.every_s):
            return None
        self.last, self.last_done = now, self.done
        elapsed, left = now - self.started, self._left(now)
        line = (f"sweep: {self.done}/{self.total} trials, {duration(elapsed)} elapsed"
                + (f", about {duration(left)} left" if self.done < self.total else ""))
        if task in self.best:
            line += f"; best dev so far on {task}: {self.best[task][0]:.3f} ({self.best[task][1]})"
        progress(line)
        return line


def _record_writer(trials_dir: Path, total: int, work: dict[str, float] | None, resources: dict[str, float]):
    from ray import tune  # heavy: ray

    class RecordWriter(tune.Callback):
        """Driver side: persist each trial's record as soon as it arrives (restore unit), with what the trial
        cost (its Ray trial's slot from its start to its result, ``orchestrator.sweep.cost``); the progress line."""

        def __init__(self):
            self.progress = SweepProgress(total, work=work)
            self.started: dict[str, float] = {}  # Ray trial -> when Tune started it (time.monotonic)

        def on_trial_start(self, iteration, trials, trial, **info):
            self.started[trial.trial_id] = time.monotonic()
            self.progress.start(trial.trial_id, [t["trial_id"] for t in trial.config["bundle"]["trials"]])

        def on_trial_result(self, iteration, trials, trial, result, **info):
            # taken out of the result, which Tune then keeps (its result.json and its experiment state, rewritten
            # as trials end: a BC5CDR trial's predictions were 1.8 MB there, 11.5 MB for 12 trials): a callback
            # may change the result in place, and this one comes before Tune's loggers
            records = result.pop("records", None)
            if records is None:
                return
            self.progress.finish(trial.trial_id)  # the last report: the Ray trial has ended
            began = self.started.pop(trial.trial_id, None)
            span = (time.monotonic() - began if began is not None  # else the worker's own span
                    else float(result.get("trial_ended", 0.0)) - float(result.get("trial_started", 0.0)))
            recs = json.loads(records)  # the Ray trial's trials (a bundle: several)
            for rec, share in zip(recs, shares(recs) if recs else []):
                spec = TrialSpec(**{**rec["trial"], "eval_epochs": tuple(rec["trial"]["eval_epochs"])})
                rec["fingerprint"], rec[TASK_DATA] = trial_fingerprint(spec), task_data_identity(spec)
                rec[COST_FIELD] = trial_cost(max(span, 0.0), resources, share)
                atomic_write_json(_record_path(trials_dir, rec["trial_id"]), rec)
                self.progress.add(rec)

    return RecordWriter()


def _plan_bundles(cfg: SweepConfig, trials: list[TrialSpec], n_models: int) -> str:
    """The dry run's line on bundles: how many Ray trials the run would start, as ``_run_tune`` groups them
    (``_bundled``: ``auto`` bundles GPU trials only; fp16 trials train alone). Whether ``gpus_per_trial``
    -1 finds GPUs is known once Ray is up, so for ``auto`` then the line gives both counts."""
    space = cfg.space
    groups = len(group_trials(trials, bundle=True, models=cfg.bundle_models, seeds=cfg.bundle_seeds))
    if groups == len(trials):
        return (f"learning rates not bundled: {len(trials)} Ray trial(s), one a trial ("
                + (f"{space.precision} trials train alone, each with its own loss scaler" if space.precision
                   not in BUNDLED_PRECISIONS else "no two trials differ only in their learning rate") + ")")
    what = (f"{groups} Ray trial(s), each training the {len(space.learning_rates)} learning rates of one setting "
            "as one batched computation"
            + ("; with sweep.bundle_models, those of models of one architecture and tokenizer together (a model "
               "not yet built counts alone here)" if cfg.bundle_models and n_models > 1 else "")
            + (f"; with sweep.bundle_seeds, its {len(space.seeds)} seeds together (each row its own dropout masks "
               "from the bundle's stream)" if cfg.bundle_seeds and len(space.seeds) > 1 else ""))
    if cfg.bundle_learning_rates == "on" or cfg.gpus_per_trial > 0:
        return f"learning rates bundled ({cfg.bundle_learning_rates}): {what}"
    if cfg.gpus_per_trial == 0:
        return (f"learning rates not bundled (auto bundles GPU trials; {cfg.KEY}.gpus_per_trial is 0): "
                f"{len(trials)} Ray trial(s), one a trial")
    return (f"learning rates bundled if the trials get GPUs (auto; {cfg.KEY}.gpus_per_trial -1 gives each one when "
            f"the machine or cluster has or can start GPUs): {what}; on CPUs {len(trials)} Ray trial(s), one a trial")


def _resources(cfg: SweepConfig) -> dict[str, float]:
    """A trial's resources; automatic GPUs (-1) ask for one when the cluster has or can start a GPU
    node (an autoscaling cluster at zero GPU workers: the request is what makes it start one)."""
    gpus = cfg.gpus_per_trial
    if gpus == -1:
        gpus = 1.0 if possible_gpus() > 0 else 0.0
    return {"cpu": cfg.cpus_per_trial, "gpu": gpus}


def _bundled(cfg: SweepConfig, resources: dict[str, float]) -> bool:
    """Whether trials that differ only in their learning rate train as one computation: ``on``, or ``auto``
    with GPU trials (on CPUs the separate trials are faster: benchmarks/RESULTS.md, session 28)."""
    return cfg.bundle_learning_rates == "on" or (cfg.bundle_learning_rates == "auto" and resources["gpu"] > 0)


def _run_tune(cfg: SweepConfig, todo: list[TrialSpec], out_dir: Path, trials_dir: Path) -> int:
    """Run ``todo`` on Ray Tune; returns how many Ray trials that took (a bundle of learning rates is one)."""
    from ray import tune  # heavy: ray

    resources = _resources(cfg)
    check_fits({"CPU": resources["cpu"], "GPU": resources["gpu"]},
               f"{cfg.KEY}.cpus_per_trial / {cfg.KEY}.gpus_per_trial", "trial")
    if resources["gpu"] > 0:
        todo = [dataclasses.replace(t, device="cuda") for t in todo]
    groups = group_trials(todo, _bundled(cfg, resources), models=cfg.bundle_models, seeds=cfg.bundle_seeds)
    if len(groups) < len(todo):
        across = sum(len({t.model_dir for t in g}) > 1 for g in groups)
        seeded = sum(len({t.seed for t in g}) > 1 for g in groups)
        log.info("sweep: %d trial(s) in %d Ray trial(s): the learning rates of each setting train as one "
                 "batched computation (sweep.bundle_learning_rates)%s%s", len(todo), len(groups),
                 f", {across} of them with several models (sweep.bundle_models)" if across else "",
                 f", {seeded} with several seeds (sweep.bundle_seeds)" if seeded else "")
    work = estimated_work(todo, split_reader())  # the start order and the progress line's time left
    if cfg.order == "longest_first":
        groups = longest_first(groups, work)
    trainable = tune.with_resources(_tune_trainable, resources)
    param_space = {"bundle": tune.grid_search([{"trials": [dataclasses.asdict(t) for t in group]}
                                                for group in groups])}
    tuner = tune.Tuner(
        trainable, param_space=param_space,
        # reuse_actors: a worker process imports torch/transformers once, not once per trial
        tune_config=tune.TuneConfig(max_concurrent_trials=cfg.max_concurrent_trials or None, reuse_actors=True),
        run_config=tune.RunConfig(name=f"sweep-{time.strftime('%Y%m%d-%H%M%S')}",
                                  storage_path=str((out_dir / "tune").resolve()),
                                  callbacks=[_record_writer(trials_dir, len(todo), work, resources), *tune_loggers()],
                                  verbose=1,
                                  failure_config=tune.FailureConfig(max_failures=cfg.max_failures)))
    grid = tuner.fit()
    failed = [r for r in grid if r.error is not None]
    if failed:
        raise OrchestratorError(f"{len(failed)} trial(s) failed; first: {_failure_line(failed[0])}")
    return len(groups)


def _failure_line(result) -> str:
    """A failed Ray trial in one line: its trials' ids, the error's last line (its type and message; Ray's text
    is the worker's whole traceback, its name in terminal colours) and where Tune wrote the traceback."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(result.error)).strip()
    last = text.splitlines()[-1].strip() if text else type(result.error).__name__
    ids = [t.get("trial_id", "?") for t in ((result.config or {}).get("bundle") or {}).get("trials", [])]
    trace = Path(result.path) / "error.txt" if result.path else None
    return (f"{', '.join(ids) or 'a trial'}: {last}"
            + (f" (traceback: {trace})" if trace is not None and trace.is_file() else ""))


def _export_best(cfg: SweepConfig, results: dict, records: list[dict], tasks: list[str],
                 out_dir: Path, ray_up: contextlib.ExitStack) -> tuple[dict[str, dict[str, dict]], int]:
    """Export each selected model not exported yet, one Ray task per model with a trial's resources."""
    plans = plan_exports(results, records, tasks, out_dir, cfg.export_seed)
    manifests = {p.dst: finished(p) for p in plans}
    todo = [p for p in plans if manifests[p.dst] is None]
    msg = (f"sweep: {len(plans)} selected model(s) to export; reusing {len(plans) - len(todo)}, training {len(todo)}"
           + made_under_each([m for m in manifests.values() if m is not None]))  # their libraries' releases since
    log.info(msg)
    print(msg, flush=True)
    if todo:
        import ray  # heavy: ray

        ray_up.enter_context(ray_session())
        resources = _resources(cfg)
        device = "cuda" if resources["gpu"] > 0 else "auto"
        todo = [dataclasses.replace(p, record={**p.record, "trial": {**p.record["trial"], "device": device}})
                for p in todo]
        task = ray.remote(num_cpus=resources["cpu"], num_gpus=resources["gpu"],
                          max_retries=cfg.max_failures)(export_run)
        for plan, manifest in zip(todo, ray.get([task.remote(p) for p in todo])):
            manifests[plan.dst] = manifest
            if not manifest.get("reproduced", True):  # said here: the Ray task's own warning reaches no terminal
                log.warning("export %s: the re-trained model scores dev %.6f / test %.6f, the sweep recorded "
                            "%.6f / %.6f (non-deterministic kernels?); exports.json says reproduced: false",
                            plan.dst.name, manifest["dev"], manifest["test"], plan.dev, plan.test)
    exports: dict[str, dict[str, dict]] = {}
    for plan in plans:
        exports.setdefault(plan.model, {})[plan.task] = export_entry(plan, manifests[plan.dst])
    return exports, len(todo)


@stage_call()  # called from a notebook: the caller's MLflow session and generators as they were (probes L1, L8)
@generators_kept()
def run_sweep(cfg: SweepConfig, models: dict[str, Path], out_dir: Path, tracking: TrackingConfig | None,
              run_dir: Path, variants: Sequence[Variant] = (), *,
              row_tags: dict[str, dict[str, str]] | None = None) -> SweepResult:
    """Run (or complete) the sweep; write results.json, selection.json and a manifest into out_dir.

    ``variants`` add rows of models fine-tuned on other data for some tasks (``Variant``);
    ``row_tags`` adds MLflow tags to a row's (model, task) runs (an experiment's arm)."""
    if not models:
        raise ConfigError("run_sweep: no models given (name -> Hugging Face BERT directory)")
    bad = [f"{n}: {p}" for n, p in models.items() if not model_dir_ok(p)]
    if bad:
        raise InputError(bad[0], "not a Hugging Face BERT directory", expected="config.json and a tokenizer")
    for name, path in models.items():  # before any trial: each would fail on a too long input
        check_model_fits(name, cfg.space, model_dir=path)
    out_dir = Path(out_dir).resolve()
    # a second job on this sweep waits at the lock, then reuses its trials; Ray runs for the block if none did
    with output_lock(out_dir), contextlib.ExitStack() as ray_up:  # (a call from a notebook left it up: probe L2)
        return _run_sweep(cfg, models, out_dir, tracking, run_dir, variants, row_tags, ray_up)


def _run_sweep(cfg: SweepConfig, models: dict[str, Path], out_dir: Path, tracking: TrackingConfig | None,
               run_dir: Path, variants: Sequence[Variant], row_tags: dict[str, dict[str, str]] | None,
               ray_up: contextlib.ExitStack) -> SweepResult:
    trials_dir = out_dir / "trials"
    trials_dir.mkdir(parents=True, exist_ok=True)
    space = cfg.space
    specs = space_tasks(space)
    export = export_tasks(cfg.export_best, specs, cfg.KEY) if cfg.export_best else []  # a misspelt task fails here
    # tokenised splits are shared by every trial of a (task, tokenizer): see finetune.loop.encode_cached
    cache_dir = str(out_dir / "cache" / "encoded")
    cache_run = mark_encoded(Path(cache_dir))  # what this run does not read is deleted at its end
    trials = [dataclasses.replace(t, cache_dir=cache_dir) for t in build_trials(cfg, space, models, variants)]
    found = [_finished(trials_dir, t) for t in trials]
    todo = [t for t, rec in zip(trials, found) if rec is None]
    skipped = len(trials) - len(todo)
    msg = (f"sweep: {len(trials)} trial(s); skipping {skipped} finished, running {len(todo)}"
           + made_under_each([rec for rec in found if rec is not None]))  # their libraries' releases since
    log.info(msg)
    print(msg, flush=True)
    started = time.monotonic()
    if todo:  # each model's tokenizer for the workers: then they import no transformers (finetune.tokenizer)
        write_worker_tokenizers(cache_dir, {t.model_dir for t in todo})
        ray_up.enter_context(ray_session())
        ray_trials = _run_tune(cfg, todo, out_dir, trials_dir)
    records = [_finished(trials_dir, t) for t in trials]
    missing = [t.trial_id for t, r in zip(trials, records) if r is None]
    if missing:
        raise OrchestratorError(f"{len(missing)} trial(s) left no record, e.g. {missing[0]}")
    model_names = list(models) + [v.name for v in variants]
    results = build_results({s.name: s for s in specs.values()}, model_names, records)
    atomic_write_json(out_dir / "results.json", results)
    selection = {m: {t: c["selected"] for t, c in cells.items()} for m, cells in results["cells"].items()}
    atomic_write_json(out_dir / "selection.json", selection)
    if warning := edge_warning(results):
        log.warning("sweep: %s", warning)
    held = slots_held(_resources(cfg), ray_trials, cfg.max_concurrent_trials) if todo else (0.0, 0.0)
    cost = sweep_cost(records, {t.trial_id for t in todo}, time.monotonic() - started, held, out_dir)
    data_files = sorted({str(f) for t in trials for f in task_files(t)})  # what the scores were read from
    write_manifest(out_dir, stage="sweep", config=cfg.as_read(), inputs=[Path(p) for p in models.values()] + data_files,
                   counts={"trials": len(trials), "ran": len(todo), "skipped": skipped},
                   extra={"search_space": to_dict(space), "models": {k: str(v) for k, v in models.items()},
                          COST_FIELD: cost})
    if todo:  # this call's device time; with trials of earlier calls reused, the whole sweep's too
        mine = cost["device_h"] - cost.get("earlier_device_h", 0.0)
        log.info("sweep: done in %s (%.3f %s-h, %d trial(s) on %g %s(s)%s)", duration(time.monotonic() - started),
                 mine, cost["device"], len(todo), cost["units"], cost["device"],
                 f"; {cost['device_h']:.3f} {cost['device']}-h with the {skipped} trial(s) of earlier runs"
                 if skipped and "earlier_device_h" in cost else "")
    if (cost.get("trials") or {}).get("unknown"):
        log.info("sweep: %d of %d trial record(s) were kept before trials were costed: their cost is unknown, in no "
                 "sum", cost["trials"]["unknown"], len(trials))
    exports, exported = _export_best(cfg, results, records, export, out_dir, ray_up) if export else ({}, 0)
    pruned, pruned_bytes = prune_encoded(Path(cache_dir), cache_run) if todo else (0, 0)  # only a run adds
    if pruned:
        log.info("sweep: deleted %d tokenised split(s) this run did not use (%.1f MB) from %s", pruned,
                 pruned_bytes / 1e6, cache_dir)
    artifacts = [out_dir / "results.json", out_dir / "selection.json"]
    if export:
        artifacts.append(atomic_write_json(out_dir / S.EXPORTS_ARTIFACT, exports))
    parent = None
    if tracking is not None:
        model_tags = {m: {S.MODEL_DIR: str(p), S.MODEL_IDENTITY: model_identity(p), **(row_tags or {}).get(m, {})}
                      for m, p in [*models.items(), *((v.name, Path(v.model_dir)) for v in variants)]}
        try:
            parent = log_sweep(tracking, run_dir, name=out_dir.parent.name or "sweep",
                               config=tracked_config(cfg, space), results=results,
                               records=records, model_tags=model_tags, selected=selected_answers(results, records),
                               artifacts=artifacts, log_predictions=cfg.log_predictions, exports=exports)
        except Exception as exc:  # MLflow raises many types; the results are on disk whatever it does
            log.warning("MLflow: logging the sweep failed (%s); the results are in %s, and re-running the same "
                        "sweep logs them (no trial is trained again)", exc, out_dir / "results.json")
    return SweepResult(results=results, out_dir=out_dir, ran=len(todo), skipped=skipped, parent_run_id=parent,
                       exports=exports, exported=exported)
