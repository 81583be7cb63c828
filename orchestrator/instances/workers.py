"""Instance creation on Ray: units of the mixing plan run as Ray Data tasks that write a shard each.

Each mixing *unit* (a set of shards, ``orchestrator.core.artifacts.Unit``) is one run of the
algorithm with an RNG seeded by (seed, max_seq_length, unit id), so output does not depend on
the worker count; units run in Ray worker processes that keep the tokenizer and tokenized shards
(``ShardTokens``) between tasks, and write one parquet shard each as soon as it is finished.
"""
from __future__ import annotations

import functools
import json
import os
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from orchestrator.core.artifacts import Unit, provenance_label
from orchestrator.core.config import from_dict, to_dict
from orchestrator.core.pretokenize import MecabWords, piece_tokenizer, pretokenize_of
from orchestrator.instances.association import AssociationTable, Cooccurrence
from orchestrator.instances.config import InstanceConfig, Params, Specials
from orchestrator.instances.encoding import MecabSentenceEncoder, SentenceEncoder
from orchestrator.instances.entity_masking import EntityMasker
from orchestrator.instances.exact import create_training_instances, unit_rng
from orchestrator.instances.grouped import create_grouped_instances
from orchestrator.instances.packing import TokenizedDocs, instance_batches
from orchestrator.instances.parquet import merge_summaries, summarize, write_batches, write_instances


class ShardTokens:
    """Shards tokenized into TokenizedDocs, LRU-cached per worker process and tokenizer.

    One per process (``shard_tokens``), not per run: a build makes instances at several
    lengths (128, then 512) from the same shards, and a worker that meets a shard again tokenizes
    it once. Entries are keyed by path, size and modification time, so a rewritten file is read
    again; the encoder's word cache is shared the same way.
    """

    def __init__(self, tokenizer_dir: str, cache_bytes: int = 256 << 20):
        from tokenizers import Tokenizer  # heavy: tokenizers

        if pretokenize_of(tokenizer_dir) == "mecab":  # MeCab words, then WordPiece (no tokenizer.json)
            self.tokenizer = piece_tokenizer(tokenizer_dir)
            self.encoder = MecabSentenceEncoder(MecabWords.from_dir(tokenizer_dir), self.tokenizer)
        else:
            self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
            self.encoder = SentenceEncoder(self.tokenizer)
        self.cache: OrderedDict[tuple, TokenizedDocs] = OrderedDict()
        self.cache_bytes = cache_bytes  # ~4 bytes a token: 256 MB hold ~25 seed-size (10 MB) shards

    def get(self, path: str) -> TokenizedDocs:
        import pyarrow.parquet as pq  # heavy: pyarrow

        stat = os.stat(path)
        key = (path, stat.st_size, stat.st_mtime_ns)
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        has_language = "language" in pq.read_schema(path).names  # shards of the corpus stage have it
        table = pq.read_table(path, columns=["sentences", "source"] + ["language"] * has_language)
        sentences = table.column("sentences").combine_chunks()
        sources = table.column("source").to_pylist()
        if has_language:  # one provenance label per document: source and language (the instances' columns)
            sources = [provenance_label(s, lang) for s, lang in zip(sources, table.column("language").to_pylist())]
        ids, starts = self.encoder.encode_flat(sentences.flatten())
        lengths = np.diff(starts)
        sent_doc = np.repeat(np.arange(len(sources)), np.diff(sentences.offsets.to_numpy()))
        kept = lengths > 0  # sentences without tokens are dropped, as in the exact path
        docs = TokenizedDocs(ids, np.concatenate([[0], np.cumsum(lengths[kept])]),
                             np.concatenate([[0], np.cumsum(np.bincount(sent_doc[kept], minlength=len(sources)))]),
                             sources)
        self.cache[key] = docs
        while len(self.cache) > 1 and sum(d.nbytes for d in self.cache.values()) > self.cache_bytes:
            self.cache.popitem(last=False)
        return docs


@functools.lru_cache(maxsize=2)
def shard_tokens(tokenizer_dir: str) -> ShardTokens:
    """This process's ShardTokens for a tokenizer directory."""
    return ShardTokens(tokenizer_dir)


