"""Experiments: every arm of a comparison in one job, each stage built once for the arms that share it.

    python jobs/blue_sweep.py --config experiments/oubiobert_ablation.yaml
    python jobs/blue_sweep.py --config experiments/oubiobert_ablation.yaml --dry-run   # the stage graph

An experiment is a chain config with ``arms:`` (``ChainConfig.arms``): each arm is the base config
with its overrides, a published model (``{model: <dir>}``; ``made_by: <job>`` when another job of this
project makes it, such as ``jobs/entity_cycle.py``), or the untrained floor of the
architecture (``{init: random}``). Each arm's corpus, vocabulary, instances and pretraining outputs
live under ``<run_dir>/stages/<output>/<key>``, placed by their content key (``orchestrator.core.reuse``):
arms whose stage would be identical share one output, built once, and a re-run reuses every
finished one (a pretraining that was stopped resumes from its checkpoint). Then every arm's model
goes through one sweep, with the same tasks, settings and seeds, so the differences pair by seed;
the report compares each arm with the baseline arm.

Arms are built one after another by default (``arm_concurrency: 1``, a laptop): each stage already
spreads over the cluster through its own Ray parallelism (Ray Data tasks, Train workers, Tune
trials). With ``arm_concurrency`` above 1 (or 0: as many pretraining jobs as the cluster's CPUs or
GPUs fit) that many arms are built at once, each from its own driver thread submitting its stages
to Ray; a stage two of them share is built by the first and reused by the other, which waits for it
(``orchestrator.core.reuse.output_lock``). A failing arm does not stop the others:
its error is recorded in ``experiment.json`` and in the report, its arm is left out of the sweep,
and a re-run redoes only what did not finish. Without ``arms:`` a config runs the chain as before.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orchestrator import chain
from orchestrator.chain import ChainConfig, ChainResult, check_inputs, corpus_keys, corpus_stages
from orchestrator.core.config import flatten, to_dict
from orchestrator.core.console import LOG_PATH
from orchestrator.core.cost import StageCost, read_cost, sweep_share
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import atomic_write_json, is_complete
from orchestrator.core.reuse import content_key, output_lock, reusable, run_stage
from orchestrator.core.runtime import possible_gpus, ray_session, seed_everything
from orchestrator.retrieval.table import CSS as RETRIEVAL_CSS
from orchestrator.retrieval.table import render_html as retrieval_html
from orchestrator.retrieval.table import render_markdown as retrieval_markdown
from orchestrator.selection.arms import read_scores, score_arm
from orchestrator.selection.settings import scoring_key
from orchestrator.sweep.space import Variant
from orchestrator.track import effective_uri
from orchestrator.track import schema as S
from orchestrator.track.experiments import experiment_id_of
from orchestrator.vocab.quality import CSS as QUALITY_CSS
from orchestrator.vocab.quality import QUALITY_TITLE
from orchestrator.vocab.quality import render_html as quality_html
from orchestrator.vocab.quality import render_markdown as quality_markdown

log = logging.getLogger("experiment")

STAGES_DIR = "stages"
STATUS_FILE = "experiment.json"
RANDOM_INIT = "random-init"
SWEEP_COSTS = "the sweep, all arms"  # the costs' entry of the whole sweep, after the arms'
MAX_TAG_TEXT = 4000  # an arm's error on the experiment's MLflow run (MLflow allows 8000 characters)


@dataclasses.dataclass(frozen=True)
class Output:
    """One stage output of an arm: ``name`` (corpus, vocab, instances/len128, pretrain or
    random-init), its content key, and where it lives."""

    stage: str
    name: str
    key: str
    path: Path

    def done(self) -> bool:
        # pretraining's manifest records its own key (pretrain_key); its folder is named by this one
        finished = is_complete(self.path) if self.name == "pretrain" else reusable(self.path, self.key)
        return finished and (self.stage != "pretrain" or (self.path / "final" / "config.json").is_file())


@dataclasses.dataclass
class ArmPlan:
    name: str
    kind: str  # pretrain | random | model (see ChainConfig.arm_kind)
    config: ChainConfig
    outputs: list[Output]  # in build order
    model_dir: Path  # what the sweep fine-tunes
    made_by: str = ""  # a model arm: the job that makes its model (arms.<name>.made_by)

    @property
    def missing(self) -> bool:
        """A model arm whose model another job has not made yet."""
        return self.kind == "model" and not (self.model_dir / "config.json").is_file()

    @property
    def augmented(self) -> bool:
        return self.kind != "model" and "augment" in self.config.stages and self.config.augment.enabled


def arm_plans(cfg: ChainConfig) -> dict[str, ArmPlan]:
    """Every arm's outputs and model directory, from configs and input files alone (nothing is built)."""
    root = cfg.run_dir / STAGES_DIR
    plans = {}
    for name in cfg.arms:
        arm, kind = cfg.arm(name), cfg.arm_kind(name)
        if kind == "model":
            entry = flatten(cfg.arms[name])
            model_dir, made_by = Path(entry[chain.ARM_MODEL]), str(entry.get(chain.ARM_MADE_BY, ""))
            if not (model_dir / "config.json").is_file() and not made_by:  # nothing here builds it
                raise ConfigError(f"arms.{name}.model: {model_dir} is not a Hugging Face model directory "
                                  "(no config.json)")
            plans[name] = ArmPlan(name, kind, arm, [], model_dir, made_by)
            continue
        if "pretrain" not in arm.stages:
            raise ConfigError(f"arms.{name}: an arm that pretrains needs the corpus, vocab, instances and pretrain "
                              f"stages (stages: {list(arm.stages)}); to fine-tune given models only, drop the arms "
                              "(arms={}: the default preset is an experiment) or make each one {model: <directory>}")
        wanted = ("corpus", "vocab") if kind == "random" else ("corpus", "vocab", "instances")
        keys = corpus_keys(arm.corpus, arm.vocab, arm.instances, wanted)
        outputs = [Output(n.split("/")[0], n, k, root / n / k) for n, k in keys.items()]
        if kind == "random":
            key = content_key("random-init", arm.pretrain.model, arm.pretrain.seed, keys["vocab"])
            outputs.append(Output("pretrain", RANDOM_INIT, key, root / RANDOM_INIT / key))
        else:
            instances = {n: k for n, k in keys.items() if n.startswith("instances/")}
            # what the run is (operational settings such as checkpoint frequency do not count, as in pretrain_key)
            key = content_key("pretrain", arm.pretrain.training_fields(), instances, keys["vocab"])
            outputs.append(Output("pretrain", "pretrain", key, root / "pretrain" / key))
        plans[name] = ArmPlan(name, kind, arm, outputs, outputs[-1].path / "final")
    return plans


