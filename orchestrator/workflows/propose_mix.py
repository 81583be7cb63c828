"""``jobs/propose_mix.py``: which data to pretrain on, as a corpus config: candidate sources scored
against the target, weighted.

    python jobs/propose_mix.py --config candidates.yaml --target BC5CDR=bc5cdr/train.tsv HoC=hoc/train.tsv
    python jobs/build_corpus.py --config runs/proposal/corpus.yaml out_dir=runs/proposal_corpus   # built
    python jobs/blue_sweep.py ... arms.proposal.corpus_from=runs/proposal/corpus.yaml   # an experiment arm

The candidates are a corpus config's sources (names, files, formats: the same section
``jobs/build_corpus.py`` reads). Each is scored against the target task text with seed 004's
measures (``orchestrator.selection.scoring``: KenLM perplexity, JSD, TVC, TTR; its files read with
their own formats, as an experiment scores an arm), or the scores of an earlier
``jobs/score_sources.py`` run are reused (``scores=``). A weighting rule
(``orchestrator.selection.proposal``, softmax of -JSD / 0.1 by default) turns the scores into
mixing weights, and the output directory gets:

- ``corpus.yaml``: the candidates with ``mixer: {name: weighted, weights: ...}`` (sources with
  weight 0 dropped), loadable by ``jobs/build_corpus.py --config`` and by an experiment arm's
  ``corpus_from``: the format any proposer writes (a proxy-model search writes the same file);
- ``proposal.json``: how it was made (``method``, the rule, the target, the scores it read, the
  weights); ``scores.json`` / ``scores_by_task.json`` in score_sources' layout; ``manifest.json``.

The written ``corpus.yaml`` is loaded back as a ``CorpusBuildConfig`` before the output appears, so
a proposal that would not run is never written. Scoring is reused from an earlier output in the
same directory when its candidates, targets and settings are unchanged (``candidates_key``).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shlex
from pathlib import Path

import yaml

from orchestrator.core.config import check_set, field, load_config, to_dict
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import (
    atomic_dir,
    atomic_write_json,
    atomic_write_text,
    check_replaceable,
    write_manifest,
)
from orchestrator.core.registry import suggest
from orchestrator.corpus.sources import source_files
from orchestrator.corpus.stage import CorpusConfig, input_stats, source_sizes
from orchestrator.report.sources import read_source_scores
from orchestrator.selection.proposal import WeightingConfig, propose_weights
from orchestrator.selection.settings import ScoringSettings, scoring_key
from orchestrator.track.caller import mlflow_state_kept
from orchestrator.workflows.build_corpus import CorpusBuildConfig
from orchestrator.workflows.config import sample_corpus

log = logging.getLogger("proposal")

STAGE = "proposal"
CORPUS_FILE, PROPOSAL_FILE = "corpus.yaml", "proposal.json"
POOLED_TARGET = "all targets pooled"


@dataclasses.dataclass(frozen=True)
class ProposalConfig(ScoringSettings):
    out_dir: str = field("runs/proposal", help="output directory: corpus.yaml (the proposal), proposal.json, "
                                               "scores.json, manifest.json")
    corpus: CorpusConfig = field(default_factory=sample_corpus,
                                 help="the candidate sources (as jobs/build_corpus.py takes them); the proposal is "
                                      "this corpus with mixer weighted and the proposed weights (the mixer's "
                                      "shard_bytes, dupe_factor and total_bytes are kept, its name replaced)")
    targets: list[str] = field(default_factory=list,
                               help="target task text: PATH or TASK=PATH (files of one task scored together), as "
                                    "jobs/score_sources.py takes them")
    target_task: str = field("", help="weight by the scores against this target task only; empty = all target "
                                      "text pooled")
    weighting: WeightingConfig = field(default_factory=WeightingConfig,
                                       help="the rule from scores to weights (orchestrator.selection.proposal)")
    scores: str = field("", help="reuse a jobs/score_sources.py output directory (source names = the candidates' "
                                 "names) instead of scoring here; targets are then not read")

    def __post_init__(self) -> None:
        super().__post_init__()
        check_set(out_dir=self.out_dir)
        if not self.scores and not self.targets:
            raise ConfigError("no targets: give --target FILE... (or targets=[...]), or scores= a score_sources "
                              "output directory")


@dataclasses.dataclass(frozen=True)
class ProposalResult:
    out_dir: Path
    weights: dict[str, float]
    scores: dict[str, dict[str, float]]  # the measures the rule read, per candidate
    rule: str

    @property
    def corpus_file(self) -> Path:
        return self.out_dir / CORPUS_FILE

    def summary(self) -> str:
        width = max(6, *(len(n) for n in self.weights))
        lines = [f"proposal ({self.rule}):", f"  {'source':<{width}}  {'weight':>7}  {'PPL':>9}  {'JSD':>6}  "
                                              f"{'TVC':>6}  {'TTR':>6}"]
        for name, w in sorted(self.weights.items(), key=lambda kv: -kv[1]):
            s = self.scores[name]
            lines.append(f"  {name:<{width}}  {w:>7.3f}  {s['ppl']:>9.1f}  {s['jsd']:>6.3f}  {s['tvc']:>6.3f}  "
                         f"{s['ttr']:>6.3f}")
        return "\n".join(lines + next_steps(self.out_dir))


def build_dir(out_dir: str | Path) -> Path:
    """Where the printed build command puts a proposal's corpus: a run directory of its own beside the proposal
    (``runs/proposal_biomed`` -> ``runs/proposal_biomed_corpus``). Without ``out_dir=``, jobs/build_corpus.py's
    tiny preset builds into runs/corpus_tiny and replaces the corpus a pretraining there was trained on."""
    out = Path(out_dir)
    return out.parent / f"{out.name}_corpus"


def next_steps(out_dir: Path) -> list[str]:
    """The summary's last lines, a proposer's (this job's and jobs/proxy_search.py's): the corpus config, the
    command that builds it into a fresh run directory, and how an experiment arm takes it."""
    corpus_file, build = shlex.quote(str(out_dir / CORPUS_FILE)), shlex.quote(str(build_dir(out_dir)))
    return [f"corpus config: {out_dir / CORPUS_FILE}",
            f"  build it:  python jobs/build_corpus.py --config {corpus_file} out_dir={build}",
            f"  as an experiment arm:  arms.<name>.corpus_from={corpus_file}"]


# ---------------------------------------------------------------------------------------------
def candidate_files(corpus: CorpusConfig) -> dict[str, list[tuple[str, str, str]]]:
    """Each candidate's files as scoring inputs (path, reader format, text field), in config order."""
    return {s.name: [(str(p), s.format, s.text_field) for p in source_files(s)] for s in corpus.sources}


