"""The names this project gives MLflow runs, tags, params, metrics and artifacts: one module that
the writer (``orchestrator.track``), the reader (``orchestrator.report.mlflow_results``) and the tests
import, so none of them spells a name of its own.

Run tree of a sweep:

    sweep parent        tags KIND=sweep, SWEEP_FINGERPRINT, GIT_COMMIT; metrics summary_metric(model, key)
      (model, task)     tags KIND=model_task, MODEL, TASK, GROUP, HIGHER_IS_BETTER, CELL_DIGEST,
                        MODEL_DIR, MODEL_IDENTITY; with sweep.export_best EXPORT_DIR (the exported model's
                        directory) and EXPORT_TRIAL (the trial it re-trained)
                        params MODEL, TASK, METRIC, selected.<key>; metrics TEST_MEAN, TEST_SD, DEV_MEAN, N,
                        CURVE_DEV / CURVE_TEST per epoch (step = epoch), per_tag.<tag>.<measure>
        trial           tags KIND=trial; params the trial's settings, MODEL and TASK as on its (model, task) run
                        (one filter finds both) with TASK_STEM the task file's stem; per-epoch train_loss, dev, test;
                        tag SELECTED_TRIAL, and on the runs behind the selected setting SELECTED_EPOCH, _DEV, _TEST;
                        early stopping (param patience > 0): dev every epoch, test at the best dev
                        epoch only, and metrics BEST_EPOCH, STOPPED_EPOCH

A pretraining run carries KIND=pretrain (named ``pretrain:<arm>`` in an experiment) and is a child of the run
active when it started; its metrics are per optimizer step (step = global step, each logged once: a resumed run
does not log again the steps it repeats), PRETRAIN_LOSS the training loss among them;
with a stopping rule (``pretrain.stop``) also WINDOW_MLM_LOSS and WINDOW_MLM_ACCURACY at each window's
end. Once it has finished, each phase's ``stopped_by_tag(phase)`` says what ended it (steps, plateau,
mlm_accuracy) and ``stop_step_metric(phase)`` holds the global step it ended at.

Run tree of an experiment (``orchestrator.workflows.blue_sweep``): one parent, KIND=experiment, EXPERIMENT_KEY;
each arm's pretraining run and the sweep parent above are its children; the pretraining run and
every (model, task) run carry ARM. The parent's tags say what the arms are and how they fared,
updated as each arm finishes: ARMS (the arm names in config order, comma-separated), BASELINE_TAG,
and per arm ``arm_tag(name, field)`` for field in ARM_FIELDS; its params are the arms' overrides
(``ARM_PARAM_PREFIX<name>.<key>``) and BASELINE as first logged. With ``selection.enabled`` each
pretraining arm also has a source-scoring child run, KIND=selection, tagged ARM and OUTPUT_KEY (the
scores' content key); its params are the scoring settings, its metrics ``source_metric(measure)``
(all tasks' text pooled) and ``source_metric(measure, task)`` for seed 004's ppl, jsd, tvc and ttr,
read back by ``read_source_metrics``. With a ``retrieval:`` section each arm's model (and each extra
model) has a retrieval run, KIND=retrieval, tagged MODEL, ARM and OUTPUT_KEY, as ``jobs/retrieval.py``
logs one per model.

A retrieval run (seed 002's cross-lingual retrieval, ``orchestrator.retrieval``): KIND=retrieval, tags
MODEL and OUTPUT_KEY (the content key of the results); params the settings and ``model_dir``; metrics
``retrieval_metric(k, src, tgt)``, precision@k of retrieving the tgt translation of each src unit,
read back by ``read_retrieval_metrics``; artifacts results.json, table.md, table.html.
"""
from __future__ import annotations

import json
import re

