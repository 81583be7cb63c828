"""Any file: its format told from its name and first row (``sniff``), its records (``read``), and
its text units (``text_units``), the view of selection and of the vocabulary report."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.formats.base import READERS, SPAN_FORMATS, Layout, Passage, Record, Sentence, lines
from orchestrator.formats.tokens import TAG
from orchestrator.formats.tsv import SENTENCE_COLUMNS

#: File name endings ``sniff`` recognises (anything else is plain text).
SUFFIXES = (".txt", ".jsonl", ".json", ".parquet", ".tsv", ".iob", ".conll")


def sniff(path: str | Path) -> str:
    """The format of ``path``: by suffix (.jsonl/.json, .parquet, .iob/.conll, else text); a .tsv by
    its first row: a header naming a sentence column or 3 columns (BLUE's headerless relation
    rows) is blue_tsv, 2 or 4 columns ending in a tag are iob or blue_ner."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json"):
        return "jsonl"
    if suffix == ".parquet":
        return "parquet"
    if suffix in (".iob", ".conll"):
        return "conll"
    if suffix != ".tsv":
        return "text"
    for number, text in lines(path):
        if not text.strip():
            continue
        cells = [c.strip() for c in text.split("\t")]
        if any(c.lower() in SENTENCE_COLUMNS for c in cells):
            return "blue_tsv"
        if len(cells) in (2, 4) and TAG.match(cells[-1]):
            return "iob" if len(cells) == 2 else "blue_ner"
        if len(cells) == 3:
            return "blue_tsv"  # BLUE relation files without a header: index, sentence, label
        raise InputError(path, "cannot tell the TSV format from its first row", line=number,
                         expected="IOB 'token<TAB>tag', BLUE NER 'token<TAB>docid<TAB>offset<TAB>tag', a BLUE "
                                  "header naming a sentence column, or 'index<TAB>sentence<TAB>label'")
    raise InputError(path, "no text (only blank lines)", expected="at least one line of text")


def resolve(path: str | Path, fmt: str = "auto") -> str:
    """The reader name for ``path`` (``auto``: ``sniff``); a missing or 0-byte file is an ``InputError``,
    an unknown format a ``ConfigError`` naming the closest."""
    path = Path(path)
    if path.is_dir():
        raise InputError(path, "is a directory, not a file", expected="a text or data file")
    if not path.is_file():
        raise InputError(path, "file not found")
    if path.stat().st_size == 0:
        raise InputError(path, "is empty (0 bytes)", expected="at least one line of text")
    name = sniff(path) if fmt == "auto" else fmt
    READERS.get(name)
    return name


def read(path: str | Path, fmt: str = "auto", layout: Layout | None = None) -> Iterator[Record]:
    """The records of one file, streamed, by the reader ``fmt`` names (``auto``: ``sniff``); a
    ``layout.span`` is read by the ``SPAN_FORMATS`` only (the others read whole files)."""
    name = resolve(path, fmt)
    if layout is not None and layout.span is not None and name not in SPAN_FORMATS:
        raise ValueError(f"format {name} reads whole files; a span is for {', '.join(SPAN_FORMATS)}")
    return READERS.get(name)(Path(path), layout or Layout())


def text_units(path: str | Path, fmt: str = "auto", text_field: str = "text") -> Iterator[str]:
    """The text of any file, one unit at a time, stripped, empty units skipped: the lines or
    documents of text (``wikitext``: pages), the ``text_field`` of each JSONL record or parquet row,
    the sentence columns of a BLUE TSV row, the tokens of each sentence of a token file joined by
    spaces."""
    fmt = resolve(path, fmt)
    keys = SENTENCE_COLUMNS if fmt == "blue_tsv" else (text_field,)
    for record in read(path, fmt, Layout(text_field=text_field)):
        if isinstance(record, Passage):
            found = [record.text]
        elif isinstance(record, Sentence):
            found = [" ".join(record.tokens)]
        else:
            found = [record.text(name) for name in record.fields if name in keys]
        yield from (unit for unit in found if unit)