def candidates_key(cfg: ProposalConfig) -> str:
    """What the scores depend on (``scoring_key``): the candidates' files and formats, the targets, the settings."""
    from orchestrator.selection.measures import target_tasks  # heavy: numpy

    targets = {task: [(p, "auto", "text") for p in paths] for task, paths in target_tasks(cfg.targets).items()}
    return scoring_key(cfg, candidate_files(cfg.corpus), targets)


def _selection_config(cfg: ProposalConfig, work_dir: str = ""):
    from orchestrator.selection.scoring import SelectionConfig  # heavy: numpy

    return SelectionConfig(**cfg.scoring(), targets=list(cfg.targets), work_dir=work_dir, parallel=False)


def score_candidates(cfg: ProposalConfig, work_dir: Path) -> dict[str, dict]:
    """Score every candidate against the targets: ``{name: {"measures", "by_task"}}``."""
    from orchestrator.selection.scoring import load_targets, score_source  # heavy: numpy, KenLM

    scfg = _selection_config(cfg, str(work_dir))
    targets = load_targets(scfg)
    out = {}
    for i, (name, files) in enumerate(candidate_files(cfg.corpus).items(), 1):
        log.info("scoring candidate %d/%d: %s against %d target task(s)", i, len(cfg.corpus.sources), name,
                 len(targets))
        score = score_source(name, [(Path(f), fmt, tf) for f, fmt, tf in files], targets, scfg)
        out[name] = {"measures": score.measures(), "by_task": score.by_task}
    return out


def check_target_task(cfg: ProposalConfig) -> None:
    """``target_task`` names one of the tasks the targets' files make (their folders' names)."""
    from orchestrator.selection.measures import target_tasks  # heavy: numpy

    tasks = sorted(target_tasks(cfg.targets))
    if cfg.target_task and cfg.target_task not in tasks:
        raise ConfigError(f"target_task {cfg.target_task!r} is not a task of the targets"
                          f"{suggest(cfg.target_task, tasks)}")


