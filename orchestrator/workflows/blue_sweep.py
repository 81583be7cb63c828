"""What ``python jobs/blue_sweep.py`` runs: the chain, or an experiment (every arm of a comparison in one
job, each stage built once for the arms that share it).

    python jobs/blue_sweep.py --config experiments/oubiobert_ablation.yaml
    python jobs/blue_sweep.py --config experiments/oubiobert_ablation.yaml --dry-run   # the stage graph

An experiment is a chain config with ``arms:`` (``ExperimentConfig``, ``orchestrator.workflows.config``):
each arm is the base config with its overrides, a published model (``{model: <dir>}``; ``made_by:
<job>`` when another job of this project makes it, such as ``jobs/entity_cycle.py``), or the untrained
floor of the architecture (``{init: random}``). Each arm's corpus, vocabulary, instances and pretraining outputs
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
and a re-run redoes only what did not finish. Without ``arms:`` a config runs the chain: one arm, built
by the same runner (``orchestrator.workflows.runner``), its outputs under the run directory by name
(``corpus``, ``vocab``, ``instances/len<L>``, ``pretrain``), fine-tuned with ``compare_models``.

An experiment that wrote its report and logged to MLflow also gets its comparison page, read back
from MLflow: ``<run_dir>/report/experiment.html`` (``dashboards/experiment_page.py``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from dashboards.experiment_page import PAGE_PATH, build_page
from orchestrator.core.config import flatten, public, to_dict
from orchestrator.core.console import LOG_PATH
from orchestrator.core.cost import StageCost, read_cost, sweep_share
from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import atomic_write_json
from orchestrator.core.reuse import content_key, made_under_at, output_lock
from orchestrator.core.runtime import ray_session, seeded
from orchestrator.report.summary import PAGE, RETRIEVAL, ChainResult
from orchestrator.report.training_data import FILE as TRAINING_DATA
from orchestrator.report.training_data import render_section as training_section
from orchestrator.track import check_local_store, effective_uri, local_uri, probe
from orchestrator.track import schema as S
from orchestrator.track.caller import mlflow_state_kept
from orchestrator.track.experiments import experiment_id_of
from orchestrator.workflows.analyses import (
    check_retrieval_inputs,
    quality_rows,
    quality_section,
    retrieval_plan,
    retrieval_section,
    retrieve_arms,
    score_arms,
    selection_plan,
    training_rows,
)
from orchestrator.workflows.config import ARM_INIT, ARM_MADE_BY, ARM_MODEL, ChainConfig, ExperimentConfig
from orchestrator.workflows.runner import (
    ArmPlan,
    arm_plans,
    augment_plan,
    augment_stage,
    build_arm,
    build_arms,
    chain_arm,
    check_corpus_outputs,
    check_inputs,
    corpus_outputs,
    plan_corpus_stages,
    shared_outputs,
    sweep,
)

log = logging.getLogger("experiment")

STATUS_FILE = "experiment.json"
CONFIG_FILE = "chain_config.json"  # the run's resolved config (redacted): an artifact of its top MLflow run too
SWEEP_COSTS = "the sweep, all arms"  # the costs' entry of the whole sweep, after the arms'
MAX_TAG_TEXT = 4000  # an arm's error on the experiment's MLflow run (MLflow allows 8000 characters)


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: ExperimentConfig) -> ChainResult:
    """``python jobs/blue_sweep.py``: the chain, or with ``arms:`` the experiment and its comparison page."""
    if not cfg.arms:
        return run_chain(cfg)
    result = run_experiment(cfg)
    if result.report and result.tracking_uri:
        write_page(result)
    return result


def plan(cfg: ExperimentConfig) -> str:
    """Dry run: validate every stage's config and inputs, and say what would run (with arms: the stage
    graph: which outputs are built, which arms share them, which are reused from disk)."""
    return plan_experiment(cfg) if cfg.arms else plan_chain(cfg)


def write_page(result: ChainResult) -> None:
    """``<run_dir>/report/experiment.html`` from the experiment's MLflow runs. The page is a view: when
    it cannot be built the job still succeeds, and says why (it can be built later by hand)."""
    from orchestrator.track.runs import attach_files  # heavy: mlflow

    out = result.run_dir / PAGE_PATH
    try:
        result.report[PAGE] = build_page(result.tracking_uri, out, result.mlflow_run_id or None)
        attach_files(result.tracking_uri, result.mlflow_run_id, [out], "report")
    except Exception as exc:  # MLflow raises many types; the experiment itself has finished
        log.warning("the experiment page was not written (%s: %s); build it with: python "
                    "dashboards/experiment_page.py --tracking-uri %s --out %s", type(exc).__name__, exc,
                    result.tracking_uri, out)


# ---------------------------------------------------------------------------------------------
# The chain: a one-arm experiment (its outputs under the run directory by name)

def run_chain(cfg: ExperimentConfig) -> ChainResult:
    run_dir = cfg.run_dir
    check_inputs(cfg)  # before Ray starts and before the run directory is written to
    check_corpus_outputs(run_dir, cfg.instances, cfg.stages)
    (arm,) = arm_plans(cfg).values()

    def stages(info: dict, started: float) -> ChainResult:
        result = _chain_stages(cfg, arm, run_dir)
        # a run that builds no model (stages [sweep, report] over compare_models) files its sweep's cost under
        # the sweep, not under model_name, a model it never built
        builds = any(s in cfg.stages for s in ("corpus", "vocab", "instances", "pretrain"))
        result.costs = {cfg.model_name if builds else "the sweep": chain_costs(cfg, run_dir, since=started)}
        return result

    # the chain's outputs are placed by name: a second job on this run directory waits for the whole first one (with
    # another config, it rebuilt the vocabulary and instances between the first one's stages, which then trained a
    # model of one vocabulary's embeddings with the other's tokenizer and exited 0: a probe, session 46)
    with output_lock(run_dir):
        return _in_ray_session(cfg, stages)


def _in_ray_session(cfg: ExperimentConfig, body) -> ChainResult:
    """What the chain and the experiment both do around their stages: the run directory and its config,
    the seed (the caller's generators given back), Ray (with the job's log file) and the run's wall time.
    ``body(info, started)`` runs the stages; Ray is shut down before returning, so workers' buffered output is
    flushed before the summary."""
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / CONFIG_FILE, public(to_dict(cfg)))
    started, tick = time.time(), time.monotonic()  # a timestamp (costs since it); the wall time's clock
    with seeded(cfg.seed), ray_session(address=cfg.ray.address or None, num_cpus=cfg.ray.num_cpus or None,
                                       log_file=run_dir / LOG_PATH) as info:
        log.info("Ray %s with %s", info["mode"], {k: v for k, v in info["resources"].items() if k in ("CPU", "GPU")})
        result = body(info, started)
    result.log_file, result.wall_s = info["log_file"], time.monotonic() - tick
    return result


def chain_costs(cfg: ChainConfig, run_dir: Path, *, since: float) -> list[StageCost]:
    """What each of the chain's stage outputs cost when it was made (their manifests), reused or not."""
    names = [name for _, name in corpus_outputs(cfg.instances, cfg.stages)]
    names += [s for s in ("pretrain", "sweep") if s in cfg.stages]
    costs = [read_cost(run_dir / name, name, since=since) for name in names]
    return [c for c in costs if c is not None]


