"""The corpus stage: sources -> sentence-split shards -> mixing plan -> AmpV vocabulary -> instances.

    from orchestrator.data.build import CorpusConfig, build_corpus, plan_corpus
    result = build_corpus(cfg, run_dir)      # run_dir/corpus, run_dir/vocab, run_dir/instances/len<L>

Layout under ``out_dir``:

    corpus/shards/<source>/shard-NNNNN.parquet   sentence-split documents (source, doc_id, page,
                                                 language, sentences, n_bytes), ~shard_bytes each
    corpus/shards.json, corpus/plan.json         per-shard document sizes; the mixer's units
    vocab/                                       HF tokenizer dir + vocab_report.json
    instances/len<L>/part-NNNNNN.parquet         one shard per unit (schema: docs/ARCHITECTURE.md)

Each of the three outputs is written atomically with a manifest.json. A stage whose manifest
records the same inputs (config + upstream manifest) is reused, so re-running a build skips
work already done. Ray is used at the edges: reading and sentence splitting (one streamed
task per file) and instance creation (a pool of actors writing parquet shards as they finish);
the driver only streams documents into fixed-size shard files and holds per-shard metadata.
On a multi-node cluster, source paths and ``out_dir`` must be on storage every node mounts
(workers read the sources and write instance shards by path).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import random
from pathlib import Path
from typing import Iterator

from orchestrator.core.config import field, to_dict
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import (atomic_dir, atomic_write_json, file_sha256, read_manifest,
                                        write_manifest)
from orchestrator.core.runtime import ray_session
from orchestrator.data.mixing import MIXERS, MixerConfig, MixPlan, ShardInfo, planned_bytes
from orchestrator.data.sources import SourceConfig, find_input_error, iter_source, read_source, source_files
from orchestrator.text.instances import InstanceConfig, run_units
from orchestrator.text.vocabulary import VocabConfig, build_vocabulary

log = logging.getLogger(__name__)

SMALL_ROLES = ("small", "domain")


@dataclasses.dataclass(frozen=True)
class RaySettings:
    address: str = field("", help="Ray address; empty = embedded local Ray unless RAY_ADDRESS is set")
    num_cpus: int = field(0, help="CPUs for an embedded Ray; 0 = all")
    workers: int = field(0, help="instance-building actors; 0 = one per CPU of the Ray cluster (at most "
                                 "one per unit)")
    cpus_per_worker: float = field(0.5, help="CPUs reserved per actor; fractional so that reads can be "
                                             "scheduled beside them on a 2-core machine")

    def __post_init__(self) -> None:
        if self.num_cpus < 0 or self.workers < 0 or self.cpus_per_worker <= 0:
            raise ConfigError("ray.num_cpus >= 0, ray.workers >= 0, ray.cpus_per_worker > 0 required")

    def resolved_workers(self, units: int) -> int:
        """Actors to start: as configured, or one per cluster CPU; never more than there are units."""
        import ray

        n = self.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        return max(1, min(n, units))


@dataclasses.dataclass(frozen=True)
class CorpusConfig:
    sources: tuple[SourceConfig, ...] = field((), help="corpora to mix (name, paths, format, role, language)")
    mixer: MixerConfig = field(default_factory=MixerConfig, help="mixing strategy and its parameters")
    vocab: VocabConfig = field(default_factory=VocabConfig, help="WordPiece / AmpV vocabulary")
    instances: InstanceConfig = field(default_factory=InstanceConfig, help="pretraining instances")
    seed: int = field(12345, help="seed of mixing and instance creation (BERT's default 12345)")
    ray: RaySettings = field(default_factory=RaySettings, help="Ray settings of this stage")

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


@dataclasses.dataclass(frozen=True)
class CorpusResult:
    corpus_dir: Path
    vocab_dir: Path
    instances: dict[int, Path]
    counts: dict

    def summary(self) -> str:
        lines = [f"corpus:    {self.corpus_dir}", f"vocab:     {self.vocab_dir}"]
        for length, path in sorted(self.instances.items()):
            c = self.counts["instances"][length]
            lines.append(f"instances: {path}  ({c['instances']} instances, {c['tokens']} tokens)")
        return "\n".join(lines)


def build_corpus(cfg: CorpusConfig, out_dir: Path) -> CorpusResult:
    """Mix the sources, train the vocabulary and write instances under ``out_dir``."""
    out_dir = Path(out_dir)
    for src in cfg.sources:
        source_files(src)  # fail fast, before Ray starts, on missing or empty files
    with ray_session(address=cfg.ray.address or None, num_cpus=cfg.ray.num_cpus or None):
        corpus_dir = _corpus_stage(cfg, out_dir / "corpus")
        vocab_dir = _vocab_stage(cfg, corpus_dir, out_dir / "vocab")
        instances, inst_counts = {}, {}
        for length in cfg.instances.max_seq_lengths:
            path = _instances_stage(cfg, corpus_dir, vocab_dir, out_dir / "instances" / f"len{length}", length)
            instances[length] = path
            inst_counts[length] = read_manifest(path)["counts"]
    counts = {"corpus": read_manifest(corpus_dir)["counts"], "vocab": read_manifest(vocab_dir)["counts"],
              "instances": inst_counts}
    return CorpusResult(corpus_dir, vocab_dir, instances, counts)


# ---------------------------------------------------------------------------------------------
# Stage 1: shards and mixing plan

def _stage_key(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _reusable(stage_dir: Path, key: str) -> bool:
    try:
        return read_manifest(stage_dir).get("stage_key") == key
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def _corpus_stage(cfg: CorpusConfig, corpus_dir: Path) -> Path:
    inputs = [p for s in cfg.sources for p in source_files(s)]
    key = _stage_key(to_dict(cfg.sources), to_dict(cfg.mixer), cfg.seed,
                     {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in inputs})
    if _reusable(corpus_dir, key):
        log.info("corpus: reusing %s", corpus_dir)
        return corpus_dir
    with atomic_dir(corpus_dir) as tmp:
        shards: list[ShardInfo] = []
        provenance: dict[str, dict] = {}
        for src in cfg.sources:
            src_shards = _write_shards(src, tmp / "shards" / src.name, cfg.mixer.shard_bytes)
            shards.extend(dataclasses.replace(s, path=str(Path(s.path).relative_to(tmp))) for s in src_shards)
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
        atomic_write_json(tmp / "shards.json", [dataclasses.asdict(s) for s in shards])
        atomic_write_json(tmp / "plan.json", {"units": [dataclasses.asdict(u) for u in plan.units],
                                              "notes": plan.notes})
        counts = {"sources": len(cfg.sources), "shards": len(shards), "units": len(plan.units),
                  "documents": sum(p["documents"] for p in provenance.values()),
                  "bytes": sum(p["bytes"] for p in provenance.values())}
        write_manifest(tmp, stage="corpus", config={"sources": cfg.sources, "mixer": cfg.mixer}, inputs=inputs,
                       counts=counts, seed=cfg.seed,
                       extra={"provenance": provenance, "plan": plan.notes, "stage_key": key})
    log.info("corpus: %d shards, %d units (%s) -> %s", len(shards), len(plan.units), cfg.mixer.name, corpus_dir)
    return corpus_dir


def _write_shards(src: SourceConfig, out: Path, shard_bytes: int) -> list[ShardInfo]:
    """Stream a source's documents (read and sentence-split on Ray) into shards of ~shard_bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import ray.data

    out.mkdir(parents=True, exist_ok=True)
    shards: list[ShardInfo] = []
    buf: dict[str, list] = {k: [] for k in ("source", "doc_id", "page", "language", "sentences", "n_bytes")}

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


