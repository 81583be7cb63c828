"""Sentence splitting for documents that are not one-sentence-per-line (e.g. one abstract per line).

BERT's instance algorithm packs *sentences* into segments A/B, so every document must arrive
as a list of sentences. syntok is used because it works offline (NLTK's punkt needs a data
download) and splits ~1 MB of PubMed text per second in pure Python.

Japanese and Chinese (a source with ``language: ja`` or ``zh``) have no spaces and end sentences with
。！？, which syntok does not know (a Chinese paragraph came out as one "sentence"): ``split_japanese``
splits after a run of 。｡！？ (full-width or ASCII ! and ?)
and ．, with the closing brackets and quotes that follow it (」』）】 ...) kept on the sentence they
close. A terminator inside a matched pair of brackets does not end the sentence (彼は「行く。」と言った。
is one sentence), unless the bracket closes right after it and is followed by the end, a space or
another opening bracket: a quotation that stands alone (「はい。」「いいえ。」 is two). An ASCII ! or ?
ends a sentence only before a space or the end (Yahoo!ニュース stays whole), and ． between
digits is a decimal point.
"""
from __future__ import annotations

from syntok import segmenter

_TERMINATORS = frozenset("。｡！？!?．")
_OPEN = "「『（(【〔［[｛{〈《“‘"
_CLOSE = "」』）)】〕］]｝}〉》”’"
_PAIR = dict(zip(_OPEN, _CLOSE))
_CLOSERS = frozenset(_CLOSE)
#: Languages whose sources are split by ``split_japanese`` instead of syntok: they end sentences with 。！？.
FULL_STOP_LANGUAGES = ("ja", "zh")


def split_sentences(text: str, language: str = "en") -> list[str]:
    """Split one document (one or more paragraphs) into sentences, keeping the original spacing
    (``language`` ja or zh: ``split_japanese``)."""
    if language in FULL_STOP_LANGUAGES:
        return split_japanese(text)
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


def _bracket_depth(text: str) -> list[int]:
    """For every position, how many matched bracket pairs enclose it (an opener without its closer,
    or a closer without its opener, encloses nothing)."""
    stack: list[tuple[str, int]] = []
    waiting: dict[str, list[int]] = {}  # closer -> the stack places of its open openers, in order
    diff = [0] * (len(text) + 1)
    for i, ch in enumerate(text):
        if ch in _PAIR:
            waiting.setdefault(_PAIR[ch], []).append(len(stack))
            stack.append((ch, i))
        elif ch in _CLOSERS and waiting.get(ch):
            j = waiting[ch][-1]  # the innermost opener it closes; those opened after it stay unmatched
            diff[stack[j][1] + 1] += 1
            diff[i] -= 1
            for opener, _ in reversed(stack[j:]):  # each place is dropped once: linear in the line
                waiting[_PAIR[opener]].pop()
            del stack[j:]
    depth, level = [], 0
    for i in range(len(text)):
        level += diff[i]
        depth.append(level)
    return depth


def split_japanese(text: str) -> list[str]:
    """Japanese sentences of ``text`` (see the module docstring); lines are split too, each sentence
    is stripped, empty ones are dropped."""
    out: list[str] = []
    for line in text.split("\n"):
        depth = _bracket_depth(line)
        n, start, i = len(line), 0, 0
        while i < n:
            if line[i] not in _TERMINATORS:
                i += 1
                continue
            j = i
            while j < n and line[j] in _TERMINATORS:
                j += 1
            k = j
            while k < n and line[k] in _CLOSERS:
                k += 1
            at_break = k == n or line[k].isspace()
            if all(c in "!?" for c in line[i:j]) and not at_break:  # Yahoo!ニュース
                i = j
                continue
            if line[i:j] == "．" and 0 < i and j < n and line[i - 1].isdigit() and line[j].isdigit():  # ３．５
                i = j
                continue
            if depth[i] and not ((k == n or depth[k] == 0) and k > j and (at_break or line[k] in _PAIR)):
                i = k  # inside brackets that the sentence goes on after (「行く。」と言った)
                continue
            sentence = line[start:k].strip()
            if sentence:
                out.append(sentence)
            start = i = k
        rest = line[start:].strip()
        if rest:
            out.append(rest)
    return out
