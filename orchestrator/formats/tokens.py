"""Token-per-line files: one token and its tag per line, a blank line (or ``-DOCSTART-``) between
sentences; each sentence a ``Sentence`` record.

- ``iob``: 2 TAB-separated columns, token and tag (BC5CDR as the MTL-Bioinformatics release has it);
- ``conll``: 2 or more columns, TAB-separated or else split on white space;
- ``blue_ner``: BLUE's 4 TAB-separated columns: token, the document id on a sentence's first token
  else ``-``, the character offset, and the bare tag ``B``/``I``/``O``.

The token and tag columns are ``layout.positions["token"]`` (default 0) and
``layout.positions["label"]`` (default -1, the last). Tags are read as written: which tags a
task accepts is the task's business. A token is read as written too, a quote being text, unless
``layout.quoting`` is ``minimal``: then a token a CSV writer quoted is unquoted (``base.unquote_cell``:
BLUE's ``write_bert_ner_file`` writes the token ``"`` as four quotes; probe B3), a bare ``"`` kept.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.formats.base import READERS, Layout, Sentence, lines, unquote_cell

#: A tag of an IOB/IOBES scheme: O, a bare B/I/E/S (BLUE's 4-column files) or one with a type.
TAG = re.compile(r"^(O|[BIES](-\S+)?)$")

_SHAPES = {"iob": (2, "token, tag"), "blue_ner": (4, "token, docid or -, offset, B/I/O")}


@READERS.register("iob")
def read_iob(path: Path, layout: Layout) -> Iterator[Sentence]:
    return _sentences(path, layout, _fixed_cells(path, "iob"), doc_column=None)


@READERS.register("blue_ner")
def read_blue_ner(path: Path, layout: Layout) -> Iterator[Sentence]:
    return _sentences(path, layout, _fixed_cells(path, "blue_ner"), doc_column=1)


@READERS.register("conll")
def read_conll(path: Path, layout: Layout) -> Iterator[Sentence]:
    def cells(number: int, text: str) -> list[str]:
        found = text.split("\t") if "\t" in text else text.split()
        if len(found) < 2:
            raise InputError(path, "a token without a tag", line=number, expected="token and tag columns")
        return found

    return _sentences(path, layout, cells, doc_column=None)


def _fixed_cells(path: Path, fmt: str) -> Callable[[int, str], list[str]]:
    width, shape = _SHAPES[fmt]

    def cells(number: int, text: str) -> list[str]:
        found = text.split("\t")
        if len(found) != width:
            raise InputError(path, f"{len(found)} TAB-separated columns", line=number,
                             expected=f"{width} columns ({shape})")
        return found

    return cells


def _sentences(path: Path, layout: Layout, cells_of: Callable[[int, str], list[str]],
               doc_column: int | None) -> Iterator[Sentence]:
    token_at = layout.positions.get("token", 0)
    tag_at = layout.positions.get("label", -1)
    tokens: list[str] = []
    tags: list[str] = []
    numbers: list[int] = []
    doc = ""
    for number, text in lines(path):
        if not text.strip() or text.startswith("-DOCSTART-"):
            if tokens:
                yield Sentence(numbers[0], tuple(tokens), tuple(tags), tuple(numbers), doc)
            tokens, tags, numbers, doc = [], [], [], ""
            continue
        cells = cells_of(number, text)
        if not all(-len(cells) <= i < len(cells) for i in (token_at, tag_at)):
            raise InputError(path, f"{len(cells)} columns", line=number,
                             expected=f"a token at column {token_at} and a tag at column {tag_at}")
        token = cells[token_at].strip()
        if layout.quoting == "minimal":
            token = unquote_cell(token)
        if not token:
            raise InputError(path, "empty token", line=number, expected="a non-empty token")
        if not tokens and doc_column is not None and cells[doc_column].strip() != "-":
            doc = cells[doc_column].strip()
        tokens.append(token)
        tags.append(cells[tag_at].strip())
        numbers.append(number)
    if tokens:
        yield Sentence(numbers[0], tuple(tokens), tuple(tags), tuple(numbers), doc)