def load_plan(corpus_dir: Path) -> tuple[list[ShardInfo], MixPlan]:
    """Shards and units of a finished corpus stage, with shard paths made absolute."""
    from orchestrator.data.mixing import Member, Unit

    shards = [ShardInfo(**{**s, "path": str(corpus_dir / s["path"]), "pages": tuple(s["pages"]),
                           "doc_sentences": tuple(s["doc_sentences"]), "doc_bytes": tuple(s["doc_bytes"])})
              for s in json.loads((corpus_dir / "shards.json").read_text())]
    raw = json.loads((corpus_dir / "plan.json").read_text())
    units = tuple(Unit(u["unit_id"], tuple(Member(str(corpus_dir / m["path"]),
                                                  tuple(m["rows"]) if m["rows"] is not None else None)
                                           for m in u["members"]), u["dupe_factor"]) for u in raw["units"])
    return shards, MixPlan(units, raw["notes"])


# ---------------------------------------------------------------------------------------------
# Stage 2: vocabulary

def _shard_sentences(paths: list[str]) -> Iterator[str]:
    import pyarrow.parquet as pq

    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(columns=["sentences"], batch_size=512):
            for doc in batch.column(0).to_pylist():
                yield from doc


def _vocab_stage(cfg: CorpusConfig, corpus_dir: Path, vocab_dir: Path) -> Path:
    key = _stage_key(to_dict(cfg.vocab), read_manifest(corpus_dir)["stage_key"])
    if _reusable(vocab_dir, key):
        log.info("vocab: reusing %s", vocab_dir)
        return vocab_dir
    shards, _ = load_plan(corpus_dir)
    small = [s for s in shards if s.role in SMALL_ROLES]
    large = [s for s in shards if s.role not in SMALL_ROLES]
    vcfg = cfg.vocab
    if not small or not large:  # AmpV needs both sides; a single-sided corpus gets a plain vocabulary
        small, large = shards, []
        vcfg = dataclasses.replace(vcfg, ampv=False, report=False)
    with atomic_dir(vocab_dir) as tmp:
        report = build_vocabulary(vcfg, lambda: _shard_sentences([s.path for s in small]),
                                  lambda: _shard_sentences([s.path for s in large]),
                                  sum(s.n_bytes for s in small), max(1, sum(s.n_bytes for s in large)), tmp)
        atomic_write_json(tmp / "special_tokens_map.json",
                          {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                           "cls_token": "[CLS]", "mask_token": "[MASK]"})
        counts = {"vocab_size": report["vocab_size"], "amplification_factor": report["amplification_factor"],
                  "vocab_sha256": file_sha256(tmp / "vocab.txt")}
        write_manifest(tmp, stage="vocab", config=cfg.vocab, inputs=[corpus_dir], counts=counts, seed=cfg.seed,
                       extra={"report": {k: v for k, v in report.items() if k != "example_terms"},
                              "stage_key": key})
    log.info("vocab: %s", {k: v for k, v in report.items() if k != "example_terms"})
    return vocab_dir


