"""Pretraining instances: BERT's ``create_pretraining_data`` algorithm run as a Ray Data stream.

The algorithm (google-research/bert ``create_pretraining_data.py``): target length with
``short_seq_prob``, segments A/B from a chunk of sentences, a random next segment from another
document half of the time (unused sentences put back), ``truncate_seq_pair``, masked LM with
80/10/10 and ``max_predictions_per_seq``, optional whole-word masking, ``dupe_factor`` passes.
It exists here in two forms:

- the *vectorised* path (default): sentence packing walks integer offsets only, truncation,
  the instance shuffle and masking are numpy operations over batches of instances, and the
  parquet columns are built from the arrays. Same steps and distributions as BERT (tested
  statistically), not the same random stream; ~10x faster than the per-instance form.
- the *exact* path (``instances.exact_reference_rng: true``, and always with entity masking):
  step for step and RNG call for RNG call the reference port in
  ``benchmarks/reference_create_pretraining_data.py`` (tested instance for instance), on token
  ids (``array('i')`` per sentence) instead of strings.

Each mixing *unit* (a set of shards, see ``orchestrator.data.mixing``) is one run of the
algorithm with an RNG seeded by (seed, max_seq_length, unit id), so output does not depend on
the worker count; units run as Ray Data tasks that write one parquet shard each as soon as
it is finished.
"""
from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import json
import math
import os
import random
from array import array
from collections import OrderedDict, defaultdict
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Sequence

import numpy as np

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError
from orchestrator.text.encoding import SentenceEncoder, run_indices
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
    exact_reference_rng: bool = field(
        False, help="run BERT's per-instance Python algorithm, random call for random call as the reference "
                    "port (slow; for equivalence checks). Default: the vectorised path, same distributions. "
                    "Entity masking always uses the per-instance path")

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

    def continuation_mask(self) -> np.ndarray:
        """``continuation`` as a bool lookup table over ids, for the vectorised whole-word masking."""
        mask = np.zeros(self.vocab_size, dtype=bool)
        mask[list(self.continuation)] = True
        return mask


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
# Vectorised path (the default): same algorithm and distributions, numpy arrays, no per-token objects

@dataclasses.dataclass(frozen=True)
class TokenizedDocs:
    """Documents as flat arrays: every token of every sentence in ``ids``, sentences and documents as offsets.

    A document ``d`` is sentences ``doc_starts[d]:doc_starts[d + 1]``; sentence ``s`` is
    ``ids[sent_starts[s]:sent_starts[s + 1]]``. Sentences without tokens are dropped (as in the
    exact path); documents left empty are kept so that row numbers stay those of the shard, and
    are dropped by ``instance_batches``. The packing loop then touches only integers.
    """

    ids: np.ndarray          # int32 [tokens]
    sent_starts: np.ndarray  # int64 [sentences + 1]
    doc_starts: np.ndarray   # int64 [documents + 1]
    sources: list[str]       # per document

    @classmethod
    def from_sentence_ids(cls, docs: Sequence[Sequence[Sequence[int]]], sources: Sequence[str]) -> "TokenizedDocs":
        kept = [([s for s in d if len(s)], src) for d, src in zip(docs, sources)]
        lengths = [len(s) for d, _ in kept for s in d]
        ids = np.fromiter(itertools.chain.from_iterable(s for d, _ in kept for s in d), dtype=np.int32,
                          count=sum(lengths))
        return cls(ids, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]),
                   np.concatenate([[0], np.cumsum([len(d) for d, _ in kept], dtype=np.int64)]),
                   [src for _, src in kept])

    def select(self, rows: Sequence[int]) -> "TokenizedDocs":
        """The documents ``rows`` (in that order) as a new, compact TokenizedDocs."""
        rows = np.asarray(rows, dtype=np.int64)
        first, last = self.doc_starts[rows], self.doc_starts[rows + 1]
        n_sent = last - first
        sent_idx = run_indices(first, n_sent)
        lengths = self.sent_starts[sent_idx + 1] - self.sent_starts[sent_idx]
        tok_idx = run_indices(self.sent_starts[sent_idx], lengths)
        return TokenizedDocs(self.ids[tok_idx], np.concatenate([[0], np.cumsum(lengths)]),
                             np.concatenate([[0], np.cumsum(n_sent)]), [self.sources[r] for r in rows.tolist()])

    @classmethod
    def concat(cls, parts: Sequence["TokenizedDocs"]) -> "TokenizedDocs":
        tok_base = np.cumsum([0] + [len(p.ids) for p in parts])
        sent_base = np.cumsum([0] + [len(p.sent_starts) - 1 for p in parts])
        return cls(np.concatenate([p.ids for p in parts]) if parts else np.zeros(0, np.int32),
                   np.concatenate([[0]] + [p.sent_starts[1:] + b for p, b in zip(parts, tok_base)]),
                   np.concatenate([[0]] + [p.doc_starts[1:] + b for p, b in zip(parts, sent_base)]),
                   [s for p in parts for s in p.sources])

    @property
    def n_docs(self) -> int:
        return len(self.doc_starts) - 1

    @property
    def nbytes(self) -> int:
        return self.ids.nbytes + self.sent_starts.nbytes + self.doc_starts.nbytes


