"""The one place that wires stages: corpus -> vocab -> instances -> pretrain -> augment -> sweep -> report.

This is what `python jobs/blue_sweep.py` runs (and `jobs/build_corpus.py`, its first three
stages). Every stage is its own module reading the previous stage's output from disk; the chain
gives each stage its config and its inputs, and the key of both (``orchestrator.core.reuse``):
a stage whose output records the same key is reused, so a re-run resumes where it stopped and a
changed setting re-runs exactly the stages downstream of it.

Importing this module is cheap (configs only): the stage implementations, with torch and Ray
behind them, are imported when a stage runs.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.augment.config import AugmentStageConfig
from orchestrator.core.artifacts import SMALL_ROLES
from orchestrator.core.config import expand_package_paths, field, flatten, from_dict, read_yaml, set_dotted, to_dict
from orchestrator.core.console import LOG_PATH
from orchestrator.core.cost import StageCost, read_cost
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import (
    atomic_write_json,
    check_replaceable,
    check_writable_dir,
    hash_inputs,
    read_manifest,
)
from orchestrator.core.reuse import content_key, run_stage
from orchestrator.core.runtime import ray_session, seed_everything
from orchestrator.corpus.sources import SourceConfig, source_files
from orchestrator.corpus.stage import CorpusConfig, input_stats, source_sizes
from orchestrator.formats import READERS
from orchestrator.instances.config import InstanceConfig
from orchestrator.pretrain.config import PretrainConfig
from orchestrator.report.summary import PAGE, RETRIEVAL, ChainResult  # noqa: F401 (chain.PAGE, chain.RETRIEVAL)
from orchestrator.retrieval.config import RetrievalSpec
from orchestrator.selection.arms import ArmScoringConfig
from orchestrator.sweep.config import SweepConfig
from orchestrator.sweep.space import Variant, space_tasks, task_data_dir, task_key
from orchestrator.track import TrackingConfig, effective_uri, local_uri, probe
from orchestrator.track.experiments import experiment_id_of
from orchestrator.vocab.quality import quality_inputs
from orchestrator.vocab.stage import model_tokenizer_files
from orchestrator.vocab.wordpiece import VocabConfig

log = logging.getLogger("chain")

ALL_STAGES: tuple[str, ...] = ("corpus", "vocab", "instances", "pretrain", "augment", "sweep", "report")
#: Each stage and the stage whose output it reads (the augment stage reads the models, as the sweep does).
UPSTREAM = {"vocab": "corpus", "instances": "vocab", "pretrain": "instances"}
AUGMENTED_SUFFIX = "+filtered-bert"
#: The row of the equal-steps control (augment.augment.method: repeat): the originals repeated unchanged.
REPEATED_SUFFIX = "+repeated"
#: Keys an experiment's arm may not change: every arm runs in the same place, on the same Ray, into
#: the same MLflow experiment, and through the one paired sweep.
ARM_FIXED = ("run_name", "runs_root", "model_name", "stages", "compare_models", "ray", "tracking", "sweep",
             "arms", "baseline", "selection", "arm_concurrency", "retrieval")
#: Arm keys that are not config overrides: a published model (no corpus, no pretraining), the
#: untrained floor of the arm's architecture (random initialisation), or the corpus: section of a
#: YAML file (a proposal of jobs/propose_mix.py, or any build_corpus / chain config) as the arm's corpus.
ARM_MODEL, ARM_INIT, ARM_CORPUS = "model", "init", "corpus_from"
#: A model arm's optional note of the job that makes its model (a model made by another job, e.g. the entity
#: cycle): its dry run passes before that job has run, and the run refuses with this note until it has.
ARM_MADE_BY = "made_by"


@dataclasses.dataclass(frozen=True)
class RayConfig:
    address: str = field("", help="Ray cluster address; empty = RAY_ADDRESS or a cluster head if present, "
                                  "else an embedded local Ray on 127.0.0.1; 'local' forces embedded")
    num_cpus: int = field(0, help="CPUs for an embedded local Ray (0 = all)")

    def __post_init__(self):
        if self.num_cpus < 0:
            raise ConfigError(f"ray.num_cpus must be >= 0 (0 = all), got {self.num_cpus}")


def sample_corpus() -> CorpusConfig:
    """The bundled sample: a small in-domain corpus and a larger general one (see sample_data/)."""
    root = Path(__file__).resolve().parent / "sample_data" / "corpus"
    return CorpusConfig(sources=(
        SourceConfig(name="in_domain", paths=(str(root / "in_domain.txt"),), role="small"),
        SourceConfig(name="general", paths=(str(root / "general.txt"),), role="large"),
    ))


@dataclasses.dataclass(frozen=True)
class ChainConfig:
    run_name: str = field("default", help="run directory name under runs_root")
    runs_root: str = field("runs", help="where run directories are created")
    model_name: str = field("ours", help="display name of the model pretrained by this run")
    stages: tuple[str, ...] = field(ALL_STAGES, help=f"stages to run, in order ({', '.join(ALL_STAGES)}); "
                                                     "augment runs only when augment.enabled")
    compare_models: dict[str, str] = field(default_factory=dict,
                                           help="extra Hugging Face BERT directories to fine-tune alongside "
                                                "(name: path), e.g. a published biomedical BERT on disk")
    seed: int = field(42, help="global seed")
    ray: RayConfig = field(default_factory=RayConfig, help="Ray runtime")
    tracking: TrackingConfig = field(default_factory=TrackingConfig, help="MLflow tracking")
    corpus: CorpusConfig = field(default_factory=sample_corpus, help="corpus stage: sources and mixing")
    vocab: VocabConfig = field(default_factory=VocabConfig, help="vocabulary stage: WordPiece / AmpV")
    instances: InstanceConfig = field(default_factory=InstanceConfig, help="instances stage: NSP + MLM")
    pretrain: PretrainConfig = field(default_factory=PretrainConfig, help="pretraining stage")
    augment: AugmentStageConfig = field(default_factory=AugmentStageConfig,
                                        help="filtered-BERT augmentation of the sweep's NER tasks (seed 001)")
    sweep: SweepConfig = field(default_factory=SweepConfig, help="BLUE fine-tuning sweep")
    arms: dict[str, dict[str, Any]] = field(
        default_factory=dict, help="an experiment: arm name -> dotted overrides of this config (corpus, vocab, "
                                   "instances, pretrain, augment keys, e.g. {corpus.mixer.name: simpt}), with "
                                   "{corpus_from: <file>} taking the corpus: section of a YAML file (a proposal of "
                                   "jobs/propose_mix.py); or "
                                   "{model: <HF directory>} for a published model; or {init: random} for the "
                                   "untrained floor. Stages the arms share run once; every arm goes through one "
                                   "sweep, paired by seed. Empty (arms={}) = one model")
    baseline: str = field("", help="the arm the report's paired differences are taken against (default: the "
                                   "first arm)")
    arm_concurrency: int = field(1, help="arms built at the same time, each submitting its stages to Ray (a stage "
                                         "two arms share is built once, the other waits for it); 1 = one after "
                                         "another (a laptop); 0 = as many as the Ray cluster's CPUs (or GPUs) fit "
                                         "pretraining jobs at once")
    selection: ArmScoringConfig = field(default_factory=ArmScoringConfig,
                                        help="an experiment's source scoring (seed 004): each pretraining arm's "
                                             "sources against the sweep's tasks, correlated with its gain")
    retrieval: RetrievalSpec = field(default_factory=RetrievalSpec,
                                     help="an experiment's cross-lingual retrieval (seed 002, Table 6), no "
                                          "fine-tuning: every arm's model (and retrieval.models) on parallel text; "
                                          "runs when retrieval.texts or retrieval.pairs names text")

    def __post_init__(self):
        if self.arm_concurrency < 0:
            raise ConfigError(f"arm_concurrency: {self.arm_concurrency}; 1 = one arm at a time, 0 = as many as the "
                              "cluster fits")
        bad = [s for s in self.stages if s not in ALL_STAGES]
        if bad:
            raise ConfigError(f"stages: unknown stage(s) {bad}; valid: {list(ALL_STAGES)}")
        for stage, upstream in UPSTREAM.items():
            if stage in self.stages and upstream not in self.stages:
                raise ConfigError(f"stages: {stage} needs the {upstream} stage (its output is {stage}'s input)")
        if "sweep" in self.stages and "pretrain" not in self.stages and not self.compare_models:
            raise ConfigError("stages: a sweep without pretraining needs compare_models (name: HF directory)")
        if self.arms and self.baseline and self.baseline not in self.arms:  # without arms it has no use
            raise ConfigError(f"baseline {self.baseline!r} is not an arm (arms: {list(self.arms)})")
        for name in self.arms:
            self.arm(name)  # every arm's config is checked when the experiment's config is read
        if self.selection.enabled and not self.arms:
            raise ConfigError("selection.enabled scores an experiment's arms: it needs arms: (docs/EXPERIMENTS.md)")
        if self.retrieval.enabled and not self.arms:
            raise ConfigError("retrieval evaluates an experiment's arms: it needs arms: (for models alone, "
                              "jobs/retrieval.py)")
        clash = sorted(set(self.retrieval.models) & set(self.arms))
        if clash:
            raise ConfigError(f"retrieval.models.{clash[0]}: {clash[0]} is already an arm; give the extra model "
                              "another name")

    def arm(self, name: str) -> ChainConfig:
        """The chain config of one arm: this config with the arm's overrides (and no arms)."""
        arm = flatten(self.arms[name])
        if not name or _safe(name) != name:
            raise ConfigError(f"arms: {name!r} is not a usable arm name (letters, digits, . _ -)")
        fixed = [k for k in arm if k.split(".")[0] in ARM_FIXED]
        if fixed:
            raise ConfigError(f"arms.{name}.{fixed[0]}: an arm cannot change {fixed[0].split('.')[0]} (every arm "
                              "shares the run directory, Ray, MLflow and the one paired sweep)")
        if ARM_INIT in arm and arm[ARM_INIT] != "random":
            raise ConfigError(f"arms.{name}.init: {arm[ARM_INIT]!r}; the only value is 'random' (the untrained floor)")
        if ARM_MODEL in arm and set(arm) - {ARM_MODEL, ARM_MADE_BY}:
            raise ConfigError(f"arms.{name}: a published model ({ARM_MODEL}: <dir>) takes no other keys than "
                              f"{ARM_MADE_BY} (got {sorted(set(arm) - {ARM_MODEL, ARM_MADE_BY})[0]})")
        if ARM_MADE_BY in arm and ARM_MODEL not in arm:
            raise ConfigError(f"arms.{name}.{ARM_MADE_BY}: only a model arm ({ARM_MODEL}: <dir>) is made by "
                              "another job")
        data = {k: v for k, v in to_dict(self).items() if k not in ("arms", "baseline", "selection", "retrieval")}
        if ARM_CORPUS in arm:  # the file's corpus replaces the base config's; the arm's other keys still apply
            data["corpus"] = corpus_section(arm[ARM_CORPUS], f"arms.{name}.{ARM_CORPUS}")
        for key, value in arm.items():
            if key not in (ARM_MODEL, ARM_INIT, ARM_CORPUS, ARM_MADE_BY):
                set_dotted(data, key.split("."), value)  # as a command-line override would
        try:
            built = from_dict(ChainConfig, data)
        except ConfigError as exc:
            raise ConfigError(f"arms.{name}: {exc}") from None
        if ARM_INIT in arm and built.pretrain.model.init_from:
            raise ConfigError(f"arms.{name}: the untrained floor cannot continue from pretrain.model.init_from "
                              f"{built.pretrain.model.init_from}")
        return built

    def arm_kind(self, name: str) -> str:
        """'model' (a published model), 'random' (the untrained floor) or 'pretrain'."""
        arm = flatten(self.arms[name])
        return "model" if ARM_MODEL in arm else "random" if ARM_INIT in arm else "pretrain"

    @property
    def baseline_arm(self) -> str:
        return self.baseline or next(iter(self.arms), "")

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_root).resolve() / self.run_name

    @property
    def active_stages(self) -> tuple[str, ...]:
        return tuple(s for s in self.stages if s != "augment" or self.augment.enabled)