# ---------------------------------------------------------------------------------------------
# Stage 3: instances

def _instances_stage(cfg: CorpusConfig, corpus_dir: Path, vocab_dir: Path, inst_dir: Path, length: int) -> Path:
    vocab_manifest = read_manifest(vocab_dir)
    key = _stage_key(to_dict(cfg.instances), length, cfg.seed, read_manifest(corpus_dir)["stage_key"],
                     vocab_manifest["stage_key"])
    if _reusable(inst_dir, key):
        log.info("instances: reusing %s", inst_dir)
        return inst_dir
    shards, plan = load_plan(corpus_dir)
    by_path = {s.path: s for s in shards}
    with atomic_dir(inst_dir) as tmp:
        total = run_units(plan.units, vocab_dir, tmp, cfg.instances, length, cfg.seed,
                          cfg.ray.resolved_workers(len(plan.units)),
                          cfg.ray.cpus_per_worker)
        if total["instances"] == 0:
            raise InputError(corpus_dir, "no instances were created", expected="documents with tokens")
        provenance = _provenance(plan, by_path, total)
        vcounts = vocab_manifest["counts"]
        counts = {"max_seq_length": length, "masking": cfg.instances.masking,
                  "vocab_size": vcounts["vocab_size"], "vocab_sha256": vcounts["vocab_sha256"],
                  "instances": total["instances"], "tokens": total["tokens"],
                  "masked_lm_prob": cfg.instances.masked_lm_prob,
                  "max_predictions_per_seq": cfg.instances.max_predictions(length),
                  "whole_word_mask": cfg.instances.whole_word_mask,
                  "masked_tokens": total["masked"], "random_next": total["random_next"],
                  "units": len(plan.units), "document_uses": total["document_uses"]}
        if cfg.instances.entity_masking is not None:
            counts["entity_masking"] = total["entity"]
        write_manifest(tmp, stage="instances", config=cfg.instances, inputs=[corpus_dir, vocab_dir], counts=counts,
                       seed=cfg.seed, extra={"provenance": provenance, "stage_key": key, **{
                           k: counts[k] for k in ("max_seq_length", "masking", "vocab_size", "vocab_sha256")}})
    log.info("instances len%d: %d instances, %d tokens -> %s", length, total["instances"], total["tokens"], inst_dir)
    return inst_dir


