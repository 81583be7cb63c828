"""The corpus stage: sources -> sentence-split shards -> the mixer's plan.

    build_corpus(cfg, out_dir)     # out_dir/shards/<source>/shard-NNNNN.parquet, shards.json, plan.json

Each source is read and sentence-split on Ray (one streamed task per file, or per span of a large
text, JSONL, WikiText or parquet file, ``corpus.sources``)
and written into shards of about ``mixer.shard_bytes`` bytes, cut at document boundaries
(columns: ``orchestrator.core.artifacts.SHARD_COLUMNS``), one language per shard (a source whose
documents name their language is cut into shards per language); the mixer then turns the shard list
into units of instance creation (``plan.json``). The driver only streams documents into shard
files and holds per-shard metadata. On a multi-node cluster, source paths and the output must be
on storage every node mounts.
"""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import json
import logging
import math
import random
import threading
import time
from pathlib import Path

from orchestrator.core.artifacts import SHARD_COLUMNS, SMALL_ROLES, ShardInfo, shard_info, write_plan
from orchestrator.core.config import field, public, to_dict
from orchestrator.core.console import due, progress, updating
from orchestrator.core.cost import duration
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import file_digests, write_manifest
from orchestrator.core.reuse import KEY_FIELD, earlier_outputs, reusable, said_once
from orchestrator.corpus.mixing import MIXERS, MixerConfig, planned_bytes, weighted_bytes
from orchestrator.corpus.sources import (
    FILTER_COUNTS,
    READ_BLOCK_BYTES,
    ReadTally,
    SourceConfig,
    find_input_error,
    iter_source,
    no_document,
    read_items,
    read_source,
    source_files,
)
from orchestrator.formats.base import check_head

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    sources: tuple[SourceConfig, ...] = field((), help="corpora to mix (name, paths, format, role, language)")
    mixer: MixerConfig = field(default_factory=MixerConfig, help="mixing strategy and its parameters")
    seed: int = field(12345, help="seed of the mixer's sampling (BERT's default 12345)")
    drop_letterless: bool = field(False, help="drop sentences without a letter of any script (seed 002: 'filter "
                                              "out sentences that do not contain letters')")

    def identity(self) -> dict:
        """The config as the stage's content key sees it: the options added after the first outputs
        (``drop_letterless``, ``mixer.upsample_from_domain`` / ``upsample_sources`` / ``weights`` / ``total_bytes``, the
        sources' ``LATER_FIELDS``) only when set, so an output built before they existed keeps its key."""
        data = to_dict(self)
        _drop_defaults(self, data, ("drop_letterless",))
        _drop_defaults(self.mixer, data["mixer"], ("upsample_from_domain", "upsample_sources", "weights",
                                                       "total_bytes"))
        for src, entry in zip(self.sources, data["sources"]):
            _drop_defaults(src, entry, SourceConfig.LATER_FIELDS)
        return data

    def __post_init__(self) -> None:
        if not self.sources:
            raise ConfigError("corpus.sources is empty: give at least one source")
        names = [s.name for s in self.sources]
        if len(set(names)) != len(names):
            raise ConfigError(f"corpus.sources: duplicate names in {names}")
        roles = {s.role for s in self.sources}
        if self.mixer.name == "simpt" and not (roles & {"small", "domain"} and roles & {"large", "general"}):
            raise ConfigError("mixer simpt needs a source with role small and one with role large")
        if self.mixer.name == "mdapt" and not roles & {"domain", "small"}:
            raise ConfigError("mixer mdapt needs a source with role domain")
        for name in self.mixer.upsample_sources:
            src = next((s for s in self.sources if s.name == name), None)
            if src is None or src.role not in ("domain", "small"):
                raise ConfigError(f"corpus.mixer.upsample_sources: {name!r} is not a source with role domain "
                                  f"(sources: {names})")
            if src.language not in self.mixer.upsample_from_domain:
                raise ConfigError(f"corpus.mixer.upsample_sources: source {name!r} is {src.language} text but "
                                  f"mixer.upsample_from_domain is {list(self.mixer.upsample_from_domain)}")
        unknown = sorted(set(self.mixer.weights) - set(names))
        if unknown:
            raise ConfigError(f"corpus.mixer.weights.{unknown[0]}: no such source (sources: {names})")
        missing = [n for n in names if n not in self.mixer.weights]
        if self.mixer.name == "weighted" and missing:
            raise ConfigError(f"mixer weighted: corpus.mixer.weights has no weight for source {missing[0]!r}; "
                              "give every source a weight (0 leaves it out of the instances)")


