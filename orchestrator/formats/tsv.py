"""BLUE / BLURB TSV: one example per row, its columns found by header name or, without a header,
by position; each row a ``Row`` keyed by role.

Quoting (``layout.quoting``):

- ``csv``: a real CSV parser over the whole file: BLUE's pandas-written files quote a cell that
  holds a TAB (BIOSSES ``dev.tsv``), and a quoted cell may span lines; a cell that does both is
  refused, naming the line its quote opened: that is an unbalanced quote that swallowed the
  columns of the next rows (the merged row can still have the right number of columns);
- ``none``: QUOTE_NONE, a quote is text (HoC: ``" Reactive " or activated stroma``);
- ``minimal``: QUOTE_NONE, and a cell a CSV writer quoted (``base.unquote_cell``: wrapped in ``"``, its inner
  quotes doubled, at least one) is unquoted; any other quote is text. ChemProt: BLUE's converter writes
  ``"To probe into the ""logic"" of ..."`` with ``csv.writer`` while the shared copy's 59 rows hold a stray ``"``,
  and both read as their text (probe B3);
- ``auto``: QUOTE_NONE, and a line with more cells than its file has columns is parsed again with
  CSV quoting, and a cell quoted as a CSV writer quotes it (``"..."`` whole, its inner quotes doubled)
  is unquoted: the text view, which reads both kinds without a task to say which (BLUE's MedNLI, DDI and
  i2b2 converters write ``"Patient has ""no"" allergies."``; HoC's literal ``" Reactive " or ...`` is
  no such cell).

Roles:

- with ``layout.columns`` (role -> header name), the first row is a header when it names the
  column of every role; ``layout.index_role`` may be missing from it and then takes pandas'
  unnamed index column (a header whose first name is empty, as BLUE's BIOSSES). A first row naming
  none of them starts a headerless file read by ``layout.positions``; anything else is a header
  that lacks columns;
- without ``layout.columns`` (the text view), a first row naming a sentence column
  (``SENTENCE_COLUMNS``) is a header and each column is its own role (lower-cased name); else the
  file is headerless, by ``layout.positions`` or else BLUE's relation layout
  (``DEFAULT_POSITIONS``: index, sentence, label).

Column count: every row of a file with a header has as many columns as the header. A headerless
file has exactly ``positional_width(positions)`` columns: non-negative positions count from the
start, negative ones from the end, and no column is named from both ends, so a row holds the
leading run up to the largest position, then the trailing run down to the most negative one:
``{id: 0, text_a: 1, label: 2}`` -> 3 columns (ChemProt); ``{id: 0, text_a: -3, text_b: -2,
label: -1}`` -> 4 (index, sentence1, sentence2, score). A row of any other width is refused:
reading it by position would take the wrong column (a year as the score).
"""
from __future__ import annotations

import csv
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.formats.base import READERS, Layout, Row, lines, unquote_cell

#: BLUE/BLURB header names of columns that hold sentences (the text view of a TSV file).
SENTENCE_COLUMNS = ("sentence", "sentence1", "sentence2", "sent1", "sent2", "text")
#: A headerless file in the text view: BLUE's relation files (index, sentence, label).
DEFAULT_POSITIONS = {"index": 0, "sentence": 1, "label": 2}
#: The longest cell a CSV-quoted TSV may hold: a document-level task's abstract, or a whole note, is
#: longer than the csv module's default 128 KiB (which refused it, saying a quote was left open).
CELL_LIMIT = 1 << 24
csv.field_size_limit(max(csv.field_size_limit(), CELL_LIMIT))


def positional_width(positions: Mapping[str, int]) -> int:
    """Columns of a headerless row whose roles sit at ``positions`` (see the module docstring)."""
    head = [p for p in positions.values() if p >= 0]
    tail = [-p for p in positions.values() if p < 0]
    return (max(head) + 1 if head else 0) + (max(tail) if tail else 0)


