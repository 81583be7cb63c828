"""``jobs/proxy_search.py``: which data to pretrain on, from proxy runs (RegMix): K tiny BERTs on random
mixtures, a regression, the best mixture.

    python jobs/proxy_search.py --config configs/proxy_biomed.yaml     # -> runs/proxy_biomed/corpus.yaml
    python jobs/build_corpus.py --config runs/proxy_biomed/corpus.yaml out_dir=runs/proxy_biomed_corpus
    python jobs/blue_sweep.py ... arms.proxy.corpus_from=runs/proxy_biomed/corpus.yaml

RegMix (Liu et al., ICLR 2025) in four steps, each reused when its inputs are unchanged:

1. **Shared pools** (``orchestrator.pretrain.proxy.build_pools``, once): every candidate source read,
   sentence-split and tokenized once with one vocabulary trained on the uniform mixture; the target
   text (the target tasks' files) tokenized and masked once at fixed positions. Kept in
   ``<work_dir>/pools/<key>`` by content key.
2. **Proxies**: K mixtures from a Dirichlet around the sources' natural proportions (their sizes),
   each one Ray Tune trial of ONE Tune run: the trial draws its mixture's sequences from the pools
   and trains a fresh tiny masked-LM BERT for the same token budget, then measures its MLM loss on
   the target positions. A finished proxy is recorded in ``<work_dir>/proxies/<key>.json`` as it
   arrives, so a re-run after a crash trains only the missing ones.
3. **Regression** (``orchestrator.selection.regmix``): weights -> target loss, cross-validated
   (the held-out Spearman correlation says whether it ranks mixtures), then the simplex search:
   the mean of the top-k of many simulated mixtures.
4. **Proposal**: ``<out_dir>/corpus.yaml`` in the format ``jobs/propose_mix.py`` writes (the
   candidates with ``mixer: {name: weighted, weights}``, loaded back as a ``CorpusBuildConfig``
   before the output appears), ``proposal.json`` (``method: proxy``, every proxy's weights and loss,
   the regression and its CV rank correlation) and ``manifest.json``; written atomically.

MLflow: one parent run (kind ``proxy_search``) with the CV correlation and the proposed weights, and
a child run per proxy (its weights as params, its target loss as a metric).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path

from orchestrator.core.config import check_set, field, to_dict
from orchestrator.core.errors import ConfigError, OrchestratorError
from orchestrator.core.manifest import (
    atomic_dir,
    atomic_write_json,
    check_replaceable,
    hash_inputs,
    read_manifest,
    write_manifest,
)
from orchestrator.core.reuse import KEY_FIELD, content_key, made_under, made_under_each, reusable, run_stage
from orchestrator.corpus.sources import source_files
from orchestrator.corpus.stage import CorpusConfig, input_stats, source_sizes
from orchestrator.formats import text_units
from orchestrator.pretrain.proxy import POOLS_STAGE, PoolConfig, ProxyModelConfig
from orchestrator.selection.measures import target_tasks
from orchestrator.selection.regmix import (
    RegressionConfig,
    cross_validate,
    dirichlet_mixtures,
    fit_regression,
    natural_proportions,
    search_simplex,
)
from orchestrator.track import TrackingConfig, effective_uri, ui_command
from orchestrator.track.caller import mlflow_state_kept
from orchestrator.workflows.config import RayConfig, sample_corpus
from orchestrator.workflows.propose_mix import CORPUS_FILE, PROPOSAL_FILE, next_steps, proposal_corpus, write_proposal

log = logging.getLogger("proxy_search")

STAGE = "proxy_search"
MIN_PROXIES = 3
#: What the search keeps in its work directory (``run``): the output may not be, or lie in, one of them.
WORK_ENTRIES = ("pools", "proxies", "tune", "mlflow.db")


@dataclasses.dataclass(frozen=True)
class ProxySearchConfig:
    out_dir: str = field("runs/proxy_search", help="output directory: corpus.yaml (the proposal), proposal.json, "
                                                   "manifest.json")
    work_dir: str = field("", help="shared pools, proxy records, Ray Tune's files and the MLflow store; "
                                   "empty = <out_dir>.work beside the output")
    corpus: CorpusConfig = field(default_factory=sample_corpus,
                                 help="the candidate sources (as jobs/build_corpus.py takes them); the proposal is "
                                      "this corpus with mixer weighted and the proposed weights")
    targets: list[str] = field(default_factory=list,
                               help="held-out target text: PATH or TASK=PATH (task files of any format: BLUE TSV, "
                                    "IOB, plain text); the proxies' loss is measured on it")
    proxies: int = field(16, help="K: proxy models, one per sampled mixture (RegMix trains 512; >= 12 for a "
                                  "usable regression over 3 sources)")
    concentration: float = field(1.0, help="Dirichlet(concentration x n x natural proportions): 1 spreads each "
                                           "source like a flat Dirichlet on average; larger stays nearer the "
                                           "natural mixture")
    seed: int = field(0, help="seed of the mixtures, of each proxy's sampling and masking, of the search")
    pools: PoolConfig = field(default_factory=PoolConfig, help="the shared pools: vocabulary, sequence length, "
                                                               "target sequences and masking")
    proxy: ProxyModelConfig = field(default_factory=ProxyModelConfig, help="every proxy's model and token budget")
    regression: RegressionConfig = field(default_factory=RegressionConfig,
                                         help="weights -> target loss, cross-validation and the simplex search")
    cpus_per_trial: float = field(1.0, help="Ray CPUs per proxy trial")
    max_concurrent_trials: int = field(0, help="proxies trained at once (0 = as many as the CPUs allow)")
    tracking: TrackingConfig = field(default_factory=TrackingConfig, help="MLflow tracking (default store: "
                                                                          "<work_dir>/mlflow.db)")
    ray: RayConfig = field(default_factory=RayConfig, help="Ray runtime")

    def __post_init__(self) -> None:
        check_set(out_dir=self.out_dir)
        if not self.targets:
            raise ConfigError("no targets: give --target FILE... (or targets=[...]): the held-out text the proxies' "
                              "loss is measured on")
        if self.proxies < MIN_PROXIES:
            raise ConfigError(f"proxies must be >= {MIN_PROXIES} (the regression is cross-validated), got "
                              f"{self.proxies}")
        if len(self.corpus.sources) < 2:
            raise ConfigError("a mixture search needs >= 2 candidate sources in corpus.sources")
        if not self.concentration > 0:
            raise ConfigError(f"concentration must be > 0, got {self.concentration}")
        if not self.cpus_per_trial > 0 or self.max_concurrent_trials < 0:
            raise ConfigError("cpus_per_trial must be > 0 and max_concurrent_trials >= 0")
        # The output is replaced as a whole when the search ends: the work directory, filled before,
        # lies outside it, and the output is none of the work's own entries.
        out, work = Path(self.out_dir).resolve(), self.work.resolve()
        if work == out or out in work.parents:
            raise ConfigError(f"work_dir {self.work} is {'out_dir' if work == out else 'inside out_dir'} "
                              f"({self.out_dir}): out_dir is written as a whole when the search ends and holds "
                              "only its output; give a work_dir outside it (empty = <out_dir>.work beside it)")
        for name in WORK_ENTRIES:
            if work / name == out or work / name in out.parents:
                raise ConfigError(f"out_dir {self.out_dir} is in work_dir's {name} ({work / name}), where the "
                                  "search keeps its own files; give an out_dir outside it")

    @property
    def work(self) -> Path:
        out = Path(self.out_dir)
        return Path(self.work_dir) if self.work_dir else out.parent / f"{out.name}.work"


@dataclasses.dataclass(frozen=True)
class ProxySearchResult:
    out_dir: Path
    weights: dict[str, float]
    predicted_loss: float
    cv: dict
    proxies: list[dict]
    reused: bool = False
    tracking_uri: str = ""

    @property
    def corpus_file(self) -> Path:
        return self.out_dir / CORPUS_FILE

    def summary(self) -> str:
        names = sorted(self.weights, key=lambda n: -self.weights[n])
        width = max(9, *(len(n) for n in names))
        lines = [f"proxies ({len(self.proxies)}), sorted by target MLM loss:",
                 "  " + "  ".join(f"{n:>{width}}" for n in names) + f"  {'loss':>7}"]
        for p in sorted(self.proxies, key=lambda p: p["target_mlm_loss"]):
            lines.append("  " + "  ".join(f"{p['weights'][n]:>{width}.3f}" for n in names)
                         + f"  {p['target_mlm_loss']:>7.4f}")
        lines += [f"regression: held-out Spearman {self.cv['spearman']:.3f} ({self.cv['folds']}-fold; Pearson "
                  f"{self.cv['pearson']:.3f}, MAE {self.cv['mae']:.4f})",
                  "proposal: " + ", ".join(f"{n} {self.weights[n]:.3f}" for n in names)
                  + f" (predicted loss {self.predicted_loss:.4f})" + (" [reused]" if self.reused else ""),
                  *next_steps(self.out_dir)]
        if self.tracking_uri:
            lines.append(f"MLflow: {ui_command(self.tracking_uri)}")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------------- keys
def _target_files(cfg: ProxySearchConfig) -> dict[str, list[str]]:
    return target_tasks(cfg.targets)


def pools_key(cfg: ProxySearchConfig) -> str:
    """What the shared pools depend on: the sources (files and how they are read), the targets, the pool settings."""
    files = [p for s in cfg.corpus.sources for p in source_files(s)]
    targets = _target_files(cfg)
    return content_key(POOLS_STAGE, [to_dict(s) for s in cfg.corpus.sources], hash_inputs(files), targets,
                       hash_inputs(p for ps in targets.values() for p in ps), cfg.pools)


def proxy_key(pools: str, cfg: ProxySearchConfig, weights: dict[str, float], seed: int) -> str:
    return content_key("proxy", pools, cfg.proxy, {k: round(v, 12) for k, v in weights.items()}, seed)


def search_key(cfg: ProxySearchConfig) -> str:
    """The whole output's identity: the pools' key and every setting that changes the proposal."""
    settings = {k: to_dict(getattr(cfg, k)) for k in ("proxies", "concentration", "seed", "proxy", "regression")}
    return content_key(STAGE, pools_key(cfg), settings, to_dict(cfg.corpus))


def mixtures(cfg: ProxySearchConfig) -> list[dict[str, float]]:
    """The K sampled mixtures, around the sources' natural proportions (bytes on disk)."""
    sizes = source_sizes(cfg.corpus)
    names = [s.name for s in cfg.corpus.sources]
    W = dirichlet_mixtures({n: sizes[n] for n in names}, cfg.proxies, cfg.concentration, cfg.seed)
    return [{n: float(w) for n, w in zip(names, row)} for row in W]