def _chain_stages(cfg: ExperimentConfig, arm: ArmPlan, run_dir: Path) -> ChainResult:
    from orchestrator.track.runs import attach_files  # heavy: mlflow

    tracking_uri = effective_uri(cfg.tracking, run_dir) if cfg.tracking.enabled else ""
    stages = cfg.active_stages
    total = len(stages)

    def banner(stage: str, text: str = "") -> None:
        text = text or {"pretrain": f"BERT on Ray Train ({cfg.pretrain.num_workers} workers)"}.get(stage, "")
        log.info("[%d/%d] %s: %s", stages.index(stage) + 1, total, stage, text)

    models = {name: Path(path) for name, path in cfg.compare_models.items()}
    pretrain_loss, top_run = None, None
    if "corpus" in stages:
        banner("corpus", "sources -> mixed shards (Ray Data)")
        if "vocab" in stages:
            banner("vocab", "AmpV WordPiece vocabulary")
        if "instances" in stages:
            banner("instances", "NSP + MLM instances (Ray Data)")
    built = build_arm(arm, run_dir, announce=banner)  # corpus, vocab, instances, pretrain: whichever run
    if built.pretrained is not None:
        pretrain_loss = (built.pretrained.first_loss, built.pretrained.last_loss)
        models = {cfg.model_name: built.pretrained.model_dir, **models}
    variants = []
    if "augment" in stages:
        banner("augment", f"filtered-BERT augmentation of the NER tasks for {len(models)} model(s)")
        variants = augment_stage(cfg.augment, cfg.sweep, models, run_dir)
    results: dict = {}
    if "sweep" in stages:
        banner("sweep", f"BLUE fine-tuning on Ray Tune over {len(models) + len(variants)} model(s)")
        swept = sweep(cfg.sweep, models, run_dir / "sweep", cfg.tracking, run_dir, variants)
        results = swept.results
        # a chain has no run above its sweep's: the config (and the report, below) go on that one
        top_run = swept.parent_run_id
        attach_files(tracking_uri, top_run, [run_dir / CONFIG_FILE])
    elif (run_dir / "sweep" / "results.json").is_file():
        results = json.loads((run_dir / "sweep" / "results.json").read_text())
    report: dict[str, Path] = {}
    if "report" in stages and results:
        from orchestrator.report.blue_table import write_report  # heavy: the stage's implementation

        banner("report", "BLUE table (HTML, Markdown, PNG)")
        report = write_report(results, run_dir / "report")
        attach_files(tracking_uri, top_run, list(report.values()), "report")
    return ChainResult(run_dir=run_dir, report=report, results=results, tracking_uri=tracking_uri,
                       pretrain_loss=pretrain_loss,
                       experiment_id=experiment_id_of(tracking_uri, cfg.tracking.experiment))