@dataclasses.dataclass(frozen=True)
class Spans:
    """Planned instances before token assembly: segment A is ``ids[a_start:a_start + a_len]``, B likewise."""

    a_start: np.ndarray
    a_len: np.ndarray
    b_start: np.ndarray
    b_len: np.ndarray
    is_random_next: np.ndarray  # bool
    doc: np.ndarray             # document of segment A (for provenance)

    def take(self, index: np.ndarray) -> "Spans":
        return Spans(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))


def plan_spans(docs: TokenizedDocs, dupe_factor: int, max_seq_length: int, short_seq_prob: float,
               rng: random.Random) -> Spans:
    """BERT's document packing (``create_instances_from_document``) on sentence offsets only.

    Same steps and distributions as the exact path — one target length per document and pass
    (``short_seq_prob``), A = the first ``randint(1, n - 1)`` sentences of the chunk, B the rest
    or (chunk of one, or a fair coin) a run of sentences from a random other document with the
    unused sentences put back — but each segment is an offset range, so no token is copied here.
    Truncation is left to ``truncate_spans``.
    """
    draw = rng.random

    def randint(lo: int, hi: int) -> int:  # uniform on [lo, hi] like rng.randint, at a fraction of its cost
        return lo + int(draw() * (hi - lo + 1))

    starts = docs.sent_starts.tolist()
    doc_starts = docs.doc_starts.tolist()
    n_docs = docs.n_docs
    order = list(range(n_docs))
    rng.shuffle(order)
    max_num_tokens = max_seq_length - 3
    a_start: list[int] = []
    a_len: list[int] = []
    b_start: list[int] = []
    b_len: list[int] = []
    is_random: list[bool] = []
    doc_of: list[int] = []
    for _ in range(dupe_factor):
        for document_index, d in enumerate(order):
            first, last = doc_starts[d], doc_starts[d + 1]
            target = max_num_tokens
            if draw() < short_seq_prob:
                target = randint(2, max_num_tokens)
            chunk = first
            while chunk < last:
                # the chunk grows one sentence at a time until it reaches the target length or
                # the document ends: its last sentence i is found by bisection on the offsets
                i = bisect.bisect_left(starts, starts[chunk] + target, chunk + 1, last) - 1
                n_chunk = i + 1 - chunk
                a_end = chunk + (randint(1, n_chunk - 1) if n_chunk >= 2 else 1)
                a_lo, a_hi = starts[chunk], starts[a_end]
                if n_chunk == 1 or draw() < 0.5:
                    for _ in range(10):
                        r = randint(0, n_docs - 1)
                        if r != document_index:
                            break
                    rd = order[r]
                    r_first, r_last = doc_starts[rd], doc_starts[rd + 1]
                    s = r_first + randint(0, r_last - r_first - 1)
                    b_lo = starts[s]
                    # sentences s.. until B reaches target - len(A) (at least one sentence)
                    end = min(bisect.bisect_left(starts, b_lo + target - (a_hi - a_lo), s + 1, r_last + 1), r_last)
                    b_hi = starts[end]
                    random_next = True
                    i = a_end - 1  # put the unused sentences back
                else:
                    b_lo, b_hi = a_hi, starts[i + 1]
                    random_next = False
                a_start.append(a_lo)
                a_len.append(a_hi - a_lo)
                b_start.append(b_lo)
                b_len.append(b_hi - b_lo)
                is_random.append(random_next)
                doc_of.append(d)
                chunk = i + 1
    a_start_, a_len_, b_start_, b_len_, doc_ = (np.asarray(x, dtype=np.int64)
                                                for x in (a_start, a_len, b_start, b_len, doc_of))
    return Spans(a_start_, a_len_, b_start_, b_len_, np.asarray(is_random, dtype=bool), doc_)


