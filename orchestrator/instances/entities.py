"""Entities in a text for seed 003's masking (US 12,393,781 B2): typed term phrases found by a
dictionary or a token-classification (NER) model, on whole words rebuilt from WordPiece tokens.

    dictionary = load_dictionaries(["orchestrator/instances/term_lists/radiology.yaml"])
    PhraseMatcher(dictionary, max_phrase_words=6)(["early", "enhancement", "of", "hcc"])
    # [(0, 2, "property_of_lesion"), (3, 4, "disease_name")]    (first word, end word, type)
    NerExtractor("runs/x/sweep/exports/<trial>-<key>")(words)   # the same spans from BIO predictions
    token_words(["[CLS]", "hepato", "##ma"])             # [("hepatoma", (1, 2))]

The term-list format (YAML): ``types: {name: {terms: [...], patterns: [regex, ...]}}``; a phrase
typed twice is an error naming both places. ``orchestrator.instances.entity_masking`` chooses the
masked targets among these entities; ``orchestrator.instances.association`` relates them.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from orchestrator.core.errors import InputError

#: The task head of a fine-tuned model exported by the sweep (``orchestrator.finetune.export.HEAD_WEIGHTS``).
EXPORT_HEAD = "head.safetensors"
SPECIAL_TOKENS = frozenset({"[CLS]", "[SEP]", "[PAD]", "[MASK]"})
_PUNCT = re.compile(r"(\W)", re.UNICODE)


@dataclass(frozen=True)
class Entity:
    """One extracted term phrase: its words [start, end) and all its WordPiece token positions."""
    start: int
    end: int
    positions: tuple[int, ...]
    type: str
    text: str


@dataclass(frozen=True)
class TermDictionary:
    """Typed term phrases (as word tuples) and whole-word-anchored regex patterns."""
    terms: dict[tuple[str, ...], str]
    patterns: tuple[tuple[re.Pattern, str], ...]
    types: frozenset[str]


def split_words(text: str, lowercase: bool = True) -> tuple[str, ...]:
    """Whitespace split, then every punctuation character is its own word (BERT's basic tokenizer)."""
    text = text.lower() if lowercase else text
    return tuple(w for chunk in text.split() for w in _PUNCT.split(chunk) if w)


def compose_yaml(path: Path) -> yaml.Node:
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except UnicodeDecodeError:
        raise InputError(path, "not UTF-8 text", expected="a UTF-8 YAML file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(path, f"invalid YAML: {getattr(exc, 'problem', exc)}",
                         line=mark.line + 1 if mark else None) from None
    if not isinstance(node, yaml.MappingNode):
        raise InputError(path, "expected a mapping at the top level", line=1)
    return node


def yaml_mapping(node: yaml.Node, path: Path, what: str) -> dict[str, yaml.Node]:
    if not isinstance(node, yaml.MappingNode):
        raise InputError(path, f"{what} must be a mapping", line=node.start_mark.line + 1)
    return {k.value: v for k, v in node.value}


def _scalars(node: yaml.Node, path: Path, what: str) -> list[tuple[str, int]]:
    if not isinstance(node, yaml.SequenceNode) or not all(isinstance(n, yaml.ScalarNode) for n in node.value):
        raise InputError(path, f"{what} must be a list of strings", line=node.start_mark.line + 1)
    return [(n.value, n.start_mark.line + 1) for n in node.value]


def load_dictionaries(paths: Sequence[str | Path], lowercase: bool = True) -> TermDictionary:
    """Merge typed term lists; a phrase given two different types is an error naming both places."""
    terms: dict[tuple[str, ...], str] = {}
    where: dict[tuple[str, ...], str] = {}
    patterns: list[tuple[re.Pattern, str]] = []
    types: set[str] = set()
    for path in map(Path, paths):
        top = yaml_mapping(compose_yaml(path), path, "the file")
        if "types" not in top:
            raise InputError(path, "no 'types' key", line=1, expected="types: {name: {terms: [...]}}")
        for type_name, body in yaml_mapping(top["types"], path, "'types'").items():
            types.add(type_name)
            entry = yaml_mapping(body, path, f"type {type_name!r}")
            unknown = set(entry) - {"terms", "patterns"}
            if unknown:
                raise InputError(path, f"type {type_name!r} has unknown key {sorted(unknown)[0]!r}",
                                 line=body.start_mark.line + 1, expected="'terms' and/or 'patterns'")
            for term, line in _scalars(entry["terms"], path, "terms") if "terms" in entry else []:
                key = split_words(term, lowercase)
                if not key:
                    raise InputError(path, "empty term", line=line)
                if key in terms and terms[key] != type_name:
                    raise InputError(path, f"term {term!r} typed {type_name!r} here but {terms[key]!r} "
                                           f"at {where[key]}", line=line)
                terms[key] = type_name
                where[key] = f"{path}:{line}"
            for text, line in _scalars(entry["patterns"], path, "patterns") if "patterns" in entry else []:
                try:
                    # anchored to whole words of the space-joined word sequence
                    patterns.append((re.compile(rf"(?<!\S)(?:{text})(?!\S)", re.IGNORECASE if lowercase else 0),
                                     type_name))
                except re.error as exc:
                    raise InputError(path, f"bad regular expression {text!r}: {exc}", line=line) from None
    return TermDictionary(terms=terms, patterns=tuple(patterns), types=frozenset(types))

class NerExtractor:
    """Entities from a token-classification model: BIO labels of each word's first sub-token.

    The model keeps its own tokenizer: the instance's words are re-tokenized, so the NER
    model need not share the pretraining vocabulary. Loaded once per masker (per worker).

    ``model_dir`` is a Hugging Face token-classification directory, or a fine-tuned model exported
    by this project's sweep (``sweep.export_best``; ``orchestrator.finetune.export``): an encoder
    with ``id2label`` beside its head in ``head.safetensors``. That head is the linear layer over the
    last hidden states that BertForTokenClassification calls ``classifier``, so the export loads as
    one, predicting as the sweep scored it (first sub-token of each word).
    """

    def __init__(self, model_dir: str | Path):
        from transformers import AutoModelForTokenClassification, AutoTokenizer  # heavy: transformers

        from orchestrator.modeling.encoder import from_pretrained  # heavy: transformers

        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = from_pretrained(AutoModelForTokenClassification, model_dir).eval()
        head = Path(model_dir) / EXPORT_HEAD
        if head.is_file():
            from safetensors.torch import load_file  # heavy: safetensors

            self.model.classifier.load_state_dict(load_file(str(head)))
        self.labels = {int(i): str(label) for i, label in self.model.config.id2label.items()}
        bad = [label for label in self.labels.values() if label != "O" and not re.match(r"^[BI]-.+", label)]
        if bad:
            raise InputError(Path(model_dir) / "config.json", f"label {bad[0]!r} is not BIO",
                             expected="id2label of O, B-<type>, I-<type>")
        self.types = frozenset(label[2:].lower() for label in self.labels.values() if label != "O")

    def __call__(self, words: list[str]) -> list[tuple[int, int, str]]:
        """(first word, end word, type) spans for one run of words."""
        import torch  # heavy: torch

        enc = self.tokenizer(words, is_split_into_words=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            ids = self.model(**enc).logits[0].argmax(-1).tolist()
        word_label: dict[int, str] = {}
        for k, w in enumerate(enc.word_ids()):
            if w is not None and w not in word_label:
                word_label[w] = self.labels[ids[k]]
        return bio_spans([word_label.get(i, "O") for i in range(len(words))])


def bio_spans(labels: Sequence[str]) -> list[tuple[int, int, str]]:
    """[start, end) spans and lowercased types from BIO labels; a stray I- starts a span."""
    spans: list[tuple[int, int, str]] = []
    for i, label in enumerate(labels):
        if label == "O":
            continue
        kind, type_name = label[0], label[2:].lower()
        if kind == "I" and spans and spans[-1][1] == i and spans[-1][2] == type_name:
            spans[-1] = (spans[-1][0], i + 1, type_name)
        else:
            spans.append((i, i + 1, type_name))
    return spans


class PhraseMatcher:
    """Longest-match, left-to-right typed phrases of a TermDictionary in a run of words."""

    def __init__(self, dictionary: TermDictionary, max_phrase_words: int):
        self.dictionary = dictionary
        self.max_phrase_words = max_phrase_words
        self._by_first: dict[str, list[tuple[tuple[str, ...], str]]] = {}
        for words, type_name in dictionary.terms.items():
            self._by_first.setdefault(words[0], []).append((words, type_name))
        for options in self._by_first.values():
            options.sort(key=lambda item: -len(item[0]))

    def __call__(self, run_words: Sequence[str]) -> list[tuple[int, int, str]]:
        """(first word, end word, type) spans, as ``NerExtractor`` gives them."""
        best = self._pattern_matches(run_words)
        spans: list[tuple[int, int, str]] = []
        i = 0
        while i < len(run_words):
            length, type_name = best.get(i, (0, ""))
            for phrase, t in self._by_first.get(run_words[i], ()):
                n = len(phrase)
                if n <= self.max_phrase_words and n > length and i + n <= len(run_words) and \
                        tuple(run_words[i:i + n]) == phrase:
                    length, type_name = n, t
                    break
            if length == 0:
                i += 1
                continue
            spans.append((i, i + length, type_name))
            i += length
        return spans

    def _pattern_matches(self, run_words: Sequence[str]) -> dict[int, tuple[int, str]]:
        """{start word: (length in words, type)} for regex matches aligned to whole words."""
        if not self.dictionary.patterns:
            return {}
        text = " ".join(run_words)
        starts = {}
        offset = 0
        for k, w in enumerate(run_words):
            starts[offset] = k
            offset += len(w) + 1
        found: dict[int, tuple[int, str]] = {}
        for pattern, type_name in self.dictionary.patterns:
            for m in pattern.finditer(text):
                if m.start() not in starts or m.end() == m.start():
                    continue
                first = starts[m.start()]
                length = text[m.start():m.end()].count(" ") + 1
                if length <= self.max_phrase_words and length > found.get(first, (0, ""))[0]:
                    found[first] = (length, type_name)
        return found


def token_words(tokens: Sequence[str], lowercase: bool = True) -> list[tuple[str, tuple[int, ...]]]:
    """Whole words rebuilt from WordPiece tokens: (word, token positions); special tokens skipped."""
    out: list[tuple[str, list[int]]] = []
    for i, tok in enumerate(tokens):
        if tok in SPECIAL_TOKENS:
            continue
        if tok.startswith("##") and out and out[-1][1][-1] == i - 1:
            out[-1] = (out[-1][0] + tok[2:], out[-1][1] + [i])
        else:
            out.append((tok, [i]))
    return [(w.lower() if lowercase else w, tuple(p)) for w, p in out]
