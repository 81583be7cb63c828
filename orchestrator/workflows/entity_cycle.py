"""What ``python jobs/entity_cycle.py`` runs: Embodiment 4 of seed 003, the iterative cycle of entity-aware
pretraining.

    cycle 0   corpus -> vocab -> instances (random masking) -> pretrain -> extractor
    cycle c   instances (entity-aware: extractor c-1, association derived) -> pretrain (from cycle c-1's
              final model) -> extractor

An extractor is the cycle's model fine-tuned on a labelled NER task (``extractor``: a one-task sweep,
BC5CDR-chemical by default) and exported (``sweep.export_best``); the next cycle's instances stage
loads that export as its entity extractor (``instances.entity_masking.ner_model``) and derives the
association from the extracted terms over the corpus (``association_method: npmi``). Each cycle is an
arm of the runner (``orchestrator.workflows.runner``): its stages are built by ``build_arm``, placed as
below and reused by key, so a re-run resumes where it stopped; its extractor is the runner's sweep.

    <run_dir>/corpus, vocab                     shared by every cycle
    <run_dir>/cycle-<c>/instances/len<L>        cycle 0: random masking; later: entity-aware
    <run_dir>/cycle-<c>/pretrain/final          the cycle's model (init_from: cycle c-1's final)
    <run_dir>/cycle-<c>/extractor/exports/...   the cycle's extractor (its F1 on the task's splits)
    <run_dir>/cycle-<c>/manifest.json           the previous extractor and its F1, entity counts, the
                                                association table, MLM accuracy (training, and on cycle
                                                0's instances: the same positions for every cycle), the
                                                stop rule that ended it

MLflow: one parent run (kind ``entity_cycle``); each cycle's numbers are a step of it, and the
cycle's pretraining and extractor sweep are its children.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from orchestrator.core.config import check_run_name, field, public, to_dict
from orchestrator.core.console import LOG_PATH
from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import atomic_write_json, read_manifest, write_manifest
from orchestrator.core.reuse import content_key
from orchestrator.core.runtime import ray_session, seeded
from orchestrator.corpus.stage import CorpusConfig, input_stats
from orchestrator.finetune.spec import load_task
from orchestrator.instances.config import InstanceConfig
from orchestrator.instances.entity_masking import EntityMaskingConfig
from orchestrator.pretrain.config import PretrainConfig
from orchestrator.sweep.config import SweepConfig
from orchestrator.track import TrackingConfig, effective_uri, ui_command
from orchestrator.track.caller import mlflow_state_kept
from orchestrator.vocab.wordpiece import VocabConfig
from orchestrator.workflows.config import ChainConfig, RayConfig, sample_corpus
from orchestrator.workflows.runner import ArmPlan, arm_outputs, build_arm, plan_corpus_stages, sweep

log = logging.getLogger("entity_cycle")

CYCLE_STAGE = "entity_cycle"
#: Logged training steps whose MLM accuracy is averaged into a cycle's figure (one step's is noisy).
ACCURACY_TAIL = 10


def _entity_instances() -> InstanceConfig:
    return InstanceConfig(entity_masking=EntityMaskingConfig(association_method="npmi", association_level="term"))


@dataclasses.dataclass(frozen=True)
class ExtractorSweep(SweepConfig):
    """The cycle's extractor sweep: a ``SweepConfig`` whose errors name the keys as the user writes them
    here (``extractor.epochs``, not ``sweep.epochs``)."""

    KEY = "extractor"


def _extractor_sweep() -> ExtractorSweep:
    return ExtractorSweep(search_space="tiny", tasks=("bc5cdr_chemical",), export_best=("bc5cdr_chemical",))


@dataclasses.dataclass(frozen=True)
class CycleConfig:
    run_name: str = field("entity_cycle", help="run directory name under runs_root")
    runs_root: str = field("runs", help="where run directories are created")
    model_name: str = field("cycle", help="display name of the models; cycle c's is <model_name>-<c>")
    cycles: int = field(2, help="pretraining cycles in all, cycle 0 (random masking) included")
    seed: int = field(42, help="seed of the driver process's generators (Python, numpy, torch); the cycle's stages "
                               "have their own (e.g. pretrain.seed, extractor.seeds)")
    ray: RayConfig = field(default_factory=RayConfig, help="Ray runtime")
    tracking: TrackingConfig = field(default_factory=TrackingConfig, help="MLflow tracking")
    corpus: CorpusConfig = field(default_factory=sample_corpus, help="corpus stage (shared by every cycle)")
    vocab: VocabConfig = field(default_factory=VocabConfig, help="vocabulary stage (shared by every cycle)")
    instances: InstanceConfig = field(
        default_factory=_entity_instances,
        help="instances of every cycle; cycle 0 drops entity_masking (random masking), later cycles use it "
             "with the previous cycle's extractor as ner_model (filled in here: leave it empty)")
    pretrain: PretrainConfig = field(
        default_factory=PretrainConfig,
        help="each cycle's pretraining: its steps and stop rules (stop.mlm_accuracy) apply per cycle; cycles "
             "after 0 continue from the previous cycle's final model (model.init_from, set here)")
    eval_instances: int = field(
        512, help="every cycle's model is also scored on the first this many of cycle 0's (random-masked) "
                  "instances, the same masked positions for every cycle (eval_mlm_accuracy); 0 = off. Training "
                  "MLM accuracy is on each cycle's own instances, entity-masked after cycle 0: not comparable")
    extractor: ExtractorSweep = field(
        default_factory=_extractor_sweep,
        help="the extractor of each cycle: a sweep of one NER task (tasks: [t], export_best: [t]) whose "
             "selected model is the next cycle's entity extractor")

    def __post_init__(self) -> None:
        check_run_name(self.run_name)
        if self.eval_instances < 0:
            raise ConfigError(f"eval_instances: {self.eval_instances}; >= 0 (0 = off)")
        if self.cycles < 1:
            raise ConfigError(f"cycles: {self.cycles}; at least 1 (cycle 0, random masking)")
        em = self.instances.entity_masking
        if self.cycles > 1 and em is None:
            raise ConfigError("instances.entity_masking: null; cycles after 0 build entity-aware instances "
                              "(e.g. instances.entity_masking.association_method: npmi)")
        if em is not None and (em.ner_model or em.dictionaries):
            raise ConfigError("instances.entity_masking: the cycle's extractor is the entity extractor; leave "
                              "ner_model and dictionaries empty")
        if len(self.extractor.tasks) != 1 or len(self.extractor.export_best) != 1:
            raise ConfigError(f"extractor: one NER task, exported: tasks: [t], export_best: [t] (got tasks "
                              f"{list(self.extractor.tasks)}, export_best {list(self.extractor.export_best)})")
        task = self.extractor.tasks[0]
        if (family := load_task(task).family) != "ner":  # the next cycle tags entities with its export
            raise ConfigError(f"extractor.tasks: {task!r} is a task of family {family}; the entity extractor "
                              "needs one of family ner (e.g. bc5cdr_chemical)")
        if self.cycles > 1 and self.pretrain.model.init_from:
            log.info("cycle 0 continues from %s; later cycles from the cycle before", self.pretrain.model.init_from)

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_root).resolve() / self.run_name

    def cycle_instances(self, extractor_dir: Path | None) -> InstanceConfig:
        """Cycle 0's instances (random masking) without an extractor, else entity-aware ones with it."""
        if extractor_dir is None:
            return dataclasses.replace(self.instances, entity_masking=None)
        em = dataclasses.replace(self.instances.entity_masking, ner_model=str(extractor_dir))
        return dataclasses.replace(self.instances, entity_masking=em)

    def cycle_pretrain(self, init_from: Path | None) -> PretrainConfig:
        if init_from is None:
            return self.pretrain
        return dataclasses.replace(self.pretrain, model=dataclasses.replace(self.pretrain.model,
                                                                            init_from=str(init_from)))