#: MLflow's experiment tag that decides what its UI opens on: the runs table for model training.
EXPERIMENT_KIND, MODEL_TRAINING = "mlflow.experimentKind", "custom_model_development"
KIND = "orchestrator.kind"
KIND_SWEEP, KIND_MODEL_TASK, KIND_TRIAL, KIND_PRETRAIN = "sweep", "model_task", "trial", "pretrain"
KIND_EXPERIMENT = "experiment"
KIND_SELECTION = "selection"
KIND_SOURCE_GAINS = "source_gains"  # seed 004's correlation of the source measures with the gains
KIND_RETRIEVAL = "retrieval"
RETRIEVAL_TO = "_to_"
SOURCE_PREFIX = "source."
SOURCE_GAIN_PREFIX = "source_gain."
EXPERIMENT_KEY = "orchestrator.experiment_key"
OUTPUT_KEY = "orchestrator.output_key"  # the content key of the stage output a run reports
#: "true" on a stage's run logged from what its reused output recorded (``runs.log_recorded_run``), in a store that
#: held no run of it (a re-run into another store, or after the user deleted it); tagged OUTPUT_KEY too
REUSED = "orchestrator.reused"
ARM = "arm"
ARMS, BASELINE_TAG = "orchestrator.arms", "orchestrator.baseline"
SWEEP_RUN = "orchestrator.sweep_run"  # an experiment's tag: the sweep run its last run logged (its page shows it)
ARM_FIELDS = ("status", "kind", "stage", "error")  # experiment.json's fields of an arm, as parent-run tags
ARM_PARAM_PREFIX, BASELINE = "arm.", "baseline"
PRETRAIN_LOSS = "loss"
WINDOW_MLM_LOSS, WINDOW_MLM_ACCURACY = "stop.window_mlm_loss", "stop.window_mlm_accuracy"
SWEEP_FINGERPRINT = "orchestrator.sweep_fingerprint"
RUN_DIR = "orchestrator.run_dir"  # a sweep's run directory: a report of it finds its sweep in a shared store
#: How a report finds "the newest" run: the one that ended last, a running one (no end yet) after those. A sweep or
#: experiment run a later job reopened (the same sweep again) keeps its start; by start, ``jobs/report.py
#: --run-dir`` showed an older job's other sweep (a probe, session 47)
NEWEST_FIRST = ("attributes.end_time DESC", "attributes.start_time DESC")
#: What an MLflow tag value holds in every store (SQL stores allow 8,000 characters; some 5,000)
MAX_TAG_CHARS = 5000
CELL_DIGEST = "orchestrator.cell_digest"  # set last: the (model, task) run and its trials are all logged
GIT_COMMIT, GIT_DIRTY, GIT_DIFF = "git_commit", "git_dirty", "git_diff_sha256"  # the code (manifest.git_state)
PARENT = "mlflow.parentRunId"

MODEL, TASK, GROUP, HIGHER_IS_BETTER, METRIC = "model", "task", "group", "higher_is_better", "metric"
TASK_STEM = "task_stem"  # a trial's task file stem (hoc_prior); TASK is the display name (HoC) on every run
MODEL_DIR, MODEL_IDENTITY = "model_dir", "model_identity"
SELECTED_PREFIX = "selected."
EDGE_PREFIX = "edge."  # edge.<setting>: the selection is that axis's first or last value (sweep.selection.grid_edges)
TEST_MEAN, TEST_SD, DEV_MEAN, N = "test_mean", "test_sd", "dev_mean", "n"
DEV_TIED = "dev_tied"  # 1 where every setting scored the same on dev: the selection is the tie-break's
TEST_SAMPLE = "test_sample"  # the test scores' sample size, where max_eval_examples cut the test split
CUT_PREFIX, CUT_OF = "cut.", ".of"  # cut.<split>: inputs cut at max_seq_length; cut.<split>.of: the split's size
CURVE_DEV, CURVE_TEST = "curve.dev", "curve.test"
# a cell's test score per seed (per fold where FOLDS is logged): metric TEST_SCORE at step i is test_scores[i],
# param SEEDS the JSON list of seeds; what the paired differences of a report rebuilt from metrics pair
TEST_SCORE, SEEDS, FOLDS = "test_score", "seeds", "folds"
BEST_EPOCH, STOPPED_EPOCH = "best_epoch", "stopped_epoch"
#: a trial run's tag, "true" when it is one of the runs behind its cell's selected setting, and those runs' metrics:
#: the epoch, dev and test score the selection used (its dev and test are the last epoch's: probe M9)
SELECTED_TRIAL = "orchestrator.selected"
SELECTED_EPOCH, SELECTED_DEV, SELECTED_TEST = "selected_epoch", "selected_dev", "selected_test"
EXPORT_DIR, EXPORT_TRIAL = "orchestrator.export_dir", "orchestrator.export_trial"
EXPORTS_ARTIFACT = "exports.json"
RESULTS_ARTIFACT = "results.json"


def metric_key(text: str) -> str:
    """MLflow metric names allow letters, digits, _ - . / and spaces: anything else becomes _."""
    return re.sub(r"[^A-Za-z0-9_./ -]+", "_", text)


