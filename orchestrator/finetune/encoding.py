"""A task split tokenised for the model (``Encoded``): ``encode`` and its JSON cache (``encode_cached``).

Inputs longer than the trial's ``max_seq_length`` word pieces are cut (a pair by ``longest_first``, as BERT's
and BLUE's scripts cut it); ``Encoded.cut`` counts them, and the trial's record and log say how many. An NER
sentence keeps every gold tag: its words past the cut, and a word of no word piece at all (a zero-width space,
a soft hyphen, a lone combining accent), are predicted ``O``, each word read from its own first piece.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import weakref
from pathlib import Path
from typing import Any

import torch

from orchestrator.core.config import to_dict
from orchestrator.core.manifest import atomic_write_json, private_dir
from orchestrator.finetune.readers import Example
from orchestrator.finetune.spec import TaskSpec
from orchestrator.finetune.tokenizer import class_name, tokenizer_settings
from orchestrator.finetune.trial import TrialSpec

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Encoded:
    """A tokenised split: features per example, plus what scoring needs."""

    features: list[dict[str, list[int]]]
    targets: list[Any]
    examples: list[Example]
    # NER: per word, the token position of its first piece, -1 for a word of no piece; words past the last
    # entry were cut by the length limit
    word_index: list[list[int]] | None = None
    cut: int = 0  # examples longer than the length limit, cut to it
    # device -> the split padded into tensors on it (``_on_device``): built once, sliced by every batch
    tensors: dict[str, tuple[dict[str, torch.Tensor], torch.Tensor, list[int]]] = dataclasses.field(
        default_factory=dict, repr=False, compare=False)


def _encoding_key(spec: TaskSpec, trial: TrialSpec, split: str, examples: list[Example], tokenizer) -> str:
    """Everything the tokenised tensors depend on: the examples' text, the tokenizer's vocabulary
    and settings, the length limit, the task's label order (targets are label indices).

    The key is ``content_key([type, lower-casing, sorted vocabulary, settings (``tokenizer_settings``),
    length, family, labels, split (, sub-word labelling)], examples)``; the tokenizer's part (a 30k-entry
    vocabulary: about a second to list, sort and serialise) is hashed once per tokenizer object (``_tokenizer_hash``)
    and the rest added to a copy of that hash, which gives the same key."""
    labelling = [spec.subword_labels] if spec.subword_labels != "first" else []  # the default keeps its keys
    rest = [trial.max_seq_length, spec.family, list(spec.labels), split, *labelling]
    digest = _tokenizer_hash(tokenizer).copy()
    digest.update("".join(", " + _canonical(p) for p in rest).encode())
    digest.update(("], " + _canonical([[ex.text_a, ex.text_b, ex.label] for ex in examples]) + "]").encode())
    return digest.hexdigest()[:24]


def _canonical(value: Any) -> str:
    """``value``'s JSON as ``content_key`` writes it (one item of its list)."""
    return json.dumps(to_dict(value), sort_keys=True, default=str)


_TOKENIZER_HASHES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _tokenizer_hash(tokenizer) -> Any:
    """sha256 fed with the start of ``_encoding_key``'s JSON text up to the tokenizer's vocabulary, once
    per tokenizer object (a process keeps its tokenizers: ``_process_cached``)."""
    if tokenizer not in _TOKENIZER_HASHES:
        head = [class_name(tokenizer), getattr(tokenizer, "do_lower_case", None),
                sorted(tokenizer.get_vocab().items()), tokenizer_settings(tokenizer)]
        # json.dumps as content_key's _canonical writes these plain lists and dicts, without its to_dict walk
        # of a 30k-entry vocabulary (about 0.2 s a tokenizer)
        text = ", ".join(json.dumps(part, sort_keys=True) for part in head)
        _TOKENIZER_HASHES[tokenizer] = hashlib.sha256(("[[" + text).encode())
    return _TOKENIZER_HASHES[tokenizer]