def truncate_spans(spans: Spans, max_num_tokens: int, gen: np.random.Generator) -> Spans:
    """``truncate_seq_pair`` for all instances at once, with the same distribution.

    The loop always trims the longer side (B on a tie), so how many tokens each side loses is
    fixed: the longer side down to the shorter, then alternately B, A. Which end each removed
    token comes from is a fair coin per token, i.e. ``Binomial(removed, 0.5)`` from the front.
    """
    la, lb = spans.a_len, spans.b_len
    excess = np.maximum(la + lb - max_num_tokens, 0)
    first_a = np.clip(np.minimum(excess, la - lb), 0, None)
    first_b = np.clip(np.minimum(excess, lb - la), 0, None)
    rest = excess - first_a - first_b
    cut_a, cut_b = first_a + rest // 2, first_b + (rest + 1) // 2
    front_a, front_b = gen.binomial(cut_a, 0.5), gen.binomial(cut_b, 0.5)
    return dataclasses.replace(spans, a_start=spans.a_start + front_a, a_len=la - cut_a,
                               b_start=spans.b_start + front_b, b_len=lb - cut_b)


def assemble(ids: np.ndarray, spans: Spans, max_seq_length: int, sp: Specials
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``[CLS] A [SEP] B [SEP]`` for a batch of spans.

    ``ids`` is the unit's token array followed by the [CLS] and [SEP] ids (``instance_batches``
    appends them), so every instance is five runs of one gather. Returns (input_ids [n, L]
    padded with 0, valid [n, L] bool, token_type_ids flat, lengths).
    """
    n = len(spans.a_len)
    lengths = spans.a_len + spans.b_len + 3
    cls_at, sep_at = len(ids) - 2, len(ids) - 1
    run_len = np.stack([np.ones(n, np.int64), spans.a_len, np.ones(n, np.int64), spans.b_len,
                        np.ones(n, np.int64)], axis=1).ravel()
    run_src = np.stack([np.full(n, cls_at), spans.a_start, np.full(n, sep_at), spans.b_start,
                        np.full(n, sep_at)], axis=1).ravel()
    flat = ids[run_indices(run_src, run_len)]
    segments = np.repeat(np.tile(np.array([0, 0, 0, 1, 1], dtype=np.int8), n), run_len)
    valid = np.arange(max_seq_length)[None, :] < lengths[:, None]
    padded = np.zeros((n, max_seq_length), dtype=np.int32)
    padded[valid] = flat
    return padded, valid, segments, lengths


def mask_batch(input_ids: np.ndarray, lengths: np.ndarray, p: Params, sp: Specials, continuation: np.ndarray,
               gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masked LM for a batch of instances, in place: (the [n, L] bool mask of targets, their original ids).

    Per instance: ``min(max_predictions, max(1, round(len * masked_lm_prob)))`` targets drawn
    uniformly without replacement among the non-special tokens (random keys, smallest k) —
    with ``whole_word_mask`` among whole words, taken in random order and skipped when they
    would overflow, exactly BERT's greedy rule — then 80 % [MASK], 10 % kept, 10 % a random id.
    """
    n, width = input_ids.shape
    j = np.arange(width)[None, :]
    cand = (j < lengths[:, None]) & (input_ids != sp.cls) & (input_ids != sp.sep)
    n_pred = np.minimum(p.max_predictions_per_seq,
                        np.maximum(1, np.rint(lengths * p.masked_lm_prob).astype(np.int64)))
    keys = gen.random((n, width))
    rows = np.arange(n)
    if not p.whole_word_mask:
        keys[~cand] = 2.0
        k = min(p.max_predictions_per_seq, width)
        smallest = np.partition(keys, k - 1, axis=1)[:, :k]
        smallest.sort(axis=1)
        chosen = cand & (keys <= smallest[rows, np.minimum(n_pred, k) - 1][:, None])
    else:
        # a word starts at every candidate that is not a ## piece (and at each row's first candidate)
        first = cand & (np.cumsum(cand, axis=1) == 1)
        starts = cand & (~continuation[input_ids] | first)
        word = np.cumsum(starts, axis=1) - 1
        word_len = np.zeros((n, width), dtype=np.int64)
        np.add.at(word_len, (np.broadcast_to(rows[:, None], word.shape)[cand], word[cand]), 1)
        keys[~starts] = 2.0
        ranked = np.argsort(keys, axis=1)  # word starts in random order first
        n_words = starts.sum(axis=1)
        taken = np.zeros(n, dtype=np.int64)
        take = np.zeros((n, width), dtype=bool)
        for r in range(int(n_words.max(initial=0))):
            w = word[rows, ranked[:, r]]
            size = word_len[rows, w]
            fits = (r < n_words) & (taken + size <= n_pred)
            taken += np.where(fits, size, 0)
            take[rows[fits], w[fits]] = True
            if (taken >= n_pred).all():
                break
        chosen = cand & take[rows[:, None], np.maximum(word, 0)]
    count = int(chosen.sum())
    original = input_ids[chosen]
    keep_or_random = gen.random(count) >= 0.8
    random_id = gen.random(count) >= 0.5
    replacement = np.where(~keep_or_random, sp.mask,
                           np.where(random_id, gen.integers(0, sp.vocab_size, count), original))
    input_ids[chosen] = replacement
    return chosen, original


