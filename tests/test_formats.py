"""orchestrator.formats: one registry of streaming readers, the same strict UTF-8 error in every one,
format sniffing, and the text view of any file; small files written here, then the real ones."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import ROOT
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.formats import (
    READERS,
    Layout,
    Passage,
    Row,
    Sentence,
    positional_width,
    read,
    sniff,
    text_units,
)

DATA = ROOT.parent / "shared" / "data"
SAMPLE = ROOT / "orchestrator" / "sample_data" / "blue"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")


def write(path: Path, data: str | bytes) -> Path:
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return path


def test_one_registry_of_every_layout():
    assert READERS.names() == ["blue_ner", "blue_tsv", "conll", "i2b2_deid", "iob", "jsonl", "parquet", "pubmed_xml",
                              "squad", "text", "wikitext"]
    with pytest.raises(ConfigError, match="unknown file format 'blue_nr' \\(did you mean 'blue_ner'\\?\\)"):
        READERS.get("blue_nr")


def test_the_guide_names_the_closed_lists_a_new_format_touches_and_they_agree_with_the_registry():
    """docs/CONTRIBUTING.md said a new format is a reader in READERS alone; a task's and a source's format are
    closed Literals, a task's mapped to its reader by READER_OF, scoring's input_format a third list."""
    from typing import get_args, get_type_hints

    from orchestrator.corpus.sources import Format
    from orchestrator.finetune.readers import DIRECTORY_FORMATS, READER_OF, TOKEN_FORMATS
    from orchestrator.finetune.spec import FileFormat
    from orchestrator.formats import SPAN_FORMATS
    from orchestrator.selection.scoring import SelectionConfig

    readers = set(READERS.names())
    assert set(READER_OF) == set(get_args(FileFormat)) and set(READER_OF.values()) <= readers
    assert set(TOKEN_FORMATS) | set(DIRECTORY_FORMATS) <= set(READER_OF)
    assert set(get_args(Format)) <= readers and set(SPAN_FORMATS) <= readers
    assert set(get_args(get_type_hints(SelectionConfig)["input_format"])) - {"auto", "blue"} <= readers
    guide = (ROOT / "docs" / "CONTRIBUTING.md").read_text(encoding="utf-8")
    for named in ('@READERS.register("name")', "orchestrator/formats/__init__.py", "`FileFormat` Literal",
                  "`READER_OF`", "`TOKEN_FORMATS`", "`DIRECTORY_FORMATS`", "`Format` Literal", "`SPAN_FORMATS`",
                  "`input_format` Literal", "`sniff`"):
        assert named in guide, named


# ----------------------------------------------------------------------------------- strict UTF-8
#: Each format: a file whose line 2 holds the byte 0xe9 at column 4 (Latin-1 'é').
BAD_LINE_2 = {
    "text": b"fine\nbad\xe9 text\n",
    "wikitext": b" = Title = \nbad\xe9 text\n",
    "jsonl": b'{"text": "fine"}\n{"t\xe9": 1}\n',
    "blue_tsv": b"index\tsentence\tlabel\nbad\xe9\tA.\tfalse\n",
    "iob": b"Aspirin\tB-Chemical\nbad\xe9\tO\n",
    "conll": b"Aspirin NN B-Chemical\nbad\xe9 NN O\n",
    "blue_ner": b"Aspirin\tdoc1\t0\tB\nbad\xe9\t-\t8\tO\n",
}


@pytest.mark.parametrize("fmt, quoting", [(fmt, "auto") for fmt in sorted(BAD_LINE_2)]
                         + [("blue_tsv", "csv"), ("blue_tsv", "none")])
def test_every_text_format_gives_the_same_utf8_error(tmp_path, fmt, quoting):
    path = write(tmp_path / "bad.tsv", BAD_LINE_2[fmt])
    with pytest.raises(InputError) as err:
        list(read(path, fmt, Layout(quoting=quoting)))
    assert (err.value.path, err.value.line) == (str(path), 2)
    assert err.value.message == "invalid UTF-8 byte 0xe9 at column 4"
    assert err.value.expected == "UTF-8 text"
    assert str(err.value) == f"{path}:2: invalid UTF-8 byte 0xe9 at column 4 (expected UTF-8 text)"


@pytest.mark.parametrize("fmt, data, units", [
    ("text", "\ufeffFirst.\r\n\r\nSecond.\r\n", ["First.", "Second."]),
    ("jsonl", '\ufeff{"text": "One."}\r\n', ["One."]),
    ("blue_tsv", "\ufeffindex\tsentence\tlabel\r\na\tOne.\tfalse\r\n", ["One."]),
    ("iob", "\ufeffAspirin\tB-Chemical\r\nworks\tO\r\n", ["Aspirin works"]),
    ("blue_ner", "\ufeffAspirin\tdoc1\t0\tB\r\nworks\t-\t8\tO\r\n", ["Aspirin works"]),
])
def test_bom_and_crlf_are_accepted(tmp_path, fmt, data, units):
    assert list(text_units(write(tmp_path / "f.tsv", data), fmt)) == units


def test_the_text_view_of_a_csv_written_blue_file_is_its_text(tmp_path):
    """A real-format probe (session 46): BLUE's MedNLI, DDI and i2b2 converters write with csv.writer, which
    quotes a cell holding a '"' whole and doubles it; the text view (vocabulary targets, tokenizer quality,
    proxy search) kept '"Patient has ""no"" known allergies."' where the task reader read the sentence. A literal
    quote that is not such a cell (HoC's '" Reactive " or ...') stays as it is."""
    data = ('index\tsentence1\tsentence2\tlabel\n'
            'id1\t"Patient has ""no"" known allergies."\tThe patient is allergic.\tcontradiction\n'
            'id2\t" Reactive " or activated stroma .\t"""@DRUG$"" may potentiate @DRUG$."\tneutral\n')
    assert list(text_units(write(tmp_path / "nli.tsv", data), "blue_tsv")) == [
        'Patient has "no" known allergies.', "The patient is allergic.", '" Reactive " or activated stroma .',
        '"@DRUG$" may potentiate @DRUG$.']


#: ASCII text as UTF-16LE without a byte-order mark: valid UTF-8, with a NUL after every letter.
UTF16_TEXT = "\n".join(f"Line {i} of a plain English document about proteins." for i in range(21))


@pytest.mark.parametrize("data, line, message", [
    (b"\0" * 5000, 1, "NUL character at column 1: binary content, not text"),
    (UTF16_TEXT.encode("utf-16-le"), 1, "NUL character at column 2: UTF-16 text without a byte-order mark?"),
    (UTF16_TEXT.encode("utf-16"), 1, "a UTF-16 (little-endian) byte-order mark: the file is UTF-16, not UTF-8"),
    (b"binary \x01\x02\x7f\x1b here\n", 1, "4 control characters (0x01, 0x02, 0x1b, 0x7f; the first at column 8): "
                                          "binary content"),
])
@pytest.mark.parametrize("fmt", ["text", "wikitext", "jsonl", "iob", "blue_ner"])
def test_binary_content_is_refused_with_file_and_line(tmp_path, fmt, data, line, message):
    """It used to be read as text: 5,000 NUL bytes as one document, UTF-16LE as 21 "documents"."""
    path = write(tmp_path / "bin.txt", data)
    with pytest.raises(InputError) as err:
        list(read(path, fmt))
    assert (err.value.path, err.value.line) == (str(path), line) and message in err.value.message, err.value


def test_text_with_tabs_page_breaks_and_a_stray_control_is_read(tmp_path):
    path = write(tmp_path / "ok.txt", b"a\ttab, a \x0bvertical tab\x0c and a page break\r\nDOS end \x1a\n")
    assert [p.text for p in read(path, "text")] == ["a\ttab, a \x0bvertical tab\x0c and a page break", "DOS end \x1a"]


def test_check_head_reads_the_first_64_kb_only(tmp_path):
    """What a job checks before Ray starts: a binary head fails at once; what lies beyond is left to the read."""
    from orchestrator.formats.base import check_head

    with pytest.raises(InputError, match=r"bin.txt:1: NUL character"):
        check_head(write(tmp_path / "bin.txt", b"\0" * 5000))
    with pytest.raises(InputError, match=r"utf16.txt:1: a UTF-16 \(big-endian\) byte-order mark"):
        check_head(write(tmp_path / "utf16.txt", "Text.\n".encode("utf-16-be").join([b"\xfe\xff", b""])))
    late = write(tmp_path / "late.txt", b"fine\n" * 20000 + b"\0\n")
    check_head(late)
    with pytest.raises(InputError, match=r"late.txt:20001: NUL"):
        list(read(late, "text"))
    check_head(write(tmp_path / "long.txt", "é".encode() * 40000))  # one line, a character cut at 64 KB


def test_binary_in_a_parquet_cell_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.corpus.sources import SourceConfig, iter_source

    pq.write_table(pa.table({"text": ["A fine document.", "bad\x00\x00 cell"]}), tmp_path / "d.parquet")
    src = SourceConfig(name="p", paths=(str(tmp_path / "d.parquet"),), format="parquet")
    with pytest.raises(InputError, match=r"d.parquet:2: NUL character at column 4"):
        list(iter_source(src))


def test_missing_empty_and_unknown(tmp_path):
    with pytest.raises(InputError, match="nope.txt: file not found"):
        list(read(tmp_path / "nope.txt"))
    with pytest.raises(InputError, match=r"empty.tsv: is empty \(0 bytes\)"):
        list(text_units(write(tmp_path / "empty.tsv", b"")))
    with pytest.raises(ConfigError, match="unknown file format"):
        list(read(write(tmp_path / "a.txt", "x\n"), "csv"))


# ----------------------------------------------------------------------------------- sniffing
@pytest.mark.parametrize("name, data, fmt", [
    ("a.txt", "anything\n", "text"),
    ("a.md", "anything\n", "text"),
    ("a.jsonl", '{"text": "x"}\n', "jsonl"),
    ("a.json", '{"text": "x"}\n', "jsonl"),
    ("a.iob", "Aspirin NN B-Chemical\n", "conll"),
    ("a.conll", "Aspirin\tB-Chemical\n", "conll"),
    ("ner.tsv", "\nAspirin\tB-Chemical\n", "iob"),
    ("blue.tsv", "Aspirin\tdoc1\t0\tB\n", "blue_ner"),           # BLUE's bare tags
    ("blue2.tsv", "\ufeffTreatment\ttrain0000\t0\tO\n", "blue_ner"),
    ("hoc.tsv", "labels\tsentence\tindex\n", "blue_tsv"),
    ("biosses.tsv", "\tgenre\tsentence1\tsentence2\tscore\n", "blue_tsv"),
    ("blurb.tsv", "pair_id\tsent1\tsent2\tscore\n", "blue_tsv"),
    ("chemprot.tsv", "1.T1.T2\t@CHEMICAL$ binds @GENE$\tfalse\n", "blue_tsv"),
])
def test_sniff_by_suffix_and_first_row(tmp_path, name, data, fmt):
    assert sniff(write(tmp_path / name, data)) == fmt


@pytest.mark.parametrize("data, line", [("a\tb\tc\td\te\n", 1), ("\n\nm1\tA.\tB.\t4.5\n", 3)])
def test_sniff_refuses_a_tsv_it_cannot_tell(tmp_path, data, line):
    with pytest.raises(InputError, match="cannot tell the TSV format from its first row") as err:
        sniff(write(tmp_path / "odd.tsv", data))
    assert err.value.line == line


# ----------------------------------------------------------------------------------- the text view
def test_text_units_of_every_format(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    assert list(text_units(write(tmp_path / "a.txt", " one \n\n two\n"))) == ["one", "two"]
    wiki = write(tmp_path / "w.txt", " = Alpha = \n A is . \n = = H = = \n Old . \n = Beta = \n B . \n")
    assert list(text_units(wiki, "wikitext")) == ["A is .\nOld .", "B ."]
    assert list(text_units(write(tmp_path / "a.jsonl", '{"body": " x ", "text": "no"}\n\n{"body": ""}\n'),
                           text_field="body")) == ["x"]
    pq.write_table(pa.table({"text": ["alpha", None, " ", "gamma"]}), tmp_path / "a.parquet")
    assert list(text_units(tmp_path / "a.parquet")) == ["alpha", "gamma"]
    ner = write(tmp_path / "ner.tsv", "Chest\tdoc1\t0\tB\npain\t-\t6\tI\n\n-DOCSTART-\t-\t-\tO\n\nNo\tdoc2\t0\tO\n")
    assert list(text_units(ner)) == ["Chest pain", "No"]
    sts = write(tmp_path / "sts.tsv", '\tgenre\tsentence1\tsentence2\tscore\n0\tbio\t"A\tquoted"\tB .\t3.0\n')
    assert list(text_units(sts)) == ["A\tquoted", "B ."]
    re_file = write(tmp_path / "re.tsv", '1.T1.T2\tBinding of @CHEMICAL$ to "@GENE$\tfalse\n')
    assert list(text_units(re_file)) == ['Binding of @CHEMICAL$ to "@GENE$']


# ----------------------------------------------------------------------------------- records
def test_text_and_wikitext_passages(tmp_path):
    f = write(tmp_path / "a.txt", "One.\nTwo a.\n\n\nThree.\n")
    assert list(read(f, "text", Layout(split="blank_line"))) == [Passage(1, "One.\nTwo a."), Passage(5, "Three.")]
    w = write(tmp_path / "w.txt", " = T = \n x \n")
    assert list(read(w, "wikitext")) == [Passage(1, "x", "T")]


def test_jsonl_rows_by_role_and_their_errors(tmp_path):
    f = write(tmp_path / "a.jsonl", '{"s1": "A", "s2": "B", "y": 1}\n')
    assert list(read(f, "jsonl", Layout(columns={"text_a": "s1", "label": "y"}))) == \
        [Row(1, {"text_a": "A", "label": 1})]
    with pytest.raises(InputError, match=r"a.jsonl:1: missing keys \['z'\]"):
        list(read(f, "jsonl", Layout(columns={"text_a": "s1", "label": "z"})))
    with pytest.raises(InputError, match=r"a.jsonl:1: no string field 'text'"):
        list(read(f, "jsonl"))
    with pytest.raises(InputError, match=r"b.jsonl:2: a JSON list, not an object"):
        list(read(write(tmp_path / "b.jsonl", '{"text": "x"}\n[1]\n'), "jsonl"))
    with pytest.raises(InputError, match=r"c.jsonl:1: invalid JSON"):
        list(read(write(tmp_path / "c.jsonl", "{oops\n"), "jsonl"))


def test_parquet_rows_number_and_missing_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"body": ["a", "b"], "title": ["T1", "T2"], "x": [1, 2]}), tmp_path / "a.parquet")
    rows = list(read(tmp_path / "a.parquet", "parquet", Layout(text_field="body", page_field="title")))
    assert rows == [Row(1, {"body": "a", "title": "T1"}), Row(2, {"body": "b", "title": "T2"})]
    with pytest.raises(InputError, match="no column 'text'"):
        list(read(tmp_path / "a.parquet", "parquet"))
    with pytest.raises(InputError, match="not a parquet file"):
        list(read(write(tmp_path / "b.parquet", "not parquet"), "parquet"))