def summary_metric(model: str, key: str) -> str:
    """The sweep parent's metric holding a model's summary score (``key``: total or a group)."""
    return metric_key(f"{model}.{key}")


def source_metric(measure: str, task: str | None = None) -> str:
    """A source-scoring run's metric: one measure, against all tasks' text or against one task's."""
    return metric_key(f"{SOURCE_PREFIX}{measure}" if task is None else f"{SOURCE_PREFIX}{task}.{measure}")


def source_gain_metric(column: str, measure: str, stat: str) -> str:
    """A source-gains run's metric: ``stat`` (r, rho, n) of ``measure`` with the gain on ``column``
    (a task, total, "tasks pooled"; "matrix" with ``measure`` "a-b" for the matrix of the measures)."""
    return metric_key(f"{SOURCE_GAIN_PREFIX}{column}.{measure}.{stat}")


def read_source_metrics(metrics: dict[str, float]) -> dict:
    """A source-scoring run's metrics back as ``{"measures": {m: v}, "by_task": {task: {m: v}}}``
    (the shape of ``orchestrator.selection.arms.read_scores``); a measure's name has no dot."""
    scores: dict = {"measures": {}, "by_task": {}}
    for name, value in metrics.items():
        if not name.startswith(SOURCE_PREFIX):
            continue
        task, _, measure = name[len(SOURCE_PREFIX):].rpartition(".")
        (scores["by_task"].setdefault(task, {}) if task else scores["measures"])[measure] = value
    return scores


def retrieval_metric(k: int, src: str, tgt: str) -> str:
    """A retrieval run's metric: precision@k of retrieving the ``tgt`` translation of each ``src`` unit."""
    return metric_key(f"p_at_{k}.{src}{RETRIEVAL_TO}{tgt}")


def read_retrieval_metrics(metrics: dict[str, float]) -> dict[str, dict[str, float]]:
    """A retrieval run's metrics back as ``{"p_at_1": {"de->en": value}}`` (the job's printed JSON, per model)."""
    out: dict[str, dict[str, float]] = {}
    for name, value in metrics.items():
        head, dot, pair = name.partition(".")
        if not (head.startswith("p_at_") and dot and RETRIEVAL_TO in pair):
            continue
        src, _, tgt = pair.partition(RETRIEVAL_TO)
        out.setdefault(head, {})[f"{src}->{tgt}"] = value
    return out


def stopped_by_tag(phase: str) -> str:
    """A pretraining run's tag saying what ended ``phase`` (phase1, phase2)."""
    return f"orchestrator.{phase}.stopped_by"


def stop_step_metric(phase: str) -> str:
    """A pretraining run's metric holding the global step ``phase`` ended at."""
    return f"{phase}.stop_step"


COST_TAG_PREFIX = "orchestrator.cost."


def cost_tags(costs: dict[str, list[dict]]) -> dict[str, str]:
    """An experiment's stage costs as its parent run's tags, one per arm (and one for the whole sweep):
    ``orchestrator.cost.<i>`` = ``{"owner": arm, "rows": [StageCost fields: stage, wall_s, device, units,
    device_h, reused, shared]}`` (``orchestrator.core.cost``), numbered in the order they are shown."""
    return {f"{COST_TAG_PREFIX}{i}": json.dumps({"owner": owner, "rows": rows})
            for i, (owner, rows) in enumerate(costs.items())}


def read_cost_tags(tags: dict[str, str]) -> dict[str, list[dict]]:
    """``cost_tags`` back: {owner: rows}, in their order."""
    found = []
    for name, value in tags.items():
        index = name[len(COST_TAG_PREFIX):]
        if name.startswith(COST_TAG_PREFIX) and index.isdigit():
            try:
                doc = json.loads(value)
                found.append((int(index), str(doc["owner"]), [dict(row) for row in doc["rows"]]))
            except (ValueError, TypeError, KeyError):
                continue
    return {owner: rows for _, owner, rows in sorted(found)}


def arm_tag(arm: str, name: str) -> str:
    """The experiment parent's tag holding one field (ARM_FIELDS) of an arm's status."""
    return f"orchestrator.arm.{arm}.{name}"


def per_tag_metric(tag: str, measure: str) -> str:
    return metric_key(f"per_tag.{tag}.{measure}")


def bool_tag(value: bool) -> str:
    return "true" if value else "false"


def read_bool_tag(text: str) -> bool:
    return text.strip().lower() in ("true", "1", "yes")
