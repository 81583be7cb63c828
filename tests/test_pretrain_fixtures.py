"""Builds a real, tiny pretraining input for the pretrain tests: a WordPiece vocabulary trained with
``tokenizers`` on ../shared/data text, and NSP instances in the instances stage's parquet schema
with its manifest (docs/ARCHITECTURE.md). Stands in for the corpus stage, which is tested on its own.
"""
from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from orchestrator.core.manifest import file_sha256, write_manifest

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PUBMED = DATA / "pubmed_sample" / "PubMedAbstract_1MB.txt"
WIKI = DATA / "general_en" / "wikitext2_tokenized" / "valid.txt"


def documents(n_pubmed: int = 150, n_wiki: int = 150) -> list[list[str]]:
    """Documents as lists of sentences (naive split on '. ')."""
    pubmed = [line.strip() for line in PUBMED.read_text(encoding="utf-8").splitlines() if line.strip()][:n_pubmed]
    wiki = [line.strip() for line in WIKI.read_text(encoding="utf-8").splitlines()
            if len(line.strip()) > 200 and not line.strip().startswith("=")][:n_wiki]
    return [[s for s in re.split(r"(?<=\.)\s+", doc) if len(s) > 10] for doc in pubmed + wiki]


def build_tokenizer(docs: list[list[str]], out: Path, vocab_size: int = 1500) -> Path:
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizer

    out.mkdir(parents=True, exist_ok=True)
    wp = BertWordPieceTokenizer(lowercase=True)
    wp.train_from_iterator((s for d in docs for s in d), vocab_size=vocab_size, min_frequency=2)
    wp.save_model(str(out))
    vocab = {line.rstrip("\n"): i for i, line in enumerate((out / "vocab.txt").read_text(encoding="utf-8")
                                                           .splitlines(keepends=True))}
    BertTokenizer(vocab=vocab).save_pretrained(str(out))
    return out


def build_instances(docs: list[list[str]], tokenizer_dir: Path, out: Path, max_seq_length: int,
                    masking: str = "dynamic", seed: int = 0) -> Path:
    """NSP pairs ([CLS] A [SEP] B [SEP], B random half the time) written as one parquet shard + manifest."""
    from transformers import AutoTokenizer

    from orchestrator.instances.config import MaskingRule, Specials
    from orchestrator.instances.masking import mask_batch

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    special = Specials.from_tokenizer(tok)
    encoded = [[tok(s, add_special_tokens=False)["input_ids"] for s in d] for d in docs]
    encoded = [d for d in encoded if len(d) >= 2]
    rows = {k: [] for k in ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids",
                            "next_sentence_label", "source")}
    budget = max_seq_length - 3
    for di, doc in enumerate(encoded):
        for i in range(len(doc) - 1):
            a = doc[i]
            if rng.random() < 0.5:
                other = encoded[rng.choice([j for j in range(len(encoded)) if j != di])]
                b, label = other[rng.randrange(len(other))], 1
            else:
                b, label = doc[i + 1], 0
            a, b = list(a), list(b)
            while len(a) + len(b) > budget:
                (a if len(a) >= len(b) else b).pop()
            if not a or not b:
                continue
            ids = [tok.cls_token_id] + a + [tok.sep_token_id] + b + [tok.sep_token_id]
            types = [0] * (len(a) + 2) + [1] * (len(b) + 1)
            positions, originals = [], []
            if masking == "static":
                masked = np.array([ids])
                chosen, orig = mask_batch(masked, np.array([len(ids)]), MaskingRule(), special,
                                          special.continuation_mask(), nprng)
                ids, positions, originals = masked[0].tolist(), np.flatnonzero(chosen[0]).tolist(), orig.tolist()
            rows["input_ids"].append(ids)
            rows["token_type_ids"].append(types)
            rows["masked_lm_positions"].append(positions)
            rows["masked_lm_ids"].append(originals)
            rows["next_sentence_label"].append(label)
            rows["source"].append("pubmed" if di < 150 else "wiki")
    schema = pa.schema([("input_ids", pa.list_(pa.int32())), ("token_type_ids", pa.list_(pa.int8())),
                        ("masked_lm_positions", pa.list_(pa.int32())), ("masked_lm_ids", pa.list_(pa.int32())),
                        ("next_sentence_label", pa.int8()), ("source", pa.string())])
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    pq.write_table(pa.table(rows, schema=schema), out / "part-00000.parquet")
    n = len(rows["input_ids"])
    write_manifest(out, stage="instances", config={"max_seq_length": max_seq_length},
                   counts={"instances": n, "tokens": sum(map(len, rows["input_ids"]))},
                   extra={"max_seq_length": max_seq_length, "masking": masking, "vocab_size": len(tok),
                          "vocab_sha256": file_sha256(tokenizer_dir / "vocab.txt"), "masked_lm_prob": 0.15,
                          "max_predictions_per_seq": 20, "whole_word_mask": False})
    return out
