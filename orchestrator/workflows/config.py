"""The configs of the BLUE workflows: a chain of stages (``ChainConfig``), and an experiment
(``ExperimentConfig``): a chain config plus the fields only an experiment has (its arms, their
baseline and concurrency, and the analyses across arms). An arm is a ``ChainConfig``: the
experiment's chain fields with the arm's overrides.

YAML files and dotted command-line overrides keep one flat layout (``ExperimentConfig`` inherits
the chain's fields, it does not nest them): ``pretrain.phase1.learning_rate=...`` and ``arms:`` sit
side by side in one file. Importing this module is cheap (configs only).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from orchestrator.augment.config import AugmentStageConfig
from orchestrator.core.config import (
    check_run_name,
    check_set,
    expand_package_paths,
    field,
    flatten,
    from_dict,
    read_yaml,
    set_dotted,
    to_dict,
)
from orchestrator.core.errors import ConfigError
from orchestrator.core.results import REPLICATE, replicate_name
from orchestrator.corpus.sources import SourceConfig
from orchestrator.corpus.stage import CorpusConfig
from orchestrator.instances.config import InstanceConfig
from orchestrator.pretrain.config import PretrainConfig
from orchestrator.retrieval.config import RetrievalSpec
from orchestrator.selection.arms import ArmScoringConfig
from orchestrator.sweep.config import SweepConfig
from orchestrator.track import TrackingConfig
from orchestrator.vocab.wordpiece import VocabConfig

ALL_STAGES: tuple[str, ...] = ("corpus", "vocab", "instances", "pretrain", "augment", "sweep", "report")
#: Each stage and the stage whose output it reads (the augment stage reads the models, as the sweep does).
UPSTREAM = {"vocab": "corpus", "instances": "vocab", "pretrain": "instances"}
#: The fields an experiment adds to a chain config (an arm has none of them).
EXPERIMENT_FIELDS = ("arms", "baseline", "arm_concurrency", "replicate_seeds", "selection", "retrieval")
#: Keys an experiment's arm may not change: every arm runs in the same place, on the same Ray, into
#: the same MLflow experiment, and through the one paired sweep.
ARM_FIXED = ("run_name", "runs_root", "model_name", "stages", "compare_models", "ray", "tracking", "sweep",
             *EXPERIMENT_FIELDS)
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
    root = Path(__file__).resolve().parent.parent / "sample_data" / "corpus"
    return CorpusConfig(sources=(
        SourceConfig(name="in_domain", paths=(str(root / "in_domain.txt"),), role="small"),
        SourceConfig(name="general", paths=(str(root / "general.txt"),), role="large"),
    ))


@dataclasses.dataclass(frozen=True)
class ChainConfig:
    run_name: str = field("default", help="run directory name under runs_root")
    runs_root: str = field("runs", help="where run directories are created")
    model_name: str = field("ours", help="display name of the model pretrained by this run")
    stages: tuple[str, ...] = field(ALL_STAGES, help=f"stages to run, a subset of ({', '.join(ALL_STAGES)}); "
                                                     "augment runs only when augment.enabled")
    compare_models: dict[str, str] = field(default_factory=dict,
                                           help="extra Hugging Face BERT directories to fine-tune alongside "
                                                "(name: path), e.g. a published biomedical BERT on disk")
    seed: int = field(42, help="seed of the driver process's generators (Python, numpy, torch); each stage has its "
                               "own: corpus.seed, instances.seed, pretrain.seed, augment.augment.seed, sweep.seeds")
    ray: RayConfig = field(default_factory=RayConfig, help="Ray runtime")
    tracking: TrackingConfig = field(default_factory=TrackingConfig, help="MLflow tracking")
    corpus: CorpusConfig = field(default_factory=sample_corpus, help="corpus stage: sources and mixing")
    vocab: VocabConfig = field(default_factory=VocabConfig, help="vocabulary stage: WordPiece / AmpV")
    instances: InstanceConfig = field(default_factory=InstanceConfig, help="instances stage: NSP + MLM")
    pretrain: PretrainConfig = field(default_factory=PretrainConfig, help="pretraining stage")
    augment: AugmentStageConfig = field(default_factory=AugmentStageConfig,
                                        help="filtered-BERT augmentation of the sweep's NER tasks (seed 001)")
    sweep: SweepConfig = field(default_factory=SweepConfig, help="BLUE fine-tuning sweep")

    def __post_init__(self):
        check_set(model_name=self.model_name)
        check_run_name(self.run_name)
        bad = [s for s in self.stages if s not in ALL_STAGES]
        if bad:
            raise ConfigError(f"stages: unknown stage(s) {bad}; valid: {list(ALL_STAGES)}")
        # the stages run in ALL_STAGES' order whatever the list's: a list in another order, or with a stage
        # twice, would print a plan the run does not follow
        repeated = sorted({s for s in self.stages if self.stages.count(s) > 1}, key=ALL_STAGES.index)
        if repeated:
            raise ConfigError(f"stages: {repeated[0]} is given twice; each stage runs once")
        ordered = tuple(s for s in ALL_STAGES if s in self.stages)
        if tuple(self.stages) != ordered:
            raise ConfigError(f"stages: {list(self.stages)} are not in the order they run; give "
                              f"{list(ordered)} (the order is fixed: {' -> '.join(ALL_STAGES)})")
        for stage, upstream in UPSTREAM.items():
            if stage in self.stages and upstream not in self.stages:
                raise ConfigError(f"stages: {stage} needs the {upstream} stage (its output is {stage}'s input)")
        if "sweep" in self.stages and "pretrain" not in self.stages and not self.compare_models:
            raise ConfigError("stages: a sweep without pretraining needs compare_models (name: HF directory)")

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_root).resolve() / self.run_name

    @property
    def active_stages(self) -> tuple[str, ...]:
        return tuple(s for s in self.stages if s != "augment" or self.augment.enabled)


@dataclasses.dataclass(frozen=True)
class ExperimentConfig(ChainConfig):
    """What ``jobs/blue_sweep.py`` runs: a chain config, and with ``arms:`` an experiment. Without arms
    it is a one-arm experiment whose arm is the chain itself (``orchestrator.workflows.runner``)."""

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
    replicate_seeds: list[int] = field(
        default_factory=list, help="replicates: each arm that pretrains (and the untrained floor) again at each of "
                                   "these pretrain.seed values, as arm <arm>_s<seed> (the same instances, another "
                                   "pretraining); the report adds each arm's paired differences with the baseline at "
                                   "every pretraining seed, marking those that recur (docs/EXPERIMENTS.md)")
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
        if self.replicate_seeds:
            object.__setattr__(self, "arms", self._with_replicates())
        super().__post_init__()
        if self.arms and self.baseline and self.baseline not in self.arms:  # without arms it has no use
            raise ConfigError(f"baseline {self.baseline!r} is not an arm (arms: {list(self.arms)})")
        built = {name: self.arm(name) for name in self.arms}  # every arm's config is checked when it is read
        own = {name for name in self.arms if self.arm_kind(name) != "model"}  # arms whose vocabulary is measured
        for name in sorted(own):
            if clash := sorted(set(built[name].vocab.quality.tokenizers) & own):  # the report names an arm's own
                # vocabulary's row by the arm: the other tokenizer's row of that name was dropped as the same one
                raise ConfigError(f"arms.{name}: vocab.quality.tokenizers.{clash[0]}: {clash[0]} is an arm, whose "
                                  "own vocabulary the tokenizer-quality table names so; give the tokenizer another "
                                  "name")
        if self.selection.enabled and not self.arms:
            raise ConfigError("selection.enabled scores an experiment's arms: it needs arms: (docs/EXPERIMENTS.md)")
        if self.retrieval.enabled and not self.arms:
            raise ConfigError("retrieval evaluates an experiment's arms: it needs arms: (for models alone, "
                              "jobs/retrieval.py)")
        for key, extra in (("retrieval.models", self.retrieval.models), ("compare_models", self.compare_models)):
            clash = sorted(set(extra) & set(self.arms))
            if clash:  # compare_models' entry took the arm's row in the sweep, the table and the differences
                raise ConfigError(f"{key}.{clash[0]}: {clash[0]} is already an arm; give the extra model another "
                                  "name")

    def _with_replicates(self) -> dict[str, dict[str, Any]]:
        """``arms`` with each pretraining (and floor) arm's replicate at every ``replicate_seeds`` seed, after its
        arm: ``<arm>_s<seed>``, the arm's overrides and ``pretrain.seed: <seed>``. An arm of that name already
        there (a config read back, or written by hand) must be that replicate."""
        seeds = self.replicate_seeds
        if not self.arms:
            raise ConfigError("replicate_seeds replicates an experiment's arms: it needs arms: (docs/EXPERIMENTS.md)")
        if len(set(seeds)) != len(seeds) or not all(isinstance(s, int) and s >= 0 for s in seeds):
            raise ConfigError(f"replicate_seeds: {seeds}; distinct pretrain.seed values (integers >= 0)")
        given = {name for name in self.arms if (m := REPLICATE.match(name)) and m["arm"] in self.arms
                 and int(m["seed"]) in seeds and self.arm_kind(m["arm"]) != "model"}
        arms: dict[str, dict[str, Any]] = {}
        for name, overrides in self.arms.items():
            if name in given:
                continue
            arms[name] = overrides
            if self.arm_kind(name) == "model":  # a published model: no pretraining to repeat
                continue
            own = self.arm(name).pretrain.seed
            for seed in seeds:
                if seed == own:
                    raise ConfigError(f"replicate_seeds: {seed} is arms.{name}'s own pretrain.seed; replicate at "
                                      "other seeds")
                replicate = {**flatten(overrides, empty=True), "pretrain.seed": seed}
                rep = replicate_name(name, seed)
                if rep in self.arms and flatten(self.arms[rep], empty=True) != replicate:
                    raise ConfigError(f"arms.{rep}: differs from {name}'s replicate at pretrain.seed {seed}, which "
                                      f"replicate_seeds names so; rename the arm or drop {seed} from replicate_seeds")
                arms[rep] = replicate
        return arms

    def chain(self) -> ChainConfig:
        """The chain fields alone: the one arm of an experiment without arms."""
        return ChainConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(ChainConfig)})

    def arm(self, name: str) -> ChainConfig:
        """The chain config of one arm: this config's chain fields with the arm's overrides."""
        arm = flatten(self.arms[name], empty=True)  # corpus.mixer.weights: {} clears the base's weights
        if not name or not name.isascii() or safe_name(name) != name:  # ids keep ASCII: bäse and büse were one
            raise ConfigError(f"arms: {name!r} is not a usable arm name (ASCII letters, digits, . _ -; not starting "
                              "or ending with -)")
        fixed = [k for k in arm if k.split(".")[0] in ARM_FIXED]
        if fixed:
            raise ConfigError(f"arms.{name}.{fixed[0]}: an arm cannot change {fixed[0].split('.')[0]} (every arm "
                              "shares the run directory, Ray, MLflow and the one paired sweep)")
        if "seed" in arm:  # every arm runs in the one driver process, seeded once
            raise ConfigError(f"arms.{name}.seed: seed seeds the driver process, which every arm shares, so an arm's "
                              "would change nothing; an arm varies a stage's own seed (corpus.seed, instances.seed, "
                              "pretrain.seed, augment.augment.seed)")
        if ARM_INIT in arm and arm[ARM_INIT] != "random":
            raise ConfigError(f"arms.{name}.init: {arm[ARM_INIT]!r}; the only value is 'random' (the untrained floor)")
        if ARM_MODEL in arm and set(arm) - {ARM_MODEL, ARM_MADE_BY}:
            raise ConfigError(f"arms.{name}: a published model ({ARM_MODEL}: <dir>) takes no other keys than "
                              f"{ARM_MADE_BY} (got {sorted(set(arm) - {ARM_MODEL, ARM_MADE_BY})[0]})")
        if ARM_MADE_BY in arm and ARM_MODEL not in arm:
            raise ConfigError(f"arms.{name}.{ARM_MADE_BY}: only a model arm ({ARM_MODEL}: <dir>) is made by "
                              "another job")
        overrides = {k: v for k, v in arm.items() if k not in (ARM_MODEL, ARM_INIT, ARM_CORPUS, ARM_MADE_BY)}
        if not overrides and ARM_CORPUS not in arm:
            built = self.chain()
        else:  # the overrides apply to the chain's fields as a command-line override would
            data = {f.name: to_dict(getattr(self, f.name)) for f in dataclasses.fields(ChainConfig)}
            if ARM_CORPUS in arm:  # the file's corpus replaces the base config's; the arm's other keys still apply
                data["corpus"] = corpus_section(arm[ARM_CORPUS], f"arms.{name}.{ARM_CORPUS}")
            for key, value in overrides.items():
                set_dotted(data, key.split("."), value)
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


def corpus_section(path: str, where: str = ARM_CORPUS) -> dict:
    """The ``corpus:`` section of a YAML file (``pkg://`` paths expanded): what an arm's ``corpus_from``
    names, e.g. the ``corpus.yaml`` a proposal writes (``orchestrator.workflows.propose_mix``)."""
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


def safe_name(text: str) -> str:
    """``text`` as a folder name: letters, digits and ``. _ -``; anything else becomes ``-``."""
    return "".join(c if c.isalnum() or c in "._-" else "-" for c in text).strip("-")
