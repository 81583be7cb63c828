"""Tokenizer quality per language (seed 002, Figure 3, after Rust et al. 2020): continued words and fertility.

    rows = quality_table({"ours": tok, "minilm": other}, [TextSet("de", "general", de_lines), ...])

For every (tokenizer, text set), over the words of the text:

- **continued-word rate**: the share of words the tokenizer splits into more than one sub-token
  (seed 002: "the fraction of words that the tokenizer splits into several subtokens");
- **fertility**: sub-tokens per word (Rust et al.'s second measure);
- **unknown rate**: the share of words that become the unknown token (a WordPiece vocabulary
  without a word's characters maps the whole word to ``[UNK]``: one token, so never "continued").

A *word* is defined once, independently of every tokenizer, so that all tokenizers are measured
on the same words (``words``): the text is split at white space, then numbers and special
characters are split off, as seed 002 word-tokenizes its task data ("We word tokenize all data
at white spaces and split off numbers and special characters"). A word is a maximal run of
letters with their combining marks, a maximal run of digits, or one other visible character; a
CJK ideograph is a word by itself, as BERT's basic tokenizer treats it (Japanese and Chinese have
no spaces: there, these are characters and kana runs, not dictionary words). Each word is then
given to the tokenizer alone, through its own normalizer (lower-casing, accent stripping of an
uncased vocabulary), without special tokens.

Pure given the tokenizers (``tokenizers.Tokenizer`` objects, or ``PythonTokenizer`` for one without a
fast form, as a MeCab vocabulary's); ``load_tokenizer`` reads one from a Hugging Face tokenizer or model
directory.
"""
from __future__ import annotations

import dataclasses
import html
import re
import types
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.reuse import TOKENIZER_FILES
from orchestrator.formats import text_units
from orchestrator.formats.base import LANGUAGE_CODE
from orchestrator.formats.parallel import read_squad

#: The measures of one row, in the order tables show them.
MEASURES = ("continued_words", "fertility", "unknown_words")


def _is_cjk(ch: str) -> bool:
    """CJK ideographs (the blocks BERT's ``_is_chinese_char`` lists)."""
    cp = ord(ch)
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


def _kind(ch: str) -> str:
    """'space' | 'letter' | 'mark' | 'digit' | 'cjk' | 'other' (a symbol or punctuation character)."""
    if ch.isspace():
        return "space"
    if _is_cjk(ch):
        return "cjk"
    cat = unicodedata.category(ch)
    if cat[0] == "L":
        return "letter"
    if cat[0] == "M":
        return "mark"
    if cat == "Nd":
        return "digit"
    if cat[0] == "C" or cat[0] == "Z":  # control, format (soft hyphen, zero-width joiner), unassigned: no word
        return "space"
    return "other"


def words(text: str) -> list[str]:
    """The words of ``text`` (module docstring): letter runs (with combining marks), digit runs, each
    CJK ideograph and each other visible character; white space, control and format characters
    separate words and are none."""
    out: list[str] = []
    current, current_kind = [], ""
    for ch in text:
        kind = _kind(ch)
        if kind == "mark" and current_kind == "letter":  # a combining mark belongs to its letter
            current.append(ch)
            continue
        kind = "letter" if kind == "mark" else kind
        if kind == current_kind and kind in ("letter", "digit"):
            current.append(ch)
            continue
        if current:
            out.append("".join(current))
        current, current_kind = ([ch], kind) if kind != "space" else ([], "")
    if current:
        out.append("".join(current))
    return out


#: What a file of ``QualityConfig.texts`` may be.
TEXT_FILES = "plain text a unit per line, JSONL, SQuAD .json, or a task file (BLUE TSV, IOB, BLUE NER)"

#: A text set's name: a language code, optionally with what the text is ("de", "de:specific").
TEXT_NAME = re.compile(rf"({LANGUAGE_CODE.pattern})(?::([A-Za-z0-9_.-]+))?")
#: The kind of a text named by its language alone, and that of the corpus's own sentences (``corpus_lines``)
DEFAULT_KIND, CORPUS_KIND = "text", "corpus"
#: The table's name for the vocabulary stage's own tokenizer
OWN_TOKENIZER = "vocab"