def _provenance(plan: MixPlan, by_path: dict[str, ShardInfo], total: dict) -> dict[str, dict]:
    """Per source: distinct documents used, instances and tokens (by segment A's document)."""
    docs: dict[str, set] = {}
    for unit in plan.units:
        for m in unit.members:
            shard = by_path[m.path]
            rows = range(shard.n_docs) if m.rows is None else m.rows
            docs.setdefault(shard.source, set()).update((m.path, r) for r in rows)
    tokens_all = max(1, total["tokens"])
    out = {}
    for name in sorted(set(docs) | set(total["by_source"])):
        c = total["by_source"].get(name, {"instances": 0, "tokens": 0})
        out[name] = {"documents": len(docs.get(name, ())), "instances": c["instances"], "tokens": c["tokens"],
                     "token_share": round(c["tokens"] / tokens_all, 4)}
    return out


# ---------------------------------------------------------------------------------------------
# Dry run

def plan_corpus(cfg: CorpusConfig) -> str:
    """Check that every source exists and parses (a full streamed pass) and describe the build."""
    lines = [f"corpus build: mixer={cfg.mixer.name}, seed={cfg.seed}"]
    sizes: dict[str, int] = {}
    for src in cfg.sources:
        files = source_files(src)
        docs = 0
        for _ in iter_source(src):
            docs += 1
        sizes[src.name] = sum(p.stat().st_size for p in files)
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
    else:
        lines.append(f"  mdapt: budget {cfg.mixer.sentence_budget} sentences, alpha={cfg.mixer.alpha}, "
                     f"dupe_factor={cfg.mixer.dupe_factor}")
    if small and large and cfg.vocab.ampv:
        lines.append(f"  vocab: AmpV, small corpus x{max(1, round(large / small))}, size {cfg.vocab.vocab_size}")
    else:
        lines.append(f"  vocab: plain WordPiece, size {cfg.vocab.vocab_size}")
    lines.append(f"  instances: max_seq_lengths={list(cfg.instances.max_seq_lengths)}, "
                 f"masking={cfg.instances.masking}, whole_word_mask={cfg.instances.whole_word_mask}, "
                 f"entity_masking={'on' if cfg.instances.entity_masking else 'off'}")
    lines.append("  outputs: corpus/, vocab/, " + ", ".join(f"instances/len{n}/" for n in cfg.instances.max_seq_lengths))
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Job entry (jobs/build_corpus.py)

@dataclasses.dataclass(frozen=True)
class CorpusJobConfig:
    corpus: CorpusConfig = field(help="the corpus build")
    out_dir: str = field("runs/corpus", help="run directory: corpus/, vocab/, instances/len<L>/ go inside")


def run_corpus_job(cfg: CorpusJobConfig) -> CorpusResult:
    return build_corpus(cfg.corpus, Path(cfg.out_dir))


def plan_corpus_job(cfg: CorpusJobConfig) -> str:
    return plan_corpus(cfg.corpus) + f"\n  run directory: {cfg.out_dir}"
