"""The whole method as one run: corpus -> vocab -> instances -> pretrain -> BLUE sweep -> report.

This is what `python jobs/blue_sweep.py` runs. Each stage is the real stage module (the same code
the per-stage jobs call); the chain only wires artifacts together, skips stages whose output is
already complete for the same config (so a re-run resumes), and says where things are.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Literal

from orchestrator.core.config import field, to_dict
from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import atomic_write_json, is_complete
from orchestrator.core.runtime import ray_session, seed_everything
from orchestrator.data.build import CorpusConfig
from orchestrator.data.sources import SourceConfig
from orchestrator.pretrain.config import PretrainConfig
from orchestrator.sweep.config import SweepConfig
from orchestrator.track import TrackingConfig

log = logging.getLogger("chain")

Stage = Literal["corpus", "pretrain", "sweep", "report"]
ALL_STAGES: tuple[str, ...] = ("corpus", "pretrain", "sweep", "report")


@dataclasses.dataclass(frozen=True)
class RayConfig:
    address: str = field("", help="Ray cluster address; empty = RAY_ADDRESS or a cluster head if present, "
                                  "else an embedded local Ray on 127.0.0.1; 'local' forces embedded")
    num_cpus: int = field(0, help="CPUs for an embedded local Ray (0 = all)")


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
    stages: tuple[str, ...] = field(ALL_STAGES, help="stages to run, in order (corpus, pretrain, sweep, report)")
    compare_models: dict[str, str] = field(default_factory=dict,
                                           help="extra Hugging Face BERT directories to fine-tune alongside "
                                                "(name: path), e.g. a published biomedical BERT on disk")
    seed: int = field(42, help="global seed")
    ray: RayConfig = field(default_factory=RayConfig, help="Ray runtime")
    tracking: TrackingConfig = field(default_factory=TrackingConfig, help="MLflow tracking")
    corpus: CorpusConfig = field(default_factory=sample_corpus,
                                 help="corpus stage: sources, mixing, vocabulary, instances")
    pretrain: PretrainConfig = field(default_factory=PretrainConfig, help="pretraining stage")
    sweep: SweepConfig = field(default_factory=SweepConfig, help="BLUE fine-tuning sweep")

    def __post_init__(self):
        bad = [s for s in self.stages if s not in ALL_STAGES]
        if bad:
            raise ConfigError(f"stages: unknown stage(s) {bad}; valid: {list(ALL_STAGES)}")
        if "pretrain" in self.stages and "corpus" not in self.stages:
            raise ConfigError("stages: pretrain needs the corpus stage (its vocabulary and instances)")
        if "sweep" in self.stages and "pretrain" not in self.stages and not self.compare_models:
            raise ConfigError("stages: a sweep without pretraining needs compare_models (name: HF directory)")

    @property
    def run_dir(self) -> Path:
        return Path(self.runs_root).resolve() / self.run_name


@dataclasses.dataclass
class ChainResult:
    run_dir: Path
    report: dict[str, Path]
    results: dict
    tracking_uri: str
    pretrain_loss: tuple[float, float] | None = None

    def mlflow_ui_command(self) -> str:
        return f"mlflow ui --backend-store-uri {self.tracking_uri} --host 127.0.0.1 --port 5000"

    def summary(self) -> str:
        lines = ["", "=" * 72, f"run directory : {self.run_dir}"]
        if self.pretrain_loss:
            lines.append(f"pretraining   : loss {self.pretrain_loss[0]:.3f} -> {self.pretrain_loss[1]:.3f}")
        for kind in ("html", "md", "png"):
            if kind in self.report:
                lines.append(f"report ({kind:4}): {self.report[kind]}")
        lines.append("MLflow UI     : " + self.mlflow_ui_command())
        lines.append("                then open http://127.0.0.1:5000")
        lines.append("=" * 72)
        return "\n".join(lines)


def fingerprint(*parts) -> str:
    text = json.dumps([to_dict(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


class _StageCache:
    """Remembers which stage outputs are complete for which config, so a re-run skips them."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "chain_state.json"
        self.state = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def done(self, stage: str, key: str, out: Path) -> bool:
        return self.state.get(stage) == key and is_complete(out)

    def mark(self, stage: str, key: str) -> None:
        self.state[stage] = key
        atomic_write_json(self.path, self.state)


def run(cfg: ChainConfig) -> ChainResult:
    run_dir = cfg.run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(run_dir / "chain_config.json", to_dict(cfg))
    seed_everything(cfg.seed)
    # Ray is shut down before returning so that workers' buffered output is flushed before the summary.
    with ray_session(address=cfg.ray.address or None, num_cpus=cfg.ray.num_cpus or None) as info:
        return _run_stages(cfg, run_dir, info)


