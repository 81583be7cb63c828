"""PubMed's XML (``PubmedArticleSet``, the baseline and update files) and NLM's MeSH descriptor file.

    <PubmedArticleSet><PubmedArticle><MedlineCitation><PMID>123</PMID>
      <Article><Journal><JournalIssue><PubDate><Year>2012</Year></PubDate></JournalIssue></Journal>
        <ArticleTitle>...</ArticleTitle><Abstract><AbstractText Label="...">...</AbstractText></Abstract></Article>
      <MeshHeadingList><MeshHeading><DescriptorName UI="D003920">...</DescriptorName></MeshHeading></MeshHeadingList>
    </MedlineCitation></PubmedArticle></PubmedArticleSet>

``pubmed_xml`` reads one ``Row`` per article with an abstract: ``text`` (the title, then each
AbstractText section on its own line; inline markup such as <i> kept as its text), ``pmid``, ``mesh``
(the DescriptorName UIs, space-separated) and ``year`` (PubDate's Year, else the first year of its
MedlineDate; "" when neither). ``line`` is the line of the article's <PubmedArticle>.
``mesh_tree_numbers`` reads NLM's ``desc<year>.xml`` (DescriptorRecordSet: each DescriptorRecord's own
DescriptorUI and TreeNumberList/TreeNumber) into {UI: tree numbers}.

Both are parsed by expat as a stream (a 200 MB baseline file is never held whole), gzipped or not (NLM
distributes ``pubmed<yy>n<NNNN>.xml.gz``: a file starting with gzip's magic bytes is decompressed as it is
read). NLM's files start with a DOCTYPE naming an external DTD, which expat never fetches: that is accepted.
A DOCTYPE with an internal subset and any ENTITY declaration are refused (no entity is ever declared or
expanded), as is XML that is not well-formed, each with an ``InputError`` naming the file and line.
"""
from __future__ import annotations

import gzip
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from xml.parsers import expat

from orchestrator.core.errors import InputError
from orchestrator.formats.base import READERS, Layout, Row

CHUNK = 1 << 20
GZIP_MAGIC = b"\x1f\x8b"
_YEAR = re.compile(r"\b(1[89]\d\d|2\d\d\d)\b")


class _Stream:
    """An expat parser over one file: element paths, text of the open elements, errors with a line."""

    def __init__(self, path: Path, expected: str) -> None:
        self.path, self.expected = path, expected
        self.stack: list[str] = []
        p = expat.ParserCreate()
        p.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        p.StartDoctypeDeclHandler = self._doctype
        p.EntityDeclHandler = self._entity
        self.parser = p

    def fail(self, what: str, line: int | None = None) -> InputError:
        return InputError(self.path, what, line=line or self.parser.CurrentLineNumber, expected=self.expected)

    def _doctype(self, name, system_id, public_id, has_internal_subset) -> None:
        if has_internal_subset:
            raise self.fail(f"a DOCTYPE {name} with an internal subset (declarations in [...])")

    def _entity(self, name, *_args) -> None:
        raise self.fail(f"an ENTITY declaration ({name})")

    def run(self, start: Callable, end: Callable, text: Callable) -> Iterator[None]:
        """Feed the file chunk by chunk; yield after each chunk so the caller can hand out records."""
        self.parser.StartElementHandler = start
        self.parser.EndElementHandler = end
        self.parser.CharacterDataHandler = text
        with self.path.open("rb") as raw:
            gzipped = raw.read(2) == GZIP_MAGIC  # NLM distributes its files as .xml.gz: read them as they are
            raw.seek(0)
            f = gzip.GzipFile(fileobj=raw) if gzipped else raw
            while True:
                try:
                    chunk = f.read(CHUNK)
                except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError; a cut file ends in EOFError
                    raise self.fail(f"a damaged or incomplete gzip file ({exc})") from None
                try:
                    self.parser.Parse(chunk, not chunk)
                except expat.ExpatError as exc:
                    raise self.fail(f"not well-formed XML ({expat.errors.messages[exc.code]}, column "
                                    f"{exc.offset + 1})", exc.lineno) from None
                yield
                if not chunk:
                    return


def _first_year(*texts: str) -> str:
    for t in texts:
        m = _YEAR.search(t)
        if m:
            return m.group(1)
    return ""