def shared_outputs(plans: dict[str, ArmPlan]) -> dict[str, tuple[Output, list[str]]]:
    """Each distinct output (by key) and the arms that use it, in build order."""
    graph: dict[str, tuple[Output, list[str]]] = {}
    for plan in plans.values():
        for out in plan.outputs:
            graph.setdefault(out.key, (out, []))[1].append(plan.name)
    return graph


# ---------------------------------------------------------------------------------------------
def plan(cfg: ChainConfig) -> str:
    """Dry run: without arms, the chain's plan; with arms, every arm's config and inputs checked, and
    the stage graph: which outputs are built, which arms share them, which are reused from disk."""
    if not cfg.arms:
        return chain.plan(cfg)
    from orchestrator.pretrain.trainer import configured_uri, plan_pretrain  # heavy: the stages' implementations
    from orchestrator.sweep.runner import plan_sweep

    plans = arm_plans(cfg)
    for arm in plans.values():
        check_inputs(arm.config)
    graph = shared_outputs(plans)
    lines = [f"run directory: {cfg.run_dir}", chain.plan_tracking(cfg),
             f"experiment: {len(plans)} arm(s), baseline {cfg.baseline_arm}"]
    for arm in plans.values():
        what = {"model": f"published model {arm.model_dir}", "random": "untrained floor (random initialisation)",
                "pretrain": "pretrained"}[arm.kind]
        if arm.made_by:
            what = f"model {arm.model_dir} (" + ("not made yet: " if arm.missing else "made by ") + f"{arm.made_by})"
        overrides = {k: v for k, v in flatten(cfg.arms[arm.name]).items()
                     if k not in (chain.ARM_MODEL, chain.ARM_INIT, chain.ARM_MADE_BY)}
        lines.append(f"  {arm.name}: {what}" + (f"; {overrides}" if overrides else "")
                     + (_augmented_text(arm.config) if arm.augmented else ""))
    per_arm = sum(len(p.outputs) for p in plans.values())
    lines += ["", f"== stage graph: {len(graph)} output(s) for {len(plans)} arm(s) "
                  f"({per_arm} if each arm ran as its own chain) =="]
    for out, arms in graph.values():
        state = "reused" if out.done() else "build"
        lines.append(f"  {out.name:<16} {out.key[:12]}  {state:<6}  {', '.join(arms)}")
    seen = set()
    for arm in plans.values():
        key = content_key(arm.config.pretrain)
        if arm.kind == "pretrain" and key not in seen:
            seen.add(key)
            lines += ["", f"== pretrain ({arm.name}) ==", plan_pretrain(
                arm.config.pretrain, None, None, tracking_uri=configured_uri(arm.config.tracking, cfg.run_dir))]
    if cfg.selection.enabled:
        lines += ["", selection_plan(cfg, plans)]
    if cfg.retrieval.enabled:
        lines += ["", retrieval_plan(cfg, plans)]
    if "sweep" in cfg.stages:
        lines += ["", "== sweep (one, over every arm: paired by seed) ==",
                  plan_sweep(cfg.sweep, {a.name: a.model_dir for a in plans.values()})]
    return "\n".join(lines)