def plan_tracking(cfg: ChainConfig) -> str:
    """The tracking line of a dry run: the store, and whether it answers (a short check)."""
    if not cfg.tracking.enabled:
        return "tracking: off"
    uri = cfg.tracking.resolve_uri(cfg.run_dir)
    problem = probe(uri)
    check_local_store(uri if problem is None else local_uri(cfg.run_dir))  # a store SQLite cannot open: refused
    state = "answers" if problem is None else (f"does NOT answer ({problem}): the run would log to "
                                               f"{local_uri(cfg.run_dir)} instead")
    return f"tracking: {uri} (experiment {cfg.tracking.experiment!r}) {state}"


def plan_chain(cfg: ChainConfig) -> str:
    """Dry run: validate every stage's config and inputs, and say what would run."""
    from orchestrator.pretrain.plan import plan_pretrain  # heavy: the stage's implementation
    from orchestrator.pretrain.trainer import configured_uri  # heavy: the stage's implementation
    from orchestrator.sweep.runner import plan_sweep, planned_positions

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
                                                          tracking_uri=configured_uri(cfg.tracking, cfg.run_dir),
                                                          built=chain_arm(cfg).made_instances())]
    if "augment" in stages:
        lines += ["", "== augment ==", augment_plan(cfg.augment)]
    if "sweep" in stages:
        names = ([cfg.model_name] if "pretrain" in stages else []) + list(cfg.compare_models)
        models = {n: Path(cfg.compare_models.get(n) or cfg.run_dir / "pretrain" / "final") for n in names}
        planned = {cfg.model_name: planned_positions(cfg.pretrain)} if "pretrain" in stages else {}
        lines += ["", "== sweep ==", plan_sweep(cfg.sweep, models, planned)]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The experiment: every arm, its stages placed by key, then one sweep

