"""What every reader shares: the registry, the layout options, the records, and strict UTF-8 lines.

A reader is a generator over ONE file, ``reader(path, layout) -> Iterator[Record]``, registered
under its format name in ``READERS``. It yields one record at a time and never holds the file:

- ``Passage``: a document of a text file (a line, a blank-line paragraph, a WikiText page);
- ``Row``: a record of named fields (a JSON object, a parquet row, a TSV row by role);
- ``Sentence``: the tokens and tags of one sentence of a token-per-line file (IOB, CoNLL, BLUE NER).

Every text file is decoded by ``lines``: strict UTF-8 (a bad byte is an ``InputError`` naming the
file, the 1-based line, the byte and its column), a UTF-8 BOM on the first line and CRLF line
ends accepted. Binary content that happens to decode is refused too (``check_text``): a NUL
character (a binary file, or UTF-16 text without its byte-order mark, which is valid UTF-8 with a
NUL after every ASCII letter), or a line with more than ``MAX_CONTROLS`` other control characters.
Tab, vertical tab, form feed and the line ends are text; an isolated control character (a DOS
end-of-file mark, an escape of a log) is tolerated, as the tokenizers drop it.
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
    quoting: Literal["auto", "csv", "none", "minimal"] = "auto"  # blue_tsv and token files: see formats.tsv
    span: Span | None = None  # SPAN_FORMATS: read this part of the file only (its lines or row groups); None = all


@dataclasses.dataclass(frozen=True)
class Span:
    """A part of a file that holds whole records: the bytes ``[start, end)`` of a text file (whole lines,
    ``file_spans``), or the row groups ``[start, end)`` of a parquet file (``parquet_spans``); its first line
    (or row) is ``first_line`` (1-based) of the file, so records and errors keep the file's own numbers."""

    start: int
    end: int
    first_line: int = 1


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


def unquote_cell(cell: str) -> str:
    """``cell`` as it was before a CSV writer quoted it (``csv.writer``'s QUOTE_MINIMAL, as BLUE's converters
    write): wrapped in ``"`` with every inner quote doubled, at least one (``"To probe the ""logic"" of"``; the
    token ``"`` as four quotes). Any other cell is returned as it is: a bare or unbalanced quote is text (the
    shared ChemProt copy's 59 rows), and so are ``"abc"`` and two quotes alone, which that writer never writes
    for a cell of a one-line, TAB-split row (it quotes such a cell only for a quote it holds)."""
    text = cell.strip()
    inner = text[1:-1]
    if len(text) >= 4 and text[0] == text[-1] == '"' and '""' in inner and '"' not in inner.replace('""', ""):
        return inner.replace('""', '"')
    return cell


Record = Passage | Row | Sentence
Reader = Callable[[Path, Layout], Iterator[Record]]

#: Registered readers: format name -> reader(path, layout) yielding records.
READERS: Registry[Reader] = Registry("file format")
#: The readers that read a ``Layout.span`` of a file (a record per line, blank-line paragraph, WikiText page or
#: parquet row).
SPAN_FORMATS = ("text", "jsonl", "wikitext", "parquet")


#: C0 control characters and DEL that are not text: all but tab, line feed, vertical tab, form feed, return.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")
#: Control characters (NUL aside) a line may hold before it is taken for binary content.
MAX_CONTROLS = 2
_UTF16_BOMS = {b"\xff\xfe": "UTF-16 (little-endian)", b"\xfe\xff": "UTF-16 (big-endian)"}


def check_text(path: str | Path, line: int | None, text: str) -> None:
    """Raise ``InputError`` if ``text`` is binary content rather than text: a NUL, or more than
    ``MAX_CONTROLS`` other control characters (see the module's docstring)."""
    found = _CONTROL.search(text)
    if found is None:
        return
    nul = text.find("\x00")
    if nul >= 0:
        hint = (": UTF-16 text without a byte-order mark? (every other byte is NUL); convert it to UTF-8, e.g. "
                "iconv -f UTF-16LE -t UTF-8") if _looks_utf16(text) else ": binary content, not text"
        raise InputError(path, f"NUL character at column {nul + 1}{hint}", line=line, expected="UTF-8 text")
    controls = _CONTROL.findall(text)
    if len(controls) > MAX_CONTROLS:
        codes = ", ".join(sorted({f"0x{ord(c):02x}" for c in controls}))
        raise InputError(path, f"{len(controls)} control characters ({codes}; the first at column "
                         f"{found.start() + 1}): binary content, not text", line=line,
                         expected="UTF-8 text (tabs, line and page breaks allowed)")


