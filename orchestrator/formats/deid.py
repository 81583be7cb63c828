"""The i2b2 2014 de-identification release (seed 001's PHI data): one XML file per clinical note,

    <deIdi2b2><TEXT><![CDATA[ the note ]]></TEXT>
    <TAGS><NAME id="P0" start="16" end="26" text="John Smith" TYPE="PATIENT" comment=""/> ...</TAGS></deIdi2b2>

read as ONE ``Sentence`` per note: the note's words (runs of letters and digits, and every other
non-space character on its own; a word is also cut where a PHI span starts or ends) tagged IOB with
each span's ``TYPE`` (the i2b2-PHI subcategory: DOCTOR, DATE, ...); ``doc`` is the file's stem,
``lines`` each word's line in the file. Offsets count characters of the TEXT content, as the release
does. A span whose ``text`` differs from the note at its offsets, spans that overlap, a document
type declaration (no entity is ever expanded) or XML that is not well-formed raise ``InputError``.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.formats.base import READERS, Layout, Sentence

WORD = re.compile(r"[^\W_]+|[^\w\s]|_")


def _text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        line = path.read_bytes()[:exc.start].count(b"\n") + 1
        raise InputError(path, f"invalid UTF-8 byte at byte {exc.start}", line=line, expected="UTF-8 XML") from None


@READERS.register("i2b2_deid")
def read_i2b2_deid(path: Path, layout: Layout) -> Iterator[Sentence]:
    """The one note of an i2b2 2014 de-identification XML file, as IOB-tagged words."""
    raw = _text(path)
    if re.search(r"<!(DOCTYPE|ENTITY)", raw):
        raise InputError(path, "a document type declaration", line=raw[:raw.index("<!")].count("\n") + 1,
                         expected="i2b2 de-identification XML without DOCTYPE or ENTITY declarations")
    try:
        root = ET.fromstring(raw)
    except ET.ParseError as exc:
        raise InputError(path, f"not well-formed XML ({exc})", line=exc.position[0],
                         expected="<deIdi2b2><TEXT>...</TEXT><TAGS>...</TAGS></deIdi2b2>") from None
    text_el = root.find("TEXT")
    if root.tag != "deIdi2b2" or text_el is None:
        raise InputError(path, f"root <{root.tag}> without a <TEXT> element", line=1,
                         expected="<deIdi2b2> holding <TEXT> (the note) and <TAGS> (its PHI spans)")
    note = text_el.text or ""
    start_of_text = raw.find("<![CDATA[")
    first_line = raw[:start_of_text if start_of_text >= 0 else raw.find("<TEXT")].count("\n") + 1
    spans = _spans(path, root, note)
    cuts = sorted({0, len(note), *[x for s, e, _ in spans for x in (s, e)]})
    words: list[tuple[int, str]] = []
    for a, b in zip(cuts, cuts[1:]):
        words += [(m.start(), m.group()) for m in WORD.finditer(note, a, b)]
    tags = _tags(words, spans)
    lines = tuple(first_line + note.count("\n", 0, start) for start, _ in words)
    if words:
        yield Sentence(lines[0], tuple(w for _, w in words), tuple(tags), lines, path.stem)


def _spans(path: Path, root: ET.Element, note: str) -> list[tuple[int, int, str]]:
    """(start, end, TYPE) of every PHI span, checked against the note and for overlaps."""
    spans = []
    for tag in root.find("TAGS") if root.find("TAGS") is not None else ():
        where = f"<{tag.tag} id={tag.get('id', '?')!r}>"
        try:
            start, end = int(tag.get("start", "")), int(tag.get("end", ""))
        except ValueError:
            raise InputError(path, f"{where}: start {tag.get('start')!r} / end {tag.get('end')!r}",
                             expected="integer character offsets into TEXT") from None
        kind = (tag.get("TYPE") or "").strip()
        if not kind or not 0 <= start < end <= len(note):
            raise InputError(path, f"{where}: TYPE {kind!r}, offsets {start}..{end}",
                             expected=f"a TYPE and 0 <= start < end <= {len(note)} (the note's length)")
        if tag.get("text") is not None and note[start:end] != tag.get("text"):
            raise InputError(path, f"{where}: text {tag.get('text')!r} but the note has {note[start:end]!r} "
                                   f"at {start}..{end}", expected="offsets that match each span's text")
        spans.append((start, end, kind))
    spans.sort()
    for (s1, e1, _), (s2, e2, _) in zip(spans, spans[1:]):
        if s2 < e1:
            raise InputError(path, f"PHI spans {s1}..{e1} and {s2}..{e2} overlap",
                             expected="non-overlapping PHI spans (one IOB tag per word)")
    return spans


def _tags(words: list[tuple[int, str]], spans: list[tuple[int, int, str]]) -> list[str]:
    """IOB tags: a word inside a span is B-TYPE when it is the span's first word, else I-TYPE."""
    tags, i = [], 0
    begun = -1
    for start, _ in words:
        while i < len(spans) and spans[i][1] <= start:
            i += 1
        if i < len(spans) and spans[i][0] <= start:
            tags.append(("I-" if begun == i else "B-") + spans[i][2])
            begun = i
        else:
            tags.append("O")
    return tags
