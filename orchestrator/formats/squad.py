"""SQuAD-style JSON (SQuAD v1.1, XQuAD, JSQuAD) as a corpus: the paragraphs' contexts as ``Passage`` records.

The file is read by ``orchestrator.formats.parallel.read_squad`` (the one SQuAD JSON parser: strict
UTF-8, errors naming the JSON path); here each distinct context becomes one passage, its page the
article's title (a context repeated, as datasets that copy a paragraph per question do, is kept
once). ``line`` is the paragraph's 1-based position in the file. JSQuAD writes every context as
``<title> [SEP] <paragraph>``: that prefix is dropped, so BERT's separator token never enters a
corpus. Questions and answers are not read.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from orchestrator.formats.base import READERS, Layout, Passage
from orchestrator.formats.parallel import read_squad

#: How JSQuAD joins an article's title to each of its paragraphs.
TITLE_SEPARATOR = " [SEP] "


@READERS.register("squad")
def read_squad_passages(path: Path, layout: Layout) -> Iterator[Passage]:
    seen: set[str] = set()
    for number, unit in enumerate(read_squad(path, "context"), start=1):
        text = unit.text
        if unit.title and text.startswith(unit.title + TITLE_SEPARATOR):
            text = text[len(unit.title) + len(TITLE_SEPARATOR):].strip()
        if text and text not in seen:
            seen.add(text)
            yield Passage(number, text, unit.title)