class UnitWorker:
    """Builds units in a Ray worker process: tokenizes member shards (cached), builds instances, writes shards.

    The vectorised path is the default; the per-instance path runs when asked for
    (``exact_reference_rng``) or when entity masking needs token strings per instance.
    """

    def __init__(self, tokenizer_dir: str, out_dir: str, seed: int, cfg: dict, max_seq_length: int,
                 cache_shards: int = 32):
        # One thread per worker: Ray reserved ~1 CPU for it, and the tokenizer's own thread pool
        # would otherwise compete with the other workers (scaling comes from workers, not threads).
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self.shards = shard_tokens(tokenizer_dir)
        self.tokenizer = self.shards.tokenizer
        vocab = self.tokenizer.get_vocab()
        self.specials = Specials.from_vocab(vocab)
        self.continuation = self.specials.continuation_mask()
        self.id_to_token = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        self.cfg: InstanceConfig = from_dict(InstanceConfig, cfg)
        self.params = Params(max_seq_length, self.cfg.short_seq_prob, self.cfg.masked_lm_prob,
                             self.cfg.max_predictions(max_seq_length), self.cfg.whole_word_mask,
                             self.cfg.masking == "static")
        self.masker = None
        if self.cfg.entity_masking is not None:
            self.masker = EntityMasker(self.cfg.entity_masking)
        self.exact = self.cfg.exact_reference_rng or self.masker is not None
        self.out_dir = Path(out_dir)
        self.seed = seed
        self.cache: OrderedDict[str, tuple] = OrderedDict()  # the exact path's form of shards
        self.cache_shards = cache_shards

    def tokenized_shard(self, path: str) -> Any:
        """A shard's documents, tokenized once per process (``ShardTokens``): TokenizedDocs, or for the
        exact path (lists of per-sentence id arrays, sources); the exact form is LRU-cached per
        worker beside the tokens it came from."""
        docs = self.shards.get(path)
        if not self.exact:
            return docs
        cached = self.cache.get(path)
        if cached is not None and cached[0] is docs:  # the same tokens: the file was not rewritten
            self.cache.move_to_end(path)
            return cached[1]
        value = self._exact_docs(docs)
        self.cache[path] = (docs, value)
        self.cache.move_to_end(path)
        if len(self.cache) > self.cache_shards:
            self.cache.popitem(last=False)
        return value

    def _exact_docs(self, docs: TokenizedDocs) -> tuple[list, list]:
        out = []
        for d in range(docs.n_docs):
            bounds = docs.sent_starts[docs.doc_starts[d]:docs.doc_starts[d + 1] + 1]
            out.append([array("i", docs.ids[a:b].tobytes()) for a, b in zip(bounds[:-1], bounds[1:])])
        return out, list(docs.sources)

    def build_unit(self, unit_id: int, members: list[dict], dupe_factor: int) -> dict:
        """One unit's instances written to ``part-<unit_id>.parquet``; returns its summary."""
        rng = unit_rng(self.seed, self.params.max_seq_length, unit_id)
        path = self.out_dir / f"part-{unit_id:06d}.parquet"
        if not self.exact:
            parts = []
            for member in members:
                docs = self.tokenized_shard(member["path"])
                parts.append(docs if member["rows"] is None else docs.select(member["rows"]))
            unit_docs = TokenizedDocs.concat(parts)
            summary = write_batches(instance_batches(unit_docs, dupe_factor, self.params, self.specials,
                                                     self.continuation, rng), path)
            summary["documents"] = int((np.diff(unit_docs.doc_starts) > 0).sum())
            return summary
        documents: list = []
        sources: list[str] = []
        for member in members:
            docs, srcs = self.tokenized_shard(member["path"])
            rows = member["rows"] if member["rows"] is not None else range(len(docs))
            documents.extend(docs[r] for r in rows)
            sources.extend(srcs[r] for r in rows)
        build = create_training_instances
        if self.masker is not None and self.cfg.entity_masking.same_type_grouping != "none":
            build = create_grouped_instances
        instances = build(documents, sources, dupe_factor, self.params, self.specials, rng, self.masker,
                          self.id_to_token)
        if instances:
            write_instances(instances, path)
        summary = summarize(instances)
        summary["documents"] = len([d for d in documents if d])
        return summary

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        """A batch of tasks (``units``: JSON lists of unit specs) -> one summary row per unit."""
        out: dict[str, list] = {"unit_id": [], "summary": []}
        for task in batch["units"]:
            for unit in json.loads(task):
                summary = self.build_unit(int(unit["unit_id"]), unit["members"], int(unit["dupe_factor"]))
                out["unit_id"].append(int(unit["unit_id"]))
                out["summary"].append(json.dumps(summary))
        return out


@functools.lru_cache(maxsize=2)
def _unit_worker(tokenizer_dir: str, out_dir: str, seed: int, cfg_json: str, max_seq_length: int) -> UnitWorker:
    """One UnitWorker per Ray worker process and run, reused by every unit task that lands there."""
    return UnitWorker(tokenizer_dir, out_dir, seed, json.loads(cfg_json), max_seq_length)


