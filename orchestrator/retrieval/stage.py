"""Encoder evaluation without fine-tuning: cross-lingual retrieval (seed 002, Section 6, Table 6).

    python jobs/retrieval.py --model minilm=<dir> --text en=xquad.en.json --text de=xquad.de.json

Parallel text (``orchestrator.formats.parallel``) is read and aligned; every model embeds every side
of it (``orchestrator.retrieval.embed``: the mean of the last layer over each unit's sub-tokens), one
Ray task per model and language; then for every ordered language pair (src, tgt) each src unit
retrieves its nearest tgt units by cosine, and precision@k is the share whose translation is among
the k nearest (``orchestrator.retrieval.metrics``). Both directions of every pair are reported, in
seed 002's Table 6 layout (``orchestrator.retrieval.table``).

Output (``<run_dir>/retrieval/``, or an experiment's ``stages/retrieval/<key>/``): ``results.json``
(``p_at_<k>``: {model: {"src->tgt": value}}, the sets, directions, settings and per-side embedding
counts), ``table.txt``, ``table.md``, ``table.html`` and ``manifest.json``. The output is keyed by
the settings, the text files' contents and each model's content identity
(``orchestrator.core.reuse.model_identity``): a re-run with the same ones reuses it. Each model gets
an MLflow run (``KIND=retrieval``) with a metric per direction and k
(``orchestrator.track.schema.retrieval_metric``) and the tables as artifacts.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from orchestrator.core.artifacts import check_model
from orchestrator.core.config import flatten
from orchestrator.core.console import CONSOLE_TAG, PROGRESS_TAG
from orchestrator.core.errors import ConfigError, OrchestratorError
from orchestrator.core.manifest import atomic_write_json, atomic_write_text, hash_inputs, write_manifest
from orchestrator.core.reuse import content_key, model_identity, run_stage
from orchestrator.core.runtime import check_fits, ray_session
from orchestrator.formats.parallel import align, detect_format, read_parallel, read_tsv_pairs
from orchestrator.retrieval.config import RetrievalSpec, pair_languages
from orchestrator.retrieval.table import (
    RESULTS,
    direction,
    metric_name,
    render_markdown,
    render_page,
    render_text,
    section_of,
)
from orchestrator.track import TrackingConfig
from orchestrator.track import schema as S

log = logging.getLogger("retrieval")

STAGE = "retrieval"
TABLE_TXT, TABLE_MD, TABLE_HTML = "table.txt", "table.md", "table.html"


# ----------------------------------------------------------------------------- parallel text
@dataclasses.dataclass(frozen=True)
class ParallelSet:
    """Units that translate each other: ``texts[lang][i]`` are translations for every i."""

    name: str  # "texts", or a pairs key such as "de-en"
    unit: str  # what a unit is: paragraph, question, line, pair
    files: dict[str, str]
    texts: dict[str, tuple[str, ...]]
    total: int  # units in the files, before max_units

    @property
    def languages(self) -> list[str]:
        return list(self.texts)

    @property
    def units(self) -> int:
        return len(next(iter(self.texts.values())))

    def describe(self) -> dict:
        """The set as results.json records it; ``repeated``: units per language whose text an earlier unit has."""
        return {"name": self.name, "unit": self.unit, "files": self.files, "languages": self.languages,
                "units": self.units, "units_in_files": self.total,
                "repeated": {lang: len(t) - len(set(t)) for lang, t in self.texts.items()}}


def load_sets(spec: RetrievalSpec) -> list[ParallelSet]:
    """Every parallel set of ``spec``, read and aligned (``InputError`` naming the file on bad or unaligned
    input), each cut to its first ``max_units`` units; a ``top_k`` that is not below a set's units is a
    ``ConfigError`` (``check_top_k``)."""
    sets = []
    if spec.texts:
        formats = {lang: detect_format(p) if spec.text_format == "auto" else spec.text_format
                   for lang, p in spec.texts.items()}
        if len(set(formats.values())) > 1:
            raise ConfigError("texts: the files are in different formats ("
                              + ", ".join(f"{lang}={spec.texts[lang]}: {f}" for lang, f in formats.items())
                              + "); give one format for all, SQuAD JSON or one unit per line")
        fmt = next(iter(formats.values()))
        sides = {lang: (path, read_parallel(path, fmt, spec.squad_unit)) for lang, path in spec.texts.items()}
        aligned = align(sides)
        unit = ("paragraph" if spec.squad_unit == "context" else "question") if fmt == "squad" else "line"
        sets.append(_cut(ParallelSet("texts", unit, dict(spec.texts),
                                     {lang: tuple(u.text for u in units) for lang, units in aligned.items()},
                                     len(next(iter(aligned.values())))), spec.max_units))
    for key, path in spec.pairs.items():
        src, tgt = pair_languages(key)
        left, right = read_tsv_pairs(path)
        sets.append(_cut(ParallelSet(key, "pair", {src: path, tgt: path},
                                     {src: tuple(u.text for u in left), tgt: tuple(u.text for u in right)},
                                     len(left)), spec.max_units))
    for s in sets:
        check_top_k(spec.top_k, s)
    return sets


def check_top_k(top_k: tuple[int, ...], s: ParallelSet) -> None:
    """Each unit of one language retrieves among the set's units of the other: with ``k`` at least that
    many, every translation is among the k nearest and P@k is 100 by construction, so such a k is refused."""
    too_large = [k for k in top_k if k >= s.units]
    if too_large:
        cut = f" (the first {s.units} of {s.total}: max_units)" if s.units < s.total else ""
        raise ConfigError(f"top_k {list(top_k)}: P@{', P@'.join(map(str, too_large))} would be 100 by construction: "
                          f"each direction of set {s.name!r} retrieves among {s.units} {s.unit}s{cut} ("
                          + ", ".join(f"{lang}={f}" for lang, f in s.files.items())
                          + f"); give every k below {s.units}")


def _cut(s: ParallelSet, max_units: int) -> ParallelSet:
    if not max_units or max_units >= s.total:
        return s
    return dataclasses.replace(s, texts={lang: t[:max_units] for lang, t in s.texts.items()})


def directions(sets: list[ParallelSet], pivot: str) -> list[dict]:
    """Every ordered language pair of every set, in Table 6's order: X -> pivot, pivot -> X, then the rest."""
    found = []
    for s in sets:
        for src in s.languages:
            for tgt in s.languages:
                if src != tgt:
                    found.append({"name": direction(src, tgt), "src": src, "tgt": tgt, "set": s.name,
                                  "section": section_of(src, tgt, pivot)})
    order = {"to": 0, "from": 1, "other": 2}
    return sorted(found, key=lambda d: order[d["section"]])  # stable: set and language order kept within a block