def _run_stages(cfg: ChainConfig, run_dir: Path, info: dict) -> ChainResult:
    from orchestrator.data.build import build_corpus
    from orchestrator.pretrain.trainer import pretrain
    from orchestrator.sweep.runner import run_sweep

    log.info("Ray %s with %s", info["mode"], {k: v for k, v in info["resources"].items() if k in ("CPU", "GPU")})
    tracking_uri = cfg.tracking.resolve_uri(run_dir)
    cache = _StageCache(run_dir)
    total = len(cfg.stages)

    def banner(i: int, text: str) -> None:
        log.info("[%d/%d] %s", i, total, text)

    step = 0
    models = {name: Path(path) for name, path in cfg.compare_models.items()}
    pretrain_loss = None
    if "corpus" in cfg.stages:
        step += 1
        banner(step, "corpus: mixing, AmpV vocabulary, pretraining instances (Ray Data)")
        # The corpus stage reuses its own complete outputs when config and inputs are unchanged.
        corpus = build_corpus(cfg.corpus, run_dir)
        cache.mark("corpus", fingerprint(cfg.corpus, corpus.counts))
    if "pretrain" in cfg.stages:
        step += 1
        banner(step, f"pretrain: BERT on Ray Train ({cfg.pretrain.num_workers} workers)")
        out = run_dir / "pretrain"
        key = fingerprint(cfg.pretrain, cache.state.get("corpus"))
        if cache.done("pretrain", key, out):
            model_dir = out / "final"
            log.info("pretrain: output complete for this config, skipped (%s)", model_dir)
            manifest = json.loads((out / "manifest.json").read_text())
            counts = manifest.get("counts", {})
            if "first_loss" in counts:
                pretrain_loss = (counts["first_loss"], counts["last_loss"])
        else:
            result = pretrain(cfg.pretrain, corpus.instances, corpus.vocab_dir, out, cfg.tracking, run_dir)
            model_dir = result.model_dir
            pretrain_loss = (result.first_loss, result.last_loss)
            cache.mark("pretrain", key)
        models = {cfg.model_name: Path(model_dir), **models}
    results: dict = {}
    if "sweep" in cfg.stages:
        step += 1
        banner(step, f"sweep: BLUE fine-tuning on Ray Tune over {len(models)} model(s)")
        sweep = run_sweep(cfg.sweep, models, run_dir / "sweep", cfg.tracking, run_dir)
        results = sweep.results
    elif (run_dir / "sweep" / "results.json").is_file():
        results = json.loads((run_dir / "sweep" / "results.json").read_text())
    report: dict[str, Path] = {}
    if "report" in cfg.stages and results:
        from orchestrator.report.blue_table import write_report

        step += 1
        banner(step, "report: BLUE table (HTML, Markdown, PNG)")
        report = write_report(results, run_dir / "report")
    return ChainResult(run_dir=run_dir, report=report, results=results, tracking_uri=tracking_uri,
                       pretrain_loss=pretrain_loss)


def plan(cfg: ChainConfig) -> str:
    """Dry run: validate every stage's config and inputs, and say what would run."""
    from orchestrator.data.build import plan_corpus
    from orchestrator.pretrain.trainer import plan_pretrain
    from orchestrator.sweep.runner import plan_sweep

    lines = [f"run directory: {cfg.run_dir}", f"stages: {' -> '.join(cfg.stages)}",
             f"tracking: {cfg.tracking.resolve_uri(cfg.run_dir)} (experiment {cfg.tracking.experiment!r})"]
    for name, path in cfg.compare_models.items():
        if not (Path(path) / "config.json").is_file():
            raise ConfigError(f"compare_models.{name}: {path} is not a Hugging Face model directory "
                              "(no config.json)")
    if "corpus" in cfg.stages:
        lines += ["", "== corpus ==", plan_corpus(cfg.corpus)]
    if "pretrain" in cfg.stages:
        lines += ["", "== pretrain ==", plan_pretrain(cfg.pretrain, None, None)]
    if "sweep" in cfg.stages:
        names = ([cfg.model_name] if "pretrain" in cfg.stages else []) + list(cfg.compare_models)
        models = {n: Path(cfg.compare_models.get(n) or cfg.run_dir / "pretrain" / "final") for n in names}
        lines += ["", "== sweep ==", plan_sweep(cfg.sweep, models)]
    return "\n".join(lines)