@dataclasses.dataclass(frozen=True)
class QualityConfig:
    tokenizers: dict[str, str] = field(default_factory=dict, help="name -> Hugging Face tokenizer or model directory "
                                                                  "to measure beside the stage's own (e.g. a "
                                                                  "monolingual and a multilingual one)")
    texts: dict[str, str] = field(default_factory=dict, help="'<language>' or '<language>:<kind>' -> a file of that "
                                                             "language's text (plain text a unit per line, JSONL, "
                                                             "SQuAD .json, or a task file: BLUE TSV, IOB, BLUE NER); "
                                                             "kind defaults to 'text' (seed 002: general / specific)")
    corpus_lines: int = field(0, help="vocabulary stage: also measure on up to this many sentences of each language "
                                      "of the corpus (kind 'corpus'); 0 = only `texts`")
    max_lines: int = field(5000, help="text units read from each file of `texts`")

    def __post_init__(self) -> None:
        check_quality_settings(self.tokenizers, self.texts, self.max_lines, keys="vocab.quality.")
        if self.corpus_lines < 0:
            raise ConfigError(f"vocab.quality.corpus_lines must be >= 0, got {self.corpus_lines}")
        if OWN_TOKENIZER in self.tokenizers:  # its row took the stage's own tokenizer's place in the table
            raise ConfigError(f"vocab.quality.tokenizers.{OWN_TOKENIZER}: {OWN_TOKENIZER!r} names the stage's own "
                              "tokenizer in the table; give this one another name")
        corpus = [name for name in self.texts if text_set_of(name)[1] == CORPUS_KIND]
        if corpus and self.corpus_lines:  # one row per (language, kind): it and the corpus's text would be one
            raise ConfigError(f"vocab.quality.texts: {corpus[0]!r} is the kind the corpus's own sentences have "
                              f"(corpus_lines); give the file another kind, e.g. {text_set_of(corpus[0])[0]}:text")
        if self.tokenizers and not self.active:  # else they are never loaded, nor measured: a setting without effect
            raise ConfigError("vocab.quality.tokenizers: no text to measure them on; give vocab.quality.texts "
                              "(LANG=FILE) or vocab.quality.corpus_lines > 0")

    @property
    def active(self) -> bool:
        """Whether there is text to measure on (else no table is made)."""
        return bool(self.texts) or self.corpus_lines > 0


def check_quality_settings(tokenizers: dict[str, str], texts: dict[str, str], max_lines: int, keys: str) -> None:
    """ConfigError for a text name that is not a language, two text names of one (language, kind) ('de' and
    'de:text': the table, its differences and the job's JSON key a text set by both), a blank tokenizer name, or
    ``max_lines`` < 1;
    ``keys``: the prefix of the keys as the job's user writes them ("vocab.quality.", or "" for the
    standalone job)."""
    seen: dict[tuple[str, str], str] = {}
    for name in texts:
        if not TEXT_NAME.fullmatch(name):
            raise ConfigError(f"{keys}texts: {name!r} is not '<language>' or '<language>:<kind>' "
                              "(e.g. de, de:specific)")
        if (other := seen.setdefault(text_set_of(name), name)) != name:  # the table keys a row by both
            raise ConfigError(f"{keys}texts: {other!r} and {name!r} are both {':'.join(text_set_of(name))}; give "
                              "each file its own kind (e.g. de:general, de:specific)")
    for name in tokenizers:
        if not name or name != name.strip():
            raise ConfigError(f"{keys}tokenizers: bad name {name!r}")
    if max_lines < 1:
        raise ConfigError(f"{keys}max_lines must be >= 1, got {max_lines}")


def text_set_of(name: str) -> tuple[str, str]:
    """(language, kind) of a text name of ``QualityConfig.texts``: 'de' is ('de', 'text')."""
    language, kind = TEXT_NAME.fullmatch(name).groups()
    return language, kind or DEFAULT_KIND


def read_text_sets(texts: dict[str, str], max_lines: int) -> list[TextSet]:
    """``QualityConfig.texts`` read: each file's first ``max_lines`` text units: the paragraphs of a
    SQuAD ``.json`` file, else the units of its sniffed format (an InputError names a missing or
    unreadable file, a directory, or a file without a word to measure on)."""
    out = []
    for name, path in texts.items():
        language, kind = text_set_of(name)
        if Path(path).is_dir():
            raise InputError(path, "is a directory, not a file", expected=f"a text file for {name}: {TEXT_FILES}")
        units = []
        # a .json file is SQuAD JSON (XQuAD, JSQuAD): its paragraphs; anything else by its sniffed format
        found = (u.text for u in read_squad(path)) if Path(path).suffix.lower() == ".json" else text_units(path)
        for unit in found:
            units.append(unit)
            if len(units) >= max_lines:
                break
        if not any(words(unit) for unit in units):  # else every measure is empty: a table of dashes
            raise InputError(path, "holds no text" if not units else f"holds no words in the {len(units)} unit(s) read",
                             expected=f"text of {name} to split into words")
        out.append(TextSet(language, kind, tuple(units)))
    return out