# ---------------------------------------------------------------------------------------------
# The first three stages (also jobs/build_corpus.py)

@dataclasses.dataclass
class CorpusResult:
    corpus_dir: Path
    vocab_dir: Path
    instances: dict[int, Path]
    counts: dict

    def summary(self) -> str:
        lines = [f"corpus:    {self.corpus_dir}", f"vocab:     {self.vocab_dir}"]
        for length, path in sorted(self.instances.items()):
            c = self.counts["instances"][length]
            lines.append(f"instances: {path}  ({c['instances']} instances, {c['tokens']} tokens)")
        return "\n".join(lines)


#: Where a stage output lives: (output name, e.g. "corpus" or "instances/len128"; its key) -> directory.
Place = Callable[[str, str], Path]


def corpus_keys(corpus: CorpusConfig, vocab: VocabConfig, instances: InstanceConfig,
                stages: tuple[str, ...] = ("corpus", "vocab", "instances")) -> dict[str, str]:
    """The key of every output of the first three stages, from configs and input files alone (a
    finished stage records its key, so a downstream key never needs the upstream output itself).
    Reads the sources' sizes and the vocabulary's target files; builds nothing."""
    keys = {"corpus": content_key("corpus", corpus.identity(), input_stats(corpus))}
    if "vocab" not in stages:
        return keys
    # the tokenizer-quality table's inputs only when it has any (default keys stay what they were)
    quality = [hash_inputs(quality_inputs(vocab.quality))] if vocab.quality.active else []
    if vocab.from_model:  # the model's tokenizer files alone: arms on other corpora share it
        keys["vocab"] = content_key("vocab", vocab.identity(), hash_inputs(model_tokenizer_files(vocab.from_model)),
                                    *quality, *([keys["corpus"]] if vocab.quality.corpus_lines else []))
    else:
        keys["vocab"] = content_key("vocab", vocab.identity(), hash_inputs(vocab.target_paths), keys["corpus"],
                                    *quality)
    for length in instances.max_seq_lengths if "instances" in stages else ():
        keys[f"instances/len{length}"] = content_key("instances", instances.output_fields(), length, keys["corpus"],
                                                     keys["vocab"])
    return keys