def read_scores(cfg: ProposalConfig) -> dict[str, dict]:
    """The scores of ``cfg.scores`` (a score_sources output), checked to cover every candidate."""
    scores = read_source_scores(cfg.scores)
    missing = [s.name for s in cfg.corpus.sources if s.name not in scores]
    if missing:
        raise InputError(cfg.scores, f"has no scores for candidate {missing[0]!r}",
                         expected=f"scores of every candidate source ({', '.join(s.name for s in cfg.corpus.sources)})")
    return {s.name: scores[s.name] for s in cfg.corpus.sources}


def measures_for(scores: dict[str, dict], target_task: str, where: str) -> dict[str, dict[str, float]]:
    """The measures the rule reads: against all targets pooled, or against one task."""
    if not target_task:
        return {name: s["measures"] for name, s in scores.items()}
    tasks = sorted({t for s in scores.values() for t in s.get("by_task", {})})
    if target_task not in tasks:
        raise ConfigError(f"target_task {target_task!r}: {where} has scores for tasks {tasks}")
    return {name: s["by_task"][target_task] for name, s in scores.items()}


def proposal_corpus(corpus: CorpusConfig, weights: dict[str, float]) -> dict:
    """The ``corpus:`` section of the proposal: the candidates with weight > 0 and the weighted mixer
    (the candidates' shard size, dupe factor and seed kept). A proposal feeds as much text as the
    candidates' own mix would: with ``total_bytes`` 0 (the sources' size x dupe factor) and a candidate
    left out, the total is written out as all the candidates' size x dupe factor (file sizes, as the
    dry run states them), so leaving a source out moves its share to the others instead of shrinking
    the pretraining text (top_k 1 of 2 fed a quarter of softmax's bytes)."""
    kept = [to_dict(s) for s in corpus.sources if weights.get(s.name, 0.0) > 0]
    total = corpus.mixer.total_bytes
    if not total and len(kept) < len(corpus.sources):
        total = sum(source_sizes(corpus).values()) * corpus.mixer.dupe_factor
    mixer = {"name": "weighted", "weights": {s["name"]: round(weights[s["name"]], 6) for s in kept},
             "shard_bytes": corpus.mixer.shard_bytes, "dupe_factor": corpus.mixer.dupe_factor,
             "total_bytes": total}
    return {"sources": kept, "mixer": mixer, "seed": corpus.seed}


def write_proposal(out_dir: Path, corpus: dict, record: dict, header: str) -> Path:
    """``corpus.yaml`` (``{"corpus": corpus}`` under a comment ``header``) and ``proposal.json``
    (``record``) into ``out_dir``; the YAML must load as a ``CorpusBuildConfig`` (ConfigError
    otherwise). The one writer of the format, for every proposer."""
    text = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    text += yaml.safe_dump({"corpus": corpus}, sort_keys=False, allow_unicode=True)
    atomic_write_text(out_dir / CORPUS_FILE, text)
    load_config(CorpusBuildConfig, out_dir / CORPUS_FILE)  # what build_corpus and an arm's corpus_from read
    return atomic_write_json(out_dir / PROPOSAL_FILE, {**record, "corpus": CORPUS_FILE})


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: ProposalConfig) -> ProposalResult:
    """Score (or read) the candidates, weight them, write the proposal into ``cfg.out_dir``."""
    input_stats(cfg.corpus)  # every candidate file exists and is not empty, before any work
    out_dir = Path(cfg.out_dir)
    check_replaceable(out_dir, STAGE)  # a folder the project did not write: refused before any scoring
    if cfg.scores:
        scores, key, where = read_scores(cfg), "", cfg.scores
    else:
        from orchestrator.selection.measures import kenlm_binary  # heavy: numpy

        kenlm_binary("lmplz"), kenlm_binary("build_binary")
        check_target_task(cfg)  # before scoring every candidate, not after
        key, where = candidates_key(cfg), "the scoring"
        scores = _reusable_scores(out_dir, key)
    with atomic_dir(out_dir, STAGE) as tmp:
        if scores is None:
            scores = score_candidates(cfg, tmp)
        else:
            log.info("scores reused (%s)", cfg.scores or f"{out_dir}: same candidates, targets and settings")
        scores = {s.name: scores[s.name] for s in cfg.corpus.sources}  # the candidates' order
        used = measures_for(scores, cfg.target_task, where)
        weights = propose_weights(used, cfg.weighting)
        w = cfg.weighting
        rule = {"softmax": f"softmax of {w.measure} closeness, temperature {w.temperature:g}",
                "top_k": f"top {w.k} by {w.measure}", "uniform": "uniform"}.get(w.name, w.name)
        target = cfg.target_task or POOLED_TARGET
        header = (f"Proposed by jobs/propose_mix.py ({rule}; target: {target}).\n"
                  "Weights: " + ", ".join(f"{n} {v:.3f}" for n, v in weights.items()) + ".\n"
                  f"Scores and how they were made: {PROPOSAL_FILE} beside this file.")
        record = {"method": "scores", "rule": to_dict(cfg.weighting), "rule_text": rule, "target_task": target,
                  "targets": list(cfg.targets), "scores_from": cfg.scores or "scored here",
                  "measures": used, "weights": weights}
        write_proposal(tmp, proposal_corpus(cfg.corpus, weights), record, header)
        atomic_write_json(tmp / "scores.json", {n: s["measures"] for n, s in scores.items()})
        tasks = sorted({t for s in scores.values() for t in s.get("by_task", {})})
        atomic_write_json(tmp / "scores_by_task.json",
                          {t: {n: s["by_task"][t] for n, s in scores.items() if t in s.get("by_task", {})}
                           for t in tasks})
        write_manifest(tmp, stage=STAGE, config=cfg,
                       inputs=[f for fs in candidate_files(cfg.corpus).values() for f, _, _ in fs],
                       counts={"candidates": len(scores), "kept": sum(1 for v in weights.values() if v > 0)},
                       seed=cfg.seed, extra={"scoring_key": key})
    return ProposalResult(out_dir=out_dir, weights=weights, scores=used, rule=rule)