ROLES = {"id": "index", "text_a": "sentence1", "text_b": "sentence2", "label": "score"}
STS_POSITIONS = {"id": 0, "text_a": -3, "text_b": -2, "label": -1}


def test_blue_tsv_by_header_name_with_pandas_index(tmp_path):
    f = write(tmp_path / "b.tsv", "\tgenre\tsentence1\tsentence2\tscore\n7\tbio\tA.\tB.\t3.0\n")
    rows = list(read(f, "blue_tsv", Layout(columns=ROLES, index_role="id", positions=STS_POSITIONS)))
    assert rows == [Row(2, {"text_a": "A.", "text_b": "B.", "label": "3.0", "id": "7"})]
    with pytest.raises(InputError, match=r"b.tsv:1: header lacks columns \['score'\]"):
        list(read(write(tmp_path / "b.tsv", "index\tsentence1\tsentence2\tlabel\n"), "blue_tsv",
                  Layout(columns=ROLES, positions=STS_POSITIONS)))


def test_positional_width_known_answers():
    assert positional_width({"id": 0, "text_a": 1, "label": 2}) == 3
    assert positional_width({"label": 0, "text_a": 1, "id": 2}) == 3
    assert positional_width(STS_POSITIONS) == 4
    assert positional_width({"text_a": -2, "label": -1}) == 2
    assert positional_width({"id": 0, "label": 3}) == 4


