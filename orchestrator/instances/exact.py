"""BERT's ``create_pretraining_data`` per instance, step for step and RNG call for RNG call.

The reference port in ``benchmarks/reference_create_pretraining_data.py`` is matched instance
for instance (tested), on token ids (``array('i')`` per sentence) instead of strings. Used when
``instances.exact_reference_rng`` is set and always with entity-aware masking (with same-type
grouping, ``orchestrator.instances.grouped`` builds the inputs instead).
"""
from __future__ import annotations

import dataclasses
import random
from array import array
from collections.abc import Sequence
from typing import Any

from orchestrator.instances.config import Params, Specials
from orchestrator.instances.masking import create_masked_lm_predictions


@dataclasses.dataclass
class Instance:
    input_ids: Sequence[int]
    token_type_ids: Sequence[int]
    is_random_next: bool
    masked_lm_positions: Sequence[int]
    masked_lm_ids: Sequence[int]
    source: str
    entity_stats: dict | None = None
    cut: int = 0  # tokens of A and B that truncate_seq_pair removed to fit max_seq_length


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random
                      ) -> tuple[int, int]:
    """Truncate the longer segment one token at a time, from the front or back at random.

    Returns how many tokens left the front of A and of B (for callers that track positions)."""
    front = [0, 0]
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        side = 0 if len(tokens_a) > len(tokens_b) else 1
        trunc = tokens_b if side else tokens_a
        if rng.random() < 0.5:
            del trunc[0]
            front[side] += 1
        else:
            trunc.pop()
    return front[0], front[1]


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
                packed = len(tokens_a) + len(tokens_b)
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
                                          array("i", positions), array("i", labels), source, stats,
                                          packed - len(tokens_a) - len(tokens_b)))
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


def unit_rng(seed: int, max_seq_length: int, unit_id: int) -> random.Random:
    """A per-unit RNG: results do not depend on which worker runs a unit, or in what order."""
    return random.Random(f"{seed}:{max_seq_length}:{unit_id}")
