"""The one runner: it builds every arm's stages (corpus -> vocab -> instances -> pretrain or
random-init -> augment) and runs the one sweep over the arms' models. The only module outside
``orchestrator.pretrain`` and ``orchestrator.sweep`` that calls ``pretrain()`` and ``run_sweep()``
(tests/test_layout.py checks it).

An arm (``ArmPlan``) is a chain config, its kind, and its outputs in build order, each with its
content key (``orchestrator.core.reuse``) and the folder a ``Place`` gives it:

- an experiment's arm (``jobs/blue_sweep.py`` with ``arms:``): ``<run_dir>/stages/<output>/<key>``
  (``by_key``), so arms whose stage would be identical share one output, built once;
- the plain chain (no ``arms:``): a one-arm experiment whose outputs are ``<run_dir>/<output>``
  (``by_name``: corpus, vocab, instances/len<L>, pretrain), where earlier runs put them;
- a cycle of ``jobs/entity_cycle.py``: corpus and vocab under the run directory, the cycle's
  instances and pretraining under ``cycle-<c>/``.

Whatever the place, an output's key is computed here from configs and input files alone, and the
stage records the same key in its manifest (``pretrain_key`` for pretraining): a finished output
with that key is reused, so a re-run resumes where it stopped and a changed setting re-runs exactly
the stages downstream of it.

Importing this module is cheap (configs only): the stage implementations, with torch and Ray
behind them, are imported when a stage runs.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator.augment.config import AugmentStageConfig
from orchestrator.core.artifacts import SMALL_ROLES, check_model, check_token_types, pair_cut_text
from orchestrator.core.config import flatten
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.imports import resolve_transformers_names
from orchestrator.core.manifest import check_replaceable, check_writable_dir, read_manifest
from orchestrator.core.reuse import content_key, output_lock, reusable, run_stage
from orchestrator.core.runtime import possible_gpus, ray_session
from orchestrator.corpus.stage import CorpusConfig, earlier_corpus_key, input_stats, source_sizes
from orchestrator.instances.config import InstanceConfig
from orchestrator.pretrain.checkpoint import CHECKPOINTS, other_run, other_run_error
from orchestrator.pretrain.config import PretrainConfig, check_init_positions, relocated_pretrain_key
from orchestrator.sweep.config import SweepConfig
from orchestrator.sweep.runner import check_model_fits, planned_positions
from orchestrator.sweep.space import Variant, space_tasks, task_data_dir, task_key
from orchestrator.track import schema as S
from orchestrator.vocab.stage import vocab_key
from orchestrator.vocab.wordpiece import VocabConfig
from orchestrator.workflows.config import ARM_MADE_BY, ARM_MODEL, ChainConfig, ExperimentConfig, safe_name

log = logging.getLogger("runner")

STAGES_DIR = "stages"
RANDOM_INIT = "random-init"
CORPUS_STAGES = ("corpus", "vocab", "instances")
AUGMENTED_SUFFIX = "+filtered-bert"
#: The row of the equal-steps control (augment.augment.method: repeat): the originals repeated unchanged.
REPEATED_SUFFIX = "+repeated"


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
            lines.append(f"instances: {path}  ({c['instances']} instances, {c['tokens']} tokens; {pair_cut_text(c)})")
        return "\n".join(lines)


#: Where a stage output lives: (output name, e.g. "corpus" or "instances/len128"; its key) -> directory.
Place = Callable[[str, str], Path]


def corpus_keys(corpus: CorpusConfig, vocab: VocabConfig, instances: InstanceConfig,
                stages: tuple[str, ...] = ("corpus", "vocab", "instances"), place: Place | None = None
                ) -> dict[str, str]:
    """The key of every output of the first three stages, from configs and input files alone (a
    finished stage records its key, so a downstream key never needs the upstream output itself).
    Reads the sources' sizes and the vocabulary's target files; builds nothing. With ``place``, the
    corpus key is that of an earlier output there built from sources of the same contents whose
    modification times or paths changed since (``earlier_corpus_key``), and the vocabulary's that of an
    earlier output made from its files at other paths (``vocab.stage.vocab_key``)."""
    # a Chinese source's corpus made before its sentences were split at 。！？ (session 42) is not reused
    splits = [{"zh": "split at full stops"}] if any(s.language == "zh" for s in corpus.sources) else []
    keys = {"corpus": content_key("corpus", corpus.identity(), input_stats(corpus), *splits)}
    if place is not None:
        keys["corpus"] = earlier_corpus_key(corpus, keys["corpus"], place("corpus", keys["corpus"]))
    if "vocab" not in stages:
        return keys
    # the target files, the model, the term list or the quality texts at other paths (a checkout cloned elsewhere)
    keys["vocab"] = vocab_key(vocab, keys["corpus"], (lambda key: place("vocab", key)) if place else None)
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
    """corpus -> vocab -> instances/len<L>, each reused by key; by default under ``run_dir`` by name, or wherever
    ``place`` puts each output (an experiment: by key). With no Ray running, one runs for the call
    (``ray_session``): Ray Data started Ray's default, on every interface with its dashboard, and left it (probe L2)."""
    check_pretokenize(vocab, instances)
    keys = keys or corpus_keys(corpus, vocab, instances, stages,  # (once: each is read from the inputs' files)
                               place or by_name(run_dir))
    if corpus_reused(corpus, vocab, instances, run_dir, stages, place, keys):  # no Ray to start (probe G7: 18-22 s)
        return _corpus_stages(corpus, vocab, instances, Path(run_dir), stages, place, keys)
    with ray_session():
        return _corpus_stages(corpus, vocab, instances, Path(run_dir), stages, place, keys)