def run(cfg: ChainConfig) -> ChainResult:
    """``python jobs/blue_sweep.py``: the chain, or with ``arms:`` the experiment."""
    if not cfg.arms:
        return chain.run(cfg)
    plans = arm_plans(cfg)
    for arm in plans.values():
        if arm.missing:
            raise ConfigError(f"arms.{arm.name}.model: {arm.model_dir} does not exist yet; it is made by: "
                              f"{arm.made_by}")
        check_inputs(arm.config)  # every arm's inputs, before Ray starts and before anything is written
    if cfg.selection.enabled:
        from orchestrator.selection.scoring import kenlm_binary  # heavy: numpy

        kenlm_binary("lmplz"), kenlm_binary("build_binary")  # fail before any arm is built, not after
    if cfg.retrieval.enabled:
        check_retrieval_inputs(cfg)  # bad or unaligned text, a missing extra model: before any arm is built
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "chain_config.json", to_dict(cfg))
    seed_everything(cfg.seed)
    started = time.time()
    with ray_session(address=cfg.ray.address or None, num_cpus=cfg.ray.num_cpus or None,
                     log_file=run_dir / LOG_PATH) as info:
        log.info("Ray %s with %s", info["mode"], {k: v for k, v in info["resources"].items() if k in ("CPU", "GPU")})
        if info["log_file"]:
            log.info("Ray's, Tune's and the workers' own output: %s", info["log_file"])
        result = _run_arms(cfg, plans, run_dir, started)
    result.log_file, result.wall_s = info["log_file"], time.time() - started
    return result


