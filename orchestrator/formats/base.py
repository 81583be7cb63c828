"""What every reader shares: the registry, the layout options, the records, and strict UTF-8 lines.

A reader is a generator over ONE file, ``reader(path, layout) -> Iterator[Record]``, registered
under its format name in ``READERS``. It yields one record at a time and never holds the file:

- ``Passage``: a document of a text file (a line, a blank-line paragraph, a WikiText page);
- ``Row``: a record of named fields (a JSON object, a parquet row, a TSV row by role);
- ``Sentence``: the tokens and tags of one sentence of a token-per-line file (IOB, CoNLL, BLUE NER).

Every text file is decoded by ``lines``: strict UTF-8 (a bad byte is an ``InputError`` naming the
file, the 1-based line, the byte and its column), a UTF-8 BOM on the first line and CRLF line
ends accepted.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from orchestrator.core.errors import InputError
from orchestrator.core.registry import Registry

#: A language code as sources and text files give it (ISO 639-1/-3, optionally with a region: en, eng,
#: pt-BR, zh_Hant): corpus sources' ``language``, tokenizer-quality text names.
LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,8}(?:[-_][A-Za-z0-9]{1,8})*")


@dataclasses.dataclass(frozen=True)
class Layout:
    """How to read one file beyond its format name; every default suits the plain text view.

    ``columns`` and ``positions`` name *roles* (any names the caller chooses): a ``Row``'s fields
    are keyed by role, so the caller never indexes columns itself.
    """

    text_field: str = "text"  # jsonl key / parquet column holding the text ("" = no text field required)
    page_field: str = ""  # jsonl key / parquet column naming the page ("" = none)
    split: Literal["line", "blank_line"] = "line"  # text: a document per line, or blank-line paragraphs
    columns: Mapping[str, str] = dataclasses.field(default_factory=dict)  # role -> TSV header name / JSON key
    positions: Mapping[str, int] = dataclasses.field(default_factory=dict)  # role -> column index (no header)
    index_role: str = ""  # blue_tsv: role that may lack a header name and then takes pandas' unnamed index
    quoting: Literal["auto", "csv", "none"] = "auto"  # blue_tsv: see orchestrator.formats.tsv


@dataclasses.dataclass(frozen=True)
class Passage:
    """One document of a text file: where it starts, its text (paragraph lines joined by newlines)."""

    line: int
    text: str
    page: str = ""


@dataclasses.dataclass(frozen=True)
class Row:
    """One record of named fields; ``line`` is its 1-based line (parquet: its 1-based row)."""

    line: int
    fields: Mapping[str, Any]

    def text(self, key: str) -> str:
        """The field ``key`` as stripped text; "" when absent or null."""
        value = self.fields.get(key)
        return "" if value is None else str(value).strip()


@dataclasses.dataclass(frozen=True)
class Sentence:
    """One sentence of a token-per-line file; ``lines`` holds each token's line, ``doc`` the
    document id BLUE's NER files give on a sentence's first token ("" when none)."""

    line: int
    tokens: tuple[str, ...]
    tags: tuple[str, ...]
    lines: tuple[int, ...]
    doc: str = ""


Record = Passage | Row | Sentence
Reader = Callable[[Path, Layout], Iterator[Record]]

#: Registered readers: format name -> reader(path, layout) yielding records.
READERS: Registry[Reader] = Registry("file format")


def lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its line end), streamed; strict UTF-8, BOM and CRLF accepted."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(path, f"invalid UTF-8 byte 0x{raw[exc.start]:02x} at column {exc.start + 1}",
                                 line=number, expected="UTF-8 text") from None
            yield number, text.rstrip("\r\n")
