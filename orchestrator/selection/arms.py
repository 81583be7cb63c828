"""Seed 004 inside an experiment: each pretraining arm's corpus scored against the sweep's tasks.

With ``selection.enabled`` an experiment (``orchestrator.workflows.blue_sweep``) scores the sources of every
arm that pretrains, as one text (its sources' files together, as written, not weighted by the
mixer), against the training text of every task of its sweep: PPL, JSD, TVC and TTR of
``orchestrator.selection.scoring``, pooled over the tasks and per task. Each arm's scores are a
stage output like any other (``<run_dir>/stages/selection/<key>/scores.json``, reused by key), and
the report correlates each measure with the arm's gain over the baseline
(``orchestrator.report.sources.source_correlations``).

This module imports configs only; the scoring (numpy, KenLM) is imported when an arm is scored.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import atomic_write_json, hash_inputs, write_manifest
from orchestrator.core.reuse import content_key

SCORES = "scores.json"
#: One input file: (path, reader format of orchestrator.formats or "auto", JSONL key / parquet column).
File = tuple[str, str, str]


@dataclasses.dataclass(frozen=True)
class ArmScoringConfig:
    enabled: bool = field(False, help="experiments only: score every pretraining arm's corpus sources against the "
                                      "training text of the sweep's tasks (seed 004: KenLM perplexity, JSD, target "
                                      "vocabulary covered, TTR) and report the Pearson r of each measure with the "
                                      "arm's gain over the baseline")
    sample_tokens: int = field(100_000, help="tokens per sub-sample of each arm's sources (10M in the seed)")
    num_samples: int = field(5, help="sub-samples per arm; each measure is their mean (5 in the seed)")
    order: int = field(3, help="n-gram order of the KenLM model and of the JSD distribution")
    seed: int = field(0, help="seed of the sub-sampling")
    short_source: Literal["error", "whole"] = field(
        "error", help="an arm's sources with fewer than sample_tokens tokens: 'error' stops naming the files; "
                      "'whole' scores all of them in every sub-sample")
    lmplz_memory: str = field("1G", help="lmplz -S: memory for n-gram counting")

    def __post_init__(self) -> None:
        if self.sample_tokens < 1 or self.num_samples < 1:
            raise ConfigError("selection.sample_tokens and selection.num_samples must be >= 1")
        if not 1 <= self.order <= 6:
            raise ConfigError(f"selection.order must be in 1..6, got {self.order}")


def scoring_key(cfg: ArmScoringConfig, sources: Sequence[File], targets: Mapping[str, Sequence[File]]) -> str:
    """What an arm's scores depend on: the settings, the source files' and the target files' contents."""
    settings = {k: v for k, v in dataclasses.asdict(cfg).items() if k != "enabled"}
    return content_key("selection", settings, [list(f) for f in sources], hash_inputs(f[0] for f in sources),
                       {task: [list(f) for f in files] for task, files in sorted(targets.items())},
                       hash_inputs(f[0] for files in targets.values() for f in files))


def score_arm(name: str, cfg: ArmScoringConfig, sources: Sequence[File], targets: Mapping[str, Sequence[File]],
              out_dir: Path) -> dict:
    """Score one arm's sources against every target task into ``out_dir`` (``scores.json`` and a
    manifest): ``{"measures": {ppl, jsd, tvc, ttr} (all targets pooled), "by_task": {task: {...}},
    "tokens", "sample_tokens", "whole_source"}``."""
    from orchestrator.selection.scoring import (  # heavy: numpy, KenLM
        SelectionConfig,
        profile_target,
        read_units,
        score_source,
    )

    if not sources:
        raise ConfigError(f"arm {name}: no corpus source to score")
    if not targets:
        raise ConfigError("selection: the sweep has no task whose training text could be the target")
    profiles = {}
    for task, files in targets.items():
        profiles[task] = profile_target((u for path, fmt, tf in files for u in read_units(path, fmt, tf)), cfg.order)
        if profiles[task].tokens == 0:
            raise ConfigError(f"selection: the training text of task {task} ({files[0][0]}) holds no tokens")
    scfg = SelectionConfig(sample_tokens=cfg.sample_tokens, num_samples=cfg.num_samples, order=cfg.order,
                           seed=cfg.seed, short_source=cfg.short_source, lmplz_memory=cfg.lmplz_memory,
                           work_dir=str(out_dir))
    score = score_source(name, [(Path(p), fmt, tf) for p, fmt, tf in sources], profiles, scfg)
    doc = {"measures": score.measures(), "by_task": score.by_task, "tokens": score.tokens,
           "sample_tokens": score.sample_tokens, "whole_source": score.whole}
    atomic_write_json(out_dir / SCORES, doc)
    listed = {"scoring": cfg, "sources": [list(f) for f in sources],
              "targets": {t: [list(f) for f in fs] for t, fs in targets.items()}}
    write_manifest(out_dir, stage="selection", config=listed,
                   inputs=[f[0] for f in sources] + [f[0] for fs in targets.values() for f in fs],
                   counts={"source_tokens": score.tokens, "target_tasks": len(targets),
                           "target_tokens": sum(p.tokens for p in profiles.values())},
                   seed=cfg.seed, extra={"tvc_content_words": "proxy: alphabetic non-function words"})
    return doc


def read_scores(out_dir: Path) -> dict:
    return json.loads((Path(out_dir) / SCORES).read_text(encoding="utf-8"))