def arm_costs(cfg: ChainConfig, plans: dict[str, ArmPlan], run_dir: Path, *, since: float
              ) -> dict[str, list[StageCost]]:
    """Each arm's stage outputs (a shared one in every arm that uses it, saying with whom), its augmented
    tasks, and its share of the sweep (its trials' device time); then the sweep as a whole. What each
    cost when it was made, from its manifest (``orchestrator.core.cost``); ``reused`` when made before
    ``since``. A published model's arm has only its share of the sweep."""
    graph = shared_outputs(plans)
    costs: dict[str, list[StageCost]] = {}
    for arm in plans.values():
        rows = []
        for out in arm.outputs:
            cost = read_cost(out.path, out.name, since=since)
            if cost is not None:
                others = [a for a in graph[out.key][1] if a != arm.name]
                rows.append(dataclasses.replace(cost, shared=", ".join(others)))
        if arm.augmented:
            for task_dir in sorted((run_dir / "augment" / arm.name).glob("*")):
                cost = read_cost(task_dir, f"augment/{task_dir.name}", since=since)
                rows += [cost] if cost is not None else []
        share = sweep_share(run_dir / "sweep", arm.name, since=since) if "sweep" in cfg.stages else None
        rows += [share] if share is not None else []
        costs[arm.name] = rows  # every arm, even without rows: the parent run's cost tags keep one count
    whole = read_cost(run_dir / "sweep", "sweep", since=since) if "sweep" in cfg.stages else None
    if whole is not None:
        costs[SWEEP_COSTS] = [whole]
    return costs


def _cost_tags(costs: dict[str, list[StageCost]]) -> dict[str, str]:
    """The costs as the experiment parent's tags: what the experiment page shows."""
    return S.cost_tags({owner: [dataclasses.asdict(c) for c in rows] for owner, rows in costs.items()})


def _run_arms(cfg: ChainConfig, plans: dict[str, ArmPlan], run_dir: Path, started: float) -> ChainResult:
    from orchestrator.sweep.runner import run_sweep  # heavy: Ray Tune, torch
    from orchestrator.track.runs import parent_run, set_run_tags

    tracking_uri = effective_uri(cfg.tracking, run_dir) if cfg.tracking.enabled else ""
    status: dict[str, dict] = {name: {"status": "pending", "kind": p.kind} for name, p in plans.items()}
    key = content_key("experiment", str(run_dir), sorted(cfg.arms))
    params = {f"{S.ARM_PARAM_PREFIX}{name}.{k}": v for name in cfg.arms for k, v in flatten(cfg.arms[name]).items()}
    with parent_run(cfg.tracking, run_dir, kind=S.KIND_EXPERIMENT, key=key, name=f"{S.KIND_EXPERIMENT}:{cfg.run_name}",
                    params={**params, S.BASELINE: cfg.baseline_arm}) as parent_id:

        def record_status() -> None:
            """experiment.json, and the same on the parent run's tags (what the comparison page reads)."""
            atomic_write_json(run_dir / STATUS_FILE, {"baseline": cfg.baseline_arm, "arms": status})
            set_run_tags(tracking_uri, parent_id, _status_tags(cfg, status))

        record_status()
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
                    record_status()
                    return
                status[arm.name] = {"status": "running", "kind": arm.kind}
            stage = None
            try:
                variant = _build_arm(cfg, arm, run_dir)
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
                record_status()

        workers = arm_workers(cfg, plans)
        if workers > 1:
            log.info("building up to %d arms at once", workers)
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="arm") as pool:
                for future in [pool.submit(build, i, arm) for i, arm in enumerate(plans.values(), 1)]:
                    future.result()
        else:
            for i, arm in enumerate(plans.values(), 1):
                build(i, arm)
        variants = [variants[name] for name in plans if name in variants]  # the arms' order, whatever finished first
        ok = [a for a in plans.values() if status[a.name]["status"] == "ok"]
        scores, scoring_notes = score_arms(cfg, ok) if cfg.selection.enabled else ({}, [])
        retrieval, retrieval_notes = retrieve_arms(cfg, ok) if cfg.retrieval.enabled else (None, [])
        models = {a.name: a.model_dir for a in ok if not a.augmented}
        models.update({name: Path(path) for name, path in cfg.compare_models.items()})
        results: dict = {}
        if "sweep" in cfg.stages and (models or variants):
            log.info("sweep: one paired sweep over %d arm(s)", len(models) + len(variants))
            row_tags = {a.name: {S.ARM: a.name} for a in ok}
            results = run_sweep(cfg.sweep, models, run_dir / "sweep", cfg.tracking, run_dir, variants,
                                row_tags=row_tags).results
        report = {}
        if "report" in cfg.stages and results:
            from orchestrator.report.blue_table import write_report  # heavy: the stage's implementation

            quality = quality_rows(ok)
            sections = ([retrieval_section(retrieval)] if retrieval else []) + \
                ([quality_section(quality)] if quality else [])
            baseline = cfg.baseline_arm if cfg.baseline_arm in results["models"] else None
            if baseline is None:
                log.warning("the baseline arm %s has no results (it failed): no paired differences", cfg.baseline_arm)
            report = write_report(results, run_dir / "report", title=f"Experiment {cfg.run_name}",
                                  baseline=baseline, notes=_failure_notes(status) + scoring_notes + retrieval_notes,
                                  source_scores=scores or None,
                                  sections=sections)
            if "sources_scatter" in report:  # seed 004's analysis: its numbers and figures on MLflow too
                from orchestrator.report.sources import log_source_gains  # heavy: mlflow

                doc = json.loads(report["comparison"].read_text(encoding="utf-8"))["sources"]
                log_source_gains(cfg.tracking, run_dir, doc, [report[k] for k in ("sources_scatter", "sources_matrix",
                                                                                  "comparison")])
        if retrieval:
            report[chain.RETRIEVAL] = retrieval[0] / "table.html"
        costs = arm_costs(cfg, plans, run_dir, since=started)
        record_status()
        set_run_tags(tracking_uri, parent_id, _cost_tags(costs))
    return ChainResult(run_dir=run_dir, report=report, results=results, tracking_uri=tracking_uri, arms=status,
                       mlflow_run_id=parent_id or "", costs=costs,
                       experiment_id=experiment_id_of(tracking_uri, cfg.tracking.experiment))