@dataclasses.dataclass
class CycleResult:
    run_dir: Path
    cycles: list[dict]
    tracking_uri: str = ""
    parent_run_id: str = ""

    def summary(self) -> str:
        lines = ["", "=" * 72, f"run directory : {self.run_dir}"]
        for c in self.cycles:
            prev = c["previous_extractor"]
            held = f", on cycle 0's instances {c['eval']['mlm_accuracy']:.3f}" if c["eval"] else ""
            lines.append(f"cycle {c['cycle']}: MLM accuracy {c['mlm_accuracy']:.3f}{held} ({c['stopped_by']}); "
                         f"extractor F1 dev {c['extractor']['dev']:.3f} test {c['extractor']['test']:.3f}"
                         + (f"; built with cycle {prev['cycle']}'s extractor (F1 test {prev['test']:.3f}), "
                            f"{c['entities'].get('entities', 0)} entities" if prev else "; random masking"))
        if self.tracking_uri:
            lines.append(f"MLflow        : {ui_command(self.tracking_uri)}")
        lines.append("=" * 72)
        return "\n".join(lines)


def mlm_accuracy(history: list[dict], tail: int = ACCURACY_TAIL) -> float:
    """The mean MLM accuracy of the last ``tail`` logged steps (0.0 without any)."""
    values = [h["mlm_accuracy"] for h in history if "mlm_accuracy" in h][-tail:]
    return sum(values) / len(values) if values else 0.0


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: CycleConfig) -> CycleResult:
    input_stats(cfg.corpus)  # fail fast, before Ray starts, on missing or empty source files
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "cycle_config.json", public(to_dict(cfg)))
    from orchestrator.track.runs import log_step_metrics, parent_run  # heavy: mlflow behind it

    uri = effective_uri(cfg.tracking, run_dir) if cfg.tracking.enabled else ""
    # Ray's, Tune's and the workers' own lines go to the run's log file, as in jobs/blue_sweep.py (--verbose: terminal)
    with seeded(cfg.seed), ray_session(address=cfg.ray.address or None, num_cpus=cfg.ray.num_cpus or None,
                                       log_file=run_dir / LOG_PATH) as info, \
            parent_run(cfg.tracking, run_dir, kind=CYCLE_STAGE, key=content_key(CYCLE_STAGE, cfg),
                       name=cfg.run_name, params={"cycles": cfg.cycles}) as parent:
        if info["log_file"]:
            log.info("Ray's, Tune's and the workers' own output: %s", info["log_file"])
        cycles: list[dict] = []
        for c in range(cfg.cycles):
            record = run_cycle(cfg, c, cycles[-1] if cycles else None)
            cycles.append(record)
            log_step_metrics(step_metrics(record), step=c)
    return CycleResult(run_dir=run_dir, cycles=cycles, tracking_uri=uri, parent_run_id=parent or "")