def text_files(spec: RetrievalSpec) -> list[str]:
    return list(spec.texts.values()) + list(spec.pairs.values())


# ----------------------------------------------------------------------------- models


def retrieval_key(spec: RetrievalSpec, models: Mapping[str, str | Path]) -> str:
    """What the scores depend on: the settings, the text files' contents, each model's content."""
    return content_key(STAGE, spec.settings(), {name: model_identity(path) for name, path in models.items()},
                       hash_inputs(text_files(spec)))


# ----------------------------------------------------------------------------- embedding on Ray
@dataclasses.dataclass(frozen=True)
class _Failed:
    message: str


def _embed_task(model_dir: str, texts, options: dict, label: str):
    """Ray task body: one side of a set embedded by one model. A user-facing error comes back as its
    message, so that the driver can say which model and file (as in ``orchestrator.workflows.score_sources``)."""
    from orchestrator.retrieval.embed import embed_texts  # heavy: torch, transformers

    _progress_to_driver()
    try:
        return embed_texts(model_dir, texts, label=label, **options)
    except OrchestratorError as exc:
        return _Failed(str(exc))


class _ToDriver(logging.Formatter):
    """A worker's record as a line the driver shows: INFO as its progress line, a warning as a line of its own."""

    def format(self, record: logging.LogRecord) -> str:
        if record.levelno < logging.WARNING:
            return PROGRESS_TAG + record.getMessage()
        return f"{CONSOLE_TAG}{record.levelname.lower()}: {record.getMessage()}"


