"""BERT's masked-LM target choice, in one place for every caller.

- ``create_masked_lm_predictions``: the per-instance form, RNG call for RNG call BERT's
  (the exact path; entity-aware masking supplies the candidate positions);
- ``mask_batch``: the same rule for a batch of instances as numpy operations (the fast path);
  the pretraining collator calls it too, for instances written unmasked (``masking: dynamic``),
  with the ``MaskingRule`` the instances manifest records: masks drawn at load time follow the
  same rule as masks drawn when the instances were built. The augment stage's MLM head
  (``orchestrator.augment.mlm_head``) masks its training windows with it too;
- ``replacements``: the 80/10/10 replacement of the chosen targets (``_replacement`` its per-token,
  Python ``random`` form).
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np

from orchestrator.instances.config import MaskingRule, Params, Specials


def create_masked_lm_predictions(tokens: list[int], p: Params, sp: Specials, rng: random.Random,
                                 masker: Any = None, id_to_token: Sequence[str] | None = None,
                                 target: Sequence[int] | None = None, group: range | None = None
                                 ) -> tuple[list[int], list[int], list[int], dict | None]:
    """BERT's masking: shuffle candidate (whole-)words, take them until ~masked_lm_prob, 80/10/10.

    With an entity ``masker`` the patent's conditions replace BERT's rule (seed 003): at least
    ``masked_fraction`` of the text's tokens, special tokens not counted, rounded up, and no
    ``max_predictions_per_seq`` cap (condition 1 is a floor); the positions come from
    ``masker.select``, its first target the entity at ``target`` when given, entities outside
    ``group`` left visible (same-type grouping); only the 80/10/10 replacement is BERT's.
    """
    num_to_predict = min(p.max_predictions_per_seq, max(1, int(round(len(tokens) * p.masked_lm_prob))))
    output = list(tokens)
    stats = None
    if masker is not None:
        strings = [id_to_token[t] for t in tokens]
        chosen, stats = masker.select(strings, rng, masker.num_to_predict(strings), target, group)
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


def mask_batch(input_ids: np.ndarray, lengths: np.ndarray, p: MaskingRule, sp: Specials, continuation: np.ndarray,
               gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masked LM for a batch of instances, in place: (the [n, L] bool mask of targets, their original ids).

    ``input_ids`` is [n, L], padded beyond ``lengths``; ``continuation`` the bool table of ## ids
    (``Specials.continuation_mask``). Per instance: ``min(max_predictions, max(1, round(len *
    masked_lm_prob)))`` targets (``len`` counts [CLS] and [SEP], as BERT does) drawn
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
    original = input_ids[chosen]
    input_ids[chosen] = replacements(original, sp, gen)
    return chosen, original


def replacements(original: np.ndarray, sp: Specials, gen: np.random.Generator) -> np.ndarray:
    """BERT's 80/10/10 for the targets ``original`` (1-D ids): 80 % [MASK], 10 % kept, 10 % a random id
    of the vocabulary. The numpy form of ``_replacement`` (which draws RNG call for RNG call as BERT)."""
    count = len(original)
    keep_or_random = gen.random(count) >= 0.8
    random_id = gen.random(count) >= 0.5
    return np.where(~keep_or_random, sp.mask, np.where(random_id, gen.integers(0, sp.vocab_size, count), original))
