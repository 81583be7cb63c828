"""The selected fine-tuned model of each (model, task) as an artifact (``sweep.export_best``).

Selection happens after every trial has ended, and trials keep no weights (a sweep of 10 tasks x
3 learning rates x 5 seeds would hold 150 BERT copies to use a handful). So the one run chosen for
a cell -- its selected learning rate (and epoch count), and one seed by ``sweep.export_seed`` -- is
trained once more, with the same TrialSpec: the same seed, data order, schedule (a shared-epoch
trial's schedule still spans its largest epoch count: ``run_trial(stop_after=)``) and thread count,
so on CPU it is the same model the sweep scored; the export's manifest records the re-run's dev and
test scores beside the recorded ones (``reproduced``), and a mismatch (a non-deterministic GPU
kernel; or a trial the sweep trained in a learning-rate bundle, ``finetune.bundle``, whose re-run alone
differs by the bundle's float rounding) is logged as a warning.

    <sweep>/exports/<trial_id>-<key>/   config.json (id2label, label2id), model.safetensors, tokenizer
                                        files, head.safetensors, task.json, manifest.json
    <sweep>/exports.json                model -> task -> the export's directory, trial, lr, epoch, seed,
                                        dev and test

``key`` is the content key of the trial's fingerprint (``space.trial_fingerprint``) and the epoch:
an export is reused while its trial is, and never changes a trial's key. Each directory is written
to a temp sibling and renamed when complete (``core.manifest.atomic_dir``): a crash leaves no
directory that looks finished (``finetune.export.load_finetuned`` refuses one without its manifest).
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import atomic_dir, is_complete, read_manifest, write_manifest
from orchestrator.core.registry import suggest
from orchestrator.core.reuse import content_key
from orchestrator.finetune.spec import TaskSpec, load_task
from orchestrator.finetune.trial import TrialSpec
from orchestrator.sweep.selection import selected_runs
from orchestrator.sweep.space import TASK_DATA, task_aliases

log = logging.getLogger(__name__)

EXPORT_STAGE = "finetune_export"
EXPORTS_DIR = "exports"


def export_tasks(wanted: tuple[str, ...], specs: dict[str, TaskSpec], key: str) -> list[str]:
    """The display names of the space's tasks that ``sweep.export_best`` names (stems, display
    names or task paths; ``all`` = every task). A name that is no task of the space is a ConfigError."""
    if "all" in wanted:
        return [spec.name for spec in specs.values()]
    names = {}
    for task, spec in specs.items():
        for alias in task_aliases(task, spec):
            names[alias] = spec.name
    unknown = [w for w in wanted if w not in names]
    if unknown:
        raise ConfigError(f"{key}.export_best: {unknown[0]!r} is not a task of the search space"
                          f"{suggest(unknown[0], list(names))}")
    return list(dict.fromkeys(names[w] for w in wanted))


@dataclasses.dataclass(frozen=True)
class ExportPlan:
    """One run to export: its trial record, the epoch whose model it is, and where it goes."""

    model: str
    task: str
    record: dict
    epoch: int  # an epoch of the grid, or an early-stopped trial's best dev epoch
    dev: float
    test: float
    dst: Path

    @property
    def trial(self) -> TrialSpec:
        t = self.record["trial"]
        return TrialSpec(**{**t, "eval_epochs": tuple(t["eval_epochs"])})

    @property
    def stop_after(self) -> int:
        """A grid trial ends after the selected epoch; an early-stopped one runs as it ran (its stop
        rule and its restored best weights give the same model)."""
        return 0 if "early_stopping" in self.record else self.epoch


def plan_exports(results: dict, records: list[dict], tasks: list[str], out_dir: Path, rule: str) -> list[ExportPlan]:
    """For each (model, task) cell of ``tasks``: the run at the selected setting with the best dev
    score (``best_dev``; ties: the smaller seed, then fold) or the median one (``median_dev``: the
    lower median by dev rank, the better of the two middle runs when their number is even)."""
    direction = {t["name"]: t["higher_is_better"] for t in results["tasks"]}
    plans = []
    for model, cells in results["cells"].items():
        for task in tasks:
            if task not in cells:
                continue
            recs = [r for r in records if r["trial"]["model_name"] == model and r["task"] == task]
            runs = selected_runs(recs, cells[task]["selected"])
            sign = -1.0 if direction[task] else 1.0
            ranked = sorted(runs, key=lambda x: (sign * x[2], x[0]["trial"]["seed"], x[0]["trial"].get("fold", -1)))
            rec, epoch, dev, test = ranked[0] if rule == "best_dev" else ranked[(len(ranked) - 1) // 2]
            key = content_key({"trial": rec["fingerprint"], "epoch": epoch}, length=12)
            plans.append(ExportPlan(model=model, task=task, record=rec, epoch=epoch, dev=dev, test=test,
                                    dst=out_dir / EXPORTS_DIR / f"{rec['trial_id']}-{key}"))
    return plans


def finished(plan: ExportPlan) -> dict | None:
    """The manifest of a complete earlier export of this plan, else None: one trained on other task files
    than the plan's record (its trial re-run on a task file edited in place) is not. An export made before
    the files' hashes were kept is taken as the record's."""
    if not is_complete(plan.dst):
        return None
    manifest = read_manifest(plan.dst)
    if manifest.get("stage") != EXPORT_STAGE:
        return None
    return manifest if manifest.get(TASK_DATA, plan.record.get(TASK_DATA)) == plan.record.get(TASK_DATA) else None


def export_run(plan: ExportPlan) -> dict:
    """Train the plan's run once more and write its model into ``plan.dst`` (temp dir, then rename);
    returns the export's manifest. Runs where a trial runs (a Ray task of the sweep's resources)."""
    from transformers import AutoTokenizer  # heavy: transformers

    from orchestrator.finetune.export import save_finetuned  # heavy: torch
    from orchestrator.finetune.loop import run_trial  # heavy: torch

    trial = plan.trial
    spec = dataclasses.replace(load_task(trial.task), dir="")
    tokenizer = AutoTokenizer.from_pretrained(trial.model_dir)
    with atomic_dir(plan.dst, EXPORT_STAGE) as tmp:
        rec = run_trial(trial, task_spec=spec, stop_after=plan.stop_after,
                        keep=lambda model: save_finetuned(model, spec, tokenizer, tmp, trial.max_seq_length))
        row = next(r for r in rec["epochs"] if r["epoch"] == plan.epoch)
        reproduced = (row["dev"], row["test"]) == (plan.dev, plan.test)
        if not reproduced:
            log.warning("export %s: the re-trained model scores dev %.6f / test %.6f, the sweep recorded %.6f / "
                        "%.6f (non-deterministic kernels?)", plan.dst.name, row["dev"], row["test"], plan.dev,
                        plan.test)
        write_manifest(tmp, stage=EXPORT_STAGE, config=trial, inputs=[trial.model_dir], seed=trial.seed,
                       counts=rec["counts"],
                       extra={"model": plan.model, "task": plan.task, "trial_id": trial.trial_id,
                              "trial_fingerprint": plan.record["fingerprint"], "learning_rate": trial.learning_rate,
                              "epoch": plan.epoch, "fold": trial.fold, "early_stopping": "early_stopping" in rec,
                              "dev": row["dev"], "test": row["test"], "recorded": {"dev": plan.dev, "test": plan.test},
                              "reproduced": reproduced,
                              **({TASK_DATA: plan.record[TASK_DATA]} if TASK_DATA in plan.record else {})})
    return read_manifest(plan.dst)


def export_entry(plan: ExportPlan, manifest: dict) -> dict:
    """One cell's line of exports.json (and of its MLflow tags)."""
    return {"dir": str(plan.dst), "trial_id": plan.record["trial_id"], "learning_rate": manifest["learning_rate"],
            "epoch": plan.epoch, "seed": manifest["seed"], "dev": manifest["dev"], "test": manifest["test"],
            "reproduced": manifest["reproduced"]}