# --------------------------------------------------------------------------------------------- run
def _tune_trainable(config: dict) -> None:
    """One proxy, in a Ray worker: train on its mixture, report its target loss (and progress on the way)."""
    from ray import tune  # heavy: ray

    from orchestrator.pretrain.proxy import train_proxy  # heavy: torch

    p = config["proxy"]
    record = train_proxy(Path(p["pools_dir"]), p["weights"], ProxyModelConfig(**p["model"]), seed=p["seed"],
                         report=tune.report)
    tune.report({"target_mlm_loss": record["target_mlm_loss"], "record": json.dumps({**record, **p})})


def _record_writer(records_dir: Path, total: int, done_before: int):
    from ray import tune  # heavy: ray

    class RecordWriter(tune.Callback):
        """Driver side: keep each proxy's record as it arrives, and say how far the search is."""

        def __init__(self):
            self.done = done_before
            self.started = time.perf_counter()

        def on_trial_result(self, iteration, trials, trial, result, **info):
            if "record" not in result:
                if "step" in result:  # a quarter of a proxy's steps
                    proxy = trial.config["proxy"]
                    log.info("proxy #%d: step %d, train MLM loss %.3f", proxy["index"], result["step"],
                             result["train_loss"])
                return
            rec = json.loads(result["record"])
            atomic_write_json(records_dir / f"{rec['key']}.json", rec)
            self.done += 1
            log.info("proxy %d/%d done (#%d: %s): target MLM loss %.4f, %.0f s; %.0f s into the Tune run",
                     self.done, total, rec["index"], ", ".join(f"{k} {v:.2f}" for k, v in rec["weights"].items()),
                     rec["target_mlm_loss"], rec["seconds"], time.perf_counter() - self.started)

    return RecordWriter()


