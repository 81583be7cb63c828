"""``jobs/augment.py``: filtered-BERT augmentation of one NER task's training split (seed 001).

    run(AugmentJobConfig(model_dir="runs/pretrain/pretrain/final"))   # -> out_dir, a drop-in task directory

The stage itself (planned rows -> MLM actor pool on Ray Data -> task directory) is
``orchestrator.augment.pipeline.augment_task``, which the sweep's augmentation stage runs too; this
module holds the job's config, its dry run and its run: the task and its data directory resolved,
the MLM directory checked, the output reused when its key is unchanged.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from orchestrator.augment.config import AugmentConfig, AugmentRayConfig, SimilarityConfig
from orchestrator.augment.filtered import check_mlm_dir
from orchestrator.augment.pipeline import AugmentResult, augment_key, augment_task, from_format, training_sentences
from orchestrator.augment.similarity import check_similarity_inputs
from orchestrator.core.config import field
from orchestrator.core.console import LOG_PATH, run_log
from orchestrator.core.cost import COST_FIELD
from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import check_replaceable, read_manifest
from orchestrator.core.reuse import run_stage
from orchestrator.finetune.spec import SAMPLE_DIR, TaskSpec, load_task
from orchestrator.track.caller import mlflow_state_kept

STAGE = "augment"
log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AugmentJobConfig:
    """``python jobs/augment.py``: one NER task's training split in, an augmented task directory out."""

    out_dir: str = field("runs/augment", help="output task directory (train augmented; dev/test copied)")
    task: str = field("bc5cdr_chemical", help="task file stem, display name or task YAML path (family ner)")
    data_dir: str = field("", help="directory holding the task's split files; empty = the shipped sample")
    format: str = field("", help="override the task's file format (e.g. iob for 2-column files); empty = "
                                 "the task's own")
    model_dir: str = field("", help="MLM directory: BertForMaskedLM / BertForPreTraining (e.g. a pretrain "
                                    "run's final/)")
    max_train_sentences: int = field(0, help="augment a fixed subset of this many training sentences "
                                             "(the subset the sweep's max_train_examples picks); 0 = all")
    device: str = field("auto", help="auto | cpu | cuda")
    augment: AugmentConfig = field(default_factory=AugmentConfig, help="the algorithm")
    similarity: SimilarityConfig = field(default_factory=SimilarityConfig, help="the similarity filter")
    ray: AugmentRayConfig = field(default_factory=AugmentRayConfig, help="actor pool placement")

    def __post_init__(self):
        if not self.out_dir:
            raise ConfigError("out_dir must be set")
        if self.max_train_sentences < 0:
            raise ConfigError("max_train_sentences must be >= 0")


def job_spec(cfg: AugmentJobConfig) -> tuple[TaskSpec, Path]:
    """The task (read as ``cfg.format`` when set) and the directory holding its split files."""
    spec = load_task(cfg.task)
    if cfg.format:
        spec = from_format(spec, cfg.format)
    data_dir = Path(cfg.data_dir) if cfg.data_dir else SAMPLE_DIR / spec.dir
    return spec, data_dir


def plan(cfg: AugmentJobConfig) -> str:
    """Dry run: the task parses, the MLM directory has a head, the vectors file starts as vectors do,
    every corpus file is text."""
    spec, data_dir = job_spec(cfg)
    examples = training_sentences(dataclasses.replace(spec, dir=""), data_dir, cfg.max_train_sentences)
    model_dir = check_inputs(cfg)
    total = int(round(len(examples) * cfg.augment.multiple))
    sim = cfg.similarity.vectors or (", ".join(cfg.similarity.corpus) or "the training sentences")
    return "\n".join([
        f"task: {spec.name} ({spec.format}) from {data_dir}: {len(examples)} training sentences",
        f"augment: {total} sentences, k={cfg.augment.words_per_sentence} words each, {cfg.augment.mask_mode} "
        f"masking, up to {cfg.augment.candidates} proposals, accept {cfg.augment.min_similarity} < cos <= "
        f"{cfg.augment.max_similarity}, entities {'replaced' if cfg.augment.replace_entities else 'kept'}",
        f"MLM: {model_dir}",
        f"similarity: {sim}",
        f"ray: {cfg.ray.actors} actors x {cfg.ray.cpus_per_actor} CPU",
        f"output: {Path(cfg.out_dir).resolve()}",
    ])


def check_inputs(cfg: AugmentJobConfig) -> Path:
    """The output directory (absent, empty or an earlier augment output: never a folder the project did
    not write, such as the task's own data directory), the MLM directory and the similarity inputs,
    checked cheaply and without torch: what the dry run checks and the run checks before it writes or
    starts Ray. Returns the MLM directory."""
    check_replaceable(cfg.out_dir, STAGE)
    model_dir = check_mlm_dir(cfg.model_dir)
    check_similarity_inputs(cfg.similarity)
    return model_dir


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: AugmentJobConfig) -> AugmentResult:
    """Augment the task into ``cfg.out_dir``, or reuse it there when task, MLM and settings are unchanged."""
    spec, data_dir = job_spec(cfg)
    check_inputs(cfg)
    spec = dataclasses.replace(spec, dir="")
    key = augment_key(spec, data_dir, cfg.model_dir, cfg.augment, cfg.similarity, cfg.max_train_sentences,
                      cfg.out_dir)
    # Ray's and the actors' own lines go to a log file beside the output (a task directory, which holds the
    # task's files alone), as pretraining's go to <out_dir>/../logs/job.log; --verbose keeps them on the terminal
    with run_log(Path(cfg.out_dir).resolve().parent / LOG_PATH) as written:
        if written:
            log.info("Ray's and the actors' own output: %s", written)
        out = run_stage(STAGE, cfg.out_dir, key, lambda tmp: augment_task(
            spec, data_dir, tmp, cfg.model_dir, cfg.augment, cfg.similarity, cfg.ray,
            max_train_sentences=cfg.max_train_sentences, device=cfg.device))
    manifest = read_manifest(out)  # the time the output took when it was made (this run, or the one reused)
    return AugmentResult(out, manifest["counts"], float((manifest.get(COST_FIELD) or {}).get("wall_s", 0.0)))