def arm_workers(cfg: ChainConfig, plans: dict[str, ArmPlan]) -> int:
    """How many arms to build at once: ``cfg.arm_concurrency``, or for 0 as many pretraining jobs as the
    connected Ray cluster's GPUs (``use_gpu``) or CPUs hold, at most one per arm that trains."""
    if cfg.arm_concurrency:
        return min(cfg.arm_concurrency, len(plans))
    import ray  # heavy: ray

    from orchestrator.pretrain.trainer import DATA_CPU_RESERVE, worker_cpus  # heavy: torch

    training = [p for p in plans.values() if p.kind == "pretrain"] or list(plans.values())
    pre = training[0].config.pretrain
    resources = ray.cluster_resources()
    if pre.use_gpu:  # an autoscaling cluster's GPU nodes count before they start: asking is what starts them
        fit = possible_gpus() // pre.num_workers
    else:
        cpus = resources.get("CPU", 0.0)  # every job's Train workers, and CPUs left for the jobs' Ray Data reads
        fit = (cpus - DATA_CPU_RESERVE) // (pre.num_workers * worker_cpus(pre, cpus) + DATA_CPU_RESERVE)
    return max(1, min(len(plans), int(fit)))


def _build_arm(cfg: ChainConfig, arm: ArmPlan, run_dir: Path) -> Variant | None:
    """Build (or reuse) the arm's outputs; an augmented arm returns its sweep row."""
    if arm.kind == "model":
        return None
    from orchestrator.pretrain.trainer import pretrain, random_init  # heavy: torch, transformers

    a = arm.config
    by_name = {o.name: o for o in arm.outputs}
    wanted = ("corpus", "vocab") if arm.kind == "random" else ("corpus", "vocab", "instances")
    corpus = corpus_stages(a.corpus, a.vocab, a.instances, run_dir, wanted,
                           place=lambda name, key: by_name[name].path, keys={o.name: o.key for o in arm.outputs})
    last = arm.outputs[-1]
    if arm.kind == "random":
        run_stage("pretrain", last.path, last.key,
                  lambda tmp: random_init(a.pretrain, corpus.vocab_dir, tmp, dest=last.path),
                  f"random initialisation ({arm.name})", units=(1.0, 0.0))  # the driver alone
    else:
        with output_lock(last.path):  # an arm sharing this pretraining waits, then reuses it
            pretrain(a.pretrain, corpus.instances, corpus.vocab_dir, last.path, a.tracking, run_dir,
                     run_tags={S.ARM: arm.name})
    if not arm.augmented:
        return None
    variant, = chain.augment_stage(a.augment, cfg.sweep, {arm.name: arm.model_dir}, run_dir)
    return dataclasses.replace(variant, name=arm.name)


