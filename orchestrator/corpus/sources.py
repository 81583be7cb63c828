"""Corpus sources: documents of text, WikiText, JSONL, parquet, SQuAD JSON and PubMed XML files; their Ray Data edge.

Files are read by ``orchestrator.formats`` (one streaming reader per format, tested without Ray);
``iter_documents`` turns their records into ``Document`` rows, one in memory at a time.
``read_source`` turns a source into a ``ray.data.Dataset`` of sentence-split documents: one read
task per file, or per ``READ_BLOCK_BYTES`` of a larger text, JSONL, WikiText or parquet file (spans
of whole lines, paragraphs, pages or row groups, ``orchestrator.formats.file_spans``, ``parquet_spans``:
the same documents, line numbers and order as one task reading it whole), batches streamed out of a
generator, so a corpus larger than memory flows through.

Bad input fails loudly with an ``InputError`` naming the file and line: a missing path, a 0-byte
file, bytes that are not UTF-8, binary content (NUL or control characters: a binary file, UTF-16
text; ``orchestrator.formats.base.check_text``), a JSONL line that is not an object or lacks the field, or a
file that holds no document at all. CRLF line ends and a UTF-8 BOM are accepted.

A document's language is the source's ``language``, or with ``language_field`` the value of
that field of each JSONL / parquet record (seed 002 takes it from the PubMed metadata). Seed
002's filters are options: ``skip_line_prefix`` drops the lines of a document that start with
it (the WMT abstracts' "#" lines: paper id and authors), and ``drop_letterless`` (the corpus
stage's setting) drops every sentence without a letter of any script. Seed 000's selection is
``mesh`` on a ``pubmed_xml`` source (PubMed's PubmedArticleSet files): articles by MeSH tree numbers
and publication year (``orchestrator.corpus.mesh``, Table A2).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from orchestrator.core.config import field, from_dict, to_dict
from orchestrator.core.errors import ConfigError, InputError, walk_exceptions
from orchestrator.corpus.mesh import MeshSelect, descriptor_trees, selected
from orchestrator.corpus.sentences import has_letter, split_sentences
from orchestrator.formats import (
    SPAN_FORMATS,
    Layout,
    Passage,
    Row,
    Span,
    file_spans,
    opens_wikitext_page,
    parquet_spans,
    read,
)
from orchestrator.formats.base import LANGUAGE_CODE, check_text

Format = Literal["text", "wikitext", "jsonl", "parquet", "squad", "pubmed_xml"]
Role = Literal["small", "large", "domain", "general"]


@dataclasses.dataclass(frozen=True)
class SourceConfig:
    name: str = field(help="short name; used in provenance and output paths")
    paths: tuple[str, ...] = field(help="files or directories (every non-hidden file inside, sorted)")
    format: Format = field("text", help="text | wikitext | jsonl | parquet | squad (SQuAD-style JSON: each distinct "
                                        "paragraph context a document, its article title the page) | pubmed_xml "
                                        "(PubMed's PubmedArticleSet: an article's title and abstract a document; "
                                        "page_field pmid makes its PMID the page)")
    document_split: Literal["line", "blank_line"] = field(
        "line", help="plain text: one document per line, or blank-line separated paragraphs")
    text_field: str = field("text", help="jsonl key / parquet column holding the document text")
    page_field: str = field("", help="jsonl key / parquet column naming the page (MDAPT: a page is "
                                     "never sampled twice across languages); empty = one page per doc")
    role: Role = field("large", help="small/large (SimPT, AmpV) or domain/general (MDAPT)")
    language: str = field("en", help="language code (MDAPT samples general text per language; ja and zh: "
                                     "sentences are split at 。！？, see orchestrator.corpus.sentences)")
    sentence_split: bool = field(True, help="split documents into sentences (syntok; full-stop rules for languages "
                                            "ja and zh); false when every line of a document is already one sentence")
    language_field: str = field("", help="jsonl key / parquet column holding each document's language code "
                                         "(source metadata, as seed 002's PubMed); empty = every document "
                                         "has `language`")
    skip_line_prefix: str = field("", help="drop the lines of a document that start with this (after leading "
                                           "spaces), e.g. '#' for seed 002's WMT abstracts; empty = keep all")
    mesh: MeshSelect = field(default_factory=MeshSelect,
                             help="pubmed_xml: keep the articles of these MeSH tree numbers and years (seed 000's "
                                  "Table A2: descriptors, include, exclude, year_from, year_to)")

    #: Fields added after the first corpus outputs: they enter the stage key only when set.
    LATER_FIELDS = ("language_field", "skip_line_prefix", "mesh")

    def __post_init__(self) -> None:
        if not self.name or not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name):
            raise ConfigError(f"source name {self.name!r} must be non-empty [A-Za-z0-9_.-]")
        if not LANGUAGE_CODE.fullmatch(self.language):
            raise ConfigError(f"source {self.name!r}: language {self.language!r} is not a language code "
                              "(such as en, de, pt-BR)")
        if self.language_field and self.format not in ("jsonl", "parquet"):
            raise ConfigError(f"source {self.name!r}: language_field needs format jsonl or parquet (a {self.format} "
                              "file has no per-document fields); set `language` instead")
        if not self.paths:
            raise ConfigError(f"source {self.name!r}: paths is empty")
        if self.mesh.active and self.format != "pubmed_xml":
            raise ConfigError(f"source {self.name!r}: mesh selects PubMed articles; it needs format pubmed_xml "
                              f"(not {self.format})")
        if self.format in ("jsonl", "parquet") and not self.text_field:
            raise ConfigError(f"source {self.name!r}: format {self.format} needs `text_field`")


@dataclasses.dataclass(frozen=True)
class Document:
    """One document as read: where it came from and its raw text (paragraphs joined by newlines)."""

    source: str
    doc_id: str
    page: str
    language: str
    text: str


def source_files(src: SourceConfig) -> list[Path]:
    """Expand the configured paths into files; a missing path or an empty directory is an error."""
    files: list[Path] = []
    for raw in src.paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
            if not found:
                raise InputError(path, f"source {src.name!r}: directory holds no files",
                                 expected="text files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(path, f"source {src.name!r}: path does not exist")
    for path in files:
        if path.stat().st_size == 0:
            raise InputError(path, f"source {src.name!r}: file is empty (0 bytes)",
                             expected="at least one document")
    return files


def iter_documents(src: SourceConfig, path: Path, file_index: int = 0, span: Span | None = None
                   ) -> Iterator[Document]:
    """All documents of one file of a source (of ``span`` of it only, when given), streamed; raises
    InputError if a whole file has none (a span may have none: the caller checks the file)."""
    count = 0
    for line, text, page, language in _documents(src, path, span):
        doc_id = f"{src.name}:{file_index}:{line}"
        count += 1
        yield Document(source=src.name, doc_id=doc_id, page=page or doc_id, language=language, text=text)
    if count == 0 and span is None:
        raise no_document(src, path)


def no_document(src: SourceConfig, path: str | Path) -> InputError:
    return InputError(path, f"source {src.name!r}: file holds no document (only blank lines or headings)",
                      expected=f"{src.format} documents")


def iter_source(src: SourceConfig) -> Iterator[Document]:
    for index, path in enumerate(source_files(src)):
        yield from iter_documents(src, path, index)


def _documents(src: SourceConfig, path: Path, span: Span | None = None) -> Iterator[tuple[int, str, str, str]]:
    """(line, text, page, language) of every non-empty document of one file (or span), by the
    ``orchestrator.formats`` reader; with ``language_field`` a record without a language code there is an
    InputError."""
    layout = Layout(text_field=src.text_field, page_field=src.page_field, split=src.document_split, span=span)
    if src.language_field and src.format == "parquet":  # the parquet reader reads the named columns only
        layout = dataclasses.replace(layout, columns={k: k for k in (src.text_field, src.page_field,
                                                                    src.language_field) if k})
    trees = descriptor_trees(src.mesh.descriptors) if src.mesh.descriptors else {}
    for record in read(path, src.format, layout):
        if src.mesh.active and isinstance(record, Row) and not selected(
                record.text("mesh").split(), record.text("year"), trees, src.mesh):
            continue
        if isinstance(record, Passage):
            yield record.line, record.text, record.page, src.language
        elif isinstance(record, Row) and record.text(src.text_field):
            check_text(path, record.line, record.text(src.text_field))  # a parquet cell or a JSON "\u0000"
            language = src.language
            if src.language_field:
                language = record.text(src.language_field)
                if not LANGUAGE_CODE.fullmatch(language):
                    raise InputError(path, f"source {src.name!r}: field {src.language_field!r} is {language!r}, "
                                     "not a language code", line=record.line,
                                     expected=f'{{"{src.language_field}": "en"}} (a code such as en, de, pt-BR)')
            yield (record.line, record.text(src.text_field), record.text(src.page_field) if src.page_field else "",
                   language)


# ---------------------------------------------------------------------------------------------
# Ray Data edge


#: Per-document counts of what the filters dropped, beside the shard columns in the read batches.
FILTER_COUNTS = ("skipped_lines", "letterless")


def document_rows(src: SourceConfig, path: Path, file_index: int, batch_docs: int = 256,
                  drop_letterless: bool = False, span: Span | None = None) -> Iterator[dict[str, list]]:
    """Columnar batches of sentence-split documents from one file, or a span of it (what each read task yields).

    Besides the shard columns, each row counts the lines ``skip_line_prefix`` dropped and the
    sentences without a letter ``drop_letterless`` dropped; a document left without sentences by
    them comes as a row without sentences (so its drops are counted), one empty before is left out."""
    batch: dict[str, list] = {k: [] for k in ("source", "doc_id", "page", "language", "sentences", "n_bytes",
                                              *FILTER_COUNTS)}
    for doc in iter_documents(src, path, file_index, span):
        lines = doc.text.split("\n")
        skipped = 0
        if src.skip_line_prefix:
            kept = [line for line in lines if not line.lstrip().startswith(src.skip_line_prefix)]
            skipped, lines = len(lines) - len(kept), kept
        if src.sentence_split:
            sentences = [s for para in lines for s in split_sentences(para, doc.language)]
        else:
            sentences = [s for s in lines if s.strip()]
        letterless = 0
        if drop_letterless:
            kept = [s for s in sentences if has_letter(s)]
            letterless, sentences = len(sentences) - len(kept), kept
        if not sentences and not (skipped or letterless):
            continue
        batch["source"].append(doc.source)
        batch["doc_id"].append(doc.doc_id)
        batch["page"].append(doc.page)
        batch["language"].append(doc.language)
        batch["sentences"].append(sentences)
        batch["n_bytes"].append(len("\n".join(sentences).encode("utf-8")) if skipped or letterless
                                else len(doc.text.encode("utf-8")))
        batch["skipped_lines"].append(skipped)
        batch["letterless"].append(letterless)
        if len(batch["doc_id"]) >= batch_docs:
            yield batch
            batch = {k: [] for k in batch}
    if batch["doc_id"]:
        yield batch


class RemoteInputError(Exception):
    """An InputError in a form that survives Ray's pickling (InputError's constructor does not)."""

    def __init__(self, path: str, message: str, line: int | None, expected: str | None):
        super().__init__(path, message, line, expected)

    @classmethod
    def wrap(cls, exc: InputError) -> RemoteInputError:
        where = exc.path if exc.line is None else f"{exc.path}:{exc.line}"
        message = str(exc).removeprefix(f"{where}: ")
        if exc.expected:
            message = message.removesuffix(f" (expected {exc.expected})")
        return cls(exc.path, message, exc.line, exc.expected)

    def unwrap(self) -> InputError:
        path, message, line, expected = self.args
        # Ray Data appends its retry advice to the first argument: keep the path only.
        return InputError(str(path).split("\n", 1)[0], message, line, expected)


#: A text, JSONL, WikiText or parquet (its data uncompressed) source file larger than this is read by one Ray task
#: per span of about this many bytes (sentence splitting reads about 0.8 MB/s a core: 10 s a span; a 5 GB file
#: on one core took 1.7 hours).
READ_BLOCK_BYTES = 8 << 20


def read_items(src: SourceConfig, block_bytes: int = READ_BLOCK_BYTES) -> list[dict]:
    """The read tasks of ``src``, in order: each a file, or a span of one (its ``start``, ``end`` and
    ``first_line``; ``span`` false for a file read whole), with ``bytes``, its share of the file's size."""
    items = []
    for index, path in enumerate(source_files(src)):
        size = path.stat().st_size
        spans = [Span(0, size)]
        if src.format == "parquet":
            spans = parquet_spans(path, block_bytes)
        elif src.format in SPAN_FORMATS:
            paragraphs = src.format == "text" and src.document_split == "blank_line"
            spans = file_spans(path, block_bytes, paragraphs=paragraphs,
                               opens=opens_wikitext_page if src.format == "wikitext" else None)
        items.extend({"path": str(path), "file_index": index, "span": len(spans) > 1, "start": s.start,
                      "end": s.end, "first_line": s.first_line,
                      "bytes": s.end - s.start if src.format != "parquet" else size // len(spans)} for s in spans)
    return items


class ReadTally:
    """The read tasks that have ended, each told by the task itself as it ends (a Ray actor the driver asks):
    their rows reach the driver in the tasks' order, which says nothing of the later tasks, most of which run in
    parallel with the first."""

    def __init__(self):
        self.ended: set[tuple[int, int]] = set()

    def end(self, file_index: int, start: int) -> None:
        self.ended.add((file_index, start))  # a set: a task Ray retries tells it once

    def tasks(self) -> list[tuple[int, int]]:
        return sorted(self.ended)


def _read_file_batches(batch: dict[str, Any], source: dict, drop_letterless: bool = False, tally: Any = None
                       ) -> Iterator[dict[str, list]]:
    src = from_dict(SourceConfig, source)
    try:
        for i, path in enumerate(batch["path"]):
            span = None
            if batch["span"][i]:
                span = Span(int(batch["start"][i]), int(batch["end"][i]), int(batch["first_line"][i]))
            yield from document_rows(src, Path(path), int(batch["file_index"][i]), drop_letterless=drop_letterless,
                                     span=span)
            if tally is not None:
                tally.end.remote(int(batch["file_index"][i]), int(batch["start"][i]))
    except InputError as exc:
        raise RemoteInputError.wrap(exc) from None


def read_source(src: SourceConfig, num_cpus: float = 1.0, drop_letterless: bool = False,
                items: list[dict] | None = None, tally: Any = None):
    """A ray.data.Dataset of sentence-split documents of ``src``: one streamed read task per item of
    ``items`` (default ``read_items(src)``). A file read in spans is not checked for holding a document:
    the caller checks it. ``tally``: a ``ReadTally`` actor each task tells when it ends."""
    import ray.data  # heavy: ray

    items = read_items(src) if items is None else items
    ds = ray.data.from_items(items, override_num_blocks=len(items))
    ds = ds.map_batches(_read_file_batches, batch_size=1,
                        fn_kwargs={"source": to_dict(src), "drop_letterless": drop_letterless, "tally": tally},
                        num_cpus=num_cpus, batch_format="default")
    # Ray Data's per-operator reservation gives this read about half the CPUs (one task at a time on 2):
    # every CPU may read, as ``num_cpus`` says (the instances stage lifts it so too)
    ds.context.op_resource_reservation_enabled = False
    return ds


def find_input_error(exc: BaseException) -> InputError | None:
    """The InputError raised inside a Ray task, found through Ray's exception wrappers."""
    for cur in walk_exceptions(exc, context=True):
        if isinstance(cur, InputError):
            return cur
        if isinstance(cur, RemoteInputError) and len(cur.args) == 4:  # not Ray's RayTaskError(...) mixin
            return cur.unwrap()
    return None