def step_metrics(record: dict) -> dict[str, float]:
    """One cycle's numbers as the parent run's metrics at step = cycle."""
    out = {"mlm_accuracy": record["mlm_accuracy"], "extractor_f1_dev": record["extractor"]["dev"],
           "extractor_f1_test": record["extractor"]["test"]}
    out.update({f"eval_{k}": float(v) for k, v in record["eval"].items() if k.startswith("mlm_")})
    for key, name in (("entities", "entities"), ("masked_entities", "entities_masked"),
                      ("protected", "entities_protected")):
        if key in record["entities"]:
            out[name] = float(record["entities"][key])
    if record["previous_extractor"]:
        out["previous_extractor_f1_test"] = record["previous_extractor"]["test"]
    out["association_pairs"] = float(len(record["association"].get("table", {}).get("pairs", [])))
    return out


def cycle_arm(cfg: CycleConfig, c: int, extractor_dir: Path | None, init_from: Path | None) -> ArmPlan:
    """Cycle ``c`` as an arm of the runner: instances (random, or entity-aware with ``extractor_dir``) and
    pretraining (from ``init_from``) under ``cycle-<c>/``, on the corpus and vocabulary every cycle
    shares under the run directory."""
    run_dir, cycle_dir = cfg.run_dir, cfg.run_dir / f"cycle-{c}"
    chain = ChainConfig(run_name=cfg.run_name, runs_root=cfg.runs_root, model_name=f"{cfg.model_name}-{c}",
                        stages=("corpus", "vocab", "instances", "pretrain"), seed=cfg.seed, ray=cfg.ray,
                        tracking=cfg.tracking, corpus=cfg.corpus, vocab=cfg.vocab,
                        instances=cfg.cycle_instances(extractor_dir), pretrain=cfg.cycle_pretrain(init_from))

    def place(name: str, key: str) -> Path:
        return run_dir / name if name in ("corpus", "vocab") else cycle_dir / name

    return ArmPlan(chain.model_name, "pretrain", chain, arm_outputs(chain, "pretrain", place),
                   cycle_dir / "pretrain" / "final", tags={"cycle": str(c)})