def corpus_reused(corpus: CorpusConfig, vocab: VocabConfig, instances: InstanceConfig, run_dir: Path,
                  stages: tuple[str, ...] = ("corpus", "vocab", "instances"), place: Place | None = None,
                  keys: dict[str, str] | None = None) -> bool:
    """Whether every output of ``corpus_stages`` is there, complete, for these configs: nothing to build."""
    place = place or by_name(run_dir)
    keys = keys or corpus_keys(corpus, vocab, instances, stages, place)
    return all(reusable(place(name, key), key) for name, key in keys.items())


def _corpus_stages(corpus: CorpusConfig, vocab: VocabConfig, instances: InstanceConfig, run_dir: Path,
                   stages: tuple[str, ...], place: Place | None, keys: dict[str, str]) -> CorpusResult:
    from orchestrator.corpus.stage import build_corpus  # heavy: Ray Data, pyarrow, tokenizers behind these
    from orchestrator.instances.stage import build_instances
    from orchestrator.vocab.stage import build_vocab

    place = place or (lambda name, key: run_dir / name)
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
        lines += ["  " + line for line in plan_instances(instances).split("\n")]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Arms: their outputs, keys and places

def by_name(run_dir: Path) -> Place:
    """The plain chain's place: every output under the run directory by its name."""
    return lambda name, key: Path(run_dir) / name


def by_key(root: Path) -> Place:
    """An experiment's place: ``root/<output>/<key>``, shared by the arms whose output it is."""
    return lambda name, key: Path(root) / name / key


@dataclasses.dataclass(frozen=True)
class Output:
    """One stage output of an arm: ``name`` (corpus, vocab, instances/len128, pretrain or
    random-init), its content key, and where it lives."""

    stage: str
    name: str
    key: str
    path: Path

    def done(self) -> bool:
        return reusable(self.path, self.key) and (self.stage != "pretrain"
                                                  or (self.path / "final" / "config.json").is_file())


@dataclasses.dataclass
class ArmPlan:
    name: str
    kind: str  # pretrain | random | model (see ExperimentConfig.arm_kind)
    config: ChainConfig
    outputs: list[Output]  # in build order
    model_dir: Path  # what the sweep fine-tunes
    made_by: str = ""  # a model arm: the job that makes its model (arms.<name>.made_by)
    tags: dict[str, str] | None = None  # on its pretraining's MLflow run

    @property
    def missing(self) -> bool:
        """A model arm whose model another job has not made yet."""
        return self.kind == "model" and not (self.model_dir / "config.json").is_file()

    @property
    def augmented(self) -> bool:
        return self.kind != "model" and "augment" in self.config.stages and self.config.augment.enabled

    def made_instances(self) -> dict[int, Path]:
        """Its instances outputs already made (complete, of its key), by length: what its pretraining reads."""
        return {int(o.name.removeprefix("instances/len")): o.path for o in self.outputs
                if o.stage == "instances" and o.done()}