def test_blue_tsv_without_header_by_position_and_exact_width(tmp_path):
    layout = Layout(columns=ROLES, positions=STS_POSITIONS, index_role="id")
    ok = write(tmp_path / "ok.tsv", "m1\tA.\tB.\t4.5\n\nm2\tC.\tD.\t1\n")
    assert [r.fields for r in read(ok, "blue_tsv", layout)] == [
        {"id": "m1", "text_a": "A.", "text_b": "B.", "label": "4.5"},
        {"id": "m2", "text_a": "C.", "text_b": "D.", "label": "1"}]
    assert [r.line for r in read(ok, "blue_tsv", layout)] == [1, 3]
    for cells, line in (("m1\tA.\tB.\t4.5\t2019\n", 1), ("m1\tA.\tB.\t4.5\nm2\tA.\t2\n", 2)):
        with pytest.raises(InputError, match=r"TAB-separated columns.*expected 4 columns in a file without a header"
                                             r", as its positions name \(id=0, text_a=-3, text_b=-2, label=-1\)") \
                as err:
            list(read(write(tmp_path / "bad.tsv", cells), "blue_tsv", layout))
        assert err.value.line == line


def test_blue_tsv_quoting(tmp_path):
    quoted = '\tsentence1\tsentence2\tscore\n0\t"A\tquoted"\t"two\nlines"\t1.0\n1\tC.\tD.\t2.0\n'
    f = write(tmp_path / "q.tsv", quoted)
    rows = list(read(f, "blue_tsv", Layout(quoting="csv")))
    assert [(r.line, r.fields["sentence1"], r.fields["sentence2"]) for r in rows] == [
        (2, "A\tquoted", "two\nlines"), (4, "C.", "D.")]
    stray = write(tmp_path / "s.tsv", 'index\tsentence\tlabel\na\t"@CHEMICAL$ binds\tfalse\nb\tX "@GENE$".\tfalse\n')
    none = [r.fields["sentence"] for r in read(stray, "blue_tsv", Layout(quoting="none"))]
    assert none == ['"@CHEMICAL$ binds', 'X "@GENE$".']
    assert [r.fields["sentence"] for r in read(stray, "blue_tsv")] == none   # auto: quotes are text ...
    tab = write(tmp_path / "t.tsv", 'index\tsentence\tlabel\na\t"x\ty"\tfalse\n')
    assert [r.fields["sentence"] for r in read(tab, "blue_tsv")] == ["x\ty"]  # ... unless the row is too wide