def quality_inputs(cfg: QualityConfig) -> list[Path]:
    """The files the table depends on: the text files and the tokenizers' tokenizer files (not their weights)."""
    files = [Path(p) for p in cfg.texts.values()]
    for path in cfg.tokenizers.values():
        files.extend(Path(path) / name for name in TOKENIZER_FILES if (Path(path) / name).is_file())
    return files


def load_tokenizers(paths: dict[str, str]) -> dict:
    return {name: load_tokenizer(path) for name, path in paths.items()}


@dataclasses.dataclass(frozen=True)
class TextSet:
    """Text of one language to measure on: ``kind`` says what it is (seed 002: general / specific)."""

    language: str
    kind: str
    lines: Sequence[str]


def word_counts(lines: Iterable[str]) -> Counter:
    return Counter(w for line in lines for w in words(line))


def measure(tokenizer, counts: Counter) -> dict:
    """Continued-word rate, fertility and unknown-word rate of ``tokenizer`` over the words ``counts``
    (word -> occurrences; each distinct word is tokenized once). A word the tokenizer's normalizer
    deletes entirely (no tokens) is left out of every measure."""
    distinct = sorted(counts)
    unk_id = _unknown_id(tokenizer)
    n_words = continued = pieces = unknown = 0
    for start in range(0, len(distinct), 4096):
        batch = distinct[start:start + 4096]
        for word, enc in zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False)):
            n = sum(enc.attention_mask)  # a tokenizer saved with padding on pads even one word
            if n == 0:
                continue
            c = counts[word]
            n_words += c
            pieces += n * c
            continued += c * (n > 1)
            unknown += c * (unk_id is not None and unk_id in enc.ids)
    if n_words == 0:
        return {"words": 0, "distinct_words": 0, **{m: None for m in MEASURES}}
    return {"words": n_words, "distinct_words": len(distinct), "continued_words": round(continued / n_words, 4),
            "fertility": round(pieces / n_words, 4), "unknown_words": round(unknown / n_words, 4)}


def _unknown_id(tokenizer) -> int | None:
    model = getattr(tokenizer, "model", None)
    token = getattr(model, "unk_token", None) or "[UNK]"
    return tokenizer.token_to_id(token)


def quality_table(tokenizers: dict, texts: Sequence[TextSet]) -> list[dict]:
    """One row per (text set, tokenizer), text sets in the order given: language, kind, tokenizer and
    ``measure``'s numbers. The words of each text set are counted once for every tokenizer."""
    rows = []
    for text in texts:
        counts = word_counts(text.lines)
        for name, tok in tokenizers.items():
            rows.append({"language": text.language, "kind": text.kind, "tokenizer": name,
                         "lines": len(text.lines), **measure(tok, counts)})
    return rows


QUALITY_TITLE = "Tokenizer quality per language"
QUALITY_INTRO = ("Words: white-space words with numbers and special characters split off (the same words for every "
                 "tokenizer). Continued words: share of words split into more than one sub-token; fertility: "
                 "sub-tokens per word; unknown: share of words that became the unknown token. Rates in percent; "
                 "the last column in percentage points.")


