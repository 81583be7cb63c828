"""What ``python jobs/build_corpus.py`` runs: the first three stages of the chain (corpus -> vocab ->
instances) into one run directory, by name (``out_dir/corpus``, ``vocab``, ``instances/len<L>``), each
reused by key. The stage wiring is the runner's (``orchestrator.workflows.runner.corpus_stages``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path

from orchestrator.core.config import check_set, field
from orchestrator.core.console import LOG_PATH
from orchestrator.core.reuse import output_lock
from orchestrator.core.runtime import ray_session
from orchestrator.corpus.stage import CorpusConfig, input_stats
from orchestrator.instances.config import InstanceConfig
from orchestrator.vocab.quality import load_tokenizers, read_text_sets
from orchestrator.vocab.wordpiece import VocabConfig
from orchestrator.workflows.config import RayConfig, sample_corpus
from orchestrator.workflows.runner import (
    CorpusResult,
    check_corpus_outputs,
    corpus_reused,
    corpus_stages,
    plan_corpus_stages,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CorpusBuildConfig:
    out_dir: str = field("runs/corpus", help="run directory: corpus/, vocab/, instances/len<L>/ go inside")
    corpus: CorpusConfig = field(default_factory=sample_corpus, help="corpus stage: sources and mixing")
    vocab: VocabConfig = field(default_factory=VocabConfig, help="vocabulary stage: WordPiece / AmpV")
    instances: InstanceConfig = field(default_factory=InstanceConfig, help="instances stage: NSP + MLM")
    ray: RayConfig = field(default_factory=RayConfig, help="Ray runtime")

    def __post_init__(self) -> None:
        check_set(out_dir=self.out_dir)


def run(cfg: CorpusBuildConfig) -> CorpusResult:
    """``python jobs/build_corpus.py``: the first three stages of the chain (``orchestrator.workflows.<job>.run``, as
    every job's workflow is named: probe L10)."""
    return build_corpus(cfg)


def build_corpus(cfg: CorpusBuildConfig) -> CorpusResult:
    """The first three stages of the chain, as ``run``."""
    input_stats(cfg.corpus)  # fail fast, before Ray starts, on missing or empty source files
    check_corpus_outputs(Path(cfg.out_dir), cfg.instances)
    quality = cfg.vocab.quality
    if quality.active:  # the tokenizer-quality inputs too (as the dry run does), not after the vocabulary is trained
        read_text_sets(quality.texts, quality.max_lines)
        load_tokenizers(quality.tokenizers)
    # its outputs are placed by name: a second job on this folder waits for the whole first one (with another config,
    # its stages replaced the first one's vocabulary between that one's vocab and instances stages)
    # Ray only when a stage is to be built (every output reused: 18-22 s of Ray for nothing, probe G7), its output in
    # the run's log as the other jobs' (Ray Data's tables were 294 of the terminal's 364 lines at 300 MB: probe G8)
    with output_lock(Path(cfg.out_dir)), contextlib.ExitStack() as stack:
        if not corpus_reused(cfg.corpus, cfg.vocab, cfg.instances, Path(cfg.out_dir)):
            info = stack.enter_context(ray_session(address=cfg.ray.address or None, num_cpus=cfg.ray.num_cpus or None,
                                                   log_file=Path(cfg.out_dir) / LOG_PATH))
            if info["log_file"]:
                log.info("Ray's and the workers' own output: %s", info["log_file"])
        result = corpus_stages(cfg.corpus, cfg.vocab, cfg.instances, Path(cfg.out_dir))
    stale = sorted(p for p in (Path(cfg.out_dir) / "instances").glob("len*")
                   if p.is_dir() and p.resolve() not in {q.resolve() for q in result.instances.values()})
    if stale:  # jobs/pretrain.py instances_dir=<out_dir>/instances takes every finished len<L>/ it finds
        log.warning("%s: made by an earlier run with other settings (other instances.max_seq_lengths; perhaps "
                    "another corpus or vocabulary), not by this one; jobs/pretrain.py reads every len<L>/ under "
                    "instances/: remove it, or give pretraining this run's folders", ", ".join(str(p) for p in stale))
    return result


def plan(cfg: CorpusBuildConfig) -> str:
    """Dry run: every source parses; what each stage would build, and where."""
    check_corpus_outputs(Path(cfg.out_dir), cfg.instances)
    return plan_corpus_stages(cfg.corpus, cfg.vocab, cfg.instances) + f"\n  run directory: {cfg.out_dir}"

