"""Seed 000's corpus selection: PubMed XML (PubmedArticleSet) read as a corpus source, articles chosen by
the MeSH tree numbers of NLM's descriptor file and by publication year (Table A2). Pure, no Ray."""
from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.core.config import from_dict
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.corpus.mesh import MeshSelect, selected, under
from orchestrator.corpus.sources import SourceConfig, iter_source
from orchestrator.corpus.stage import CorpusConfig, input_stats
from orchestrator.formats import read
from orchestrator.formats.pubmed import mesh_tree_numbers

DOCTYPE = ('<!DOCTYPE PubmedArticleSet PUBLIC "-//NLM//DTD PubMedArticle, 1st January 2025//EN" '
           '"https://dtd.nlm.nih.gov/ncbi/pubmed/out/pubmed_250101.dtd">')


def _article(pmid: str, year: str, uis: list[str], abstract: str = "An abstract.", date: str = "") -> str:
    pub = f"<MedlineDate>{date}</MedlineDate>" if date else f"<Year>{year}</Year><Month>Mar</Month>"
    mesh = "".join(f'<MeshHeading><DescriptorName UI="{u}" MajorTopicYN="N">x</DescriptorName>'
                   f'<QualifierName UI="Q000000">q</QualifierName></MeshHeading>' for u in uis)
    abstract_el = f"<Abstract><AbstractText>{abstract}</AbstractText></Abstract>" if abstract else ""
    return (f"<PubmedArticle>\n<MedlineCitation Status=\"MEDLINE\" Owner=\"NLM\">\n<PMID Version=\"1\">{pmid}</PMID>\n"
            f"<DateCompleted><Year>1999</Year></DateCompleted>\n<Article PubModel=\"Print\">\n"
            f"<Journal><JournalIssue><PubDate>{pub}</PubDate></JournalIssue></Journal>\n"
            f"<ArticleTitle>Title {pmid}.</ArticleTitle>\n{abstract_el}\n</Article>\n"
            f"<MeshHeadingList>{mesh}</MeshHeadingList>\n"
            f"<CommentsCorrectionsList><CommentsCorrections RefType=\"Cites\"><PMID Version=\"1\">999</PMID>"
            f"</CommentsCorrections></CommentsCorrectionsList>\n</MedlineCitation>\n</PubmedArticle>\n")


def _pubmed(tmp_path: Path, *articles: str, head: str = DOCTYPE) -> Path:
    path = tmp_path / "pubmed25n0001.xml"
    path.write_text(f'<?xml version="1.0" encoding="utf-8"?>\n{head}\n<PubmedArticleSet>\n'
                    + "".join(articles) + "</PubmedArticleSet>\n", encoding="utf-8")
    return path


def _descriptors(tmp_path: Path) -> Path:
    """D1 a disease (C04), D2 an animal disease (C22) also under E05 (excluded), D3 a plant (B01.650.940),
    D4 bacteria only (B03), D5 a pharmacological action record referring to D1 (not D1's own record)."""
    records = {"D1": ["C04.557"], "D2": ["C22.100", "E05.200"], "D3": ["B01.650.940"], "D4": ["B03.440"],
               "D5": ["D27.505"]}
    body = ""
    for ui, trees in records.items():
        extra = ("<PharmacologicalActionList><PharmacologicalAction><DescriptorReferredTo><DescriptorUI>D1"
                 "</DescriptorUI></DescriptorReferredTo></PharmacologicalAction></PharmacologicalActionList>"
                 if ui == "D5" else "")
        body += (f'<DescriptorRecord DescriptorClass="1">\n<DescriptorUI>{ui}</DescriptorUI>\n'
                 f"<DescriptorName><String>n</String></DescriptorName>{extra}\n<TreeNumberList>"
                 + "".join(f"<TreeNumber>{t}</TreeNumber>" for t in trees) + "</TreeNumberList>\n</DescriptorRecord>\n")
    path = tmp_path / "desc2025.xml"
    path.write_text('<?xml version="1.0"?>\n<!DOCTYPE DescriptorRecordSet SYSTEM '
                    '"https://www.nlm.nih.gov/databases/dtd/nlmdescriptorrecordset_20250101.dtd">\n'
                    f'<DescriptorRecordSet LanguageCode="eng">\n{body}</DescriptorRecordSet>\n', encoding="utf-8")
    return path


def test_pubmed_xml_rows_title_abstract_mesh_and_year(tmp_path):
    path = _pubmed(tmp_path, _article("1", "2012", ["D1", "D3"], abstract="Sections <i>in</i> italics."),
                   _article("2", "", ["D4"], date="1998 Dec-1999 Jan"),
                   _article("3", "2015", ["D1"], abstract=""))  # no abstract: not a document
    rows = list(read(path, "pubmed_xml"))
    assert [(r.fields["pmid"], r.fields["mesh"], r.fields["year"]) for r in rows] == [("1", "D1 D3", "2012"),
                                                                                     ("2", "D4", "1998")]
    assert rows[0].fields["text"] == "Title 1.\nSections in italics."
    assert rows[0].line == 4 and rows[1].line == 17  # each <PubmedArticle>'s line
    # NLM distributes pubmed<yy>n<NNNN>.xml.gz: read as it is (a real-format probe, session 46: "not well-formed
    # XML ... column 1"); a cut one names the file
    import gzip

    packed = tmp_path / "pubmed26n0001.xml.gz"
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert [(r.line, r.fields) for r in read(packed, "pubmed_xml")] == [(r.line, r.fields) for r in rows]
    cut = tmp_path / "pubmed26n0002.xml.gz"
    cut.write_bytes(packed.read_bytes()[:-20])
    with pytest.raises(InputError, match="pubmed26n0002.xml.gz.*a damaged or incomplete gzip file"):
        list(read(cut, "pubmed_xml"))