def _progress_to_driver() -> None:
    """Show the embedding's progress lines (``orchestrator.retrieval.embed``'s INFO) in the job's output: a
    Ray worker's loggers print warnings only, and Ray forwards a worker's stderr to the driver, whose
    terminal shows them as its progress line (``console.PROGRESS_TAG``) while Ray's own lines go to the
    run's log file."""
    logger = logging.getLogger("orchestrator.retrieval")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(_ToDriver())
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def embed_all(spec: RetrievalSpec, models: Mapping[str, str | Path], sets: list[ParallelSet],
              ray_address: str | None = None, num_cpus: int | None = None,
              log_file: Path | None = None) -> tuple[dict, dict]:
    """{(model, set, lang): vectors} and {(model, set, lang): EmbedInfo}: one Ray task per model and side
    (Ray's and the tasks' own lines into ``log_file`` when given, ``runtime.ray_session``)."""
    import ray  # heavy: ray

    options = {"max_seq_length": spec.max_seq_length, "batch_size": spec.batch_size,
               "special_tokens": spec.special_tokens, "long_units": spec.long_units,
               "device": "cuda" if spec.use_gpu else "cpu", "threads": max(1, int(spec.cpus_per_task))}
    with ray_session(address=ray_address, num_cpus=num_cpus, log_file=log_file) as info:
        if info["log_file"]:
            log.info("Ray's and the embedding tasks' own output: %s", info["log_file"])
        check_fits({"CPU": spec.cpus_per_task, "GPU": spec.gpus_per_task if spec.use_gpu else 0.0},
                   "retrieval: cpus_per_task / use_gpu, gpus_per_task")
        task = ray.remote(num_cpus=spec.cpus_per_task, num_gpus=spec.gpus_per_task if spec.use_gpu else 0,
                          max_retries=0)(_embed_task)
        refs = {(s.name, lang): ray.put(list(s.texts[lang])) for s in sets for lang in s.languages}
        pending = {}
        for name, path in models.items():
            for s in sets:
                for lang in s.languages:
                    label = f"{name} / {s.name} / {lang}"
                    pending[task.remote(str(path), refs[(s.name, lang)], options, label)] = (name, s.name, lang)
        log.info("embedding: %d task(s), one per model and language side (%d model(s), %d side(s))", len(pending),
                 len(models), len(refs))
        vectors, infos, waiting = {}, {}, list(pending)
        while waiting:
            done, waiting = ray.wait(waiting, num_returns=1)
            result = ray.get(done[0])
            where = pending[done[0]]
            if isinstance(result, _Failed):
                for ref in waiting:
                    ray.cancel(ref)
                raise OrchestratorError(f"retrieval: embedding {' / '.join(where)} failed: {result.message}")
            vectors[where], infos[where] = result
            log.info("embedded %s: %d units, %d windows, %.1f s [%d/%d]", " / ".join(where), result[1].units,
                     result[1].windows, result[1].seconds, len(vectors), len(pending))
    return vectors, infos


# ----------------------------------------------------------------------------- the evaluation
def evaluate(spec: RetrievalSpec, models: Mapping[str, str | Path], sets: list[ParallelSet], out_dir: Path,
             ray_address: str | None = None, num_cpus: int | None = None, log_file: Path | None = None) -> dict:
    """Embed, retrieve, score; write results.json, the tables and the manifest into ``out_dir``."""
    from orchestrator.retrieval.metrics import precision_at_k, text_groups  # heavy: numpy

    vectors, infos = embed_all(spec, models, sets, ray_address, num_cpus, log_file)
    dirs = directions(sets, spec.pivot)
    # identical target texts are one answer (metrics.gold_ranks): XQuAD repeats a few questions
    groups = {(s.name, lang): text_groups(s.texts[lang]) for s in sets for lang in s.languages}
    scores: dict[str, dict] = {metric_name(k): {m: {} for m in models} for k in spec.top_k}
    for name in models:
        for d in dirs:
            p = precision_at_k(vectors[(name, d["set"], d["src"])], vectors[(name, d["set"], d["tgt"])], spec.top_k,
                               groups[(d["set"], d["tgt"])])
            for k, value in p.items():
                scores[metric_name(k)][name][d["name"]] = value
    results = {
        **scores,
        "ks": list(spec.top_k), "pivot": spec.pivot, "models": list(models), "directions": dirs,
        "sets": [s.describe() for s in sets],
        "settings": spec.settings(),
        "model_dirs": {name: str(path) for name, path in models.items()},
        "embedding": {name: {f"{set_name}/{lang}": dataclasses.asdict(info)
                             for (m, set_name, lang), info in infos.items() if m == name} for name in models},
    }
    write_outputs(results, out_dir)
    write_manifest(out_dir, stage=STAGE, config={"settings": spec.settings(), "models": results["model_dirs"]},
                   inputs=text_files(spec),
                   counts={"models": len(models), "sets": len(sets), "directions": len(dirs),
                           "units": {s.name: s.units for s in sets}},
                   extra={"model_identity": {name: model_identity(path) for name, path in models.items()}})
    return results


def write_outputs(results: dict, out_dir: Path) -> None:
    atomic_write_json(out_dir / RESULTS, results)
    atomic_write_text(out_dir / TABLE_TXT, render_text(results))
    atomic_write_text(out_dir / TABLE_MD, render_markdown(results))
    atomic_write_text(out_dir / TABLE_HTML, render_page(results))


def read_results(out_dir: str | Path) -> dict:
    return json.loads((Path(out_dir) / RESULTS).read_text(encoding="utf-8"))


