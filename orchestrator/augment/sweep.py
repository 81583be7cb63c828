"""The sweep's augmentation option: every NER trial is also run on a filtered-BERT augmented copy
of its training data, reported as a second model ``<model>+filtered-bert`` in results.json, MLflow
and the report (with the same per-tag precision / recall / F1 as the original).

The augmented copy holds the same (capped) training sentences as the original trial plus their
augmentations, so the two rows differ only by the augmentation.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from orchestrator.augment.config import AugmentConfig, AugmentRayConfig, SimilarityConfig
from orchestrator.core.config import field
from orchestrator.core.manifest import is_complete, read_manifest
from orchestrator.finetune.loop import TrialSpec
from orchestrator.finetune.spec import load_task

log = logging.getLogger(__name__)

SUFFIX = "+filtered-bert"


@dataclasses.dataclass(frozen=True)
class SweepAugmentConfig:
    enabled: bool = field(False, help="also fine-tune every NER task on filtered-BERT augmented training data")
    model_dir: str = field("", help="MLM proposing replacements; empty = each swept model itself (needs an "
                                    "MLM head: this project's pretrain output has one)")
    augment: AugmentConfig = field(default_factory=AugmentConfig, help="the algorithm")
    similarity: SimilarityConfig = field(default_factory=SimilarityConfig, help="the similarity filter")
    ray: AugmentRayConfig = field(default_factory=AugmentRayConfig, help="actor pool placement")


def augmented_name(model_name: str) -> str:
    return model_name + SUFFIX


def augmented_trials(cfg: SweepAugmentConfig, trials: list[TrialSpec], out_dir: Path) -> list[TrialSpec]:
    """The augmented twin of every NER trial; augments each (model, task) training set once
    into ``out_dir/augmented/<model>/<task>/`` (reused when its manifest matches)."""
    if not cfg.enabled:
        return []
    twins: list[TrialSpec] = []
    done: dict[tuple[str, str], Path] = {}
    for trial in trials:
        spec = load_task(trial.task)
        if spec.family != "ner":
            continue
        key = (trial.model_name, trial.task)
        if key not in done:
            done[key] = _augment_once(cfg, trial, out_dir / "augmented" / _safe(trial.model_name) /
                                      _safe(Path(trial.task).stem))
        twins.append(dataclasses.replace(
            trial, trial_id=f"{trial.trial_id}{SUFFIX.replace('+', '__')}", model_name=augmented_name(trial.model_name),
            data_dir=str(done[key]), max_train_examples=0))
    return twins


def _augment_once(cfg: SweepAugmentConfig, trial: TrialSpec, out: Path) -> Path:
    from orchestrator.augment.pipeline import augment_task

    mlm = cfg.model_dir or trial.model_dir
    wanted = {"max_train_sentences": trial.max_train_examples, "model_dir": str(mlm), "data_dir": trial.data_dir,
              "augment": dataclasses.asdict(cfg.augment)}
    if is_complete(out) and read_manifest(out).get("sweep_key") == wanted:
        log.info("reusing augmented data %s", out)
        return out
    spec = dataclasses.replace(load_task(trial.task), dir="")
    augment_task(spec, trial.data_dir, out, mlm, cfg.augment, cfg.similarity, cfg.ray,
                 max_train_sentences=trial.max_train_examples, device=trial.device,
                 extra_manifest={"sweep_key": wanted})
    return out


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text).strip("-")