def instance_batches(docs: TokenizedDocs, dupe_factor: int, p: Params, sp: Specials, continuation: np.ndarray,
                     rng: random.Random, batch_size: int = 4096) -> Iterator[tuple[Any, dict]]:
    """BERT's ``create_training_instances`` on flat arrays: (parquet record batch, summary) per batch.

    Documents are shuffled and packed ``dupe_factor`` times (``plan_spans``), truncated, and
    the instances shuffled, all as offset arrays; tokens are then gathered and masked a batch
    at a time, so memory holds the offsets of a unit plus one padded batch, not every token.
    """
    docs = docs.select(np.flatnonzero(np.diff(docs.doc_starts) > 0))  # BERT drops empty documents
    gen = np.random.default_rng(rng.getrandbits(128))
    spans = plan_spans(docs, dupe_factor, p.max_seq_length, p.short_seq_prob, rng)
    spans = truncate_spans(spans, p.max_seq_length - 3, gen)
    spans = spans.take(gen.permutation(len(spans.a_len)))  # BERT's final rng.shuffle(instances)
    names = sorted(set(docs.sources))
    doc_source = np.asarray([names.index(s) for s in docs.sources] if names else [], dtype=np.int32)
    ids = np.concatenate([docs.ids, np.array([sp.cls, sp.sep], dtype=np.int32)])
    for lo in range(0, len(spans.a_len), batch_size):
        part = spans.take(slice(lo, lo + batch_size))
        input_ids, valid, segments, lengths = assemble(ids, part, p.max_seq_length, sp)
        if p.static_masking:
            chosen, labels = mask_batch(input_ids, lengths, p, sp, continuation, gen)
        else:
            chosen, labels = np.zeros(input_ids.shape, dtype=bool), np.zeros(0, dtype=np.int32)
        source = doc_source[part.doc]
        yield _record_batch(input_ids[valid], segments, lengths, chosen, labels, part.is_random_next, source,
                            names), {
            "instances": len(lengths), "tokens": int(lengths.sum()), "masked": int(chosen.sum()),
            "random_next": int(part.is_random_next.sum()),
            "by_source": {names[k]: {"instances": int(n), "tokens": int(t)} for k, (n, t) in enumerate(zip(
                np.bincount(source, minlength=len(names)),
                np.bincount(source, weights=lengths, minlength=len(names)).astype(np.int64))) if n},
            "entity": {"entities": 0, "masked_entities": 0, "protected": 0}}


def _record_batch(input_ids: np.ndarray, segments: np.ndarray, lengths: np.ndarray, chosen: np.ndarray,
                  labels: np.ndarray, is_random_next: np.ndarray, source: np.ndarray, names: list[str]):
    """Ragged parquet columns straight from flat arrays (row-major order keeps masked positions sorted)."""
    import pyarrow as pa

    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    _, positions = np.nonzero(chosen)
    mask_offsets = pa.array(np.concatenate([[0], np.cumsum(chosen.sum(axis=1))]).astype(np.int32))
    columns = [pa.ListArray.from_arrays(offsets, pa.array(input_ids)),
               pa.ListArray.from_arrays(offsets, pa.array(segments)),
               pa.ListArray.from_arrays(mask_offsets, pa.array(positions.astype(np.int32))),
               pa.ListArray.from_arrays(mask_offsets, pa.array(labels.astype(np.int32))),
               pa.array(is_random_next.astype(np.int8)),
               pa.DictionaryArray.from_arrays(pa.array(source), pa.array(names, pa.string())).dictionary_decode()]
    return pa.RecordBatch.from_arrays(columns, schema=instance_schema())