def scores_only(results: dict) -> dict:
    """``{"p_at_1": {model: {"src->tgt": value}}, ...}``: what the job prints last and MLflow holds."""
    return {metric_name(k): results[metric_name(k)] for k in results["ks"]}


def model_metrics(results: dict, model: str) -> dict[str, float]:
    """One model's scores as its MLflow run's metrics (``schema.retrieval_metric``)."""
    return {S.retrieval_metric(k, d["src"], d["tgt"]): results[metric_name(k)][model][d["name"]]
            for k in results["ks"] for d in results["directions"]}


def retrieval_stage(spec: RetrievalSpec, models: Mapping[str, str | Path], place: Callable[[str], Path],
                    tracking: TrackingConfig | None, run_dir: Path, tags: Mapping[str, Mapping[str, str]] | None = None,
                    ray_address: str | None = None, num_cpus: int | None = None,
                    log_file: Path | None = None) -> tuple[Path, dict]:
    """Evaluate ``models`` on ``spec``'s text into ``place(key)`` (reused when its key is unchanged) and
    log each model's run to MLflow (tags per model from ``tags``); Ray's own lines go to ``log_file``
    when given. Returns (output directory, results)."""
    if not models:
        raise ConfigError("retrieval: no models: give --model NAME=DIR (models.NAME=DIR)")
    if not spec.enabled:
        raise ConfigError("retrieval: no text: give --text LANG=FILE twice or more (texts.LANG=FILE), or "
                          "--pair SRC-TGT=FILE.tsv (pairs.SRC-TGT=FILE)")
    for name, path in models.items():
        check_model(name, path)
    sets = load_sets(spec)  # bad or unaligned text fails here, before Ray starts
    key = retrieval_key(spec, models)
    out = run_stage(STAGE, place(key), key,
                    lambda tmp: evaluate(spec, models, sets, tmp, ray_address, num_cpus, log_file), "retrieval")
    results = read_results(out)
    log_results(tracking, run_dir, spec, results, out, key, tags or {})
    return out, results


def log_results(tracking: TrackingConfig | None, run_dir: Path, spec: RetrievalSpec, results: dict, out: Path,
                key: str, tags: Mapping[str, Mapping[str, str]]) -> dict[str, str | None]:
    """One finished MLflow run per model (``KIND=retrieval``, tagged MODEL and OUTPUT_KEY): its P@k per
    direction, the settings as params, the tables and results.json as artifacts. {model: run id}."""
    from orchestrator.track.runs import log_stage_result  # heavy: mlflow

    runs = {}
    for name in results["models"]:
        params = {**flatten(spec.settings()), "model_dir": results["model_dirs"][name]}
        runs[name] = log_stage_result(tracking, run_dir, stage=S.KIND_RETRIEVAL, params=params,
                                      metrics=model_metrics(results, name),
                                      tags={S.MODEL: name, S.OUTPUT_KEY: key, **tags.get(name, {})},
                                      artifacts=[out / RESULTS, out / TABLE_MD, out / TABLE_HTML])
    return runs


def plan_sets(spec: RetrievalSpec, sets: list[ParallelSet] | None = None) -> list[str]:
    """The dry run's lines for the text: every file parsed and aligned (``sets``: already loaded), what each
    set holds."""
    lines = []
    sets = load_sets(spec) if sets is None else sets
    for s in sets:
        cut = f" (the first {s.units} of {s.total})" if s.units < s.total else ""
        lines.append(f"text {s.name}: {s.units} {s.unit}s{cut} in {len(s.languages)} languages, aligned: "
                     + ", ".join(f"{lang}={f}" for lang, f in s.files.items()))
    dirs = directions(sets, spec.pivot)
    counts = {sec: sum(d["section"] == sec for d in dirs) for sec in ("to", "from", "other")}
    lines.append(f"directions: {len(dirs)} ({counts['to']} to {spec.pivot}, {counts['from']} from {spec.pivot}, "
                 f"{counts['other']} other); P@{', P@'.join(map(str, spec.top_k))}")
    pooling = "sub-tokens only" if spec.special_tokens == "exclude" else "all positions but padding"
    lines.append(f"embedding: mean of the last layer over {pooling}; windows of {spec.max_seq_length}, long units: "
                 f"{spec.long_units}; {'GPU' if spec.use_gpu else 'CPU'}")
    return lines


__all__ = ["ParallelSet", "check_model", "check_top_k", "directions", "evaluate", "load_sets", "log_results",
           "model_metrics", "plan_sets", "read_results", "retrieval_key", "retrieval_stage", "scores_only"]