def build_units(batch: dict[str, Any], tokenizer_dir: str, out_dir: str, seed: int, cfg_json: str,
                max_seq_length: int) -> dict[str, list]:
    """The Ray Data task body: build the batch's units with this process's cached UnitWorker."""
    return _unit_worker(tokenizer_dir, out_dir, seed, cfg_json, max_seq_length)(batch)


class CooccurrenceCounter:
    """Counts entity types (or terms: association_level) per window over documents of tokenized
    shards, in a Ray worker process: the masker's own extraction (``EntityMasker.extract``) on each
    sentence's WordPiece tokens, so the derived association sees the entities the masking will see.
    Shares the process's ShardTokens with the unit workers: a shard counted here is tokenized once
    for both passes."""

    def __init__(self, tokenizer_dir: str, cfg: dict):
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        self.shards = shard_tokens(tokenizer_dir)
        vocab = self.shards.tokenizer.get_vocab()
        self.id_to_token = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        self.cfg = from_dict(InstanceConfig, cfg).entity_masking
        self.masker = EntityMasker(self.cfg, association=AssociationTable({}, 0.0))  # extraction only

    def count(self, path: str, rows: Sequence[int] | None) -> Cooccurrence:
        docs = self.shards.get(path)
        counts = Cooccurrence()
        for d in range(docs.n_docs) if rows is None else rows:
            bounds = docs.sent_starts[docs.doc_starts[d]:docs.doc_starts[d + 1] + 1]
            sentences = [[self.masker.key(e) for e in self.masker.extract([self.id_to_token[t] for t in docs.ids[a:b]])]
                         for a, b in zip(bounds[:-1], bounds[1:])]
            counts.add_document(sentences, self.cfg.association_window)
        return counts


@functools.lru_cache(maxsize=2)
def _counter(tokenizer_dir: str, cfg_json: str) -> CooccurrenceCounter:
    return CooccurrenceCounter(tokenizer_dir, json.loads(cfg_json))


def count_shards(batch: dict[str, Any], tokenizer_dir: str, cfg_json: str) -> dict[str, list]:
    """The Ray Data task body of the association pass: one row per shard, its co-occurrence counts."""
    counter = _counter(tokenizer_dir, cfg_json)
    out: dict[str, list] = {"counts": []}
    for task in batch["shards"]:
        spec = json.loads(task)
        out["counts"].append(json.dumps(counter.count(spec["path"], spec["rows"]).to_dict()))
    return out


def plan_documents(units: Sequence[Unit]) -> list[dict]:
    """The distinct documents of the mixing plan, per shard (sorted rows; None = all): a document that
    several units (or passes) use counts once in the association statistics."""
    rows: dict[str, set[int] | None] = {}
    for unit in units:
        for m in unit.members:
            if m.rows is None or rows.get(m.path, set()) is None:
                rows[m.path] = None
            else:
                rows.setdefault(m.path, set()).update(m.rows)
    return [{"path": path, "rows": None if r is None else sorted(r)} for path, r in sorted(rows.items())]


def count_cooccurrence(units: Sequence[Unit], tokenizer_dir: Path, cfg: InstanceConfig, workers: int,
                       cpus_per_worker: float) -> Cooccurrence:
    """The association pass (Ray Data): entity-type co-occurrence over the plan's distinct documents,
    one task per shard, merged on the driver (integer sums: the split does not change the result)."""
    import ray.data  # heavy: ray

    shards = plan_documents(units)
    ds = ray.data.from_items([{"shards": json.dumps(s)} for s in shards], override_num_blocks=max(1, len(shards)))
    num_cpus = max(cpus_per_worker, ray.cluster_resources().get("CPU", workers) / (max(1, workers) + 0.5))
    ds = ds.map_batches(count_shards, batch_size=1, compute=ray.data.TaskPoolStrategy(size=max(1, len(shards))),
                        num_cpus=num_cpus, fn_kwargs={"tokenizer_dir": str(tokenizer_dir),
                                                      "cfg_json": json.dumps(to_dict(cfg), sort_keys=True)})
    ds.context.op_resource_reservation_enabled = False
    ds.context.enable_progress_bars = False
    total = Cooccurrence()
    for row in ds.iter_rows():
        total.merge(Cooccurrence.from_dict(json.loads(row["counts"])))
    return total


