"""Instances on disk -> padded tensors for one micro-batch; input checks.

Pure functions (numpy in, numpy out) so collation is tested without Ray or torch. The parquet
schema is the instances stage's (``orchestrator.core.artifacts.instance_schema``): unpadded
``input_ids``, ``token_type_ids``, ``masked_lm_positions``/``masked_lm_ids`` (empty under
dynamic masking), ``next_sentence_label`` (0 = real next segment, 1 = random). Masks drawn at
load time come from the instances stage's own masking (``orchestrator.instances.masking``), with
the rule the instances manifest records: static and dynamic masking choose targets the same way.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from orchestrator.core.artifacts import InstanceInfo
from orchestrator.core.errors import InputError
from orchestrator.core.manifest import file_sha256
from orchestrator.instances.config import MaskingRule, Specials
from orchestrator.instances.masking import mask_batch

IGNORE_INDEX = -100


def masking_rule(info: InstanceInfo) -> MaskingRule:
    """The rule the instances stage recorded for this directory (used when its masking is dynamic)."""
    return MaskingRule(info.masked_lm_prob, info.max_predictions_per_seq, info.whole_word_mask)


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


def collate(rows: Mapping[str, Sequence], special: Specials, *, rule: MaskingRule | None = None,
            gen: np.random.Generator | None = None, continuation: np.ndarray | None = None,
            pad_to_multiple: int = 1) -> dict[str, np.ndarray]:
    """Pad a micro-batch (column -> per-row sequences) into model inputs.

    ``labels`` holds the original id at predicted positions and IGNORE_INDEX elsewhere. Static
    instances carry their masks; with a ``rule`` (dynamic masking) the masks are drawn here from
    ``gen`` by ``mask_batch``, a fresh draw every time a row is seen (``continuation``: the ## table
    of ``special``, computed once by the caller, needed for whole-word masking).
    """
    input_rows = rows["input_ids"]
    n = len(input_rows)
    lengths = np.fromiter((len(r) for r in input_rows), dtype=np.int64, count=n)
    width = -(-int(lengths.max()) // pad_to_multiple) * pad_to_multiple
    valid = np.arange(width)[None, :] < lengths[:, None]
    input_ids = np.full((n, width), special.pad, np.int64)
    input_ids[valid] = np.concatenate([np.asarray(r, np.int64) for r in input_rows])
    token_type = np.zeros((n, width), np.int64)
    token_type[valid] = np.concatenate([np.asarray(r, np.int64) for r in rows["token_type_ids"]])
    labels = np.full((n, width), IGNORE_INDEX, np.int64)
    if rule is not None:
        if gen is None:
            raise ValueError("dynamic masking needs a random generator")
        table = continuation if continuation is not None else special.continuation_mask()
        chosen, originals = mask_batch(input_ids, lengths, rule, special, table, gen)
        labels[chosen] = originals
    else:
        for i in range(n):
            labels[i, np.asarray(rows["masked_lm_positions"][i], np.int64)] = rows["masked_lm_ids"][i]
    return {"input_ids": input_ids, "token_type_ids": token_type, "attention_mask": valid.astype(np.int64),
            "labels": labels, "next_sentence_label": np.asarray(rows["next_sentence_label"], np.int64)}