def check_pretokenize(vocab: VocabConfig, instances: InstanceConfig) -> None:
    """instances.pretokenize, when not auto, must be what the vocabulary trains with (a vocabulary taken
    from a model is checked against its files when the instances are built)."""
    if instances.pretokenize != "auto" and not vocab.from_model and instances.pretokenize != vocab.pretokenize:
        raise ConfigError(f"instances.pretokenize is {instances.pretokenize} but vocab.pretokenize is "
                          f"{vocab.pretokenize}: instances must split words as the vocabulary does (set both, or "
                          "instances.pretokenize=auto)")


def check_corpus_outputs(run_dir: Path, instances: InstanceConfig,
                         stages: tuple[str, ...] = ("corpus", "vocab", "instances")) -> None:
    """The first three stages' outputs under ``run_dir`` (by name) may be written: each is absent, empty
    or an earlier output of its stage. Checked before Ray starts and by the dry run: a folder holding
    its own ``vocab/`` stops the job before ``corpus/`` is written beside it."""
    for stage, name in corpus_outputs(instances, stages):
        check_replaceable(run_dir / name, stage)


def corpus_outputs(instances: InstanceConfig, stages: tuple[str, ...]) -> list[tuple[str, str]]:
    """(stage, output name under the run directory) of the first three stages that run."""
    names = [(s, s) for s in ("corpus", "vocab") if s in stages]
    if "instances" in stages:
        names += [("instances", f"instances/len{n}") for n in instances.max_seq_lengths]
    return names


