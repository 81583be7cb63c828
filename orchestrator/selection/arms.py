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

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError
from orchestrator.core.manifest import atomic_write_json, write_manifest
from orchestrator.selection.settings import File, ScoringSettings

SCORES = "scores.json"


@dataclasses.dataclass(frozen=True)
class ArmScoringConfig(ScoringSettings):
    """The experiment's ``selection:`` section: the scoring settings (``ScoringSettings``) and ``enabled``."""
    enabled: bool = field(False, help="experiments only: score every pretraining arm's corpus sources against the "
                                      "training text of the sweep's tasks (seed 004: KenLM perplexity, JSD, target "
                                      "vocabulary covered, TTR) and report the Pearson r of each measure with the "
                                      "arm's gain over the baseline")

    def __post_init__(self) -> None:
        try:
            super().__post_init__()
        except ConfigError as exc:
            raise ConfigError(f"selection.{exc}") from None


def score_arm(name: str, cfg: ArmScoringConfig, sources: Sequence[File], targets: Mapping[str, Sequence[File]],
              out_dir: Path) -> dict:
    """Score one arm's sources against every target task into ``out_dir`` (``scores.json`` and a
    manifest): ``{"measures": {ppl, jsd, tvc, ttr} (all targets pooled), "by_task": {task: {...}},
    "tokens", "sample_tokens", "whole_source"}``."""
    from orchestrator.selection.measures import profile_target, read_units  # heavy: numpy, KenLM
    from orchestrator.selection.scoring import SelectionConfig, score_source

    if not sources:
        raise ConfigError(f"arm {name}: no corpus source to score")
    if not targets:
        raise ConfigError("selection: the sweep has no task whose training text could be the target")
    profiles = {}
    for task, files in targets.items():
        profiles[task] = profile_target((u for path, fmt, tf in files for u in read_units(path, fmt, tf)), cfg.order)
        if profiles[task].tokens == 0:
            raise ConfigError(f"selection: the training text of task {task} ({files[0][0]}) holds no tokens")
    scfg = SelectionConfig(**cfg.scoring(), work_dir=str(out_dir))
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
