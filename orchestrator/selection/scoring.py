"""Scoring pretraining sources against target task text (seed 004, Dai et al. 2020): the stage.

``score_source`` draws a source's sub-samples and measures each with the functions of
``orchestrator.selection.measures`` (PPL, JSD, TVC, TTR: see there); the job
(``orchestrator.workflows.score_sources``) scores every source of a ``SelectionConfig`` (as parallel
Ray tasks) and writes ``scores.json``, ``scores_by_task.json``, ``samples.json``, ``table.txt`` and
a manifest. The settings every way of scoring shares are
``orchestrator.selection.settings.ScoringSettings``.
"""
from __future__ import annotations

import contextlib
import logging
import re
import time
import zlib
from collections import Counter
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import scratch_dir
from orchestrator.selection.measures import (
    MEASURES,
    TargetProfile,
    build_kenlm,
    input_files,
    jensen_shannon,
    merge_profiles,
    ngrams,
    perplexity,
    plan_samples,
    profile_target,
    read_units,
    target_tasks,
    tokenize,
    type_token_ratio,
    vocabulary_covered,
)
from orchestrator.selection.settings import ScoringSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SelectionConfig(ScoringSettings):
    """jobs/score_sources.py: the scoring settings (``ScoringSettings``, 10M tokens per sub-sample as in the
    seed) and what to score against what."""
    targets: list[str] = field(
        default_factory=list, help="target task files (text, JSONL, parquet, IOB, BLUE TSV), each PATH or TASK=PATH; "
                                   "files of one task are scored together (default task name: the folder for "
                                   "train/dev/devel/test files, else the file stem)")
    sources: dict[str, str] = field(default_factory=dict, help="source name -> file or directory of files")
    out_dir: str = field("runs/selection", help="output directory: scores.json, table.txt, manifest.json")
    sample_tokens: int = field(10_000_000, help="tokens per sub-sample of each source (10M in the seed)")
    input_format: Literal["auto", "text", "wikitext", "jsonl", "parquet", "iob", "conll", "blue_ner", "blue_tsv",
                          "blue"] = field(
        "auto", help="reader for every input (orchestrator.formats; blue = blue_tsv); auto: by suffix, and a .tsv "
                     "by its first row (IOB / BLUE NER rows end in a tag, a BLUE header names a sentence column)")
    text_field: str = field("text", help="JSONL key / parquet column holding the text")
    gains: dict[str, list[float]] = field(
        default_factory=dict, help="downstream gain per source (one value per task x seed); if given, the "
                                   "Pearson correlation of each measure with the gain is reported (seed Fig. 3)")
    task_gains: dict[str, dict[str, list[float]]] = field(
        default_factory=dict, help="downstream gain per target task and source ({task: {source: [gains]}}): "
                                   "Pearson r over (source, task) points with per-task measures, as the seed's "
                                   "Figure 3 does")
    work_dir: str = field("", help="where the tokenized source copy and samples go while scoring "
                                   "(as large as the source); empty = the system temp directory")
    parallel: bool = field(True, help="score sources as parallel Ray tasks (false: one after another in-process)")
    num_cpus: int = field(0, help="CPUs for the embedded local Ray (0 = all)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_cpus < 0:
            raise ConfigError(f"num_cpus must be >= 0 (0 = all), got {self.num_cpus}")
        for name, path in self.sources.items():  # Path("") is the working directory: all of it would be scored
            if not str(path).strip():
                raise ConfigError(f"sources.{name} is empty: give the source's file or directory")
        if any(not str(t).strip() for t in self.targets):
            raise ConfigError("targets: an entry is empty: give a file, or TASK=PATH")
        unknown = sorted(set(self.gains).union(*self.task_gains.values()) - set(self.sources))
        if unknown:
            raise ConfigError(f"gains given for unknown source {unknown[0]!r}; sources: {sorted(self.sources)}")
        tasks = set(target_tasks(self.targets))
        missing = sorted(set(self.task_gains) - tasks)
        if missing:
            raise ConfigError(f"task_gains given for unknown task {missing[0]!r}; tasks: {sorted(tasks)}")


# ----------------------------------------------------------------------------- one source
@dataclass(frozen=True)
class SourceScore:
    name: str
    ppl: float
    jsd: float
    tvc: float
    ttr: float
    samples: tuple[dict, ...]       # per sub-sample measures
    tokens: int                     # tokens in the whole source
    sample_tokens: int              # tokens per sub-sample actually used
    whole: bool                     # True when the source was shorter than sample_tokens
    by_task: dict[str, dict[str, float]]  # per target task: mean measures (TTR is the source's own)

    def measures(self) -> dict[str, float]:
        return {m: getattr(self, m) for m in MEASURES}


#: One input file of a source: (path, reader format, JSONL key / parquet column).
InputFile = tuple[Path, str, str]


def _tokenize_source(files: Sequence[InputFile], out: Path) -> np.ndarray:
    """Write the tokenized source, one unit per line; return tokens per unit."""
    counts = []
    with open(out, "w", encoding="utf-8") as f:
        for path, fmt, text_field in files:
            for unit in read_units(path, fmt, text_field):
                toks = tokenize(unit)
                if toks:
                    f.write(" ".join(toks) + "\n")
                    counts.append(len(toks))
    return np.asarray(counts, dtype=np.int64)


def score_source(name: str, path: str | Path | Sequence[InputFile], targets: Mapping[str, TargetProfile],
                 cfg: SelectionConfig) -> SourceScore:
    """All four measures for one source, each the mean over ``cfg.num_samples`` sub-samples.

    ``targets`` maps task names to profiles; the pooled target (all tasks) gives the headline
    measures, each task its own (the same sample, n-gram counts and KenLM model serve all).
    ``path`` is a file or a directory read with ``cfg.input_format``, or a list of
    (file, format, text field) for a source whose files differ in format (an experiment arm's corpus).
    """
    steps = scoring_steps(name, path, targets, cfg)
    while True:
        try:
            next(steps)
        except StopIteration as end:
            return end.value


def scoring_steps(name: str, path: str | Path | Sequence[InputFile], targets: Mapping[str, TargetProfile],
                  cfg: SelectionConfig) -> Generator[tuple[int, int], None, SourceScore]:
    """``score_source`` step by step: yields (sub-samples measured, sub-samples) once the source is tokenized and
    sampled, then after each sub-sample, and returns the score. A Ray task yields them to the driver, whose
    progress line counts them (``orchestrator.workflows.score_sources``): its workers' log lines stay in the log."""
    if isinstance(path, (str, Path)):
        files = [(f, cfg.input_format, cfg.text_field) for f in input_files(path)]
    else:
        files = [(Path(f), fmt, text_field) for f, fmt, text_field in path]
        path = ", ".join(str(f) for f, _, _ in files)
    pooled = merge_profiles(targets.values()) if len(targets) > 1 else next(iter(targets.values()))
    # removed at the end; one a killed Ray worker left is removed by the next scoring of this source
    with scratch_dir("score-" + re.sub(r"[^A-Za-z0-9._-]", "_", name), cfg.work_dir) as work:
        unit_tokens = _tokenize_source(files, work / "tokens.txt")
        total = int(unit_tokens.sum())
        if total == 0:
            raise InputError(path, "holds no text", expected="at least one token")
        whole = total < cfg.sample_tokens
        if whole and cfg.short_source == "error":
            raise InputError(path, f"source {name!r} has {total} tokens, fewer than sample_tokens="
                                   f"{cfg.sample_tokens}",
                             expected="a larger source, a smaller sample_tokens, or short_source=whole")
        if whole:
            log.warning("%s: %d tokens < sample_tokens=%d: every sub-sample is the whole source",
                        name, total, cfg.sample_tokens)
        size = min(total, cfg.sample_tokens)
        rng = np.random.default_rng([cfg.seed, zlib.crc32(name.encode())])
        plans = plan_samples(unit_tokens, size, cfg.num_samples, rng)
        sample_files = [work / f"sample-{i}.txt" for i in range(len(plans))]
        _write_samples(work / "tokens.txt", unit_tokens, plans, sample_files)
        yield 0, len(sample_files)
        samples = []
        for i, sample in enumerate(sample_files):
            start = time.perf_counter()
            samples.append(_measure_sample(sample, pooled, targets, cfg, work / f"lm-{i}"))
            samples[-1]["seconds"] = round(time.perf_counter() - start, 3)
            log.info("%s sample %d/%d: %s", name, i + 1, len(sample_files),
                     {k: samples[-1][k] for k in (*MEASURES, "seconds")})
            yield i + 1, len(sample_files)
    mean = {m: float(np.mean([s[m] for s in samples])) for m in MEASURES}
    by_task = {task: {m: float(np.mean([s["by_task"][task][m] for s in samples])) for m in MEASURES}
               for task in targets}
    return SourceScore(name=name, samples=tuple(samples), tokens=total, sample_tokens=size, whole=whole,
                       by_task=by_task, **mean)


def _write_samples(tokens_file: Path, unit_tokens: np.ndarray, plans: list[dict[int, int]],
                   sample_files: list[Path]) -> None:
    """One streaming pass over the tokenized source, each unit copied (cut if planned) into its samples."""
    with contextlib.ExitStack() as stack:
        handles = [stack.enter_context(open(p, "w", encoding="utf-8")) for p in sample_files]
        source = stack.enter_context(open(tokens_file, encoding="utf-8"))
        for unit, line in enumerate(source):
            for plan, handle in zip(plans, handles):
                take = plan.get(unit)
                if take:
                    handle.write(line if take == unit_tokens[unit] else " ".join(line.split()[:take]) + "\n")


def _measure_sample(sample: Path, pooled: TargetProfile, targets: Mapping[str, TargetProfile],
                    cfg: SelectionConfig, work: Path) -> dict:
    """Pooled measures plus ``by_task``; source n-grams are counted once, on the pooled target's keys."""
    work.mkdir()
    on_target: Counter = Counter()
    types: set[str] = set()
    tokens = ngram_total = 0
    keys = pooled.ngrams
    with open(sample, encoding="utf-8") as f:
        for line in f:
            toks = line.split()
            tokens += len(toks)
            types.update(toks)
            for gram in ngrams(toks, cfg.order):
                ngram_total += 1
                if gram in keys:
                    on_target[gram] += 1
    model = build_kenlm(sample, work, cfg.order, cfg.lmplz_memory)
    ttr = type_token_ratio(len(types), tokens)

    def measures(t: TargetProfile) -> dict[str, float]:
        # each task's keys are a subset of the pooled keys, so the restricted counts serve it too
        return {"ppl": perplexity(model, t.lines),
                "jsd": jensen_shannon(t.ngrams, t.ngram_total, on_target, ngram_total),
                "tvc": vocabulary_covered(t.content_vocab, types), "ttr": ttr}

    by_task = {task: measures(t) for task, t in targets.items()}
    overall = measures(pooled) if len(targets) > 1 else dict(next(iter(by_task.values())))

    return {**overall, "by_task": by_task}


# ----------------------------------------------------------------------------- the targets
def load_targets(cfg: SelectionConfig) -> dict[str, TargetProfile]:
    """{task: profile} of the target files, grouped by task name (see ``target_tasks``)."""
    if not cfg.targets:
        raise ConfigError("no targets: give --target FILE... or targets=[...]")
    profiles = {}
    for task, paths in target_tasks(cfg.targets).items():
        files = [f for p in paths for f in input_files(p)]
        profiles[task] = profile_target(
            (u for f in files for u in read_units(f, cfg.input_format, cfg.text_field)), cfg.order)
        if profiles[task].tokens == 0:
            raise InputError(", ".join(map(str, files)), f"target task {task!r} holds no text",
                             expected="target task text")
    return profiles


__all__ = ["SelectionConfig", "SourceScore", "InputFile", "score_source", "scoring_steps", "load_targets"]