def _augmented_text(arm: ChainConfig) -> str:
    a = arm.augment.augment
    data = ("the originals repeated unchanged (the equal-steps control)" if a.method == "repeat"
            else "filtered-BERT augmented training sentences")
    return f"; NER tasks only, fine-tuned on the originals + {a.multiple:g} x {data}"


def _status_tags(cfg: ChainConfig, status: dict[str, dict]) -> dict[str, str]:
    """The arms' status as the experiment parent's tags (``orchestrator.track.schema``): names in order,
    the baseline, and each arm's status, kind, failed stage and error (cut to fit a tag; empty when
    there is none, so a re-run that fixed an arm clears the error an earlier attempt left)."""
    tags = {S.ARMS: ",".join(status), S.BASELINE_TAG: cfg.baseline_arm}
    for name, arm in status.items():
        for field in S.ARM_FIELDS:
            tags[S.arm_tag(name, field)] = "" if arm.get(field) is None else str(arm[field])[:MAX_TAG_TEXT]
    return tags


def _failure_notes(status: dict[str, dict]) -> list[str]:
    return [f"Arm {name} failed" + (f" in {s['stage']}" if s.get("stage") else "") + f": {s['error']}"
            for name, s in status.items() if s["status"] == "failed"]


# ---------------------------------------------------------------------------------------------
# Source scoring (seed 004): every pretraining arm's sources against the sweep's tasks

def _scoring_outputs(cfg: ChainConfig, arms) -> tuple[dict[str, tuple[str, Path, list]], dict[str, list]]:
    """{arm: (key, output directory, source files)} for the arms that pretrain, and the targets."""
    targets = chain.selection_targets(cfg.sweep)
    outputs = {}
    for arm in arms:
        if arm.kind == "pretrain":
            sources = chain.selection_sources(arm.config.corpus)
            key = scoring_key(cfg.selection, sources, targets)
            outputs[arm.name] = (key, cfg.run_dir / STAGES_DIR / "selection" / key, sources)
    return outputs, targets