def _looks_utf16(text: str) -> bool:
    """NUL in (nearly) every other character and (nearly) nowhere else: ASCII text encoded as UTF-16."""
    halves = [text[0::2].count("\x00"), text[1::2].count("\x00")]
    n = len(text) // 2
    return n >= 2 and max(halves) >= 0.8 * n and min(halves) <= 0.2 * n


def lines(path: Path, span: Span | None = None) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its line end), streamed; strict UTF-8, BOM and CRLF accepted,
    binary content refused (``check_text``). With ``span``, the lines of that span only, numbered as in
    the file."""
    with open(path, "rb") as f:
        if span is None:
            for number, raw in enumerate(f, start=1):
                yield number, _decode(path, number, raw)
            return
        f.seek(span.start)
        pos = span.start
        for number, raw in enumerate(f, start=span.first_line):
            if pos >= span.end:
                return
            pos += len(raw)
            yield number, _decode(path, number, raw)


def file_spans(path: str | Path, block_bytes: int, paragraphs: bool = False,
               opens: Callable[[str], bool] | None = None) -> list[Span]:
    """``path`` cut into spans of whole lines of about ``block_bytes`` each (one span when the file is no
    larger), so that several readers can read one file side by side and together see every record once,
    with the file's line numbers. With ``paragraphs`` a span ends only after a blank line (a line that is
    whitespace once decoded), so a blank-line separated paragraph is never cut; with ``opens`` a span starts
    only at a line for which it is true (a WikiText page's title). One pass counts the lines."""
    path = Path(path)
    size = path.stat().st_size
    if size <= block_bytes:
        return [Span(0, size)]
    cuts = []
    with open(path, "rb") as f:
        target = block_bytes
        while target < size:
            f.seek(target)
            f.readline()  # the rest of the line the target falls in
            cut = f.tell()
            while (paragraphs or opens) and cut < size:
                raw = f.readline()
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if opens is not None and opens(text):
                    break  # the span starts at this line
                cut = f.tell()
                if paragraphs and not text.strip():
                    break  # ... or after this one
            if cut >= size:
                break
            cuts.append(cut)
            target = cut + block_bytes
        spans, line, start = [], 1, 0
        f.seek(0)
        for end in [*cuts, size]:
            spans.append(Span(start, end, line))
            left = end - start
            while left:
                chunk = f.read(min(left, 1 << 24))
                line += chunk.count(b"\n")
                left -= len(chunk)
            start = end
    return spans


def check_head(path: str | Path, size: int = 1 << 16) -> None:
    """The complete lines of a text file's first ``size`` bytes as ``lines`` reads them: a binary, UTF-16
    or otherwise undecodable file fails here in a millisecond (a job checks its inputs so before Ray
    starts); the rest of the file is checked as it is read."""
    with open(path, "rb") as f:
        head = f.read(size)
    if len(head) == size and b"\n" in head:
        head = head[:head.rindex(b"\n") + 1]  # whole lines only: no character cut in two
    elif len(head) == size:  # one long line: a character cut at the end is left out
        cut = len(head)
        while cut > len(head) - 3 and head[cut - 1] & 0xC0 == 0x80:  # continuation bytes
            cut -= 1
        head = head[:cut - 1] if head[cut - 1] >= 0xC0 else head[:cut]  # and the lead byte before them
    for number, raw in enumerate(head.split(b"\n"), start=1):
        _decode(path, number, raw)


def _decode(path: str | Path, number: int, raw: bytes) -> str:
    """One raw line as text (strict UTF-8, a BOM on line 1 dropped, the line end stripped), checked."""
    try:
        text = raw.decode("utf-8-sig" if number == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        bom = _UTF16_BOMS.get(raw[:2]) if number == 1 and exc.start < 2 else None
        what = (f"a {bom} byte-order mark: the file is {bom.split(' ')[0]}, not UTF-8; convert it, e.g. "
                f"iconv -f UTF-16 -t UTF-8") if bom else (
            f"invalid UTF-8 byte 0x{raw[exc.start]:02x} at column {exc.start + 1}")
        raise InputError(path, what, line=number, expected="UTF-8 text") from None
    text = text.rstrip("\r\n")
    check_text(path, number, text)
    return text
