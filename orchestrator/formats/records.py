"""JSON Lines and parquet: records of named fields, as ``Row`` records.

With ``layout.columns`` (role -> key / column) a row's fields are keyed by role and every key
must be present; otherwise a row holds the whole object (JSONL) or the text and page columns
(parquet), and ``layout.text_field``, when set, must name a string field.
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.formats.base import READERS, Layout, Row, Span, lines


@READERS.register("jsonl")
def read_jsonl(path: Path, layout: Layout) -> Iterator[Row]:
    """One JSON object per non-blank line (of ``layout.span`` only when set)."""
    for number, text in lines(path, layout.span):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InputError(path, f"invalid JSON: {exc.msg}", line=number,
                             expected="one JSON object per line") from None
        if not isinstance(obj, dict):
            raise InputError(path, f"a JSON {type(obj).__name__}, not an object", line=number,
                             expected="one JSON object per line")
        if layout.columns:
            missing = [key for key in layout.columns.values() if key not in obj]
            if missing:
                raise InputError(path, f"missing keys {missing}", line=number,
                                 expected=f"keys {list(layout.columns.values())}")
            yield Row(number, {role: obj[key] for role, key in layout.columns.items()})
            continue
        if layout.text_field and not isinstance(obj.get(layout.text_field), str):
            raise InputError(path, f"no string field {layout.text_field!r}", line=number,
                             expected=f'{{"{layout.text_field}": "..."}}')
        yield Row(number, obj)


def _parquet_file(path: Path):
    import pyarrow.parquet as pq  # heavy: pyarrow

    try:
        return pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises several types for a file that is not parquet
        raise InputError(path, f"not a parquet file: {exc}") from None


def parquet_spans(path: str | Path, block_bytes: int) -> list[Span]:
    """A parquet file cut into spans of whole row groups of about ``block_bytes`` (uncompressed) each: one
    span when the file is no larger or has one row group."""
    meta = _parquet_file(Path(path)).metadata
    spans, start, first, size, rows = [], 0, 1, 0, 0
    for i in range(meta.num_row_groups):
        size, rows = size + meta.row_group(i).total_byte_size, rows + meta.row_group(i).num_rows
        if size >= block_bytes or i == meta.num_row_groups - 1:
            spans.append(Span(start, i + 1, first))
            start, first, size, rows = i + 1, first + rows, 0, 0
    return spans or [Span(0, 0)]


@READERS.register("parquet")
def read_parquet(path: Path, layout: Layout) -> Iterator[Row]:
    """Rows of the needed columns only, streamed in batches; ``line`` is the 1-based row. With ``layout.span``
    (``parquet_spans``), the rows of its row groups only."""
    pf = _parquet_file(path)
    if layout.columns:
        roles = dict(layout.columns)
    else:
        roles = {name: name for name in (layout.text_field, layout.page_field) if name}
    names = pf.schema_arrow.names
    missing = [c for c in roles.values() if c not in names]
    if missing:
        raise InputError(path, f"no column {missing[0]!r}", expected=f"one of the columns {names}")
    columns = list(dict.fromkeys(roles.values()))
    row, groups = 0, None
    if layout.span is not None:
        row, groups = layout.span.first_line - 1, list(range(layout.span.start, layout.span.end))
    for batch in pf.iter_batches(columns=columns, batch_size=1024, row_groups=groups):
        data = batch.to_pydict()
        for i in range(batch.num_rows):
            row += 1
            yield Row(row, {role: data[name][i] for role, name in roles.items()})