def test_token_files_sentences_lines_and_doc(tmp_path):
    f = write(tmp_path / "n.tsv", "Chest\tdoc1\t0\tB\npain\t-\t6\tI\n\n\nNo\t-\t0\tO\n")
    assert list(read(f, "blue_ner")) == [Sentence(1, ("Chest", "pain"), ("B", "I"), (1, 2), "doc1"),
                                         Sentence(5, ("No",), ("O",), (5,), "")]
    conll = write(tmp_path / "c.conll", "-DOCSTART- -X- O\n\nAspirin NN B-Chemical\nworks\tVB\tO\n")
    assert list(read(conll, "conll")) == [Sentence(3, ("Aspirin", "works"), ("B-Chemical", "O"), (3, 4))]


@pytest.mark.parametrize("fmt, data, line, what", [
    ("iob", "Aspirin\tB-Chemical\nworks\tVB\tO\n", 2, r"3 TAB-separated columns.*expected 2 columns \(token, tag\)"),
    ("blue_ner", "Aspirin\tdoc\t0\tB\nworks\t-\t8\n", 2, r"3 TAB-separated columns.*expected 4 columns"),
    ("conll", "Aspirin NN B\nworks\n", 2, "a token without a tag"),
    ("iob", "Aspirin\tB-Chemical\n \tO\n", 2, "empty token"),
])
def test_token_file_errors_name_the_line(tmp_path, fmt, data, line, what):
    path = write(tmp_path / "bad.tsv", data)
    with pytest.raises(InputError, match=what) as err:
        list(read(path, fmt))
    assert (err.value.path, err.value.line) == (str(path), line)


