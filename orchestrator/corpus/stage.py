"""The corpus stage: sources -> sentence-split shards -> the mixer's plan.

    build_corpus(cfg, out_dir)     # out_dir/shards/<source>/shard-NNNNN.parquet, shards.json, plan.json

Each source is read and sentence-split on Ray (one streamed task per file, ``corpus.sources``)
and written into shards of about ``mixer.shard_bytes`` bytes, cut at document boundaries
(columns: ``orchestrator.core.artifacts.SHARD_COLUMNS``); the mixer then turns the shard list
into units of instance creation (``plan.json``). The driver only streams documents into shard
files and holds per-shard metadata. On a multi-node cluster, source paths and the output must be
on storage every node mounts.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import random
from pathlib import Path

from orchestrator.core.artifacts import SHARD_COLUMNS, SMALL_ROLES, ShardInfo, write_plan
from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import write_manifest
from orchestrator.corpus.mixing import MIXERS, MixerConfig, planned_bytes, weighted_bytes
from orchestrator.corpus.sources import SourceConfig, find_input_error, iter_source, read_source, source_files

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    sources: tuple[SourceConfig, ...] = field((), help="corpora to mix (name, paths, format, role, language)")
    mixer: MixerConfig = field(default_factory=MixerConfig, help="mixing strategy and its parameters")
    seed: int = field(12345, help="seed of the mixer's sampling (BERT's default 12345)")

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
        unknown = sorted(set(self.mixer.weights) - set(names))
        if unknown:
            raise ConfigError(f"corpus.mixer.weights.{unknown[0]}: no such source (sources: {names})")
        missing = [n for n in names if n not in self.mixer.weights]
        if self.mixer.name == "weighted" and missing:
            raise ConfigError(f"mixer weighted: corpus.mixer.weights has no weight for source {missing[0]!r}; "
                              "give every source a weight (0 leaves it out of the instances)")


def input_stats(cfg: CorpusConfig) -> dict[str, tuple[int, int]]:
    """{file: (size, mtime_ns)} of every source file: what the stage's key says about its inputs.
    Fails fast, before Ray starts, on a missing or empty file."""
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for s in cfg.sources for p in source_files(s)}


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
        src_shards = _write_shards(src, out_dir / "shards" / src.name, cfg.mixer.shard_bytes)
        shards.extend(dataclasses.replace(s, path=str(Path(s.path).relative_to(out_dir))) for s in src_shards)
        provenance[src.name] = {"role": src.role, "language": src.language, "shards": len(src_shards),
                                "documents": sum(s.n_docs for s in src_shards),
                                "sentences": sum(s.n_sentences for s in src_shards),
                                "bytes": sum(s.n_bytes for s in src_shards)}
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


def _write_shards(src: SourceConfig, out: Path, shard_bytes: int) -> list[ShardInfo]:
    """Stream a source's documents (read and sentence-split on Ray) into shards of ~shard_bytes."""
    import pyarrow as pa  # heavy: pyarrow, ray
    import pyarrow.parquet as pq
    import ray.data

    out.mkdir(parents=True, exist_ok=True)
    shards: list[ShardInfo] = []
    buf: dict[str, list] = {k: [] for k in SHARD_COLUMNS}

    def flush() -> None:
        if not buf["doc_id"]:
            return
        path = out / f"shard-{len(shards):05d}.parquet"
        pq.write_table(pa.table(buf), path)
        shards.append(ShardInfo(path=str(path), source=src.name, role=src.role, language=src.language,
                                n_bytes=sum(buf["n_bytes"]), pages=tuple(buf["page"]),
                                doc_sentences=tuple(len(s) for s in buf["sentences"]),
                                doc_bytes=tuple(buf["n_bytes"])))
        for v in buf.values():
            v.clear()

    size = 0
    options = ray.data.DataContext.get_current().execution_options
    keep_order = options.preserve_order
    options.preserve_order = True  # file order -> shard contents -> mixing plan: reproducible
    try:
        for batch in read_source(src).iter_batches(batch_size=None, batch_format="pyarrow"):
            for row in batch.to_pylist():
                for k in buf:
                    buf[k].append(row[k])
                size += row["n_bytes"]
                if size >= shard_bytes:
                    flush()
                    size = 0
    except Exception as exc:
        found = find_input_error(exc)
        if found is not None:
            raise found from None
        raise
    finally:
        options.preserve_order = keep_order
    flush()
    if not shards:
        raise InputError(", ".join(src.paths), f"source {src.name!r} yielded no sentences",
                         expected="non-empty documents")
    return shards


def plan_corpus(cfg: CorpusConfig) -> str:
    """Dry run: every source exists and parses (a full streamed pass); describe the mix."""
    lines = [f"corpus: mixer={cfg.mixer.name}, seed={cfg.seed}"]
    sizes = source_sizes(cfg)
    for src in cfg.sources:
        files = source_files(src)
        docs = sum(1 for _ in iter_source(src))
        n_shards = max(1, math.ceil(sizes[src.name] / cfg.mixer.shard_bytes))
        lines.append(f"  source {src.name}: {len(files)} file(s), {docs} documents, {sizes[src.name]} bytes, "
                     f"~{n_shards} shard(s), format={src.format}, role={src.role}, language={src.language}")
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
                     f"dupe_factor={cfg.mixer.dupe_factor}")
    return "\n".join(lines)