@READERS.register("blue_tsv")
def read_blue_tsv(path: Path, layout: Layout) -> Iterator[Row]:
    rows = _rows(path, layout.quoting)
    first = next(rows, None)
    if first is None:
        return
    roles, width, has_header = _roles(path, first[0], [c.strip() for c in first[1]], layout)
    if has_header:
        shape = "like the header"
    else:
        rows = itertools.chain([first], rows)
        named = ", ".join(f"{role}={i}" for role, i in roles.items())
        shape = f"in a file without a header, as its positions name ({named})"
    for line, cells in rows:
        if layout.quoting == "auto":
            cells = next(csv.reader(["\t".join(cells)], delimiter="\t")) if len(cells) > width else \
                [_unquoted(c) for c in cells]
        elif layout.quoting == "minimal":
            cells = [unquote_cell(c) for c in cells]
        if len(cells) != width:
            raise InputError(path, f"{len(cells)} TAB-separated columns", line=line,
                             expected=f"{width} columns {shape}")
        yield Row(line, {role: cells[i].strip() for role, i in roles.items()})


def _unquoted(cell: str) -> str:
    """``cell`` as a CSV reader reads it when a CSV writer quoted it whole (``"..."``, every inner quote
    doubled); any other cell as it is. Looser than ``unquote_cell`` (``"abc"`` loses its quotes, as a CSV reader
    takes them): the text view of a file whose task reads it with a CSV parser."""
    text = cell.strip()
    inner = text[1:-1]
    if len(text) >= 2 and text[0] == text[-1] == '"' and '"' not in inner.replace('""', ""):
        return inner.replace('""', '"')
    return cell


def _rows(path: Path, quoting: str) -> Iterator[tuple[int, list[str]]]:
    """(line the row starts on, cells) of every row holding a non-blank cell."""
    if quoting != "csv":
        for number, text in lines(path):
            cells = text.split("\t")
            if any(c.strip() for c in cells):
                yield number, cells
        return
    reader = csv.reader((text + "\n" for _, text in lines(path)), delimiter="\t")
    start = 1
    while True:
        try:
            cells = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise InputError(path, f"CSV: {exc}", line=reader.line_num,
                             expected="TAB-separated cells, a quoted cell closed") from None
        for i, cell in enumerate(cells):
            if "\t" in cell and "\n" in cell:
                opened = start + sum(c.count("\n") for c in cells[:i])
                raise InputError(path, f"a quoted cell opened on this line runs on to line {reader.line_num} and "
                                 "holds TABs and line breaks: an unbalanced quote likely swallowed the columns "
                                 "and rows after it", line=opened,
                                 expected="every quote closed; a quoted cell may span lines or hold a TAB, not both")
        if any(c.strip() for c in cells):
            yield start, cells
        start = reader.line_num + 1


def _roles(path: Path, line: int, header: list[str], layout: Layout) -> tuple[dict[str, int], int, bool]:
    """(role -> column, columns per row, whether the first row is a header)."""
    if not layout.columns:
        names = [name.lower() for name in header]
        if any(name in SENTENCE_COLUMNS for name in names):
            return {name: i for i, name in enumerate(names)}, len(names), True
        positions = dict(layout.positions or DEFAULT_POSITIONS)
        return positions, positional_width(positions), False
    required = [name for role, name in layout.columns.items() if role != layout.index_role]
    if all(name in header for name in required):
        roles = {role: header.index(name) for role, name in layout.columns.items() if name in header}
        if layout.index_role and layout.index_role not in roles and header[0] == "":
            roles[layout.index_role] = 0  # pandas' unnamed index column (BLUE's BIOSSES)
        return roles, len(header), True
    if layout.positions and not any(name in header for name in required):
        positions = dict(layout.positions)
        return positions, positional_width(positions), False
    missing = [name for name in required if name not in header]
    raise InputError(path, f"header lacks columns {missing}", line=line,
                     expected=f"a TAB-separated header naming {list(layout.columns.values())}")
