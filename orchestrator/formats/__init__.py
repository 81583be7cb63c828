"""File formats: ONE registry of streaming readers, one per file layout, and the text view of any file.

    from orchestrator.formats import Layout, read, text_units
    for row in read("hoc/train.tsv", "blue_tsv", Layout(columns={"text": "sentence", "y": "labels"})):
        row.line, row.fields["text"], row.fields["y"]
    list(text_units("BC5CDR-chem/test.tsv"))   # sniffed blue_ner: the tokens of each sentence

Formats (``READERS``): text, wikitext, squad (``Passage``), jsonl, parquet, blue_tsv, pubmed_xml (``Row``), iob, conll,
blue_ner, i2b2_deid (``Sentence``; the last: i2b2 2014 de-identification XML, a note per file). Every text
file is strict UTF-8 with the same ``InputError`` (file, line, byte, column); a text or JSONL file can be
read in spans of whole lines, a WikiText file in spans of whole pages (``file_spans``), a parquet file in spans
of row groups (``parquet_spans``; ``Layout.span``), so that several tasks share a large one. This
package knows file layouts only, what a column or tag means is the caller's.
"""
from orchestrator.formats import deid, pubmed, records, squad, text, tokens, tsv  # noqa: F401  (each registers its readers)
from orchestrator.formats.base import (
    READERS,
    SPAN_FORMATS,
    Layout,
    Passage,
    Reader,
    Record,
    Row,
    Sentence,
    Span,
    file_spans,
    lines,
)
from orchestrator.formats.files import SUFFIXES, read, resolve, sniff, text_units
from orchestrator.formats.records import parquet_spans
from orchestrator.formats.text import opens_wikitext_page
from orchestrator.formats.tokens import TAG
from orchestrator.formats.tsv import SENTENCE_COLUMNS, positional_width

__all__ = ["READERS", "Layout", "Passage", "Reader", "Record", "Row", "Sentence", "SENTENCE_COLUMNS",
           "SPAN_FORMATS", "SUFFIXES", "Span", "TAG", "file_spans", "lines", "opens_wikitext_page", "parquet_spans",
           "positional_width", "read", "resolve", "sniff", "text_units"]