def _reusable_scores(out_dir: Path, key: str) -> dict[str, dict] | None:
    """An earlier proposal's scores in ``out_dir`` when they were made from the same inputs and settings."""
    try:
        manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
        if manifest.get("stage") != STAGE or manifest.get("scoring_key") != key:
            return None
        return read_source_scores(out_dir)
    except (OSError, ValueError, InputError):
        return None


def plan(cfg: ProposalConfig) -> str:
    """Dry run: the candidates and targets exist and parse, the scores to reuse cover the candidates
    (and then the weights, which cost nothing), KenLM is there, the run may write ``out_dir``; nothing is
    written."""
    from orchestrator.corpus.stage import plan_corpus  # heavy: the corpus stage's reader (a full pass)

    check_replaceable(cfg.out_dir, STAGE)
    lines = ["candidates (the proposal replaces their mixer by the weighted one):", plan_corpus(cfg.corpus)]
    if cfg.scores:
        scores = read_scores(cfg)
        weights = propose_weights(measures_for(scores, cfg.target_task, cfg.scores), cfg.weighting)
        lines.append(f"scores: read from {cfg.scores}; weights: "
                     + ", ".join(f"{n} {w:.3f}" for n, w in weights.items()))
    else:
        from orchestrator.selection.measures import kenlm_binary  # heavy: numpy
        from orchestrator.selection.scoring import load_targets  # heavy: numpy

        check_target_task(cfg)
        for task, t in load_targets(_selection_config(cfg)).items():
            lines.append(f"target task {task}: {t.tokens} tokens, {len(t.lines)} units")
        lines.append(f"scoring: {len(cfg.corpus.sources)} candidate(s) x {cfg.num_samples} sub-samples x "
                     f"{cfg.sample_tokens} tokens; lmplz {kenlm_binary('lmplz')}")
    w = cfg.weighting
    lines.append(f"rule: {w.name} on {w.measure} (temperature {w.temperature:g}, k {w.k}, min_weight "
                 f"{w.min_weight:g}); target: {cfg.target_task or POOLED_TARGET}")
    lines.append(f"writes {Path(cfg.out_dir) / CORPUS_FILE} (loads with jobs/build_corpus.py --config) and "
                 f"{PROPOSAL_FILE}")
    return "\n".join(lines)


__all__ = ["ProposalConfig", "ProposalResult", "run", "plan", "write_proposal", "proposal_corpus", "candidate_files",
           "candidates_key", "next_steps", "build_dir", "CORPUS_FILE", "PROPOSAL_FILE"]