def _drop_defaults(cfg, data: dict, names: tuple[str, ...]) -> None:
    """Remove from ``data`` (``to_dict(cfg)``) the fields ``names`` that hold their default."""
    fields = {f.name: f for f in dataclasses.fields(cfg)}
    for name in names:
        f = fields[name]
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        if getattr(cfg, name) == default:
            del data[name]


def input_stats(cfg: CorpusConfig) -> dict[str, tuple[int, int]]:
    """{file: (size, mtime_ns)} of every source file: what the stage's key says about its inputs.
    Fails fast, before Ray starts, on a missing or empty file, and on a text file whose first 64 KB
    are not UTF-8 text (a binary or UTF-16 file: ``check_head``); the rest is checked as it is read."""
    stats = {}
    for src in cfg.sources:
        for path in source_files(src):
            if src.format != "parquet":
                check_head(path)
            stats[str(path)] = (path.stat().st_size, path.stat().st_mtime_ns)
        if src.mesh.descriptors:  # the tree numbers the selection reads
            path = Path(src.mesh.descriptors)
            if not path.is_file():
                raise InputError(path, f"source {src.name!r}: mesh.descriptors does not exist",
                                 expected="NLM's MeSH descriptor file, desc<year>.xml")
            stats[str(path)] = (path.stat().st_size, path.stat().st_mtime_ns)
    return stats


def earlier_corpus_key(cfg: CorpusConfig, key: str, out_dir: Path) -> str:
    """``key`` (from the sources' paths, sizes and modification times, ``input_stats``), or the key of a finished
    corpus output at ``out_dir`` or beside it that this very config built from sources of these very contents, at
    these paths or others. Sources copied, restored, checked out or downloaded again get new modification times,
    and the key alone then built every stage again (the corpus, its vocabulary, instances, pretraining: a day's
    rerun of an experiment, session 54); so did the bundled sample sources of a checkout cloned elsewhere, or data
    copied to another disk (``_paths_at``: the configs differ in their sources' paths alone). The sources are
    hashed (through the per-user hash cache) only when such an output exists and ``key`` has none. A Chinese source
    (its sentence split changed the key once) or MeSH descriptors (not among a manifest's inputs) keep ``key``."""
    out_dir = Path(out_dir)
    if reusable(out_dir, key) or any(s.language == "zh" or s.mesh.descriptors for s in cfg.sources):
        return key
    config = json.loads(json.dumps(public(to_dict(cfg)), default=str))  # as a manifest holds it
    candidates = [(path, manifest, at) for path, manifest in earlier_outputs("corpus", out_dir)
                  if (at := _paths_at(config, manifest.get("config"))) is not None]
    if not candidates:
        return key
    files = [(raw, p) for s in cfg.sources for raw in s.paths
             for p in source_files(dataclasses.replace(s, paths=(raw,)))]
    digests = file_digests([p for _, p in files], by_path=True)
    for path, manifest, at in candidates:  # each file named as the output's build named it: at its paths
        made = {str(Path(at[raw]) / p.relative_to(raw)) if p != Path(raw) else str(Path(at[raw])): digests[str(p)]
                for raw, p in files}
        if manifest.get("inputs") == made:
            said_once(path, key, log, "corpus: %s was built from sources of these contents (their paths or "
                      "modification times changed since): it is reused, with the outputs made from it", path)
            return str(manifest[KEY_FIELD])
    return key


def _paths_at(config: dict, made) -> dict[str, str] | None:
    """{each source path of ``config``: the path in its place in ``made``, an earlier corpus output's config} when
    the two differ in their sources' paths alone (as many paths a source), else None."""
    if not isinstance(made, dict) or not isinstance(made.get("sources"), list) \
            or len(made["sources"]) != len(config["sources"]):
        return None
    at, sources = {}, []
    for ours, theirs in zip(config["sources"], made["sources"]):
        if not isinstance(theirs, dict) or not isinstance(theirs.get("paths"), list) \
                or len(theirs["paths"]) != len(ours["paths"]) or not all(isinstance(p, str) for p in theirs["paths"]):
            return None
        at.update(zip(ours["paths"], theirs["paths"]))
        sources.append({**theirs, "paths": ours["paths"]})
    return at if {**made, "sources": sources} == config else None


def source_sizes(cfg: CorpusConfig) -> dict[str, int]:
    """Bytes on disk per source (AmpV and SimPT plans are stated in file sizes, as in seed 000)."""
    return {s.name: sum(p.stat().st_size for p in source_files(s)) for s in cfg.sources}