def unit_work_bytes(unit: Unit) -> int:
    """Text a unit turns into instances, in shard-file bytes times its passes (a cost estimate)."""
    total = 0
    for member in unit.members:
        size = os.path.getsize(member.path)
        if member.rows is not None:
            import pyarrow.parquet as pq  # heavy: pyarrow

            size = size * len(member.rows) // max(1, pq.ParquetFile(member.path).metadata.num_rows)
        total += size
    return total * unit.dupe_factor


def plan_tasks(work_bytes: Sequence[int], workers: int, min_task_bytes: int = 1_000_000) -> list[list[int]]:
    """Units (indices into ``work_bytes``, a cost estimate each) grouped into Ray Data tasks, in order.

    Factoring (Hummel, Schonberg & Flynn, 1992): each round of ``workers`` equal tasks takes half
    of the work still left, so the first tasks are large (few scheduling round trips, ~10-60 ms each) and the
    last ones are single units that even out the workers' finishing times, whatever the error of
    the estimate (WikiText costs ~30 % more per byte than PubMed here). A task is never smaller
    than ``min_task_bytes`` of work unless it is one unit. Equal tasks, by contrast, leave a
    whole task of imbalance: 23 equal units in 5 tasks give one of 2 workers 13 units and the
    other 10 (measured on 2 CPUs: scaling 1.42 there).
    """
    n, workers = len(work_bytes), max(1, workers)
    groups, lo, left = [], 0, float(sum(work_bytes))
    while lo < n:
        target = max(left / (2 * workers), float(min_task_bytes))  # one round: a task per worker
        for _ in range(workers):
            if lo == n:
                break
            hi, acc = lo + 1, float(work_bytes[lo])
            while hi < n and acc + work_bytes[hi] / 2 <= target:  # the next unit mostly fits
                acc += work_bytes[hi]
                hi += 1
            groups.append(list(range(lo, hi)))
            lo, left = hi, left - acc
    return groups


def run_units(units: Sequence[Unit], tokenizer_dir: Path, out_dir: Path, cfg: InstanceConfig, max_seq_length: int,
              seed: int, workers: int, cpus_per_worker: float) -> dict:
    """Build every unit's instances as Ray Data tasks (at most ``workers`` at once); returns the merged summary.

    Shards are written into ``out_dir`` as
    units finish; only the small per-unit summaries travel back to the driver.
    """
    import ray.data  # heavy: ray

    specs = [{"unit_id": u.unit_id, "dupe_factor": u.dupe_factor,
              "members": [{"path": m.path, "rows": list(m.rows) if m.rows is not None else None} for m in u.members]}
             for u in units]
    rows = [{"units": json.dumps([specs[i] for i in group])}
            for group in plan_tasks([unit_work_bytes(u) for u in units], workers)]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, len(rows)))
    # Tasks, not an actor pool: tasks run in Ray's already started worker processes, where a new
    # actor pays a process start and every import first (~10 s on a loaded 2-core machine, more
    # than the work); the per-process worker cache keeps what an actor would (tokenizer, shards).
    # Every task is submitted at once, each reserving enough CPU that only ``workers`` run: the
    # rest wait in Ray's queue and start the moment a CPU frees, instead of after a round trip to
    # this driver's scheduling loop, which the workers starve of CPU when they fill every core
    # (with 2 x workers in flight the last small tasks of a 2-CPU run went to one worker while
    # the other sat idle). plan_tasks keeps the number of tasks small.
    workers = max(1, workers)
    num_cpus = max(cpus_per_worker, ray.cluster_resources().get("CPU", workers) / (workers + 0.5))
    ds = ds.map_batches(build_units, batch_size=1, compute=ray.data.TaskPoolStrategy(size=max(1, len(rows))),
                        num_cpus=num_cpus,
                        fn_kwargs={"tokenizer_dir": str(tokenizer_dir), "out_dir": str(out_dir), "seed": seed,
                                   "cfg_json": json.dumps(to_dict(cfg), sort_keys=True),
                                   "max_seq_length": max_seq_length})
    # Ray Data's per-operator reservation gives this map ~half the CPUs on a small node (one task
    # at a time on 2 CPUs): the CPU request above is the intended limit, so lift it for this
    # dataset. Its own progress bars cost the driver CPU the workers need; the bar below is ours.
    ds.context.op_resource_reservation_enabled = False
    ds.context.enable_progress_bars = False
    summaries = []
    with tqdm(total=len(units), desc=f"instances len{max_seq_length}", unit="unit", leave=False) as bar:
        for row in ds.iter_rows():
            summaries.append(json.loads(row["summary"]))
            bar.update(1)
    total = merge_summaries(summaries)
    total["document_uses"] = sum(s["documents"] for s in summaries)
    return total