def arm_outputs(arm: ChainConfig, kind: str, place: Place) -> list[Output]:
    """An arm's outputs in build order (the stages of ``arm.stages`` it has), keyed from configs and input
    files alone (nothing is built); a pretraining output's key is ``pretrain_key`` (or, made from ``init_from`` at
    another path, a finished one's there or a stopped one's: ``relocated_pretrain_key``), the one it records."""
    stages = ("corpus", "vocab") if kind == "random" else tuple(s for s in CORPUS_STAGES if s in arm.stages)
    if not stages:
        return []
    keys = corpus_keys(arm.corpus, arm.vocab, arm.instances, stages, place)
    outputs = [Output(n.split("/")[0], n, k, place(n, k)) for n, k in keys.items()]
    if kind == "random":
        key = content_key("random-init", arm.pretrain.model, arm.pretrain.seed, keys["vocab"])
        outputs.append(Output("pretrain", RANDOM_INIT, key, place(RANDOM_INIT, key)))
    elif "pretrain" in arm.stages:
        lengths = {n: keys[f"instances/len{n}"] for n in arm.instances.max_seq_lengths}
        # init_from at another path with the same files (another venv, a clone): an earlier output's key answers,
        # finished (reused) or stopped before its end (resumed), where this layout puts it
        key = relocated_pretrain_key(arm.pretrain, lengths, keys["vocab"], place=lambda k: place("pretrain", k))
        outputs.append(Output("pretrain", "pretrain", key, place("pretrain", key)))
    return outputs


def chain_arm(cfg: ChainConfig) -> ArmPlan:
    """The plain chain as the one arm of an experiment, named ``model_name``, its outputs by name
    under the run directory (``by_name``)."""
    outputs = arm_outputs(cfg, "pretrain", by_name(cfg.run_dir))
    return ArmPlan(cfg.model_name, "pretrain", cfg, outputs, cfg.run_dir / "pretrain" / "final")


def arm_plans(cfg: ExperimentConfig) -> dict[str, ArmPlan]:
    """Every arm's outputs and model directory (an experiment's arms by key under ``<run_dir>/stages``;
    without arms, the chain's one arm), from configs and input files alone (nothing is built)."""
    if not cfg.arms:
        return {cfg.model_name: chain_arm(cfg.chain())}
    place = by_key(cfg.run_dir / STAGES_DIR)
    plans = {}
    for name in cfg.arms:
        arm, kind = cfg.arm(name), cfg.arm_kind(name)
        if kind == "model":
            entry = flatten(cfg.arms[name])
            model_dir, made_by = Path(entry[ARM_MODEL]), str(entry.get(ARM_MADE_BY, ""))
            if not (model_dir / "config.json").is_file() and not made_by:  # nothing here builds it
                raise ConfigError(f"arms.{name}.model: {model_dir} is not a Hugging Face model directory "
                                  "(no config.json)")
            plans[name] = ArmPlan(name, kind, arm, [], model_dir, made_by)
            continue
        if "pretrain" not in arm.stages:
            raise ConfigError(f"arms.{name}: an arm that pretrains needs the corpus, vocab, instances and pretrain "
                              f"stages (stages: {list(arm.stages)}); to fine-tune given models only, drop the arms "
                              "(arms={}: the default preset is an experiment) or make each one {model: <directory>}")
        outputs = arm_outputs(arm, kind, place)
        plans[name] = ArmPlan(name, kind, arm, outputs, outputs[-1].path / "final", tags={S.ARM: name})
        if plans[name].augmented and "sweep" in cfg.stages:  # its sweep row fine-tunes the NER tasks only
            tasks = space_tasks(cfg.sweep.space)
            if not any(spec.family == "ner" for spec in tasks.values()):
                raise ConfigError(f"arms.{name}: augment.enabled fine-tunes the arm on augmented NER tasks only, and "
                                  f"the search space has none (its tasks: {', '.join(tasks)}): add an NER task "
                                  "or drop the arm")
    return plans