@READERS.register("pubmed_xml")
def read_pubmed_xml(path: Path, layout: Layout) -> Iterator[Row]:
    """One ``Row`` (text, pmid, mesh, year) per PubmedArticle that has an abstract."""
    stream = _Stream(path, "PubMed XML: <PubmedArticleSet><PubmedArticle><MedlineCitation>... (NLM's format)")
    stack = stream.stack
    done: list[Row] = []
    art: dict = {}
    buf: list[str] = []  # text of the element being collected (title, abstract section, pmid, date)
    collecting: list[str] = []  # the element collected, by its path

    def start(name: str, attrs: dict) -> None:
        stack.append(name)
        if len(stack) == 1 and name != "PubmedArticleSet":
            raise stream.fail(f"root <{name}>")
        if name == "PubmedArticle":
            art.clear()
            art.update(line=stream.parser.CurrentLineNumber, sections=[], mesh=[], pmid="", title="", year="",
                       medline_date="")
        elif name == "DescriptorName" and stack[-2:-1] == ["MeshHeading"] and art:
            ui = attrs.get("UI", "").strip()
            if not ui:
                raise stream.fail("<DescriptorName> without a UI attribute")
            art["mesh"].append(ui)
        if art and not collecting and name in ("ArticleTitle", "AbstractText", "PMID", "Year", "MedlineDate"):
            collecting.append(name)
            buf.clear()

    def end(name: str) -> None:
        if collecting and collecting[0] == name and len(stack) and stack[-1] == name:
            value = " ".join("".join(buf).split())
            parent = stack[-2] if len(stack) > 1 else ""
            if name == "ArticleTitle" and parent == "Article":
                art["title"] = value
            elif name == "AbstractText" and parent == "Abstract" and value:  # not OtherAbstract
                art["sections"].append(value)
            elif name == "PMID" and parent == "MedlineCitation":
                art["pmid"] = value
            elif name == "Year" and parent == "PubDate":
                art["year"] = value
            elif name == "MedlineDate" and parent == "PubDate":
                art["medline_date"] = value
            collecting.clear()
        stack.pop()
        if name == "PubmedArticle":
            if not art["pmid"]:
                raise stream.fail("<PubmedArticle> without MedlineCitation/PMID", art["line"])
            if art["sections"]:
                text = "\n".join(t for t in (art["title"], *art["sections"]) if t)
                year = _first_year(art["year"], art["medline_date"])
                done.append(Row(art["line"], {"text": text, "pmid": art["pmid"], "mesh": " ".join(art["mesh"]),
                                              "year": year}))
            art.clear()

    def text(data: str) -> None:
        if collecting:
            buf.append(data)

    for _ in stream.run(start, end, text):
        yield from done
        done.clear()
    if stack:
        raise stream.fail(f"the file ends inside <{stack[-1]}>")


def mesh_tree_numbers(path: str | Path) -> dict[str, tuple[str, ...]]:
    """{DescriptorUI: its tree numbers} of NLM's MeSH descriptor file (``desc<year>.xml``)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "MeSH descriptor file does not exist", expected="NLM's desc<year>.xml")
    stream = _Stream(path, "NLM MeSH descriptors: <DescriptorRecordSet><DescriptorRecord><DescriptorUI>, "
                           "<TreeNumberList><TreeNumber>")
    stack = stream.stack
    out: dict[str, tuple[str, ...]] = {}
    record: dict = {}
    buf: list[str] = []

    def start(name: str, attrs: dict) -> None:
        stack.append(name)
        if len(stack) == 1 and name != "DescriptorRecordSet":
            raise stream.fail(f"root <{name}>")
        if name == "DescriptorRecord":
            record.clear()
            record.update(line=stream.parser.CurrentLineNumber, ui="", trees=[])
        buf.clear()

    def end(name: str) -> None:
        parent = stack[-2] if len(stack) > 1 else ""
        if name == "DescriptorUI" and parent == "DescriptorRecord":
            record["ui"] = "".join(buf).strip()
        elif name == "TreeNumber" and parent == "TreeNumberList" and stack[-3:-2] == ["DescriptorRecord"]:
            record["trees"].append("".join(buf).strip())
        elif name == "DescriptorRecord":
            if not record["ui"]:
                raise stream.fail("<DescriptorRecord> without its DescriptorUI", record["line"])
            out[record["ui"]] = tuple(record["trees"])
        stack.pop()
        buf.clear()

    def text(data: str) -> None:
        buf.append(data)

    for _ in stream.run(start, end, text):
        pass
    if stack:
        raise stream.fail(f"the file ends inside <{stack[-1]}>")
    if not out:
        raise InputError(path, "no DescriptorRecord", expected=stream.expected)
    return out