# ----------------------------------------------------------------------------------- real files
@needs_data
def test_every_shared_and_bundled_text_file_passes_the_binary_check():
    """No real file is taken for binary: every text file of ../shared/data and of the bundled samples."""
    from orchestrator.formats.base import lines

    files = [p for root in (DATA, ROOT / "orchestrator" / "sample_data") for p in sorted(root.rglob("*"))
             if p.is_file() and p.suffix in ("", ".txt", ".tsv", ".jsonl", ".json", ".iob", ".conll", ".md")]
    assert len(files) > 40
    assert sum(1 for path in files for _ in lines(path)) > 100_000


@needs_data
def test_real_files_through_the_text_view():
    biosses = list(text_units(DATA / "biosses/blue/dev.tsv"))
    assert len(biosses) == 32 and sum("\t" in u for u in biosses) == 1   # the CSV-quoted TAB
    assert len(list(text_units(DATA / "biosses/blurb/train.tsv"))) == 128
    assert len(list(text_units(DATA / "chemprot/dev.tsv"))) == 11268
    chem = DATA / "ner/BC5CDR-chem-IOB/devel.tsv"
    assert sniff(chem) == "iob"
    sentences = list(read(chem))
    assert sum(t == "B-Chemical" for s in sentences for t in s.tags) == 5347   # BLUE's dev mention count
    assert len({row.fields["index"].split("_")[0] for row in read(DATA / "hoc/test.tsv")}) == 315  # abstracts


