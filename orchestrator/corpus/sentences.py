"""Sentence splitting for documents that are not one-sentence-per-line (e.g. one abstract per line).

BERT's instance algorithm packs *sentences* into segments A/B, so every document must arrive
as a list of sentences. syntok is used because it works offline (NLTK's punkt needs a data
download) and splits ~1 MB of PubMed text per second in pure Python.
"""
from __future__ import annotations

from syntok import segmenter


def split_sentences(text: str) -> list[str]:
    """Split one document (one or more paragraphs) into sentences, keeping the original spacing."""
    out: list[str] = []
    for paragraph in segmenter.analyze(text):
        for sentence in paragraph:
            joined = "".join(token.spacing + token.value for token in sentence).strip()
            if joined:
                out.append(joined)
    return out


def has_letter(sentence: str) -> bool:
    """True when ``sentence`` holds a letter of any script (Unicode categories Lu, Ll, Lt, Lm, Lo:
    Latin, Cyrillic, Greek, CJK ideographs, kana, ...). Seed 002 drops sentences without letters
    ("filter out sentences that do not contain letters"): lines of numbers, tables, punctuation."""
    return any(ch.isalpha() for ch in sentence)