def corpus_stages(corpus: CorpusConfig, vocab: VocabConfig, instances: InstanceConfig, run_dir: Path,
                  stages: tuple[str, ...] = ("corpus", "vocab", "instances"), place: Place | None = None,
                  keys: dict[str, str] | None = None) -> CorpusResult:
    """corpus -> vocab -> instances/len<L> (Ray must be running), each reused by key; by default under
    ``run_dir`` by name, or wherever ``place`` puts each output (an experiment: by key)."""
    from orchestrator.corpus.stage import build_corpus  # heavy: Ray Data, pyarrow, tokenizers behind these
    from orchestrator.instances.stage import build_instances
    from orchestrator.vocab.stage import build_vocab

    check_pretokenize(vocab, instances)
    run_dir = Path(run_dir)
    place = place or (lambda name, key: run_dir / name)
    keys = keys or corpus_keys(corpus, vocab, instances, stages)
    corpus_dir = run_stage("corpus", place("corpus", keys["corpus"]), keys["corpus"],
                           lambda tmp: build_corpus(corpus, tmp))
    vocab_dir = place("vocab", keys["vocab"]) if "vocab" in stages else run_dir / "vocab"
    inst_dirs: dict[int, Path] = {}
    if "vocab" in stages:
        run_stage("vocab", vocab_dir, keys["vocab"], lambda tmp: build_vocab(vocab, corpus_dir, tmp))
    if "instances" in stages:
        for length in instances.max_seq_lengths:
            name = f"instances/len{length}"
            inst_dirs[length] = run_stage(
                "instances", place(name, keys[name]), keys[name],
                lambda tmp, n=length: build_instances(instances, corpus_dir, vocab_dir, tmp, n),
                f"instances len{length}")
    counts = {"corpus": read_manifest(corpus_dir)["counts"],
              "vocab": read_manifest(vocab_dir)["counts"] if "vocab" in stages else {},
              "instances": {n: read_manifest(p)["counts"] for n, p in inst_dirs.items()}}
    return CorpusResult(corpus_dir, vocab_dir, inst_dirs, counts)


