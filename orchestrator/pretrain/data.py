"""Instances on disk -> padded tensors for one micro-batch; dynamic masking; input checks.

Pure functions (numpy in, numpy out) so masking and collation are tested without Ray or torch.
The parquet schema is the instances stage's (docs/ARCHITECTURE.md): unpadded ``input_ids``,
``token_type_ids``, ``masked_lm_positions``/``masked_lm_ids`` (empty under dynamic masking),
``next_sentence_label`` (0 = real next segment, 1 = random), ``source``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from orchestrator.core.artifacts import InstanceInfo
from orchestrator.core.errors import InputError
from orchestrator.core.manifest import file_sha256

IGNORE_INDEX = -100


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    """Token ids the masking needs; ``never_mask`` are ids that are never chosen for prediction."""
    pad: int
    mask: int
    vocab_size: int
    never_mask: tuple[int, ...]


def check_vocab_matches(info: InstanceInfo, tokenizer_dir: Path, tokenizer_vocab_size: int) -> None:
    """Refuse instances built with another vocabulary: ids would index the wrong embeddings."""
    vocab_txt = Path(tokenizer_dir) / "vocab.txt"
    if not vocab_txt.is_file():
        raise InputError(tokenizer_dir, "tokenizer directory has no vocab.txt", expected="a WordPiece vocab")
    sha = file_sha256(vocab_txt)
    if sha != info.vocab_sha256 or tokenizer_vocab_size != info.vocab_size:
        raise InputError(info.path / "manifest.json",
                         f"instances were built with another vocabulary (vocab_size {info.vocab_size}, "
                         f"vocab_sha256 {info.vocab_sha256[:12]}) than the tokenizer in {tokenizer_dir} "
                         f"(vocab_size {tokenizer_vocab_size}, vocab_sha256 {sha[:12]})",
                         expected="instances and tokenizer from the same corpus run")


def predictions_cap(max_predictions_per_seq: int, max_seq_length: int) -> int:
    """BERT's cap of 20 predictions at length 128 scales with length (80 at 512)."""
    return max(1, round(max_predictions_per_seq * max_seq_length / 128))


def dynamic_mask(input_ids: np.ndarray, rng: np.random.Generator, special: SpecialIds, probability: float,
                 max_predictions: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BERT masking of one unpadded sequence: choose ~probability of the maskable tokens (at least one,
    at most ``max_predictions``); of those 80% -> [MASK], 10% -> a random token, 10% unchanged.

    Returns (masked input ids, positions, original ids at those positions).
    """
    ids = np.asarray(input_ids, dtype=np.int64)
    candidates = np.flatnonzero(~np.isin(ids, special.never_mask))
    if candidates.size == 0:
        return ids.copy(), np.zeros(0, np.int64), np.zeros(0, np.int64)
    n = min(max_predictions, max(1, int(round(candidates.size * probability))))
    positions = np.sort(rng.choice(candidates, size=n, replace=False))
    originals = ids[positions].copy()
    out = ids.copy()
    roll = rng.random(n)
    out[positions[roll < 0.8]] = special.mask
    rand_pos = positions[(roll >= 0.8) & (roll < 0.9)]
    out[rand_pos] = rng.integers(0, special.vocab_size, size=rand_pos.size)
    return out, positions, originals


def collate(rows: Mapping[str, Sequence], special: SpecialIds, *, dynamic: bool, rng: np.random.Generator | None,
            probability: float = 0.15, max_predictions: int = 20, pad_to_multiple: int = 1) -> dict[str, np.ndarray]:
    """Pad a micro-batch (column -> per-row sequences) into model inputs.

    ``labels`` holds the original id at predicted positions and IGNORE_INDEX elsewhere. With
    ``dynamic`` the masks are drawn here from ``rng`` (a fresh draw every time a row is seen).
    """
    input_rows = rows["input_ids"]
    n = len(input_rows)
    length = max(len(r) for r in input_rows)
    length = -(-length // pad_to_multiple) * pad_to_multiple
    input_ids = np.full((n, length), special.pad, np.int64)
    token_type = np.zeros((n, length), np.int64)
    attention = np.zeros((n, length), np.int64)
    labels = np.full((n, length), IGNORE_INDEX, np.int64)
    for i in range(n):
        ids = np.asarray(input_rows[i], np.int64)
        if dynamic:
            if rng is None:
                raise ValueError("dynamic masking needs an rng")
            ids, positions, originals = dynamic_mask(ids, rng, special, probability, max_predictions)
        else:
            positions = np.asarray(rows["masked_lm_positions"][i], np.int64)
            originals = np.asarray(rows["masked_lm_ids"][i], np.int64)
        k = len(ids)
        input_ids[i, :k] = ids
        token_type[i, :k] = np.asarray(rows["token_type_ids"][i], np.int64)
        attention[i, :k] = 1
        labels[i, positions] = originals
    return {"input_ids": input_ids, "token_type_ids": token_type, "attention_mask": attention, "labels": labels,
            "next_sentence_label": np.asarray(rows["next_sentence_label"], np.int64)}