def encode_cached(spec: TaskSpec, trial: TrialSpec, split: str, examples: list[Example], tokenizer) -> Encoded:
    """``encode`` through a JSON cache in ``trial.cache_dir``: every trial of a (task, tokenizer)
    after the first reads the tokenised split instead of tokenising it again."""
    if not trial.cache_dir:
        return encode(spec, examples, tokenizer, trial.max_seq_length)
    # a task under a data-use agreement keeps its token ids (its text, reversibly) in an owner-only folder
    cache_dir = private_dir(Path(trial.cache_dir) / "restricted") if spec.restricted else Path(trial.cache_dir)
    path = cache_dir / f"{_encoding_key(spec, trial, split, examples, tokenizer)}.json"
    if path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            with contextlib.suppress(OSError):  # read now: kept by prune_encoded (a read-only folder keeps all)
                os.utime(path)
            if "cut" in data:  # else written before the cut was counted (and NER's word index was per word)
                return Encoded(data["features"], data["targets"], examples, data["word_index"], data["cut"])
        except (json.JSONDecodeError, KeyError):
            log.warning("unreadable encoding cache %s: tokenising again", path)
    enc = encode(spec, examples, tokenizer, trial.max_seq_length)
    atomic_write_json(path, {"features": enc.features, "targets": enc.targets, "word_index": enc.word_index,
                             "cut": enc.cut}, private=spec.restricted)
    return enc


def encode(spec: TaskSpec, examples: list[Example], tokenizer, max_len: int) -> Encoded:
    if spec.family == "ner":
        return _encode_ner(spec, examples, tokenizer, max_len)
    feats, targets, cut = [], [], 0
    for ex in examples:
        # one piece over the limit tells a cut input (cutting it again gives longest_first's cut to max_len)
        enc = tokenizer(ex.text_a, ex.text_b, truncation=True, max_length=max_len + 1)
        if len(enc["input_ids"]) > max_len:
            cut += 1
            enc = tokenizer(ex.text_a, ex.text_b, truncation=True, max_length=max_len)
        feats.append({k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc})
        if spec.family == "sts":
            targets.append(float(ex.label))
        elif spec.family == "multilabel":
            row = [0.0] * len(spec.labels)
            for i in ex.label:
                row[i] = 1.0
            targets.append(row)
        else:
            targets.append(spec.labels.index(ex.label))
    return Encoded(feats, targets, examples, cut=cut)


def _encode_ner(spec: TaskSpec, examples: list[Example], tokenizer, max_len: int) -> Encoded:
    """Word tags onto sub-word positions: each word's first sub-word carries its tag, and with
    ``spec.subword_labels == "all"`` (seed 001) every further sub-word carries it too; the rest, and
    [CLS]/[SEP], are ignored by the loss (-100). A word is predicted from its first sub-word; a word of no
    sub-word (a zero-width space) is -1 in ``word_index``, so the words after it keep their own positions
    (they took the position of the word before them, every later tag one word early)."""
    every = spec.subword_labels == "all"
    feats, targets, word_index, cut = [], [], [], 0
    for ex in examples:
        enc = tokenizer(list(ex.text_a), is_split_into_words=True, truncation=True, max_length=max_len + 1)
        if len(enc["input_ids"]) > max_len:
            cut += 1
            enc = tokenizer(list(ex.text_a), is_split_into_words=True, truncation=True, max_length=max_len)
        labels, firsts = [], [-1] * len(ex.text_a)
        for pos, w in enumerate(enc.word_ids()):
            if w is None or (firsts[w] >= 0 and not every):
                labels.append(-100)
                continue
            if firsts[w] < 0:
                firsts[w] = pos
            labels.append(spec.labels.index(ex.label[w]))
        last = max((w for w in enc.word_ids() if w is not None), default=-1)
        feats.append({k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc})
        targets.append(labels)
        word_index.append(firsts[:last + 1])
    return Encoded(feats, targets, examples, word_index, cut)