def plan_corpus_stages(corpus: CorpusConfig, vocab: VocabConfig, instances: InstanceConfig,
                       stages: tuple[str, ...] = ("corpus", "vocab", "instances")) -> str:
    """Dry run of the first three stages: every source parses; what each stage would build."""
    from orchestrator.corpus.stage import plan_corpus  # heavy: the stage's implementation
    from orchestrator.instances.stage import plan_instances
    from orchestrator.vocab.stage import plan_vocab

    check_pretokenize(vocab, instances)
    lines = [plan_corpus(corpus)]
    if "vocab" in stages:
        sizes = source_sizes(corpus)
        small = sum(sizes[s.name] for s in corpus.sources if s.role in SMALL_ROLES)
        lines.append("  " + plan_vocab(vocab, small, sum(sizes.values()) - small))
    if "instances" in stages:
        lines.append("  " + plan_instances(instances))
    return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class CorpusBuildConfig:
    out_dir: str = field("runs/corpus", help="run directory: corpus/, vocab/, instances/len<L>/ go inside")
    corpus: CorpusConfig = field(default_factory=sample_corpus, help="corpus stage: sources and mixing")
    vocab: VocabConfig = field(default_factory=VocabConfig, help="vocabulary stage: WordPiece / AmpV")
    instances: InstanceConfig = field(default_factory=InstanceConfig, help="instances stage: NSP + MLM")
    ray: RayConfig = field(default_factory=RayConfig, help="Ray runtime")


def build_corpus(cfg: CorpusBuildConfig) -> CorpusResult:
    """``python jobs/build_corpus.py``: the first three stages of the chain."""
    input_stats(cfg.corpus)  # fail fast, before Ray starts, on missing or empty source files
    check_corpus_outputs(Path(cfg.out_dir), cfg.instances)
    with ray_session(address=cfg.ray.address or None, num_cpus=cfg.ray.num_cpus or None):
        return corpus_stages(cfg.corpus, cfg.vocab, cfg.instances, Path(cfg.out_dir))


