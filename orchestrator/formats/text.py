"""Plain text and WikiText: documents of a text file, as ``Passage`` records."""
from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from orchestrator.formats.base import READERS, Layout, Passage, lines

_WIKITEXT_TITLE = re.compile(r"^ ?= ([^=].*?) = ?$")
_WIKITEXT_SUBHEADING = re.compile(r"^ ?(= ){2,}.*( =){2,} ?$")


@READERS.register("text")
def read_text(path: Path, layout: Layout) -> Iterator[Passage]:
    """Every non-blank line (``split="line"``), or blank-line separated paragraphs, stripped (of
    ``layout.span`` only when set: cut by ``file_spans``, with ``paragraphs`` for blank-line paragraphs)."""
    if layout.split == "line":
        for number, text in lines(path, layout.span):
            if text.strip():
                yield Passage(number, text.strip())
        return
    start, para = 0, []
    for number, text in lines(path, layout.span):
        if text.strip():
            if not para:
                start = number
            para.append(text.strip())
        elif para:
            yield Passage(start, "\n".join(para))
            para = []
    if para:
        yield Passage(start, "\n".join(para))


def opens_wikitext_page(text: str) -> bool:
    """A WikiText line that starts a page (`` = Title = ``): where ``file_spans`` may cut a WikiText file."""
    return bool(_WIKITEXT_TITLE.match(text)) and not _WIKITEXT_SUBHEADING.match(text)


@READERS.register("wikitext")
def read_wikitext(path: Path, layout: Layout) -> Iterator[Passage]:
    """WikiText: a `` = Title = `` line starts a page (its paragraphs, one passage); `` = = Section = = ``
    lines are dropped. With ``layout.span`` (cut by ``file_spans`` at ``opens_wikitext_page``), its pages only."""
    start, title, para = 0, "", []
    for number, text in lines(path, layout.span):
        if _WIKITEXT_SUBHEADING.match(text):
            continue
        heading = _WIKITEXT_TITLE.match(text)
        if heading:
            if para:
                yield Passage(start, "\n".join(para), title)
            start, title, para = number, heading.group(1).strip(), []
            continue
        if text.strip():
            if not para and not title:
                start = number
            para.append(text.strip())
    if para:
        yield Passage(start, "\n".join(para), title)
