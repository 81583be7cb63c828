"""SQuAD-style JSON (SQuAD v1.1, XQuAD, JSQuAD): the paragraphs' contexts as ``Passage`` records.

    {"data": [{"title": "...", "paragraphs": [{"context": "...", "qas": [...]}, ...]}, ...]}

Each distinct context is one passage (a context repeated, as datasets that copy a paragraph per
question do, is kept once), its page the article's title. ``line`` is the paragraph's 1-based
position in the file (the JSON has no useful line numbers; a JSON syntax error names its line).
JSQuAD writes every context as ``<title> [SEP] <paragraph>``: that prefix is dropped, so BERT's
separator token never enters a corpus. Questions and answers are not read.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.formats.base import READERS, Layout, Passage, lines

EXPECTED = 'SQuAD JSON: {"data": [{"title": ..., "paragraphs": [{"context": "..."}, ...]}, ...]}'
#: How JSQuAD joins an article's title to each of its paragraphs.
TITLE_SEPARATOR = " [SEP] "


@READERS.register("squad")
def read_squad(path: Path, layout: Layout) -> Iterator[Passage]:
    text = "\n".join(line for _, line in lines(path))  # strict UTF-8, a bad byte named by its line
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno,
                         expected=EXPECTED) from None
    articles = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(articles, list):
        raise InputError(path, "no list 'data' at the top level", expected=EXPECTED)
    seen: set[str] = set()
    number = 0
    for a, article in enumerate(articles):
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list):
            raise InputError(path, f"data[{a}] has no list 'paragraphs'", expected=EXPECTED)
        title = article.get("title")
        title = title.strip() if isinstance(title, str) else ""
        for p, paragraph in enumerate(paragraphs):
            number += 1
            context = paragraph.get("context") if isinstance(paragraph, dict) else None
            if not isinstance(context, str):
                raise InputError(path, f"data[{a}].paragraphs[{p}] has no string 'context'", expected=EXPECTED)
            if title and context.startswith(title + TITLE_SEPARATOR):
                context = context[len(title) + len(TITLE_SEPARATOR):]
            context = context.strip()
            if context and context not in seen:
                seen.add(context)
                yield Passage(number, context, title)