def plan_build_corpus(cfg: CorpusBuildConfig) -> str:
    check_corpus_outputs(Path(cfg.out_dir), cfg.instances)
    return plan_corpus_stages(cfg.corpus, cfg.vocab, cfg.instances) + f"\n  run directory: {cfg.out_dir}"


# ---------------------------------------------------------------------------------------------
# The augmentation stage

def augment_stage(cfg: AugmentStageConfig, sweep: SweepConfig, models: dict[str, Path], run_dir: Path) -> list:
    """Every NER task of the sweep's space augmented once per model (``run_dir/augment/<model>/<task>``,
    reused by key); returns the sweep variants ``<model>+filtered-bert`` that fine-tune on them
    (``<model>+repeated`` with method ``repeat``, the equal-steps control)."""
    from orchestrator.augment.pipeline import augment_key, augment_task  # heavy: torch, fastText

    space = sweep.space
    ner = {task: spec for task, spec in space_tasks(space).items() if spec.family == "ner"}
    if not ner:
        log.warning("augment: the search space has no NER task; nothing to augment")
        return []
    variants = []
    for name, model_dir in models.items():
        mlm = Path(cfg.model_dir or model_dir)
        task_dirs = {}
        for task, spec in ner.items():
            data_dir = task_data_dir(sweep, task, spec)
            flat = dataclasses.replace(spec, dir="")

            def build(tmp: Path, flat=flat, data_dir=data_dir, mlm=mlm) -> None:
                augment_task(flat, data_dir, tmp, mlm, cfg.augment, cfg.similarity, cfg.ray,
                             max_train_sentences=space.max_train_examples)

            key = augment_key(flat, data_dir, mlm, cfg.augment, cfg.similarity, space.max_train_examples)
            out = run_stage("augment", run_dir / "augment" / _safe(name) / task_key(task), key, build,
                            f"augment {name}/{spec.name}")
            task_dirs[task] = str(out)
        suffix = REPEATED_SUFFIX if cfg.augment.method == "repeat" else AUGMENTED_SUFFIX
        variants.append(Variant(name + suffix, str(model_dir), task_dirs))
    return variants


def augment_plan(cfg: AugmentStageConfig) -> str:
    """The dry run's line for the augmentation stage."""
    a = cfg.augment
    if a.method == "repeat":
        return (f"repeat (the equal-steps control): every NER task's training sentences plus {a.multiple:g} x as "
                f"many unchanged copies, as many as filtered-BERT writes; rows <model>{REPEATED_SUFFIX}")
    return (f"MLM: {cfg.model_dir or 'each model itself'}; k={a.words_per_sentence}, cos > {a.min_similarity}, "
            f"{a.multiple:g} x the training sentences; every NER task of the sweep gets a row "
            f"<model>{AUGMENTED_SUFFIX}")


# ---------------------------------------------------------------------------------------------
# Source scoring (seed 004) in an experiment: what is scored against what

def selection_sources(corpus: CorpusConfig) -> list[tuple[str, str, str]]:
    """An arm's pretraining text as scoring inputs: every file of its corpus sources, each with its
    source's format and text field (``orchestrator.selection.arms.File``)."""
    return [(str(path), src.format, src.text_field) for src in corpus.sources for path in source_files(src)]


def selection_targets(sweep: SweepConfig) -> dict[str, list[tuple[str, str, str]]]:
    """The target text: the training split of every task of the sweep (the whole split, not the
    ``max_train_examples`` subset), by the task's display name as the results name it. A token
    file is read with its own format; BLUE TSV layouts by their header (``auto``)."""
    targets = {}
    for task, spec in space_tasks(sweep.space).items():
        flat = dataclasses.replace(spec, dir="")
        path = flat.split_path(Path(task_data_dir(sweep, task, spec)), "all" if spec.cv_folds else "train")
        targets[spec.name] = [(str(path), spec.format if spec.format in READERS else "auto", "text")]
    return targets