def table_cells(rows: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """The table's header and its cells as shown (both renderings use these); a column of differences to
    the first tokenizer (seed 002's Figure 3 plots the continued-word rate of the multilingual minus that
    of the monolingual tokenizer)."""
    names = list(dict.fromkeys(r["tokenizer"] for r in rows))
    first: dict[tuple[str, str], float | None] = {(r["language"], r["kind"]): r["continued_words"]
                                                  for r in rows if r["tokenizer"] == names[0]} if names else {}
    header = ["language", "text", "tokenizer", "words", "continued words", "fertility", "unknown",
              f"continued − {names[0] if names else ''}"]
    cells = []
    for r in rows:
        base = first.get((r["language"], r["kind"]))
        diff = "–" if r["continued_words"] is None or base is None or r["tokenizer"] == names[0] else \
            f"{100 * (r['continued_words'] - base):+.1f}"
        cells.append([r["language"], r["kind"], r["tokenizer"], str(r["words"]), _pct(r["continued_words"]),
                      "–" if r["fertility"] is None else f"{r['fertility']:.3f}", _pct(r["unknown_words"]), diff])
    return header, cells


def render_markdown(rows: Sequence[dict], title: str = QUALITY_TITLE, heading: str = "##") -> str:
    """The rows as a Markdown table (``table_cells``)."""
    header, cells = table_cells(rows)
    lines = [f"{heading} {title}", "", QUALITY_INTRO, "", "| " + " | ".join(header) + " |",
             "|---|---|---|" + "---:|" * (len(header) - 3)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"


CSS = """
table.tokenizer-quality { border-collapse: collapse; font-size: 14px; margin-bottom: 1em; }
table.tokenizer-quality th, table.tokenizer-quality td { padding: 4px 10px; border-bottom: 1px solid #ddd; }
table.tokenizer-quality td:nth-child(n+4) { text-align: right; }
table.tokenizer-quality thead th { border-bottom: 2px solid #333; }
"""


def render_html(rows: Sequence[dict], title: str = QUALITY_TITLE, heading: str = "h2") -> str:
    """The rows as an HTML fragment (``table_cells``; ``class="tokenizer-quality"``, each row
    ``data-tokenizer`` and ``data-language``)."""
    esc = html.escape
    header, cells = table_cells(rows)
    out = [f"<{heading}>{esc(title)}</{heading}>", f'<p class="notes">{esc(QUALITY_INTRO)}</p>',
           '<table class="tokenizer-quality"><thead><tr>' + "".join(f"<th>{esc(h)}</th>" for h in header)
           + "</tr></thead><tbody>"]
    for row in cells:
        out.append(f'<tr data-tokenizer="{esc(row[2])}" data-language="{esc(row[0])}">'
                   + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out) + "\n"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def load_tokenizer(path: str | Path):
    """The fast tokenizer (``tokenizers.Tokenizer``) of a Hugging Face tokenizer or model directory:
    its tokenizer.json, else the one transformers builds from its vocab.txt and tokenizer_config.json
    (which says whether it lower-cases); padding and truncation off."""
    path = Path(path)
    if not path.is_dir():
        raise InputError(path, "tokenizer directory does not exist",
                         expected="a Hugging Face tokenizer or model directory (tokenizer.json or vocab.txt)")
    check_tokenizer_dir_files(path)
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer  # heavy: tokenizers

        try:
            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as exc:  # tokenizers raises a plain Exception for a malformed file
            raise InputError(path / "tokenizer.json", f"not a tokenizer file: {exc}") from None
        tokenizer.no_padding()  # MiniLM's is saved padding to 128: one word must stay its own tokens
        tokenizer.no_truncation()
        return tokenizer
    from transformers import AutoTokenizer  # heavy: transformers

    tokenizer = AutoTokenizer.from_pretrained(str(path), use_fast=True)
    return tokenizer.backend_tokenizer if getattr(tokenizer, "is_fast", False) else PythonTokenizer(tokenizer)


class PythonTokenizer:
    """A transformers tokenizer that has no fast (``tokenizers``) form, with the three things ``measure``
    uses of a ``tokenizers.Tokenizer``: ``encode_batch``, ``token_to_id`` and ``model.unk_token``. The one
    this project writes is a MeCab vocabulary's ``BertJapaneseTokenizer`` (``vocab.pretokenize: mecab``):
    MeCab's words, then WordPiece, as the model reads its text."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.model = types.SimpleNamespace(unk_token=tokenizer.unk_token)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False) -> list[types.SimpleNamespace]:
        ids = self.tokenizer(list(texts), add_special_tokens=add_special_tokens)["input_ids"]
        return [types.SimpleNamespace(ids=row, attention_mask=[1] * len(row)) for row in ids]

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.convert_tokens_to_ids(token)


def check_tokenizer_dir_files(path: str | Path) -> None:
    """InputError naming what is missing unless the directory ``path`` holds a tokenizer.json, or a
    vocab.txt with the tokenizer_config.json that says how to read it (a folder with neither would get
    transformers' advice to install sentencepiece or tiktoken instead)."""
    path = Path(path)
    if (path / "tokenizer.json").is_file() or ((path / "vocab.txt").is_file()
                                               and (path / "tokenizer_config.json").is_file()):
        return
    raise InputError(path, "no tokenizer.json, nor vocab.txt with tokenizer_config.json here",
                     expected="a Hugging Face tokenizer or model directory")