def test_shipped_samples_through_the_text_view():
    assert {d.name: sniff(d / "train.tsv") for d in sorted(SAMPLE.iterdir())} == {
        "BC5CDR-chem": "blue_ner", "BC5CDR-disease": "blue_ner", "BIOSSES": "blue_tsv", "ChemProt": "blue_tsv",
        "DDI": "blue_tsv", "HoC": "blue_tsv", "MedNLI": "blue_tsv", "MedSTS": "blue_tsv", "ShAReCLEFE": "blue_ner",
        "i2b2-2010": "blue_tsv"}
    units = list(text_units(SAMPLE / "BC5CDR-chem" / "test.tsv"))
    assert len(units) == 40 and units[0] == "Exposure to heparin was discontinued after two weeks ."


def test_blue_tsv_csv_quote_that_swallows_tabs_and_lines_is_refused(tmp_path):
    """Probe B finding 5: with CSV quoting an unbalanced quote made one cell of the rest of a row,
    the next row and its TABs, at the right column count; refused at the line the quote opened."""
    merged = write(tmp_path / "m.tsv", '\tsentence1\tsentence2\tscore\n0\tA.\tB.\t1.0\n'
                                       '1\t"Opens.\tC.\t2.0\n2\tD.\tCloses."\t3.0\n')
    with pytest.raises(InputError, match=r"m.tsv:3: a quoted cell opened on this line runs on to line 4 .*"
                                         r"unbalanced quote.*\(expected every quote closed") as err:
        list(read(merged, "blue_tsv", Layout(quoting="csv")))
    assert err.value.line == 3
    later = write(tmp_path / "l.tsv", '\tsentence1\tsentence2\tscore\n0\t"two\nlines"\t"Opens.\tC.\t2.0\n')
    with pytest.raises(InputError, match=r"l.tsv:3: a quoted cell opened on this line runs on to line 3 "):
        list(read(later, "blue_tsv", Layout(quoting="csv")))  # the second cell opens on the row's second line


def _span_file(path: Path, seed: int = 0) -> Path:
    """A text file of uneven lines: a BOM, CRLF and LF ends, runs of blank (or whitespace) lines between
    paragraphs of 1-4 lines, non-ASCII text, and no line end at the end."""
    import random

    rng = random.Random(seed)
    words = ["alpha", "β-cell", "IL-6", "receptor", "naïve", "腫瘍", "binds", "the", "{x}"]
    out = ["\ufeff"]
    for i in range(300):
        for _ in range(rng.randint(1, 4)):
            out.append(" ".join(rng.choice(words) for _ in range(rng.randint(1, 30))) + f" {i}."
                       + rng.choice(["\n", "\r\n"]))
        out.append(rng.choice(["\n", "\r\n", " \n", "\t\n\n"]))
    return write(path, "".join(out).rstrip("\n"))