def corpus_section(path: str, where: str = ARM_CORPUS) -> dict:
    """The ``corpus:`` section of a YAML file (``pkg://`` paths expanded): what an arm's ``corpus_from``
    names, e.g. the ``corpus.yaml`` a proposal writes (``orchestrator.proposal``)."""
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where}: {path!r}; the path of a YAML file with a corpus: section")
    try:
        data = read_yaml(path)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if not isinstance(data.get("corpus"), dict):
        raise ConfigError(f"{where}: {path} has no corpus: section (a jobs/propose_mix.py corpus.yaml, or a "
                          "build_corpus / chain config)")
    return expand_package_paths(data["corpus"])


def _safe(text: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text).strip("-")


# ---------------------------------------------------------------------------------------------
# The whole chain

def check_inputs(cfg: ChainConfig) -> None:
    """The checks that cost no pass over the data, made before anything is written or started:
    source files exist and are not empty, model directories hold a config, task files exist."""
    if "corpus" in cfg.stages:
        input_stats(cfg.corpus)
    check_writable_dir(cfg.run_dir, "runs_root/run_name")
    if "vocab" in cfg.stages:
        for path in cfg.vocab.target_paths:
            if not Path(path).is_file():
                raise InputError(path, "vocab target file does not exist", expected="a text or task file")
    for name, path in cfg.compare_models.items():
        if not (Path(path) / "config.json").is_file():
            raise ConfigError(f"compare_models.{name}: {path} is not a Hugging Face model directory "
                              "(no config.json)")
    if "sweep" in cfg.stages:
        for task, spec in space_tasks(cfg.sweep.space).items():
            flat = dataclasses.replace(spec, dir="")
            for split in spec.file_splits:
                path = flat.split_path(Path(task_data_dir(cfg.sweep, task, spec)), split)
                if not path.is_file():
                    raise InputError(path, f"file not found for task {spec.name}", expected=f"its {split} split")


def run(cfg: ChainConfig) -> ChainResult:
    run_dir = cfg.run_dir
    check_inputs(cfg)  # before Ray starts and before the run directory is written to
    check_corpus_outputs(run_dir, cfg.instances, cfg.stages)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "chain_config.json", to_dict(cfg))
    seed_everything(cfg.seed)
    started = time.time()
    # Ray is shut down before returning so that workers' buffered output is flushed before the summary.
    with ray_session(address=cfg.ray.address or None, num_cpus=cfg.ray.num_cpus or None,
                     log_file=run_dir / LOG_PATH) as info:
        result = _run_stages(cfg, run_dir, info)
    result.costs = {cfg.model_name: chain_costs(cfg, run_dir, since=started)}
    result.log_file, result.wall_s = info["log_file"], time.time() - started
    return result


def chain_costs(cfg: ChainConfig, run_dir: Path, *, since: float) -> list[StageCost]:
    """What each of the chain's stage outputs cost when it was made (their manifests), reused or not."""
    names = [name for _, name in corpus_outputs(cfg.instances, cfg.stages)]
    names += [s for s in ("pretrain", "sweep") if s in cfg.stages]
    costs = [read_cost(run_dir / name, name, since=since) for name in names]
    return [c for c in costs if c is not None]


