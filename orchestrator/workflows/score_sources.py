"""``jobs/score_sources.py``: rank pretraining sources by closeness to target task text (seed 004).

    result = run(SelectionConfig(targets=["hoc/train.tsv"], sources={"pubmed": "pubmed.txt", "wiki": "wiki/"}))

The measures (KenLM perplexity, JSD, TVC, TTR) and ``score_source``, which scores one source, are
``orchestrator.selection.scoring``'s (an experiment scores its arms with them too). The job checks
every input first, fans the sources out as Ray tasks (the largest first), and writes the whole
output atomically: ``scores.json``, ``scores_by_task.json``, ``samples.json``, ``table.txt``, the
correlations with the downstream gains when given, and ``manifest.json``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.core.console import due, progress, updating
from orchestrator.core.cost import duration
from orchestrator.core.errors import ConfigError, InputError, OrchestratorError
from orchestrator.core.manifest import (
    atomic_dir,
    atomic_write_json,
    atomic_write_text,
    check_replaceable,
    write_manifest,
)
from orchestrator.core.runtime import ray_session
from orchestrator.selection.measures import (
    TargetProfile,
    correlations,
    input_files,
    kenlm_binary,
    ranked_table,
    read_units,
    target_tasks,
    task_correlations,
    tokenize,
)
from orchestrator.selection.scoring import SelectionConfig, SourceScore, load_targets, score_source, scoring_steps
from orchestrator.track.caller import mlflow_state_kept

log = logging.getLogger(__name__)

STAGE = "selection"


@dataclass(frozen=True)
class SelectionResult:
    out_dir: Path
    scores: dict[str, dict[str, float]]
    by_task: dict[str, dict[str, dict[str, float]]]
    table: str
    correlations: dict | None
    task_correlations: dict | None

    def summary(self) -> str:
        text = self.table + f"\nscores: {self.out_dir / 'scores.json'}"
        if self.correlations:
            text += "\nPearson r with the downstream gain: " + ", ".join(
                f"{m}={c['r']:+.3f}" if c["r"] is not None else f"{m}=n/a ({c['why']})"
                for m, c in self.correlations.items())
        if self.task_correlations:
            text += "\nPearson r over (source, task) points: " + ", ".join(
                f"{m}={c['r']:+.3f}" if c["r"] is not None else f"{m}=n/a ({c['why']})"
                for m, c in self.task_correlations.items())
        return text


def plan(cfg: SelectionConfig) -> str:
    """Dry run: the run may write ``out_dir``, every input exists and parses in full, sizes against
    sample_tokens, KenLM is installed."""
    if not cfg.sources:
        raise ConfigError("no sources: give --source NAME=PATH ... or sources={name: path}")
    check_replaceable(cfg.out_dir, STAGE)
    lines = [f"target task {task}: {t.tokens} tokens, {len(t.lines)} units, {len(t.content_vocab)} content-word "
             f"types, {t.ngram_total} n-grams" for task, t in load_targets(cfg).items()]
    for name, path in sorted(cfg.sources.items()):
        files = input_files(path)
        tokens = sum(len(tokenize(u)) for f in files for u in read_units(f, cfg.input_format, cfg.text_field))
        note = ""
        if tokens == 0:  # what scoring stops on (score_source), with the same words
            raise InputError(path, "holds no text", expected="at least one token")
        if tokens < cfg.sample_tokens:
            if cfg.short_source == "error":  # what scoring would stop on, after the sources before it
                raise InputError(", ".join(str(f) for f in files), f"source {name!r} has {tokens} tokens, fewer "
                                 f"than sample_tokens={cfg.sample_tokens}",
                                 expected="a larger source, a smaller sample_tokens, or short_source=whole")
            note = " -- fewer than sample_tokens: scored whole"
        lines.append(f"source {name}: {len(files)} file(s), {tokens} tokens{note}")
    lines.append(f"per source: {cfg.num_samples} sub-samples x {cfg.sample_tokens} tokens; "
                 f"lmplz={kenlm_binary('lmplz')}, build_binary={kenlm_binary('build_binary')}")
    return "\n".join(lines)


@mlflow_state_kept()  # a library call leaves the caller's MLflow session as it was
def run(cfg: SelectionConfig) -> SelectionResult:
    """Score every source against the targets; write scores.json, samples.json, table.txt, manifest."""
    if not cfg.sources:
        raise ConfigError("no sources: give --source NAME=PATH ... or sources={name: path}")
    out_dir = Path(cfg.out_dir)
    check_replaceable(out_dir, STAGE)  # a folder the project did not write: refused before any scoring
    for tool in ("lmplz", "build_binary"):  # fail before any work, not after the first source
        kenlm_binary(tool)
    for path in cfg.sources.values():  # cheap checks first: a missing or 0-byte file stops before any scoring
        for f in input_files(path):
            if f.stat().st_size == 0:
                raise InputError(f, "is empty (0 bytes)", expected="text to score")
    targets = load_targets(cfg)
    for task, t in targets.items():
        log.info("target task %s: %d tokens, %d content-word types", task, t.tokens, len(t.content_vocab))
    if cfg.parallel and len(cfg.sources) > 1:
        results = _score_on_ray(targets, cfg)
    else:
        results = [score_source(n, p, targets, cfg) for n, p in sorted(cfg.sources.items())]
    scores = {r.name: r.measures() for r in results}
    by_task = {task: {r.name: r.by_task[task] for r in results} for task in targets}
    table = ranked_table(scores)
    corr = correlations(scores, cfg.gains) if cfg.gains else None
    task_corr = task_correlations(by_task, cfg.task_gains) if cfg.task_gains else None
    with atomic_dir(out_dir, STAGE) as tmp:
        atomic_write_json(tmp / "scores.json", scores)
        atomic_write_json(tmp / "scores_by_task.json", by_task)
        atomic_write_json(tmp / "samples.json", {
            r.name: {"samples": list(r.samples), "source_tokens": r.tokens, "sample_tokens": r.sample_tokens,
                     "whole_source": r.whole} for r in results})
        atomic_write_text(tmp / "table.txt", table + "\n")
        if corr is not None:
            atomic_write_json(tmp / "correlations.json", corr)
        if task_corr is not None:
            atomic_write_json(tmp / "correlations_by_task.json", task_corr)
        write_manifest(tmp, stage=STAGE, config=cfg,
                       inputs=[p for paths in target_tasks(cfg.targets).values() for p in paths]
                       + list(cfg.sources.values()),
                       counts={"sources": len(results), "target_tasks": len(targets),
                               "target_tokens": sum(t.tokens for t in targets.values())},
                       seed=cfg.seed,
                       extra={"jsd_base": 2, "tvc_content_words": "proxy: alphabetic non-function words",
                              "short_sources": sorted(r.name for r in results if r.whole)})
    return SelectionResult(out_dir=out_dir, scores=scores, by_task=by_task, table=table, correlations=corr,
                           task_correlations=task_corr)


@dataclass(frozen=True)
class _Failed:
    message: str


def _score_source_task(name: str, path: str, targets: Mapping[str, TargetProfile],
                       cfg: SelectionConfig) -> Iterator[tuple[int, int] | SourceScore | _Failed]:
    """Ray task body, a generator: (sub-samples measured, sub-samples) as ``scoring_steps`` goes, then the score.
    A user-facing error comes back as its message: InputError's constructor signature keeps Ray from rebuilding
    it on the driver (it would arrive as an opaque UnserializableException instead of naming the bad file)."""
    try:
        score = yield from scoring_steps(name, path, targets, cfg)
    except OrchestratorError as exc:
        score = _Failed(str(exc))
    yield score


def largest_first(sources: Mapping[str, str]) -> list[str]:
    """Source names by their input bytes, largest first (ties by name): the order the Ray path submits
    them in. With more sources than CPUs, a large source submitted last would start only when a CPU
    frees and finish long after the others (3 sources on 2 CPUs, WikiText last: 1.4x sequential
    instead of 1.9x)."""
    size = {n: sum(f.stat().st_size for f in input_files(p)) for n, p in sources.items()}
    return sorted(sources, key=lambda n: (-size[n], n))


def _score_on_ray(targets: dict[str, TargetProfile], cfg: SelectionConfig) -> list[SourceScore]:
    """One Ray task per source (each runs its own lmplz), the largest submitted first; the first failure
    is raised with its message. Results come back in name order. The driver's progress line counts the
    sub-samples measured as the tasks yield them (``_ScoringProgress``)."""
    import ray  # heavy: ray

    with ray_session(num_cpus=cfg.num_cpus or None):
        task = ray.remote(num_cpus=1)(_score_source_task)
        ref = ray.put(targets)
        running = {task.remote(n, cfg.sources[n], ref, cfg): n for n in largest_first(cfg.sources)}
        said = _ScoringProgress(list(running.values()), cfg.num_samples)
        scored = {}
        while running:
            ready, _ = ray.wait(list(running), num_returns=1, timeout=said.wait_s())
            for steps in ready:
                try:
                    step = ray.get(next(steps))
                except StopIteration:
                    del running[steps]
                    continue
                if isinstance(step, tuple):
                    said.measured(running[steps], *step)
                else:
                    scored[running[steps]] = step
            said.beat()
    results = [scored[n] for n in sorted(cfg.sources)]
    for result in results:
        if isinstance(result, _Failed):
            raise OrchestratorError(result.message)
    return results


class _ScoringProgress:
    """The parallel scoring's progress line: sub-samples measured of all the sources' (sources x num_samples),
    the source of the last one, elapsed, and the time left. A source's first step (tokenizing it, then writing its
    sub-samples) takes a time the driver cannot foresee, so the line names the sources without a measured sub-sample
    and gives no time left until every source has one; then the time left is the longest of the sources' (they
    run at once), each at its own pace so far (its sub-samples are of one size). A line when one is due
    (``console.due``; at every sub-sample on a terminal), at the last one, and at least every ``HEARTBEAT_S``
    seconds while none comes."""

    #: Seconds without a line after which one says the scoring goes on
    HEARTBEAT_S = 30.0

    def __init__(self, names: list[str], samples: int):
        self.total, self.last_done = len(names) * samples, 0
        self.steps: dict[str, list] = {n: [] for n in names}  # per source: (done, samples, when) as they came
        self.started = self.last = time.monotonic()

    def wait_s(self) -> float:
        """How long the driver may wait for a sub-sample before the next heartbeat is due."""
        return max(0.0, self.last + self.HEARTBEAT_S - time.monotonic())

    def measured(self, name: str, done: int, samples: int) -> None:
        """Source ``name`` has ``done`` of its ``samples`` sub-samples measured."""
        now = time.monotonic()
        self.steps[name].append((done, samples, now))
        count = self._count()
        if not done or (count < self.total and not updating()
                        and not due(now - self.last, count - self.last_done, self.total)):
            return
        self._say(now, detail=f" ({name} {done}/{samples})")

    def beat(self) -> None:
        now = time.monotonic()
        if now - self.last >= self.HEARTBEAT_S:
            self._say(now)

    def _count(self) -> int:
        return sum(steps[-1][0] for steps in self.steps.values() if steps)

    def _left(self, now: float) -> float | None:
        """Seconds left, the longest of the unfinished sources' at their pace; None before each has one."""
        left = 0.0
        for steps in self.steps.values():
            if not steps or steps[-1][0] < steps[-1][1]:
                if len(steps) < 2:
                    return None
                (_, _, first), (done, samples, last) = steps[0], steps[-1]
                left = max(left, (last - first) / done * (samples - done) - (now - last))
        return max(left, 0.0)

    def _say(self, now: float, detail: str = "") -> None:
        count = self._count()
        self.last, self.last_done = now, count
        text = f"score_sources: {count}/{self.total} sub-samples measured{detail}, {duration(now - self.started)}"
        left = self._left(now)
        if count < self.total and left is not None:
            text += f" elapsed, about {duration(left)} left"
        elif count < self.total:  # a source still tokenized or sampled, or waiting for a CPU
            text += " elapsed, no sub-sample yet from " + ", ".join(n for n, steps in self.steps.items()
                                                                     if len(steps) < 2)
        else:
            text += " elapsed"
        progress(text)