def shared_outputs(plans: dict[str, ArmPlan]) -> dict[str, tuple[Output, list[str]]]:
    """Each distinct output (by key) and the arms that use it, in build order."""
    graph: dict[str, tuple[Output, list[str]]] = {}
    for plan in plans.values():
        for out in plan.outputs:
            graph.setdefault(out.key, (out, []))[1].append(plan.name)
    return graph



@dataclasses.dataclass
class BuiltArm:
    corpus: CorpusResult | None
    pretrained: object | None = None  # orchestrator.pretrain.trainer.PretrainResult (not for random-init)
    variant: Variant | None = None  # an augmented arm's sweep row


def build_arm(arm: ArmPlan, run_dir: Path, sweep: SweepConfig | None = None,
              announce: Callable[[str], None] | None = None) -> BuiltArm:
    """Build (or reuse) the arm's outputs, each where its plan places it (Ray must be running); with
    ``sweep``, an augmented arm's NER tasks too, as its sweep row. ``announce(stage)`` is called
    before its pretraining starts (a progress line)."""
    if arm.kind == "model" or not arm.outputs:
        return BuiltArm(None)
    from orchestrator.pretrain.trainer import random_init  # heavy: torch, transformers

    a = arm.config
    by_name_ = {o.name: o for o in arm.outputs}
    wanted = tuple(dict.fromkeys(o.stage for o in arm.outputs if o.stage in CORPUS_STAGES))
    corpus = corpus_stages(a.corpus, a.vocab, a.instances, run_dir, wanted,
                           place=lambda name, key: by_name_[name].path, keys={o.name: o.key for o in arm.outputs})
    built = BuiltArm(corpus)
    last = arm.outputs[-1]
    if last.name == RANDOM_INIT:
        run_stage("pretrain", last.path, last.key,
                  lambda tmp: random_init(a.pretrain, corpus.vocab_dir, tmp, dest=last.path),
                  f"random initialisation ({arm.name})", units=(1.0, 0.0))  # the driver alone
    elif last.stage == "pretrain":
        if announce is not None:
            announce("pretrain")
        with output_lock(last.path):  # an arm sharing this pretraining waits, then reuses it
            built.pretrained = pretrain_stage(a.pretrain, corpus.instances, corpus.vocab_dir, last.path, a.tracking,
                                              run_dir, tags=arm.tags)
    if sweep is not None and arm.augmented:
        variant, = augment_stage(a.augment, sweep, {arm.name: arm.model_dir}, run_dir)
        built.variant = dataclasses.replace(variant, name=arm.name)
    return built


def pretrain_stage(cfg: PretrainConfig, instances: dict[int, Path], tokenizer_dir: Path, out_dir: Path, tracking,
                   run_dir: Path, tags: dict[str, str] | None = None):
    """Pretrain (or resume, or reuse) into ``out_dir``: ``orchestrator.pretrain.trainer.pretrain``, whose
    output records ``pretrain_key`` of these inputs (an arm's: the key its plan placed it by)."""
    from orchestrator.pretrain.trainer import pretrain  # heavy: torch, transformers, Ray Train

    return pretrain(cfg, instances, tokenizer_dir, out_dir, tracking, run_dir, run_tags=tags)