def selection_plan(cfg: ChainConfig, plans: dict[str, ArmPlan]) -> str:
    """The dry run's section: which arms are scored (shared by key), against which task text."""
    from orchestrator.selection.scoring import kenlm_binary, read_units, tokenize  # heavy: numpy

    outputs, targets = _scoring_outputs(cfg, plans.values())
    s = cfg.selection
    lines = [f"== source scoring (seed 004): {len(outputs)} pretraining arm(s) x {len(targets)} task(s); "
             f"{s.num_samples} sub-samples x {s.sample_tokens} tokens; lmplz {kenlm_binary('lmplz')} ==",
             "  targets: " + ", ".join(f"{task} ({files[0][0]})" for task, files in targets.items())]
    by_key: dict[str, list[str]] = {}
    for name, (key, _, _) in outputs.items():
        by_key.setdefault(key, []).append(name)
    for key, names in by_key.items():
        state = "reused" if reusable(outputs[names[0]][1], key) else "build"
        sources = outputs[names[0]][2]
        tokens = sum(len(tokenize(u)) for f, fmt, tf in sources for u in read_units(f, fmt, tf))  # every file parses
        if tokens < s.sample_tokens and s.short_source == "error":  # the run would stop there: say so now
            raise InputError(sources[0][0], f"the source(s) of arm(s) {', '.join(names)} hold {tokens} tokens, "
                                            f"fewer than selection.sample_tokens={s.sample_tokens}",
                             expected="a larger source, a smaller selection.sample_tokens, or "
                                      "selection.short_source=whole")
        short = "" if tokens >= s.sample_tokens else "; fewer than sample_tokens: scored whole"
        files = ", ".join(Path(f).name for f, _, _ in sources)
        lines.append(f"  {'selection':<16} {key[:12]}  {state:<6}  {', '.join(names)}  "
                     f"({files}: {tokens} tokens{short})")
    lines.append(f"  the report correlates each measure with each arm's gain over {cfg.baseline_arm} "
                 f"({len(outputs) - (cfg.baseline_arm in outputs)} point(s) per column)")
    return "\n".join(lines)


def score_arms(cfg: ChainConfig, arms: list[ArmPlan]) -> tuple[dict[str, dict], list[str]]:
    """Each pretraining arm's scores (built or reused by key under the run directory's stages/); an
    arm whose scoring fails is left out of the correlations, and said so in the report's notes."""
    from orchestrator.track.runs import log_stage_result  # heavy: mlflow

    outputs, targets = _scoring_outputs(cfg, arms)
    scores, notes = {}, []
    for name, (key, out, sources) in outputs.items():
        try:
            run_stage("selection", out, key, lambda tmp, n=name, src=sources: score_arm(n, cfg.selection, src,
                                                                                       targets, tmp),
                      f"source scoring ({name})")
            scores[name] = read_scores(out)
            log_stage_result(cfg.tracking, cfg.run_dir, stage=S.KIND_SELECTION, params=cfg.selection,
                             metrics=_score_metrics(scores[name]), tags={S.ARM: name, S.OUTPUT_KEY: key})
        except Exception as exc:  # the analysis of one arm never stops the experiment
            log.error("source scoring of arm %s failed: %s: %s", name, type(exc).__name__, exc)
            notes.append(f"Source scoring of arm {name} failed: {type(exc).__name__}: {exc}")
    return scores, notes


def _score_metrics(scores: dict) -> dict[str, float]:
    """An arm's scores as the metrics of its source-scoring run (``orchestrator.track.schema``)."""
    metrics = {S.source_metric(m): v for m, v in scores["measures"].items()}
    for task, measures in scores.get("by_task", {}).items():
        metrics.update({S.source_metric(m, task): v for m, v in measures.items()})
    return metrics


# ---------------------------------------------------------------------------------------------
# Cross-lingual retrieval (seed 002, Table 6): every arm's encoder on parallel text, no fine-tuning

def retrieval_models(cfg: ChainConfig, arms) -> dict[str, Path]:
    """The encoders compared: each arm's model in arm order (an augmented arm's encoder is its base
    model's: augmentation changes fine-tuning only, so it has no column of its own), then retrieval.models."""
    models = {a.name: a.model_dir for a in arms if not a.augmented}
    models.update({name: Path(path) for name, path in cfg.retrieval.models.items()})
    return models


def check_retrieval_inputs(cfg: ChainConfig) -> list:
    """The text parses and aligns and the extra models are BERT directories; returns the parallel sets."""
    from orchestrator.retrieval.stage import check_model, load_sets  # heavy: the stage's implementation

    for name, path in cfg.retrieval.models.items():
        check_model(name, path)
    return load_sets(cfg.retrieval)