def test_descriptor_file_maps_each_records_own_ui_to_its_tree_numbers(tmp_path):
    trees = mesh_tree_numbers(_descriptors(tmp_path))
    assert trees == {"D1": ("C04.557",), "D2": ("C22.100", "E05.200"), "D3": ("B01.650.940",), "D4": ("B03.440",),
                     "D5": ("D27.505",)}


def test_table_a2_rule_included_but_not_excluded_and_years():
    assert under("C04.557", "C") and under("B01.650.940", "B01.650") and under("B01.650", "B01.650")
    assert not under("B01.6501", "B01.650") and not under("A130", "A13") and not under("D27.505", "C")
    trees = {"D1": ("C04.557",), "D2": ("C22.100", "E05.200"), "D3": ("B01.650.940",), "D4": ("B03.440",)}
    sp = MeshSelect(descriptors="desc.xml", include=("C", "B01.650", "B03"), exclude=("E05",), year_from=2011)
    assert selected(["D1"], "2012", trees, sp)
    assert not selected(["D1", "D2"], "2012", trees, sp)  # D2 is also under E05 (excluded)
    assert not selected(["D1"], "2010", trees, sp)  # "published after 2010"
    assert not selected(["D1"], "", trees, sp)
    assert selected(["D4"], "2020", trees, sp)
    assert not selected(["D4"], "2020", trees, MeshSelect(descriptors="d", include=("C", "B01.650")))  # fP: no B03
    assert not selected(["D9"], "2020", trees, sp)  # a UI the descriptor file lacks has no tree number
    assert selected(["D9"], "2020", {}, MeshSelect(year_to=2020))
    fp = MeshSelect(descriptors="d", include=("C", "B01.650"), exclude=("E05",))
    op = MeshSelect(descriptors="d", include=("C", "B01.650"), exclude=("E05",), invert=True)  # PubMed minus fP
    for uis in (["D1"], ["D1", "D2"], ["D3"], ["D4"], ["D9"]):
        assert selected(uis, "2020", trees, fp) != selected(uis, "2020", trees, op)


def test_a_pubmed_source_keeps_the_selected_articles_only(tmp_path):
    desc = _descriptors(tmp_path)
    path = _pubmed(tmp_path, _article("1", "2012", ["D1"]), _article("2", "2012", ["D1", "D2"]),
                   _article("3", "2009", ["D3"]), _article("4", "2013", ["D3"]), _article("5", "2014", ["D5"]))
    src = from_dict(SourceConfig, {"name": "sP", "paths": [str(path)], "format": "pubmed_xml", "page_field": "pmid",
                                   "mesh": {"descriptors": str(desc), "include": ["C", "B01.650"],
                                            "exclude": ["E05"], "year_from": 2011}})
    docs = list(iter_source(src))
    assert [d.page for d in docs] == ["1", "4"]
    assert docs[0].text == "Title 1.\nAn abstract."
    cfg = from_dict(CorpusConfig, {"sources": [dataclasses_asdict(src)], "mixer": {"name": "conventional"}})
    assert str(desc) in input_stats(cfg)  # the descriptor file is an input of the corpus key


def dataclasses_asdict(src: SourceConfig) -> dict:
    from orchestrator.core.config import to_dict
    return to_dict(src)


@pytest.mark.parametrize("head, body, match, line", [
    ("<!DOCTYPE PubmedArticleSet [<!ENTITY x \"boom\">]>", "", "internal subset", 2),
    ("", "<PubmedArticle><MedlineCitation><PMID>1</PMID>\n<Article></MedlineCitation></PubmedArticle>",
     "not well-formed XML", 5),
    ("", "<PubmedArticle>\n<MedlineCitation><Article><ArticleTitle>t</ArticleTitle></Article></MedlineCitation>"
         "</PubmedArticle>", "without MedlineCitation/PMID", 4),
])
def test_bad_pubmed_xml_names_file_and_line(tmp_path, head, body, match, line):
    path = _pubmed(tmp_path, body, head=head)
    with pytest.raises(InputError, match=match) as err:
        list(read(path, "pubmed_xml"))
    assert err.value.path == str(path) and err.value.line == line


def test_wrong_root_and_missing_descriptor_file(tmp_path):
    path = tmp_path / "x.xml"
    path.write_text("<?xml version=\"1.0\"?>\n<DescriptorRecordSet></DescriptorRecordSet>\n")
    with pytest.raises(InputError, match="root <DescriptorRecordSet>"):
        list(read(path, "pubmed_xml"))
    with pytest.raises(InputError, match="does not exist"):
        mesh_tree_numbers(tmp_path / "desc2025.xml")
    with pytest.raises(InputError, match="no DescriptorRecord"):
        mesh_tree_numbers(path)


def test_mesh_config_errors():
    with pytest.raises(ConfigError, match="not a MeSH tree number"):
        MeshSelect(descriptors="d", include=("C04.5",))
    with pytest.raises(ConfigError, match="need mesh.descriptors"):
        MeshSelect(include=("C",))
    with pytest.raises(ConfigError, match="from <= to"):
        MeshSelect(year_from=2012, year_to=2010)
    with pytest.raises(ConfigError, match="invert negates"):
        MeshSelect(invert=True)
    with pytest.raises(ConfigError, match="needs format pubmed_xml"):
        from_dict(SourceConfig, {"name": "a", "paths": ["x"], "mesh": {"year_from": 2011}})