def build_arms(cfg: ExperimentConfig, plans: dict[str, ArmPlan], run_dir: Path, status: dict[str, dict],
               on_status: Callable[[], None]) -> list[Variant]:
    """Every arm built (up to ``arm_workers`` at once); ``status`` holds each arm's outcome, and
    ``on_status`` is called under a lock whenever it changes. A failing arm does not stop the others:
    its error goes into its status, and an arm sharing the output it failed in is not retried.
    Returns the augmented arms' sweep rows, in the arms' order."""
    failed: dict[str, str] = {}  # output key -> the error that stopped it (arms sharing it are not retried)
    variants: dict[str, Variant] = {}
    guard = threading.Lock()  # status, failed, variants and the status records, across arm threads

    def build(i: int, arm: ArmPlan) -> None:
        log.info("[arm %d/%d] %s", i, len(plans), arm.name)
        with guard:
            blocked = next((o for o in arm.outputs if o.key in failed), None)
            if blocked is not None:
                status[arm.name] = {"status": "failed", "kind": arm.kind, "stage": blocked.name,
                                    "error": f"shared with a failed arm: {failed[blocked.key]}"}
                on_status()
                return
            status[arm.name] = {"status": "running", "kind": arm.kind}
        stage = None
        try:
            variant = build_arm(arm, run_dir, cfg.sweep).variant
            result = {"status": "ok", "kind": arm.kind, "model_dir": str(arm.model_dir)}
        except Exception as exc:  # one arm's failure never stops the others
            variant, stage = None, next((o for o in arm.outputs if not o.done()), None)
            error = f"{type(exc).__name__}: {exc}"
            log.error("arm %s failed%s: %s", arm.name, f" in {stage.name}" if stage else "", error)
            result = {"status": "failed", "kind": arm.kind, "stage": stage.name if stage else None,
                      "error": error}
        with guard:
            if stage is not None:
                failed[stage.key] = result["error"]
            if variant is not None:
                variants[arm.name] = variant
            status[arm.name] = result
            on_status()

    workers = arm_workers(cfg, plans)
    if workers > 1:
        log.info("building up to %d arms at once", workers)
        resolve_transformers_names()  # transformers' first imports are not thread-safe
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arm") as pool:
            for future in [pool.submit(build, i, arm) for i, arm in enumerate(plans.values(), 1)]:
                future.result()
    else:
        for i, arm in enumerate(plans.values(), 1):
            build(i, arm)
    return [variants[name] for name in plans if name in variants]  # the arms' order, whatever finished first


def arm_workers(cfg: ExperimentConfig, plans: dict[str, ArmPlan]) -> int:
    """How many arms to build at once: ``cfg.arm_concurrency``, or for 0 as many pretraining jobs as the
    connected Ray cluster's GPUs (``use_gpu``; a worker takes ``pretrain.resources_per_worker.GPU`` of one,
    1 unless set: 0.5 puts two jobs on a GPU) or CPUs hold, at most one per arm."""
    if cfg.arm_concurrency:
        return min(cfg.arm_concurrency, len(plans))
    import ray  # heavy: ray

    from orchestrator.pretrain.trainer import DATA_CPU_RESERVE, worker_cpus  # heavy: torch

    training = [p for p in plans.values() if p.kind == "pretrain"] or list(plans.values())
    pre = training[0].config.pretrain
    if pre.use_gpu:  # an autoscaling cluster's GPU nodes count before they start: asking is what starts them
        fit = possible_gpus() // (pre.num_workers * (pre.resources_per_worker.get("GPU") or 1.0))
    else:
        cpus = ray.cluster_resources().get("CPU", 0.0)  # every job's Train workers, and CPUs for their Data reads
        fit = (cpus - DATA_CPU_RESERVE) // (pre.num_workers * worker_cpus(pre, cpus) + DATA_CPU_RESERVE)
    return max(1, min(len(plans), int(fit)))



def sweep(cfg: SweepConfig, models: dict[str, Path], out_dir: Path, tracking, run_dir: Path,
          variants: list[Variant] = (), row_tags: dict[str, dict[str, str]] | None = None):
    """The one sweep over the models (and the augmented rows): ``orchestrator.sweep.runner.run_sweep``."""
    from orchestrator.sweep.runner import run_sweep  # heavy: Ray Tune, torch

    return run_sweep(cfg, models, out_dir, tracking, run_dir, list(variants), row_tags=row_tags)


# ---------------------------------------------------------------------------------------------
# Checks before anything is written