def build_corpus(cfg: CorpusConfig, out_dir: Path) -> Path:
    """Write the shards and the mixing plan into ``out_dir`` (Ray must be running)."""
    out_dir = Path(out_dir)
    inputs = [p for s in cfg.sources for p in source_files(s)]
    shards: list[ShardInfo] = []
    provenance: dict[str, dict] = {}
    for src in cfg.sources:
        src_shards, dropped = _write_shards(src, out_dir / "shards" / src.name, cfg.mixer.shard_bytes,
                                            cfg.drop_letterless)
        shards.extend(dataclasses.replace(s, path=str(Path(s.path).relative_to(out_dir))) for s in src_shards)
        languages: dict[str, int] = {}
        for s in src_shards:
            languages[s.language] = languages.get(s.language, 0) + s.n_sentences
        provenance[src.name] = {"role": src.role, "language": src.language, "shards": len(src_shards),
                                "documents": sum(s.n_docs for s in src_shards),
                                "sentences": sum(s.n_sentences for s in src_shards),
                                "bytes": sum(s.n_bytes for s in src_shards), "languages": languages}
        if cfg.drop_letterless or src.skip_line_prefix:
            provenance[src.name]["dropped"] = dropped
    plan = MIXERS.get(cfg.mixer.name)(shards, cfg.mixer, random.Random(cfg.seed))
    planned = planned_bytes(plan, shards)
    total_planned = sum(planned.values()) or 1
    for name, prov in provenance.items():
        prov["planned_bytes"] = planned.get(name, 0)
        prov["planned_share"] = round(planned.get(name, 0) / total_planned, 4)
    write_plan(out_dir, shards, plan)
    counts = {"sources": len(cfg.sources), "shards": len(shards), "units": len(plan.units),
              "documents": sum(p["documents"] for p in provenance.values()),
              "bytes": sum(p["bytes"] for p in provenance.values())}
    write_manifest(out_dir, stage="corpus", config=cfg, inputs=inputs, counts=counts, seed=cfg.seed,
                   extra={"provenance": provenance, "plan": plan.notes})
    log.info("corpus: %d shards, %d units (%s)", len(shards), len(plan.units), cfg.mixer.name)
    return out_dir


def _write_shards(src: SourceConfig, out: Path, shard_bytes: int, drop_letterless: bool = False,
                  block_bytes: int = READ_BLOCK_BYTES) -> tuple[list[ShardInfo], dict[str, int]]:
    """Stream a source's documents (read and sentence-split on Ray, a task per file or per ``block_bytes``
    span of one: the same shards either way) into shards of ~shard_bytes, one language per shard (a buffer
    per language, in order of first appearance); also returns what the filters dropped (``FILTER_COUNTS``)."""
    import pyarrow as pa  # heavy: pyarrow, ray
    import pyarrow.parquet as pq
    import ray
    import ray.data

    out.mkdir(parents=True, exist_ok=True)
    shards: list[ShardInfo] = []
    bufs: dict[str, dict[str, list]] = {}
    sizes: dict[str, int] = {}
    dropped = {k: 0 for k in FILTER_COUNTS}

    def flush(language: str) -> None:
        buf = bufs[language]
        if not buf["doc_id"]:
            return
        path = out / f"shard-{len(shards):05d}.parquet"
        pq.write_table(pa.table(buf), path)
        shards.append(shard_info(path=str(path), source=src.name, role=src.role, language=language,
                                 n_bytes=sum(buf["n_bytes"]), pages=buf["page"],
                                 doc_sentences=(len(s) for s in buf["sentences"]), doc_bytes=buf["n_bytes"]))
        for v in buf.values():
            v.clear()
        sizes[language] = 0

    options = ray.data.DataContext.get_current().execution_options
    keep_order = options.preserve_order
    options.preserve_order = True  # file order -> shard contents -> mixing plan: reproducible
    items = read_items(src, block_bytes)
    unseen = {item["file_index"]: item["path"] for item in items if item["span"]}  # a span may hold no document
    # several tasks: each tells a tally as it ends, so the progress lines know what the rows in order do not
    tally = ray.remote(num_cpus=0)(ReadTally).remote() if len(items) > 1 else None
    dataset = read_source(src, drop_letterless=drop_letterless, items=items, tally=tally)
    said = _ReadProgress(src.name, items, tally)
    said.start()
    try:
        # batches of 1,024 documents: a whole block (up to Ray Data's 128 MB) as Python rows was the driver's peak
        for batch in dataset.iter_batches(batch_size=1024, batch_format="pyarrow"):
            for row in batch.to_pylist():
                file_index, line = map(int, row["doc_id"].split(":")[1:])
                said.reached(file_index, line)
                if unseen:
                    unseen.pop(file_index, None)
                for k in dropped:
                    dropped[k] += row[k]
                if not row["sentences"]:  # every sentence filtered out
                    continue
                language = row["language"]
                if language not in bufs:
                    bufs[language], sizes[language] = {k: [] for k in SHARD_COLUMNS}, 0
                for k, v in bufs[language].items():
                    v.append(row[k])
                sizes[language] += row["n_bytes"]
                if sizes[language] >= shard_bytes:
                    flush(language)
    except Exception as exc:
        found = find_input_error(exc)
        if found is not None:
            raise found from None
        raise
    finally:
        options.preserve_order = keep_order
        said.stop()
        if tally is not None:
            with contextlib.suppress(Exception):  # Ray may be going down (Ctrl-C): the read's own error goes on
                ray.kill(tally)
    said.finished()
    if unseen:  # a file read in spans none of which held a document
        raise no_document(src, next(iter(unseen.values())))
    for language in bufs:
        flush(language)
    if not shards:
        raise InputError(", ".join(src.paths), f"source {src.name!r} yielded no sentences",
                         expected="non-empty documents" + (" with letters" if drop_letterless else ""))
    return shards, dropped