@pytest.mark.parametrize("fmt, split", [("text", "line"), ("text", "blank_line"), ("jsonl", "line"),
                                        ("wikitext", "line")])
@pytest.mark.parametrize("block", [1, 97, 2048, 1 << 30])
def test_a_file_read_in_spans_gives_its_records_once_in_order_with_its_line_numbers(tmp_path, fmt, split, block):
    import json

    from orchestrator.formats import Span, file_spans, opens_wikitext_page

    f = _span_file(tmp_path / "a.txt")
    if fmt == "jsonl":  # the same lines as JSON objects, blank lines kept
        f = write(tmp_path / "a.jsonl", "".join(json.dumps({"text": line}) + "\n" if line.strip() else line + "\n"
                                                for line in f.read_text(encoding="utf-8-sig").splitlines()))
    if fmt == "wikitext":  # pages with titles and sections, text before the first title
        f = write(tmp_path / "w.txt", "".join(
            (f" = Page {i} = \n" if i % 7 == 3 else " = = Section = = \n" if i % 7 == 5 else "") + line + "\n"
            for i, line in enumerate(f.read_text(encoding="utf-8-sig").splitlines())))
    layout = Layout(split=split)
    cut = {"paragraphs": split == "blank_line", "opens": opens_wikitext_page if fmt == "wikitext" else None}
    spans = file_spans(f, block, **cut)
    data = f.read_bytes()
    assert spans[0].start == 0 and spans[-1].end == len(data)
    assert all(a.end == b.start for a, b in zip(spans, spans[1:]))  # contiguous: every byte in one span
    assert len(spans) == 1 if block >= len(data) else len(spans) > 5
    for s in spans[1:]:
        assert data[s.start - 1:s.start] == b"\n"  # a span starts a line
        assert s.first_line == data[:s.start].count(b"\n") + 1
        if split == "blank_line":  # ... after a blank one
            assert not data[:s.start - 1].rsplit(b"\n", 1)[-1].strip()
        if fmt == "wikitext":  # ... at a page's title
            assert opens_wikitext_page(data[s.start:].split(b"\n", 1)[0].decode())
    whole = list(read(f, fmt, layout))
    parts = [r for s in spans for r in read(f, fmt, Layout(split=split, span=s))]
    assert parts == whole and len(whole) >= (40 if fmt == "wikitext" else 300)
    # a bad byte far into the file: the span that holds it names the file's own line
    bad = write(tmp_path / f"bad.{fmt}", data[:-200] + b"\xff" + data[-200:])
    line = bad.read_bytes()[:len(data) - 200].count(b"\n") + 1
    with pytest.raises(InputError, match="invalid UTF-8") as info:
        for s in file_spans(bad, block, **cut):
            list(read(bad, fmt, Layout(split=split, span=s)))
    assert info.value.line == line
    with pytest.raises(ValueError, match="reads whole files"):
        list(read(f, "squad", Layout(span=Span(0, 10))))


@pytest.mark.parametrize("block", [1, 6000, 1 << 30])
def test_a_parquet_file_read_in_spans_of_row_groups_gives_its_rows_once_in_order(tmp_path, block):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.formats import parquet_spans

    texts = [f"Sentence {i} of the corpus." if i % 9 else None for i in range(1000)]
    f = tmp_path / "a.parquet"
    pq.write_table(pa.table({"text": texts, "page": [f"p{i // 10}" for i in range(1000)]}), f, row_group_size=64)
    spans = parquet_spans(f, block)
    if block == 6000:
        assert 1 < len(spans) < 16  # several row groups a span
    else:
        assert len(spans) == {1: 16, 1 << 30: 1}[block]  # a span a row group; the whole file
    assert spans[0].start == 0 and spans[-1].end == 16 and all(a.end == b.start for a, b in zip(spans, spans[1:]))
    layout = Layout(page_field="page")
    whole = list(read(f, "parquet", layout))
    parts = [r for s in spans for r in read(f, "parquet", Layout(page_field="page", span=s))]
    assert parts == whole and [r.line for r in whole] == list(range(1, 1001))