def _run_stages(cfg: ChainConfig, run_dir: Path, info: dict) -> ChainResult:
    from orchestrator.pretrain.trainer import pretrain  # heavy: torch, transformers
    from orchestrator.sweep.runner import run_sweep

    log.info("Ray %s with %s", info["mode"], {k: v for k, v in info["resources"].items() if k in ("CPU", "GPU")})
    tracking_uri = effective_uri(cfg.tracking, run_dir) if cfg.tracking.enabled else ""
    stages = cfg.active_stages
    total = len(stages)

    def banner(stage: str, text: str) -> None:
        log.info("[%d/%d] %s: %s", stages.index(stage) + 1, total, stage, text)

    models = {name: Path(path) for name, path in cfg.compare_models.items()}
    pretrain_loss = None
    corpus = None
    if "corpus" in stages:
        banner("corpus", "sources -> mixed shards (Ray Data)")
        if "vocab" in stages:
            banner("vocab", "AmpV WordPiece vocabulary")
        if "instances" in stages:
            banner("instances", "NSP + MLM instances (Ray Data)")
        corpus = corpus_stages(cfg.corpus, cfg.vocab, cfg.instances, run_dir,
                               tuple(s for s in stages if s in ("corpus", "vocab", "instances")))
    if "pretrain" in stages:
        banner("pretrain", f"BERT on Ray Train ({cfg.pretrain.num_workers} workers)")
        out = run_dir / "pretrain"
        result = pretrain(cfg.pretrain, corpus.instances, corpus.vocab_dir, out, cfg.tracking, run_dir)
        pretrain_loss = (result.first_loss, result.last_loss)
        models = {cfg.model_name: out / "final", **models}
    variants = []
    if "augment" in stages:
        banner("augment", f"filtered-BERT augmentation of the NER tasks for {len(models)} model(s)")
        variants = augment_stage(cfg.augment, cfg.sweep, models, run_dir)
    results: dict = {}
    if "sweep" in stages:
        banner("sweep", f"BLUE fine-tuning on Ray Tune over {len(models) + len(variants)} model(s)")
        results = run_sweep(cfg.sweep, models, run_dir / "sweep", cfg.tracking, run_dir, variants).results
    elif (run_dir / "sweep" / "results.json").is_file():
        results = json.loads((run_dir / "sweep" / "results.json").read_text())
    report: dict[str, Path] = {}
    if "report" in stages and results:
        from orchestrator.report.blue_table import write_report  # heavy: the stage's implementation

        banner("report", "BLUE table (HTML, Markdown, PNG)")
        report = write_report(results, run_dir / "report")
    return ChainResult(run_dir=run_dir, report=report, results=results, tracking_uri=tracking_uri,
                       pretrain_loss=pretrain_loss,
                       experiment_id=experiment_id_of(tracking_uri, cfg.tracking.experiment))


def plan_tracking(cfg: ChainConfig) -> str:
    """The tracking line of a dry run: the store, and whether it answers (a short check)."""
    if not cfg.tracking.enabled:
        return "tracking: off"
    uri = cfg.tracking.resolve_uri(cfg.run_dir)
    problem = probe(uri)
    state = "answers" if problem is None else (f"does NOT answer ({problem}): the run would log to "
                                               f"{local_uri(cfg.run_dir)} instead")
    return f"tracking: {uri} (experiment {cfg.tracking.experiment!r}) {state}"


def plan(cfg: ChainConfig) -> str:
    """Dry run: validate every stage's config and inputs, and say what would run."""
    from orchestrator.pretrain.trainer import configured_uri, plan_pretrain  # heavy: the stage's implementation
    from orchestrator.sweep.runner import plan_sweep

    stages = cfg.active_stages
    lines = [f"run directory: {cfg.run_dir}", f"stages: {' -> '.join(stages)}", plan_tracking(cfg)]
    check_inputs(cfg)
    check_corpus_outputs(cfg.run_dir, cfg.instances, stages)
    if "corpus" in stages:
        lines += ["", "== corpus, vocab, instances ==",
                  plan_corpus_stages(cfg.corpus, cfg.vocab, cfg.instances,
                                     tuple(s for s in stages if s in ("corpus", "vocab", "instances")))]
    if "pretrain" in stages:
        lines += ["", "== pretrain ==", plan_pretrain(cfg.pretrain, None, None,
                                                          tracking_uri=configured_uri(cfg.tracking, cfg.run_dir))]
    if "augment" in stages:
        lines += ["", "== augment ==", augment_plan(cfg.augment)]
    if "sweep" in stages:
        names = ([cfg.model_name] if "pretrain" in stages else []) + list(cfg.compare_models)
        models = {n: Path(cfg.compare_models.get(n) or cfg.run_dir / "pretrain" / "final") for n in names}
        lines += ["", "== sweep ==", plan_sweep(cfg.sweep, models)]
    return "\n".join(lines)