def check_checkpoints_fit(cfg: ChainConfig) -> None:
    """Refuse, before any stage runs, the checkpoints in the chain's ``pretrain/`` of another run, when stages before
    it would be rebuilt first: a changed vocabulary rebuilt ``vocab/`` and ``instances/`` (placed by name, the old
    ones gone), then pretraining refused the checkpoints, the run directory left pairing the new vocabulary with the
    old model (probe L5). With those stages unchanged, pretraining's own check decides (it knows the key a run
    recorded before issue 32)."""
    if "pretrain" not in cfg.stages or cfg.pretrain.on_mismatch != "refuse" or cfg.pretrain.storage_path:
        return
    *inputs, planned = chain_arm(cfg).outputs or [None]
    if planned is None or planned.stage != "pretrain" or all(reusable(o.path, o.key) for o in inputs):
        return
    ckpt_dir = planned.path / CHECKPOINTS
    if what := other_run(ckpt_dir, planned.key, cfg.pretrain.training_fields()):
        raise other_run_error(ckpt_dir, what)


def check_inputs(cfg: ChainConfig) -> None:
    """The checks that cost no pass over the data, made before anything is written or started:
    source files exist and are not empty, model directories hold a config, task files exist."""
    if "corpus" in cfg.stages:
        input_stats(cfg.corpus)
    check_writable_dir(cfg.run_dir, "runs_root/run_name")
    if "pretrain" in cfg.stages:
        check_init_positions(cfg.pretrain)  # a continued model's positions (phase 2 failed after phase 1 trained)
    if "vocab" in cfg.stages:
        for path in cfg.vocab.target_paths:
            if not Path(path).is_file():
                raise InputError(path, "vocab target file does not exist", expected="a text or task file")
    for name, path in cfg.compare_models.items():  # config, weights and tokenizer, read from the file names
        check_model(f"compare_models.{name}", path)
    if "augment" in cfg.active_stages and cfg.augment.augment.method != "repeat":
        # what the stage would stop on after pretraining: the MLM (when one is named) and the vectors' inputs
        from orchestrator.augment.filtered import check_mlm_dir
        from orchestrator.augment.similarity import check_similarity_inputs  # heavy: numpy

        check_similarity_inputs(cfg.augment.similarity)
        if cfg.augment.model_dir:
            check_mlm_dir(cfg.augment.model_dir, "augment.model_dir")
    check_checkpoints_fit(cfg)
    init = cfg.pretrain.model.init_from
    if "pretrain" in cfg.stages and init and (Path(init) / "config.json").is_file():  # the rest: plan_pretrain's
        check_token_types("pretrain.model.init_from", init, "pretraining's instances")
    if "sweep" in cfg.stages:
        # the models' positions fit the space's sequences: a longer input fails every trial, after the stages
        tasks = space_tasks(cfg.sweep.space)
        pairs = [spec.name for spec in tasks.values() if spec.sentence_pairs]
        for name, path in cfg.compare_models.items():
            check_model_fits(name, cfg.sweep.space, model_dir=path)
            if pairs:
                check_token_types(f"compare_models.{name}", path, f"the sentence-pair tasks ({', '.join(pairs)})")
        if cfg.sweep.space.tune == "adapters" and cfg.compare_models:
            from orchestrator.modeling.adapters import check_adaptable  # heavy: torch, transformers

            for name, path in cfg.compare_models.items():
                check_adaptable(f"compare_models.{name}", path)
        if "pretrain" in cfg.stages:
            check_model_fits(cfg.model_name, cfg.sweep.space, planned=planned_positions(cfg.pretrain))
        for task, spec in tasks.items():
            flat = dataclasses.replace(spec, dir="")
            for split in spec.file_splits:
                path = flat.split_path(Path(task_data_dir(cfg.sweep, task, spec)), split)
                if not path.is_file():
                    raise InputError(path, f"file not found for task {spec.name}", expected=f"its {split} split")



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

            place = run_dir / "augment" / safe_name(name) / task_key(task)
            key = augment_key(flat, data_dir, mlm, cfg.augment, cfg.similarity, space.max_train_examples, place)
            out = run_stage("augment", place, key, build, f"augment {name}/{spec.name}")
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