def retrieval_plan(cfg: ChainConfig, plans: dict[str, ArmPlan]) -> str:
    """The dry run's section: the text (parsed and aligned), the encoders, one task per encoder and side."""
    from orchestrator.retrieval.stage import plan_sets  # heavy: the stage's implementation

    sets = check_retrieval_inputs(cfg)
    models = retrieval_models(cfg, plans.values())
    sides = sum(len(s.languages) for s in sets)
    lines = [f"== cross-lingual retrieval (seed 002, Table 6): {len(models)} encoder(s), {len(models) * sides} "
             "embedding task(s) on Ray, after the arms are built =="]
    lines += [f"  {line}" for line in plan_sets(cfg.retrieval, sets)]
    lines.append("  encoders: " + ", ".join(models))
    return "\n".join(lines)


def retrieve_arms(cfg: ChainConfig, arms: list[ArmPlan]) -> tuple[tuple[Path, dict] | None, list[str]]:
    """Every finished arm's encoder (and retrieval.models) evaluated in one output,
    ``<run_dir>/stages/retrieval/<key>`` (reused by key), each logged as a child run tagged by arm. A
    failure is said in the report's notes: the analysis never stops the experiment."""
    from orchestrator.retrieval.stage import retrieval_stage  # heavy: the stage's implementation

    models = retrieval_models(cfg, arms)
    if not models:
        return None, []
    root = cfg.run_dir / STAGES_DIR / "retrieval"
    try:
        out, results = retrieval_stage(cfg.retrieval, models, lambda key: root / key, cfg.tracking, cfg.run_dir,
                                       tags={a.name: {S.ARM: a.name} for a in arms})
    except Exception as exc:
        log.error("cross-lingual retrieval failed: %s: %s", type(exc).__name__, exc)
        return None, [f"Cross-lingual retrieval failed: {type(exc).__name__}: {exc}"]
    log.info("cross-lingual retrieval: %s", out / "table.md")
    return (out, results), []


def retrieval_section(retrieval: tuple[Path, dict]) -> tuple[str, str]:
    """The retrieval tables as a (Markdown, HTML) section of the experiment's report."""
    _, results = retrieval
    return retrieval_markdown(results), f"<style>{RETRIEVAL_CSS}</style>\n" + retrieval_html(results)


# ---------------------------------------------------------------------------------------------
# Tokenizer quality (seed 002, Figure 3): what each arm's vocabulary stage measured (vocab.quality)

def quality_rows(arms) -> list[dict]:
    """The tokenizer-quality rows of the arms' vocabularies (``tokenizer_quality.json`` of each vocab
    output), the stage's own tokenizer named by the arms that share it ("conventional, floor"), every
    other tokenizer once; grouped by text set. [] when no arm's vocabulary stage measured any."""
    shared: dict[Path, list[str]] = {}
    for arm in arms:
        for out in arm.outputs:
            if out.stage == "vocab" and (out.path / "tokenizer_quality.json").is_file():
                shared.setdefault(out.path, []).append(arm.name)
    rows, seen = [], set()
    for path, names in shared.items():
        for row in json.loads((path / "tokenizer_quality.json").read_text(encoding="utf-8")):
            name = ", ".join(names) if row["tokenizer"] == "vocab" else row["tokenizer"]
            if (row["language"], row["kind"], name) not in seen:
                seen.add((row["language"], row["kind"], name))
                rows.append({**row, "tokenizer": name})
    texts = list(dict.fromkeys((r["language"], r["kind"]) for r in rows))
    return sorted(rows, key=lambda r: texts.index((r["language"], r["kind"])))


def quality_section(rows: list[dict]) -> tuple[str, str]:
    """The arms' tokenizer-quality table as a (Markdown, HTML) section of the experiment's report."""
    title = f"{QUALITY_TITLE} (seed 002, Figure 3)"
    return quality_markdown(rows, title), f"<style>{QUALITY_CSS}</style>\n" + quality_html(rows, title)