def plan_experiment(cfg: ExperimentConfig) -> str:
    """Every arm's config and inputs checked, and the stage graph: which outputs are built, which arms
    share them, which are reused from disk."""
    from orchestrator.pretrain.plan import plan_pretrain  # heavy: the stages' implementations
    from orchestrator.pretrain.trainer import configured_uri  # heavy: the stages' implementations
    from orchestrator.sweep.runner import plan_sweep, planned_positions

    plans = arm_plans(cfg)
    for arm in plans.values():
        check_inputs(arm.config)
    graph = shared_outputs(plans)
    lines = [f"run directory: {cfg.run_dir}", plan_tracking(cfg),
             f"experiment: {len(plans)} arm(s), baseline {cfg.baseline_arm}"]
    for arm in plans.values():
        what = {"model": f"published model {arm.model_dir}", "random": "untrained floor (random initialisation)",
                "pretrain": "pretrained"}[arm.kind]
        if arm.made_by:
            what = f"model {arm.model_dir} (" + ("not made yet: " if arm.missing else "made by ") + f"{arm.made_by})"
        overrides = {k: v for k, v in flatten(cfg.arms[arm.name]).items()
                     if k not in (ARM_MODEL, ARM_INIT, ARM_MADE_BY)}
        lines.append(f"  {arm.name}: {what}" + (f"; {overrides}" if overrides else "")
                     + (_augmented_text(arm.config) if arm.augmented else ""))
    per_arm = sum(len(p.outputs) for p in plans.values())
    lines += ["", f"== stage graph: {len(graph)} output(s) for {len(plans)} arm(s) "
                  f"({per_arm} if each arm ran as its own chain) =="]
    for out, arms in graph.values():
        done = out.done()
        lines.append(f"  {out.name:<16} {out.key[:12]}  {'reused' if done else 'build':<6}  {', '.join(arms)}"
                     + (made_under_at(out.path) if done else ""))  # an upgrade since it was made, said
    pretraining: dict[tuple, list[ArmPlan]] = {}  # arms of one pretraining config and the same instances made
    for arm in plans.values():
        if arm.kind == "pretrain":
            made = tuple(sorted((n, str(p)) for n, p in arm.made_instances().items()))
            pretraining.setdefault((content_key(arm.config.pretrain), made), []).append(arm)
    for arms in pretraining.values():
        lines += ["", f"== pretrain ({', '.join(a.name for a in arms)}) ==", plan_pretrain(
            arms[0].config.pretrain, None, None, tracking_uri=configured_uri(arms[0].config.tracking, cfg.run_dir),
            built=arms[0].made_instances())]
    if cfg.selection.enabled:
        lines += ["", selection_plan(cfg, plans)]
    if cfg.retrieval.enabled:
        lines += ["", retrieval_plan(cfg, plans)]
    if "sweep" in cfg.stages:  # the arms' models and compare_models', as the run sweeps them
        models = {**{a.name: a.model_dir for a in plans.values()},
                  **{name: Path(path) for name, path in cfg.compare_models.items()}}
        planned = {a.name: planned_positions(a.config.pretrain) for a in plans.values()
                   if a.kind in ("pretrain", "random")}
        lines += ["", "== sweep (one, over every arm: paired by seed) ==", plan_sweep(cfg.sweep, models, planned)]
    elif "report" in cfg.stages:
        lines += ["", "report: no table (stages has no sweep); jobs/report.py --run-dir reports the last sweep logged"]
    return "\n".join(lines)


def run_experiment(cfg: ExperimentConfig) -> ChainResult:
    """Every arm built (or reused), the analyses, the one paired sweep, the report."""
    plans = arm_plans(cfg)
    for arm in plans.values():
        if arm.missing:
            raise ConfigError(f"arms.{arm.name}.model: {arm.model_dir} does not exist yet; it is made by: "
                              f"{arm.made_by}")
        check_inputs(arm.config)  # every arm's inputs, before Ray starts and before anything is written
    if cfg.selection.enabled:
        from orchestrator.selection.measures import kenlm_binary  # heavy: numpy

        kenlm_binary("lmplz"), kenlm_binary("build_binary")  # fail before any arm is built, not after
    if cfg.retrieval.enabled:
        check_retrieval_inputs(cfg)  # bad or unaligned text, a missing extra model: before any arm is built

    def arms(info: dict, started: float) -> ChainResult:
        if info["log_file"]:
            log.info("Ray's, Tune's and the workers' own output: %s", info["log_file"])
        return _run_arms(cfg, plans, cfg.run_dir, started)

    return _in_ray_session(cfg, arms)


def arm_costs(cfg: ExperimentConfig, plans: dict[str, ArmPlan], run_dir: Path, *, since: float
              ) -> dict[str, list[StageCost]]:
    """Each arm's stage outputs (a shared one in every arm that uses it, saying with whom), its augmented
    tasks, and its share of the sweep (its trials' device time); each ``compare_models`` entry's share, in a
    block of its own; then the sweep as a whole. What each cost when it was made, from its manifest
    (``orchestrator.core.cost``); ``reused`` when made before ``since``. A published model's arm has only its
    share of the sweep."""
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
    for name in cfg.compare_models if "sweep" in cfg.stages else ():  # a published model's share: its own block
        share = sweep_share(run_dir / "sweep", name, since=since)
        if share is not None:
            costs[name] = [share]
    whole = read_cost(run_dir / "sweep", "sweep", since=since) if "sweep" in cfg.stages else None
    if whole is not None:
        costs[SWEEP_COSTS] = [whole]
    return costs


def _cost_tags(costs: dict[str, list[StageCost]]) -> dict[str, str]:
    """The costs as the experiment parent's tags: what the experiment page shows."""
    return S.cost_tags({owner: [dataclasses.asdict(c) for c in rows] for owner, rows in costs.items()})


