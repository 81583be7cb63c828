"""Pretraining instances: a faithful port of BERT's ``create_pretraining_data`` run as a Ray Data stream.

The algorithm (google-research/bert ``create_pretraining_data.py``) is kept step for step and
RNG call for RNG call — target length with ``short_seq_prob``, segments A/B from a chunk of
sentences, a random next segment from another document half of the time (unused sentences
put back), ``truncate_seq_pair``, masked LM with 80/10/10 and ``max_predictions_per_seq``,
optional whole-word masking, ``dupe_factor`` passes — so that for the same token lists and
seed it produces the same instances as the reference port in
``benchmarks/reference_create_pretraining_data.py`` (tested). It works on token *ids*
(``array('i')`` per sentence) instead of strings: 4 bytes per cached token, and the ids
written to parquet need no lookup.

Each mixing *unit* (a set of shards, see ``orchestrator.data.mixing``) is one call of
``create_training_instances`` with an RNG seeded by (seed, max_seq_length, unit id); units
run in Ray Data actors that write one parquet shard each as soon as it is finished.
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
from array import array
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Any, Iterable, Literal, Sequence

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError
from orchestrator.text.entity_masking import EntityMaskingConfig


Masking = Literal["static", "dynamic"]


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    max_seq_lengths: tuple[int, ...] = field((128,), help="one instances/len<L>/ directory per length "
                                                         "(seed 000: 128, then 512)")
    short_seq_prob: float = field(0.1, help="probability of a shorter random target length (BERT: 0.1)")
    masked_lm_prob: float = field(0.15, help="share of tokens masked (BERT: 0.15)")
    max_predictions_per_seq: int = field(0, help="cap on masked tokens; 0 = BERT's ratio, 20 per 128 tokens")
    whole_word_mask: bool = field(False, help="mask all pieces of a word together")
    masking: Masking = field("static", help="static: masks drawn here, dupe_factor times; dynamic: "
                                            "unmasked instances, masks drawn at load time (dynamic_mask)")
    entity_masking: EntityMaskingConfig | None = field(
        None, help="entity-aware target selection (seed 003); null = BERT's random masking")

    def __post_init__(self) -> None:
        if not self.max_seq_lengths or any(n < 8 for n in self.max_seq_lengths):
            raise ConfigError("instances.max_seq_lengths must be non-empty, each >= 8")
        if len(set(self.max_seq_lengths)) != len(self.max_seq_lengths):
            raise ConfigError("instances.max_seq_lengths has duplicates")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError("instances.short_seq_prob must be in [0, 1]")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ConfigError("instances.masked_lm_prob must be in (0, 1)")
        if self.max_predictions_per_seq < 0:
            raise ConfigError("instances.max_predictions_per_seq must be >= 0")

    def max_predictions(self, max_seq_length: int) -> int:
        return self.max_predictions_per_seq or max(1, round(max_seq_length * 20 / 128))


@dataclasses.dataclass(frozen=True)
class Specials:
    """Ids the algorithm needs: [CLS], [SEP], [MASK], the vocabulary size, and word continuations."""

    cls: int
    sep: int
    mask: int
    vocab_size: int
    continuation: frozenset[int]

    @classmethod
    def from_vocab(cls, vocab: dict[str, int]) -> "Specials":
        return cls(cls=vocab["[CLS]"], sep=vocab["[SEP]"], mask=vocab["[MASK]"], vocab_size=len(vocab),
                   continuation=frozenset(i for t, i in vocab.items() if t.startswith("##")))


@dataclasses.dataclass
class Instance:
    input_ids: Sequence[int]
    token_type_ids: Sequence[int]
    is_random_next: bool
    masked_lm_positions: Sequence[int]
    masked_lm_ids: Sequence[int]
    source: str
    entity_stats: dict | None = None


@dataclasses.dataclass(frozen=True)
class Params:
    max_seq_length: int
    short_seq_prob: float
    masked_lm_prob: float
    max_predictions_per_seq: int
    whole_word_mask: bool
    static_masking: bool = True


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Truncate the longer segment one token at a time, from the front or back at random."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()


def create_masked_lm_predictions(tokens: list[int], p: Params, sp: Specials, rng: random.Random,
                                 masker: Any = None, id_to_token: Sequence[str] | None = None
                                 ) -> tuple[list[int], list[int], list[int], dict | None]:
    """BERT's masking: shuffle candidate (whole-)words, take them until ~masked_lm_prob, 80/10/10.

    With an entity ``masker`` the candidate positions come from ``masker.select`` (seed 003)
    and only the 80/10/10 replacement is BERT's.
    """
    num_to_predict = min(p.max_predictions_per_seq, max(1, int(round(len(tokens) * p.masked_lm_prob))))
    output = list(tokens)
    stats = None
    if masker is not None:
        positions, stats = masker.select([id_to_token[t] for t in tokens], rng, num_to_predict)
        chosen = sorted(positions)[:num_to_predict]
    else:
        cand_indexes: list[list[int]] = []
        for i, token in enumerate(tokens):
            if token == sp.cls or token == sp.sep:
                continue
            if p.whole_word_mask and cand_indexes and token in sp.continuation:
                cand_indexes[-1].append(i)
            else:
                cand_indexes.append([i])
        rng.shuffle(cand_indexes)
        chosen = []
        covered: set[int] = set()
        for index_set in cand_indexes:
            if len(chosen) >= num_to_predict:
                break
            if len(chosen) + len(index_set) > num_to_predict:
                continue
            if any(i in covered for i in index_set):
                continue
            for index in index_set:
                covered.add(index)
                chosen.append(index)
                output[index] = _replacement(tokens[index], sp, rng)
        chosen.sort()
        return output, chosen, [tokens[i] for i in chosen], stats
    for index in chosen:
        output[index] = _replacement(tokens[index], sp, rng)
    return output, chosen, [tokens[i] for i in chosen], stats


def _replacement(token: int, sp: Specials, rng: random.Random) -> int:
    if rng.random() < 0.8:
        return sp.mask
    if rng.random() < 0.5:
        return token
    return rng.randint(0, sp.vocab_size - 1)


def create_instances_from_document(all_documents: Sequence[Sequence[Sequence[int]]], document_index: int,
                                   p: Params, sp: Specials, rng: random.Random, source: str = "",
                                   masker: Any = None, id_to_token: Sequence[str] | None = None
                                   ) -> list[Instance]:
    """BERT's per-document instance builder (sentences packed into A/B up to a target length)."""
    document = all_documents[document_index]
    max_num_tokens = p.max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < p.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)
    instances: list[Instance] = []
    current_chunk: list[Sequence[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        segment = document[i]
        current_chunk.append(segment)
        current_length += len(segment)
        if i == len(document) - 1 or current_length >= target_seq_length:
            if current_chunk:
                a_end = 1
                if len(current_chunk) >= 2:
                    a_end = rng.randint(1, len(current_chunk) - 1)
                tokens_a: list[int] = []
                for j in range(a_end):
                    tokens_a.extend(current_chunk[j])
                tokens_b: list[int] = []
                if len(current_chunk) == 1 or rng.random() < 0.5:
                    is_random_next = True
                    target_b_length = target_seq_length - len(tokens_a)
                    for _ in range(10):
                        random_document_index = rng.randint(0, len(all_documents) - 1)
                        if random_document_index != document_index:
                            break
                    random_document = all_documents[random_document_index]
                    random_start = rng.randint(0, len(random_document) - 1)
                    for j in range(random_start, len(random_document)):
                        tokens_b.extend(random_document[j])
                        if len(tokens_b) >= target_b_length:
                            break
                    i -= len(current_chunk) - a_end  # put the unused segments back
                else:
                    is_random_next = False
                    for j in range(a_end, len(current_chunk)):
                        tokens_b.extend(current_chunk[j])
                truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
                tokens = [sp.cls, *tokens_a, sp.sep, *tokens_b, sp.sep]
                segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
                if p.static_masking:
                    tokens, positions, labels, stats = create_masked_lm_predictions(
                        tokens, p, sp, rng, masker, id_to_token)
                else:
                    positions, labels, stats = [], [], None
                # Compact arrays (4 or 1 bytes per token): a unit's instances are all held until the final shuffle.
                instances.append(Instance(array("i", tokens), array("b", segment_ids), is_random_next,
                                          array("i", positions), array("i", labels), source, stats))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def create_training_instances(documents: Sequence[Sequence[Sequence[int]]], sources: Sequence[str],
                              dupe_factor: int, p: Params, sp: Specials, rng: random.Random,
                              masker: Any = None, id_to_token: Sequence[str] | None = None) -> list[Instance]:
    """BERT's driver: drop empty documents, shuffle them, ``dupe_factor`` passes, shuffle instances."""
    kept = [(d, s) for d, s in zip(documents, sources) if d]
    order = list(range(len(kept)))
    rng.shuffle(order)  # same permutation, same RNG use, as BERT's rng.shuffle(all_documents)
    all_documents = [kept[i][0] for i in order]
    doc_sources = [kept[i][1] for i in order]
    instances: list[Instance] = []
    for _ in range(dupe_factor):
        for document_index in range(len(all_documents)):
            instances.extend(create_instances_from_document(all_documents, document_index, p, sp, rng,
                                                            doc_sources[document_index], masker, id_to_token))
    rng.shuffle(instances)
    return instances


def dynamic_mask(input_ids: Sequence[int], rng: random.Random, sp: Specials, masked_lm_prob: float = 0.15,
                 max_predictions_per_seq: int = 20, whole_word_mask: bool = False
                 ) -> tuple[list[int], list[int], list[int]]:
    """Masks for an unmasked instance at load time (dynamic masking): (input_ids, positions, labels)."""
    p = Params(len(input_ids), 0.0, masked_lm_prob, max_predictions_per_seq, whole_word_mask)
    out, positions, labels, _ = create_masked_lm_predictions(list(input_ids), p, sp, rng)
    return out, positions, labels


def group_sentences(document: Sequence[Sequence[int]], masker: Any, id_to_token: Sequence[str]) -> list:
    """Reorder a document so that sentences of the same entity type group are adjacent (seed 003).

    BERT packs *consecutive* sentences into one input, so putting each group's sentences next
    to each other (groups in order of their first sentence, document order inside a group) is
    what sends associated sentences into the same input. The "real next" segment of NSP is
    then the next sentence of the group rather than of the document.
    """
    from orchestrator.text.entity_masking import group_same_type

    groups = group_same_type([[id_to_token[t] for t in s] for s in document], masker)
    return [document[i] for group in groups for i in group]


def unit_rng(seed: int, max_seq_length: int, unit_id: int) -> random.Random:
    """A per-unit RNG: results do not depend on which worker runs a unit, or in what order."""
    return random.Random(f"{seed}:{max_seq_length}:{unit_id}")


# ---------------------------------------------------------------------------------------------
# Parquet output

def instance_schema():
    import pyarrow as pa

    return pa.schema([("input_ids", pa.list_(pa.int32())), ("token_type_ids", pa.list_(pa.int8())),
                      ("masked_lm_positions", pa.list_(pa.int32())), ("masked_lm_ids", pa.list_(pa.int32())),
                      ("next_sentence_label", pa.int8()), ("source", pa.string())])


def write_instances(instances: Sequence[Instance], path: Path) -> None:
    """One parquet shard, written to a temp name and renamed (a reader never sees half a file)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "input_ids": [x.input_ids for x in instances],
        "token_type_ids": [x.token_type_ids for x in instances],
        "masked_lm_positions": [x.masked_lm_positions for x in instances],
        "masked_lm_ids": [x.masked_lm_ids for x in instances],
        "next_sentence_label": [int(x.is_random_next) for x in instances],
        "source": [x.source for x in instances],
    }, schema=instance_schema())
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    pq.write_table(table, tmp)
    os.replace(tmp, path)


def summarize(instances: Iterable[Instance]) -> dict:
    """Counts for the manifest: per source instances/tokens, masked tokens, random-next share."""
    out: dict[str, Any] = {"instances": 0, "tokens": 0, "masked": 0, "random_next": 0,
                           "by_source": defaultdict(lambda: {"instances": 0, "tokens": 0}),
                           "entity": {"entities": 0, "masked_entities": 0, "protected": 0}}
    for x in instances:
        out["instances"] += 1
        out["tokens"] += len(x.input_ids)
        out["masked"] += len(x.masked_lm_positions)
        out["random_next"] += int(x.is_random_next)
        src = out["by_source"][x.source]
        src["instances"] += 1
        src["tokens"] += len(x.input_ids)
        if x.entity_stats:
            for k in out["entity"]:
                out["entity"][k] += int(x.entity_stats.get(k, 0))
    out["by_source"] = {k: dict(v) for k, v in out["by_source"].items()}
    return out


def merge_summaries(parts: Iterable[dict]) -> dict:
    total: dict[str, Any] = {"instances": 0, "tokens": 0, "masked": 0, "random_next": 0, "by_source": {},
                             "entity": {"entities": 0, "masked_entities": 0, "protected": 0}}
    for part in parts:
        for k in ("instances", "tokens", "masked", "random_next"):
            total[k] += part[k]
        for k in total["entity"]:
            total["entity"][k] += part["entity"][k]
        for src, c in part["by_source"].items():
            agg = total["by_source"].setdefault(src, {"instances": 0, "tokens": 0})
            agg["instances"] += c["instances"]
            agg["tokens"] += c["tokens"]
    return total


# ---------------------------------------------------------------------------------------------
# Ray Data worker

class UnitWorker:
    """A Ray Data actor: tokenizes member shards (cached), builds a unit's instances, writes its shard."""

    def __init__(self, tokenizer_dir: str, out_dir: str, seed: int, cfg: dict, max_seq_length: int,
                 cache_shards: int = 32):
        from tokenizers import Tokenizer

        from orchestrator.core.config import from_dict

        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        vocab = self.tokenizer.get_vocab()
        self.specials = Specials.from_vocab(vocab)
        self.id_to_token = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
        self.cfg: InstanceConfig = from_dict(InstanceConfig, cfg)
        self.params = Params(max_seq_length, self.cfg.short_seq_prob, self.cfg.masked_lm_prob,
                             self.cfg.max_predictions(max_seq_length), self.cfg.whole_word_mask,
                             self.cfg.masking == "static")
        self.masker = None
        if self.cfg.entity_masking is not None:
            from orchestrator.text.entity_masking import EntityMasker

            self.masker = EntityMasker(self.cfg.entity_masking)
        self.out_dir = Path(out_dir)
        self.seed = seed
        self.cache: OrderedDict[str, tuple[list, list]] = OrderedDict()
        self.cache_shards = cache_shards

    def tokenized_shard(self, path: str) -> tuple[list[list[array]], list[str]]:
        """All documents of a shard as lists of token-id arrays (one per sentence), LRU-cached."""
        if path in self.cache:
            self.cache.move_to_end(path)
            return self.cache[path]
        import pyarrow.parquet as pq

        table = pq.read_table(path, columns=["sentences", "source"]).to_pydict()
        flat = [s for doc in table["sentences"] for s in doc]
        encodings = self.tokenizer.encode_batch_fast(flat, add_special_tokens=False) if flat else []
        group = self.masker is not None and self.cfg.entity_masking.same_type_grouping
        docs, k = [], 0
        for doc in table["sentences"]:
            ids = [s for s in (array("i", e.ids) for e in encodings[k:k + len(doc)]) if len(s)]
            docs.append(group_sentences(ids, self.masker, self.id_to_token) if group and len(ids) > 1 else ids)
            k += len(doc)
        value = (docs, table["source"])
        self.cache[path] = value
        if len(self.cache) > self.cache_shards:
            self.cache.popitem(last=False)
        return value

    def __call__(self, batch: dict[str, Any]) -> dict[str, list]:
        out: dict[str, list] = {"unit_id": [], "summary": []}
        for unit_id, members, dupe in zip(batch["unit_id"], batch["members"], batch["dupe_factor"]):
            documents: list = []
            sources: list[str] = []
            for member in json.loads(members):
                docs, srcs = self.tokenized_shard(member["path"])
                rows = member["rows"] if member["rows"] is not None else range(len(docs))
                documents.extend(docs[r] for r in rows)
                sources.extend(srcs[r] for r in rows)
            rng = unit_rng(self.seed, self.params.max_seq_length, int(unit_id))
            instances = create_training_instances(documents, sources, int(dupe), self.params, self.specials, rng,
                                                  self.masker, self.id_to_token)
            if instances:
                write_instances(instances, self.out_dir / f"part-{int(unit_id):06d}.parquet")
            summary = summarize(instances)
            summary["documents"] = len([d for d in documents if d])
            out["unit_id"].append(int(unit_id))
            out["summary"].append(json.dumps(summary))
        return out


def run_units(units: Sequence[Any], tokenizer_dir: Path, out_dir: Path, cfg: InstanceConfig, max_seq_length: int,
              seed: int, workers: int, cpus_per_worker: float) -> dict:
    """Build every unit's instances on a pool of Ray Data actors; returns the merged summary.

    ``units`` are ``orchestrator.data.mixing.Unit``. Shards are written into ``out_dir`` as
    units finish; only the small per-unit summaries travel back to the driver.
    """
    import ray.data
    from tqdm import tqdm

    from orchestrator.core.config import to_dict

    rows = [{"unit_id": u.unit_id, "dupe_factor": u.dupe_factor,
             "members": json.dumps([{"path": m.path, "rows": list(m.rows) if m.rows is not None else None}
                                    for m in u.members])} for u in units]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, len(rows)))
    ds = ds.map_batches(UnitWorker, batch_size=1, compute=ray.data.ActorPoolStrategy(size=max(1, workers)),
                        num_cpus=cpus_per_worker,
                        fn_constructor_kwargs={"tokenizer_dir": str(tokenizer_dir), "out_dir": str(out_dir),
                                               "seed": seed, "cfg": to_dict(cfg), "max_seq_length": max_seq_length})
    summaries = []
    with tqdm(total=len(rows), desc=f"instances len{max_seq_length}", unit="unit", leave=False) as bar:
        for row in ds.iter_rows():
            summaries.append(json.loads(row["summary"]))
            bar.update(1)
    total = merge_summaries(summaries)
    total["document_uses"] = sum(s["documents"] for s in summaries)
    return total