def run_cycle(cfg: CycleConfig, c: int, previous: dict | None) -> dict:
    """One cycle: instances (random, or entity-aware with the previous extractor) -> pretrain -> extractor;
    writes and returns its record (``cycle-<c>/manifest.json``)."""
    from orchestrator.pretrain.evaluate import evaluate_mlm  # heavy: torch, transformers

    run_dir, cycle_dir = cfg.run_dir, cfg.run_dir / f"cycle-{c}"
    extractor_dir = Path(previous["extractor"]["dir"]) if previous else None
    init_from = Path(previous["model_dir"]) if previous else None
    arm = cycle_arm(cfg, c, extractor_dir, init_from)
    log.info("cycle %d (%d of %d): instances (%s), then pretrain%s", c, c + 1, cfg.cycles,
             f"entities by {extractor_dir}" if extractor_dir else "random masking",
             f" from {init_from}" if init_from else "")
    built = build_arm(arm, run_dir)
    corpus, result, pre_cfg = built.corpus, built.pretrained, arm.config.pretrain
    model_name = f"{cfg.model_name}-{c}"
    log.info("cycle %d: extractor (%s) from %s", c, cfg.extractor.tasks[0], result.model_dir)
    extractor = sweep(cfg.extractor, {model_name: result.model_dir}, cycle_dir / "extractor", cfg.tracking, run_dir)
    (export,) = extractor.exports[model_name].values()
    first = min(corpus.instances)
    inst_manifest = read_manifest(corpus.instances[first])
    reference = previous["reference_instances"] if previous else str(corpus.instances[first])
    evaluation = evaluate_mlm(result.model_dir, reference, cfg.eval_instances) if cfg.eval_instances else {}
    record = {
        "cycle": c,
        "model_dir": str(result.model_dir),
        "init_from": str(init_from or pre_cfg.model.init_from or ""),
        "masking": "entity" if extractor_dir else "random",
        "instances": {n: str(p) for n, p in corpus.instances.items()},
        "mlm_accuracy": mlm_accuracy(result.history),
        "reference_instances": reference,
        "eval": evaluation,
        "stopped_by": ",".join(f"{p['phase']}:{p['stopped_by']}@{p['phase_step']}" for p in result.phases),
        "steps": sum(p["phase_step"] for p in result.phases),
        "entities": inst_manifest["counts"].get("entity_masking", {}),
        "association": inst_manifest.get("association", {}),
        "extractor": {"task": cfg.extractor.tasks[0], **export},
        "previous_extractor": ({"cycle": previous["cycle"], **previous["extractor"]} if previous else None),
    }
    write_manifest(cycle_dir, stage=CYCLE_STAGE, config=cfg, inputs=[], seed=cfg.seed,
                   counts={"mlm_accuracy": record["mlm_accuracy"], "steps": record["steps"],
                           "entities": record["entities"]},
                   extra={k: v for k, v in record.items() if k not in ("entities",)})
    log.info("cycle %d: MLM accuracy %.3f, extractor F1 test %.3f", c, record["mlm_accuracy"], export["test"])
    return record


def plan(cfg: CycleConfig) -> str:
    """Dry run: every stage's config checked; what each cycle would do."""
    from orchestrator.pretrain.plan import plan_pretrain  # heavy: the stage's implementation
    from orchestrator.pretrain.trainer import configured_uri  # heavy: the stage's implementation
    from orchestrator.sweep.runner import plan_sweep

    lines = [f"run directory: {cfg.run_dir}", f"cycles: {cfg.cycles} (cycle 0: random masking)", "",
             "== corpus, vocab, instances (cycle 0) ==",
             plan_corpus_stages(cfg.corpus, cfg.vocab, cfg.cycle_instances(None)),
             "", "== pretrain (each cycle; after cycle 0 from the previous final model) ==",
             plan_pretrain(cfg.pretrain, None, None, tracking_uri=configured_uri(cfg.tracking, cfg.run_dir)),
             "", f"== extractor (each cycle: {cfg.extractor.tasks[0]}, exported) ==",
             plan_sweep(cfg.extractor, {f"{cfg.model_name}-0": cfg.run_dir / "cycle-0" / "pretrain" / "final"})]
    em = cfg.instances.entity_masking
    if cfg.cycles > 1 and em is not None:
        lines += ["", f"== cycles 1..{cfg.cycles - 1} ==",
                  f"instances: entity-aware, extractor = the previous cycle's export, association "
                  f"{em.association_method} of {em.association_level}s ({em.association_window}, min_count "
                  f"{em.association_min_count}), "
                  f"threshold {em.threshold}, same_type_grouping {em.same_type_grouping}"]
    return "\n".join(lines)