def _finished(records_dir: Path, key: str) -> dict | None:
    try:
        return json.loads((records_dir / f"{key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def planned_proxies(cfg: ProxySearchConfig, key_of_pools: str) -> list[dict]:
    """Each proxy's index, key (its record's name), mixture and seed."""
    planned = []
    for index, weights in enumerate(mixtures(cfg)):
        seed = cfg.seed * 100_003 + index
        planned.append({"index": index, "key": proxy_key(key_of_pools, cfg, weights, seed), "weights": weights,
                        "seed": seed})
    return planned


def run_proxies(cfg: ProxySearchConfig, pools_dir: Path, key_of_pools: str) -> list[dict]:
    """Every proxy's record (weights, target loss, ...): the recorded ones reused, the rest as trials of one
    Ray Tune run (Ray must be running)."""
    from ray import tune  # heavy: ray

    from orchestrator.core.runtime import check_fits, tune_loggers  # heavy: ray behind it

    records_dir = cfg.work / "proxies"
    records_dir.mkdir(parents=True, exist_ok=True)
    todo, records = [], {}
    for p in planned_proxies(cfg, key_of_pools):
        found = _finished(records_dir, p["key"])
        if found is not None:
            records[p["index"]] = found
        else:
            todo.append({**p, "pools_dir": str(pools_dir.resolve()), "model": to_dict(cfg.proxy)})
    if records:
        log.info("proxies: %d of %d already trained (same pools, settings and mixture), reused%s", len(records),
                 cfg.proxies, made_under_each(list(records.values())))  # their libraries' releases since
    if todo:
        log.info("proxies: training %d as trials of one Ray Tune run (%d steps of %d x %d tokens each)", len(todo),
                 cfg.proxy.steps(cfg.pools.max_seq_length), cfg.proxy.batch_size, cfg.pools.max_seq_length)
        check_fits({"CPU": cfg.cpus_per_trial}, "cpus_per_trial", "trial")
        trainable = tune.with_resources(_tune_trainable, {"cpu": cfg.cpus_per_trial})
        tuner = tune.Tuner(
            trainable, param_space={"proxy": tune.grid_search(todo)},
            tune_config=tune.TuneConfig(max_concurrent_trials=cfg.max_concurrent_trials or None, reuse_actors=True),
            run_config=tune.RunConfig(name=f"proxies-{time.strftime('%Y%m%d-%H%M%S')}",
                                      storage_path=str((cfg.work / "tune").resolve()), verbose=0,
                                      callbacks=[_record_writer(records_dir, cfg.proxies, len(records)),
                                                 *tune_loggers()]))
        grid = tuner.fit()
        failed = [r for r in grid if r.error is not None]
        if failed:
            raise OrchestratorError(f"{len(failed)} proxy trial(s) failed; first: {failed[0].error}")
        for p in todo:
            rec = _finished(records_dir, p["key"])
            if rec is None:
                raise OrchestratorError(f"proxy {p['index']} finished without a record in {records_dir}")
            records[p["index"]] = rec
    return [records[i] for i in range(cfg.proxies)]


def regress(cfg: ProxySearchConfig, proxies: list[dict]) -> dict:
    """The regression over the proxies, its cross-validation and the simplex search."""
    import numpy as np  # heavy: numpy

    names = [s.name for s in cfg.corpus.sources]
    W = np.array([[p["weights"][n] for n in names] for p in proxies])
    y = np.array([p["target_mlm_loss"] for p in proxies])
    cv = cross_validate(W, y, cfg.regression, seed=cfg.seed)
    fit = fit_regression(W, y, cfg.regression)
    best, predicted = search_simplex(fit, len(names), cfg.regression, seed=cfg.seed)
    return {"weights": {n: float(w) for n, w in zip(names, best)}, "predicted_loss": predicted, "cv": cv,
            "coefficients": fit.coef.tolist(), "best_proxy": int(np.argmin(y))}


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: ProxySearchConfig) -> ProxySearchResult:
    """The whole search: pools -> proxies (one Tune run) -> regression -> corpus.yaml in ``cfg.out_dir``."""
    from orchestrator.core.runtime import ray_session  # heavy: ray behind it

    input_stats(cfg.corpus)  # every candidate file exists and is not empty, before any work
    for paths in _target_files(cfg).values():
        for p in paths:
            next(iter(text_units(p)), None)  # the target files exist and parse
    out_dir, key = Path(cfg.out_dir), search_key(cfg)
    check_replaceable(out_dir, STAGE)  # a folder the project did not write: refused before any proxy trains
    if reusable(out_dir, key):
        log.info("proxy search: output complete for this config and inputs, reused (%s)%s", out_dir,
                 made_under(read_manifest(out_dir)))  # an upgrade keeps it (no key holds a version), said
        return _read_result(out_dir, reused=True)
    work = cfg.work
    work.mkdir(parents=True, exist_ok=True)
    tracking = cfg.tracking
    uri = effective_uri(tracking, work) if tracking.enabled else ""
    from orchestrator.pretrain.proxy import build_pools  # heavy: tokenizers, pyarrow
    from orchestrator.track.runs import log_stage_result, log_step_metrics, parent_run  # heavy: mlflow

    key_of_pools = pools_key(cfg)
    pools_dir = work / "pools" / key_of_pools
    with ray_session(address=cfg.ray.address or None, num_cpus=cfg.ray.num_cpus or None), \
            parent_run(tracking, work, kind=STAGE, key=key, name=Path(cfg.out_dir).name,
                       params={"proxies": cfg.proxies, "sources": ",".join(s.name for s in cfg.corpus.sources),
                               "train_tokens": cfg.proxy.train_tokens, "proxy_size": cfg.proxy.size}):
        run_stage(POOLS_STAGE, pools_dir, key_of_pools,
                  lambda tmp: build_pools(cfg.corpus.sources, _target_files(cfg), cfg.pools, tmp), "proxy pools")
        proxies = run_proxies(cfg, pools_dir, key_of_pools)
        for p in proxies:
            log_stage_result(tracking, work, stage="proxy", params={"weights": p["weights"], "steps": p["steps"],
                                                                    "train_tokens": p["train_tokens"]},
                             metrics={"target_mlm_loss": p["target_mlm_loss"],
                                      "target_mlm_accuracy": p["target_mlm_accuracy"], "train_loss": p["train_loss"],
                                      "seconds": p["seconds"]},
                             tags={"orchestrator.proxy_index": str(p["index"]), "orchestrator.proxy_key": p["key"]})
        found = regress(cfg, proxies)
        log_step_metrics({"cv_spearman": found["cv"]["spearman"], "cv_pearson": found["cv"]["pearson"],
                          "cv_mae": found["cv"]["mae"], "predicted_loss": found["predicted_loss"],
                          "best_proxy_loss": proxies[found["best_proxy"]]["target_mlm_loss"],
                          **{f"weight.{n}": w for n, w in found["weights"].items()}}, step=0)
        write_output(cfg, key, proxies, found)
    return _read_result(out_dir, tracking_uri=uri)


def write_output(cfg: ProxySearchConfig, key: str, proxies: list[dict], found: dict) -> None:
    weights = found["weights"]
    natural = natural_proportions(source_sizes(cfg.corpus))
    rule = (f"RegMix: {cfg.proxies} {cfg.proxy.size} proxies of {proxies[0]['train_tokens']:,} tokens, "
            f"{cfg.regression.features} regression (held-out Spearman {found['cv']['spearman']:.3f}), mean of the "
            f"top {cfg.regression.top_k} of {cfg.regression.samples:,} simulated mixtures")
    header = (f"Proposed by jobs/proxy_search.py ({rule}).\n"
              "Weights: " + ", ".join(f"{n} {v:.3f}" for n, v in weights.items()) + ".\n"
              f"Every proxy's mixture and loss: {PROPOSAL_FILE} beside this file.")
    keep = ("index", "weights", "target_mlm_loss", "target_mlm_accuracy", "train_loss", "steps", "train_tokens",
            "sequences", "seconds", "seed")
    record = {"method": "proxy", "rule_text": rule, "targets": list(cfg.targets), "natural_proportions": natural,
              "weights": weights, "predicted_loss": found["predicted_loss"],
              "regression": {**to_dict(cfg.regression), "coefficients": found["coefficients"],
                             "cv_spearman": found["cv"]["spearman"], "cv_pearson": found["cv"]["pearson"],
                             "cv_mae": found["cv"]["mae"], "cv_folds": found["cv"]["folds"],
                             "cv_predicted": found["cv"]["predicted"]},
              "best_proxy": found["best_proxy"], "proxy": to_dict(cfg.proxy), "pools": to_dict(cfg.pools),
              "proxies": [{k: p[k] for k in keep} for p in proxies]}
    with atomic_dir(Path(cfg.out_dir), STAGE) as tmp:
        write_proposal(tmp, proposal_corpus(cfg.corpus, weights), record, header)
        write_manifest(tmp, stage=STAGE, config=cfg,
                       inputs=[*(p for s in cfg.corpus.sources for p in source_files(s)),
                               *(p for ps in _target_files(cfg).values() for p in ps)],
                       counts={"proxies": len(proxies), "candidates": len(weights),
                               "kept": sum(1 for w in weights.values() if w > 0)},
                       seed=cfg.seed, extra={KEY_FIELD: key, "cv_spearman": found["cv"]["spearman"]})


def _read_result(out_dir: Path, reused: bool = False, tracking_uri: str = "") -> ProxySearchResult:
    record = json.loads((out_dir / PROPOSAL_FILE).read_text(encoding="utf-8"))
    reg = record["regression"]
    cv = {"spearman": reg["cv_spearman"], "pearson": reg["cv_pearson"], "mae": reg["cv_mae"], "folds": reg["cv_folds"]}
    return ProxySearchResult(out_dir=out_dir, weights=record["weights"], predicted_loss=record["predicted_loss"],
                             cv=cv, proxies=record["proxies"], reused=reused, tracking_uri=tracking_uri)


def plan(cfg: ProxySearchConfig) -> str:
    """Dry run: the candidates and targets exist and parse, the run may write ``out_dir``; the mixtures,
    the budget and what is written."""
    from orchestrator.corpus.stage import plan_corpus  # heavy: the corpus stage's reader (a full pass)

    check_replaceable(cfg.out_dir, STAGE)
    lines = ["candidates (the proposal replaces their mixer by the weighted one):", plan_corpus(cfg.corpus)]
    for task, paths in _target_files(cfg).items():
        units = sum(1 for p in paths for _ in text_units(p))
        lines.append(f"target {task}: {units} units ({', '.join(paths)})")
    natural = natural_proportions(source_sizes(cfg.corpus))
    steps = cfg.proxy.steps(cfg.pools.max_seq_length)
    lines.append("natural proportions: " + ", ".join(f"{n} {w:.3f}" for n, w in natural.items()))
    lines.append(f"{cfg.proxies} proxies ({cfg.proxy.size}, {steps} steps x {cfg.proxy.batch_size} x "
                 f"{cfg.pools.max_seq_length} = {steps * cfg.proxy.batch_size * cfg.pools.max_seq_length:,} tokens "
                 f"each), one Ray Tune run, {cfg.cpus_per_trial:g} CPU per trial; mixtures (Dirichlet, "
                 f"concentration {cfg.concentration:g}):")
    for i, w in enumerate(mixtures(cfg)):
        lines.append(f"  #{i:<3} " + ", ".join(f"{n} {v:.3f}" for n, v in w.items()))
    lines.append(f"regression: {cfg.regression.features}, ridge {cfg.regression.ridge:g}, "
                 f"{'leave-one-out' if cfg.regression.folds == 0 else f'{cfg.regression.folds}-fold'} CV; search: "
                 f"mean of the top {cfg.regression.top_k} of {cfg.regression.samples:,} mixtures")
    lines.append(f"work directory: {cfg.work} (pools, proxy records, Tune, mlflow.db)")
    lines.append(f"writes {Path(cfg.out_dir) / CORPUS_FILE} (loads with jobs/build_corpus.py --config) and "
                 f"{PROPOSAL_FILE}")
    if Path(cfg.out_dir).is_dir() and (Path(cfg.out_dir) / "manifest.json").is_file():
        manifest = read_manifest(cfg.out_dir)
        same = manifest.get(KEY_FIELD) == search_key(cfg)
        lines.append(f"{cfg.out_dir}: " + ("complete for this config and inputs, would be reused" + made_under(manifest)
                                           if same else "an earlier search, would be replaced"))
    return "\n".join(lines)


__all__ = ["ProxySearchConfig", "ProxySearchResult", "run", "plan", "mixtures", "regress", "search_key", "pools_key",
           "STAGE"]