class _ReadProgress:
    """The read's progress lines: read tasks done of the total, megabytes, time elapsed and left. The tasks run
    in parallel, but their rows reach the driver in the tasks' order (``preserve_order``): the rows of task ``j``
    say the tasks up to ``j`` are done and nothing of the later ones, most of which may be done too. Counted from
    the rows alone, a line said 7m12s left where 1m49s were, then 13/13 a second after 9/13 (scale probe S1). So
    each task tells a ``ReadTally`` actor as it ends (``tally``; a read of several tasks has one), which the
    heartbeat thread asks every ``POLL_S`` seconds; the time left is the bytes of the tasks not ended at the rate
    the ended ones were read. Without a tally a line gives no time left. While nothing ends, a line every
    ``HEARTBEAT_S`` seconds says the read goes on (a source of one task too)."""

    #: Seconds without a line after which a line says the read goes on
    HEARTBEAT_S = 30.0
    #: Seconds between two questions to the tally
    POLL_S = 2.0

    def __init__(self, name: str, items: list[dict], tally=None):
        self.name, self.items, self.tally = name, items, tally
        self.starts = [(item["file_index"], item["first_line"]) for item in items]  # where each task's rows start
        self.index = {(item["file_index"], item["start"]): i for i, item in enumerate(items)}  # the tally's keys
        self.total_bytes = sum(item["bytes"] for item in items) or 1
        self.in_order = 0  # tasks before the one whose rows are arriving: ended
        self.ended: set[int] = set()  # tasks the tally says ended
        self.done = self.last_done = 0
        self.started = self.last = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name=f"corpus-read-{name}", daemon=True)

    def start(self) -> None:
        """The heartbeat starts (``stop`` ends it: in a ``finally``)."""
        self._beat.start()

    def stop(self) -> None:
        self._stop.set()
        self._beat.join()

    def reached(self, file_index: int, line: int) -> None:
        """A document of file ``file_index`` at ``line`` arrived (each row: cheap unless it says more)."""
        task = bisect.bisect_right(self.starts, (file_index, line)) - 1
        if task > self.in_order:
            self.said(in_order=task)

    def finished(self) -> None:
        self.said(in_order=len(self.items))

    def said(self, in_order: int = 0, ended: tuple[int, ...] = ()) -> None:
        """What the rows (``in_order``: the tasks before it ended) or the tally (``ended``) say; a line when due."""
        with self._lock:
            self.in_order = max(self.in_order, in_order)
            self.ended.update(ended)
            done, now, total_tasks = len(self._ended()), time.monotonic(), len(self.items)
            if done <= self.done or total_tasks < 2:
                return
            self.done = done
            if done < total_tasks and not updating() and not due(now - self.last, done - self.last_done,
                                                                 total_tasks):
                return
            self.last, self.last_done = now, done
            progress(self._line(now))

    def _heartbeat(self) -> None:
        asked = time.monotonic()
        while not self._stop.wait(min(self.POLL_S, self.HEARTBEAT_S / 4)):
            if self.tally is not None and time.monotonic() - asked >= self.POLL_S:
                asked = time.monotonic()
                self._ask()
            with self._lock:
                now = time.monotonic()
                if now - self.last >= self.HEARTBEAT_S and not self._stop.is_set():
                    self.last = now
                    progress(self._line(now) + ", reading on")

    def _ask(self) -> None:
        import ray  # heavy: ray (running: the read is on it)

        try:
            ended = ray.get(self.tally.tasks.remote(), timeout=self.POLL_S * 5)
        except Exception as exc:  # progress must not stop the read: without the tally, lines from the rows
            log.debug("corpus: %s: the read tally did not answer (%s); progress from the rows", self.name, exc)
            self.tally = None
            return
        self.said(ended=tuple(self.index[key] for key in map(tuple, ended) if key in self.index))

    def _ended(self) -> set[int]:
        return self.ended | set(range(self.in_order))

    def _line(self, now: float) -> str:
        tasks = self._ended()
        read, elapsed = sum(self.items[i]["bytes"] for i in tasks), now - self.started
        left = ""
        if self.tally is not None and 0 < read < self.total_bytes and len(tasks) < len(self.items):
            left = f", about {duration(elapsed * (self.total_bytes - read) / read)} left"
        return (f"corpus: {self.name}: {len(tasks)}/{len(self.items)} read tasks done ({read / 1e6:.0f}/"
                f"{self.total_bytes / 1e6:.0f} MB), {duration(elapsed)} elapsed{left}")