def write_batches(batches: Iterable[tuple[Any, dict]], path: Path) -> dict:
    """Stream record batches into one parquet shard (temp name, then rename); returns the merged summary.

    No file is written when there are no instances.
    """
    import pyarrow.parquet as pq

    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    writer = None
    summaries = []
    try:
        for batch, summary in batches:
            if writer is None:
                # no general-purpose codec (dictionary-encoded ids are already ~3x smaller; snappy
                # saved 8 % of the bytes for a quarter of the write time) and no column statistics
                # (no reader filters instances by value): together ~35 % less write time
                writer = pq.ParquetWriter(tmp, batch.schema, compression="none", write_statistics=False)
            writer.write_batch(batch)
            summaries.append(summary)
    finally:
        if writer is not None:
            writer.close()
    if writer is not None:
        os.replace(tmp, path)
    return merge_summaries(summaries)


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

class ShardTokens:
    """Shards tokenized into TokenizedDocs, LRU-cached per worker process and tokenizer.

    One per process (``shard_tokens``), not per run: a build makes instances at several
    lengths (128, then 512) from the same shards, and a worker that meets a shard again tokenizes
    it once. Entries are keyed by path, size and modification time, so a rewritten file is read
    again; the encoder's word cache is shared the same way.
    """

    def __init__(self, tokenizer_dir: str, cache_bytes: int = 256 << 20):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
        self.encoder = SentenceEncoder(self.tokenizer)
        self.cache: OrderedDict[tuple, TokenizedDocs] = OrderedDict()
        self.cache_bytes = cache_bytes  # ~4 bytes a token: 256 MB hold ~25 seed-size (10 MB) shards

    def get(self, path: str) -> TokenizedDocs:
        import pyarrow.parquet as pq

        stat = os.stat(path)
        key = (path, stat.st_size, stat.st_mtime_ns)
        if key in self.cache:
            self.cache.move_to_end(key)
            return self.cache[key]
        table = pq.read_table(path, columns=["sentences", "source"])
        sentences = table.column("sentences").combine_chunks()
        sources = table.column("source").to_pylist()
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
        from orchestrator.core.config import from_dict

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
            from orchestrator.text.entity_masking import EntityMasker

            self.masker = EntityMasker(self.cfg.entity_masking)
        self.exact = self.cfg.exact_reference_rng or self.masker is not None
        self.out_dir = Path(out_dir)
        self.seed = seed
        self.cache: OrderedDict[str, tuple] = OrderedDict()  # the exact path's form of shards (masker-dependent)
        self.cache_shards = cache_shards

    def tokenized_shard(self, path: str) -> Any:
        """A shard's documents, tokenized once per process (``ShardTokens``): TokenizedDocs, or for the
        exact path (lists of per-sentence id arrays, sources), grouped by entity association when
        asked; the exact form is LRU-cached per worker beside the tokens it came from."""
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
        group = self.masker is not None and self.cfg.entity_masking.same_type_grouping
        out = []
        for d in range(docs.n_docs):
            bounds = docs.sent_starts[docs.doc_starts[d]:docs.doc_starts[d + 1] + 1]
            ids = [array("i", docs.ids[a:b].tobytes()) for a, b in zip(bounds[:-1], bounds[1:])]
            out.append(group_sentences(ids, self.masker, self.id_to_token) if group and len(ids) > 1 else ids)
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
        instances = create_training_instances(documents, sources, dupe_factor, self.params, self.specials, rng,
                                              self.masker, self.id_to_token)
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


def unit_work_bytes(unit: Any) -> int:
    """Text a unit turns into instances, in shard-file bytes times its passes (a cost estimate)."""
    total = 0
    for member in unit.members:
        size = os.path.getsize(member.path)
        if member.rows is not None:
            import pyarrow.parquet as pq

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


def run_units(units: Sequence[Any], tokenizer_dir: Path, out_dir: Path, cfg: InstanceConfig, max_seq_length: int,
              seed: int, workers: int, cpus_per_worker: float) -> dict:
    """Build every unit's instances as Ray Data tasks (at most ``workers`` at once); returns the merged summary.

    ``units`` are ``orchestrator.data.mixing.Unit``. Shards are written into ``out_dir`` as
    units finish; only the small per-unit summaries travel back to the driver.
    """
    import ray.data
    from tqdm import tqdm

    from orchestrator.core.config import to_dict

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