def _run_arms(cfg: ExperimentConfig, plans: dict[str, ArmPlan], run_dir: Path, started: float) -> ChainResult:
    from orchestrator.track.runs import attach_files, parent_run, set_run_tags  # heavy: mlflow

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
        attach_files(tracking_uri, parent_id, [run_dir / CONFIG_FILE])  # MLflow alone reproduces the run (M7)
        try:
            variants = build_arms(cfg, plans, run_dir, status, record_status)
        except (KeyboardInterrupt, SystemExit):  # Ctrl-C or SIGTERM: the arm being built says so (it said
            for name, arm in status.items():  # "pending": probe M4), with the stage it stopped in
                if arm["status"] == "running":
                    stage = next((o.name for o in plans[name].outputs if not o.done()), None)
                    status[name] = {"status": "interrupted", "kind": arm["kind"], "stage": stage}
            record_status()
            raise
        ok = [a for a in plans.values() if status[a.name]["status"] == "ok"]
        scores, scoring_notes = score_arms(cfg, ok) if cfg.selection.enabled else ({}, [])
        retrieval, retrieval_notes = retrieve_arms(cfg, ok) if cfg.retrieval.enabled else (None, [])
        models = {a.name: a.model_dir for a in ok if not a.augmented}
        models.update({name: Path(path) for name, path in cfg.compare_models.items()})
        results: dict = {}
        if "sweep" in cfg.stages and (models or variants):
            log.info("sweep: one paired sweep over %d arm(s)", len(models) + len(variants))
            row_tags = {a.name: {S.ARM: a.name} for a in ok}
            swept = sweep(cfg.sweep, models, run_dir / "sweep", cfg.tracking, run_dir, variants, row_tags=row_tags)
            results = swept.results
            # the page shows this sweep: a re-run whose sweep matches an earlier one reopens that run (an older
            # start, perhaps under another experiment run), which the newest child was not (a probe, session 46)
            set_run_tags(tracking_uri, parent_id, {S.SWEEP_RUN: swept.parent_run_id or ""})
        report = {}
        if "report" in cfg.stages and results:
            from orchestrator.report.blue_table import write_report  # heavy: the stage's implementation

            quality, trained_on = quality_rows(ok), training_rows(ok)
            sections = ([training_section(trained_on)] if trained_on else []) + \
                ([retrieval_section(retrieval)] if retrieval else []) + \
                ([quality_section(quality)] if quality else [])
            baseline = cfg.baseline_arm if cfg.baseline_arm in results["models"] else None
            if baseline is None:
                log.warning("the baseline arm %s has no results (it failed): no paired differences", cfg.baseline_arm)
            report = write_report(results, run_dir / "report", title=f"Experiment {cfg.run_name}",
                                  baseline=baseline, notes=_failure_notes(status) + scoring_notes + retrieval_notes,
                                  source_scores=scores or None, sections=sections,
                                  documents={TRAINING_DATA: trained_on} if trained_on else None)
            if "sources_scatter" in report:  # seed 004's analysis: its numbers and figures on MLflow too
                from orchestrator.report.sources import log_source_gains  # heavy: mlflow

                doc = json.loads(report["comparison"].read_text(encoding="utf-8"))["sources"]
                log_source_gains(cfg.tracking, run_dir, doc, [report[k] for k in ("sources_scatter", "sources_matrix",
                                                                                  "comparison")])
        elif "report" in cfg.stages:  # it was skipped without a word (an experiments probe, session 46)
            log.warning("report: no table written: %s; jobs/report.py --run-dir %s reports the last sweep logged",
                        "stages has no sweep" if "sweep" not in cfg.stages else "the sweep had no model to fine-tune",
                        run_dir)
        if retrieval:
            report[RETRIEVAL] = retrieval[0] / "table.html"
        attach_files(tracking_uri, parent_id, list(report.values()), "report")  # experiment.html: write_page
        costs = arm_costs(cfg, plans, run_dir, since=started)
        record_status()
        set_run_tags(tracking_uri, parent_id, _cost_tags(costs))
    return ChainResult(run_dir=run_dir, report=report, results=results, tracking_uri=tracking_uri, arms=status,
                       mlflow_run_id=parent_id or "", costs=costs,
                       experiment_id=experiment_id_of(tracking_uri, cfg.tracking.experiment))



def _augmented_text(arm: ChainConfig) -> str:
    a = arm.augment.augment
    data = ("the originals repeated unchanged (the equal-steps control)" if a.method == "repeat"
            else "filtered-BERT augmented training sentences")
    return f"; NER tasks only, fine-tuned on the originals + {a.multiple:g} x {data}"


def _status_tags(cfg: ExperimentConfig, status: dict[str, dict]) -> dict[str, str]:
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