def plan_corpus(cfg: CorpusConfig) -> str:
    """Dry run: every source exists and parses (a full streamed pass); describe the mix."""
    lines = [f"corpus: mixer={cfg.mixer.name}, seed={cfg.seed}"
             + (", sentences without letters dropped" if cfg.drop_letterless else "")]
    sizes = source_sizes(cfg)
    for src in cfg.sources:
        files = source_files(src)
        by_language: dict[str, int] = {}
        for doc in iter_source(src):
            by_language[doc.language] = by_language.get(doc.language, 0) + 1
        docs = sum(by_language.values())
        n_shards = max(1, math.ceil(sizes[src.name] / cfg.mixer.shard_bytes))
        language = src.language
        if src.language_field:
            language = f"from field {src.language_field!r}: " + ", ".join(f"{k} {n}" for k, n in by_language.items())
        tasks = len(read_items(src))
        lines.append(f"  source {src.name}: {len(files)} file(s), {docs} documents, {sizes[src.name]} bytes, "
                     f"{tasks} read task(s), ~{n_shards} shard(s), format={src.format}, role={src.role}, "
                     f"language={language}"
                     + (f", lines starting {src.skip_line_prefix!r} dropped" if src.skip_line_prefix else ""))
    small = sum(sizes[s.name] for s in cfg.sources if s.role in SMALL_ROLES)
    large = sum(sizes[s.name] for s in cfg.sources if s.role not in SMALL_ROLES)
    if cfg.mixer.name == "simpt":
        n_small = sum(max(1, math.ceil(sizes[s.name] / cfg.mixer.shard_bytes))
                      for s in cfg.sources if s.role in SMALL_ROLES)
        n_large = sum(max(1, math.ceil(sizes[s.name] / cfg.mixer.shard_bytes))
                      for s in cfg.sources if s.role not in SMALL_ROLES)
        k = min(cfg.mixer.shards_per_side, n_small)
        units = cfg.mixer.units or math.ceil(large / (small * k / n_small)) * cfg.mixer.dupe_factor
        lines.append(f"  simpt: ~{units} units of {k} small shards + as many bytes of the {n_large} large ones; "
                     f"small corpus ~50% of instances "
                     f"(its size share is {small / max(1, small + large):.1%})")
    elif cfg.mixer.name == "conventional":
        lines.append(f"  conventional: every shard x dupe_factor={cfg.mixer.dupe_factor}; small corpus keeps "
                     f"its size share {small / max(1, small + large):.1%}")
    elif cfg.mixer.name == "weighted":
        total = cfg.mixer.total_bytes or sum(sizes.values()) * cfg.mixer.dupe_factor
        target = weighted_bytes(sizes, cfg.mixer.weights, total)
        shares = ", ".join(f"{name} {target[name] / max(1, total):.1%} ({target[name] / max(1, sizes[name]):.2f} "
                           "passes)" for name in sizes)
        lines.append(f"  weighted: ~{total} bytes to instance creation (file sizes): {shares}")
    else:
        lines.append(f"  mdapt: budget {cfg.mixer.sentence_budget} sentences, alpha={cfg.mixer.alpha}, "
                     f"dupe_factor={cfg.mixer.dupe_factor}"
                     + (f", up-sampled from their domain text: {list(cfg.mixer.upsample_from_domain)}"
                        if cfg.mixer.upsample_from_domain else ""))
    return "\n".join(lines)
