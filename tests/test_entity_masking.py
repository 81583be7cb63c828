"""Entity-aware masking (seed 003): known answers for the patent's three conditions."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError, InputError
from orchestrator.instances.association import load_association
from orchestrator.instances.entities import split_words
from orchestrator.instances.entity_masking import EntityMasker, EntityMaskingConfig

# FIG. 7 of the patent, WordPiece-tokenized ("s3" -> s ##3, "washout" -> wash ##out, "hcc" -> hc ##c).
FIG7 = ("[CLS] tumor having a size of a diameter of 6 cm is recognized in a liver s ##3 . "
        "early enhancement and wash ##out are shown , and hc ##c is suspected . [SEP]").split()


def masker(**kw) -> EntityMasker:
    return EntityMasker(EntityMaskingConfig(**{"plain_random_share": 0.0, **kw}))


def positions_of(entity_text: str, m: EntityMasker, tokens=FIG7) -> set[int]:
    return {p for e in m.extract(tokens) if e.text == entity_text for p in e.positions}


def test_extracts_typed_phrases_across_wordpieces():
    found = {(e.text, e.type) for e in masker().extract(FIG7)}
    assert found == {("tumor", "lesion_name"), ("size", "quantity"), ("diameter", "quantity"),
                     ("6 cm", "quantity"), ("liver s3", "anatomical_site"),
                     ("early enhancement", "property_of_lesion"), ("washout", "property_of_lesion"),
                     ("hcc", "disease_name")}
    hcc = [e for e in masker().extract(FIG7) if e.text == "hcc"][0]
    assert [FIG7[p] for p in hcc.positions] == ["hc", "##c"]


def test_patent_budget_rounds_up_without_a_cap():
    # FIG. 10: 25 tokens x 0.15 = 3.75 -> at least four tokens masked.
    tokens = ["[CLS]"] + [f"w{i}" for i in range(25)] + ["[SEP]"]
    assert masker().num_to_predict(tokens) == 4
    # condition 1 is a floor: no max_predictions_per_seq cap (200 x 0.15 = 30 > BERT's 20 per 128)
    assert masker().num_to_predict(["[CLS]"] + ["w"] * 200 + ["[SEP]"]) == 30
    assert masker().num_to_predict(["[CLS]", "[SEP]"]) == 0


# The FIG. 11 sentence as 25 word tokens (the patent's count; its comma before "and HCC" dropped,
# "early enhancement" two tokens here where the patent's morphemes make it one).
FIG7_25 = ("tumor having size of diameter of 6 cm is recognized in liver s3 . "
           "early enhancement and washout are shown and hcc is suspected .").split()


def test_patent_conditions_on_fig7_through_the_instance_builder():
    """Conditions 1-3 of FIG. 10 on the patent's own 25-token text and FIG. 8 table, over many draws,
    through the instance builder's masking (BERT's max_predictions_per_seq set to 3: not applied)."""
    from orchestrator.instances.config import Params, Specials
    from orchestrator.instances.masking import create_masked_lm_predictions

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(FIG7_25))
    index = {t: i for i, t in enumerate(vocab)}
    tokens = [index["[CLS]"]] + [index[t] for t in FIG7_25] + [index["[SEP]"]]
    strings = [vocab[t] for t in tokens]
    assert len(FIG7_25) == 25
    m = masker()
    at = {e.text: set(e.positions) for e in m.extract(strings)}
    assert set(at) == {"tumor", "size", "diameter", "6 cm", "liver s3", "early enhancement", "washout", "hcc"}
    p = Params(64, 0.0, 0.15, 3, False)
    hcc_targets = 0
    for seed in range(400):
        _, positions, _, stats = create_masked_lm_predictions(tokens, p, Specials.from_vocab(index),
                                                              random.Random(seed), m, vocab)
        masked = set(positions)
        assert len(masked) == len(positions) >= 4                                  # condition 1: ceil(3.75)
        assert any(pos <= masked for pos in at.values())                           # condition 2
        assert stats["masked_entities"] >= 1
        if at["hcc"] <= masked:                                                    # condition 3
            hcc_targets += 1
            for kept in ("tumor", "early enhancement", "washout"):
                assert not at[kept] & masked, f"{kept} masked with hcc (seed {seed})"
    assert hcc_targets > 40


def test_entity_masking_refuses_dynamic_masking_and_keys_only_its_own_configs():
    from orchestrator.core.config import from_dict
    from orchestrator.core.reuse import content_key
    from orchestrator.instances.config import InstanceConfig

    with pytest.raises(ConfigError, match=r"instances\.masking: dynamic .*instances\.entity_masking"):
        from_dict(InstanceConfig, {"masking": "dynamic", "entity_masking": {}})

    def key(data: dict) -> str:
        return content_key("instances", from_dict(InstanceConfig, data).output_fields(), 128, "corpuskey", "vocabkey")

    # keys computed before entity masking had a version: unchanged without it, changed with it
    assert key({}) == "91ebf873de38c935"
    assert key({"max_seq_lengths": [64, 128], "whole_word_mask": True, "masking": "dynamic"}) == "c5143752509ac93a"
    assert key({"entity_masking": {}}) != "9b840f62f040f30c"


def test_an_edited_term_list_or_association_table_makes_other_instances(tmp_path):
    """An experiments probe (session 46): the instances key held the tables' paths, so editing a term list or an
    association table in place kept its instances and the pretraining on them. Their contents are in it now."""
    import shutil

    from orchestrator.core.config import from_dict
    from orchestrator.core.reuse import content_key
    from orchestrator.instances.config import InstanceConfig
    from orchestrator.instances.entity_masking import DEFAULT_ASSOCIATION, DEFAULT_DICTIONARY

    terms, table = tmp_path / "terms.yaml", tmp_path / "assoc.yaml"
    shutil.copy(DEFAULT_DICTIONARY, terms)
    shutil.copy(DEFAULT_ASSOCIATION, table)

    def key() -> str:
        cfg = from_dict(InstanceConfig, {"entity_masking": {"dictionaries": [str(terms)], "association": str(table)}})
        return content_key("instances", cfg.output_fields(), 128, "corpuskey", "vocabkey")

    before = key()
    assert key() == before  # the same files: the same key
    terms.write_text(terms.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    edited = key()
    assert edited != before
    table.write_text(table.read_text(encoding="utf-8") + "\n", encoding="utf-8")
    assert key() not in (before, edited)


def test_fig11_masking_hcc_keeps_its_associates_visible():
    m = masker()
    associated = {t: positions_of(t, m) for t in ("tumor", "early enhancement", "washout", "liver s3")}
    hcc = positions_of("hcc", m)
    seen_hcc = 0
    for seed in range(200):
        chosen, stats = m.select(FIG7, random.Random(seed), num_to_predict=5)
        masked = set(chosen)
        assert len(chosen) == 5 and len(masked) == 5                     # condition 1: the budget
        assert stats["masked_entities"] >= 1                              # condition 2
        assert stats["entities"] == 8
        assert not masked & {0, len(FIG7) - 1}                           # [CLS]/[SEP] never
        if hcc <= masked:
            seen_hcc += 1
            for text, pos in associated.items():                          # condition 3
                assert not pos & masked, f"{text} masked together with hcc (seed {seed})"
            assert stats["protected"] >= 4
    assert seen_hcc > 10


def test_a_target_chosen_first_is_masked_and_entities_outside_the_group_stay_visible():
    m = masker()
    entities = m.extract(FIG7)
    for e in entities:
        for seed in range(10):
            chosen, stats = m.select(FIG7, random.Random(seed), 5, target=e.positions)
            assert set(e.positions) <= set(chosen) and stats["masked_entities"] >= 1
    sentence_one = range(1, FIG7.index(".") + 1)  # "tumor ... liver s3 ." as A, the rest another text
    for seed in range(50):
        masked = set(m.select(FIG7, random.Random(seed), 5, group=sentence_one)[0])
        assert not any(masked & set(e.positions) for e in entities if e.positions[0] not in sentence_one)


def test_no_two_masked_entities_are_associated_and_entities_are_whole():
    m = masker()
    for seed in range(300):
        chosen, stats = m.select(FIG7, random.Random(seed), num_to_predict=6)
        masked = set(chosen)
        hit = [e for e in m.extract(FIG7) if masked & set(e.positions)]
        for e in hit:
            assert set(e.positions) <= masked, "an entity is masked whole or not at all"
        for a in hit:
            for b in hit:
                if a is not b:
                    assert m.association(a.type, b.type) < m.cfg.threshold
        assert stats["masked_entities"] == len(hit)


def test_prefer_entities_masks_more_entity_tokens_than_uniform_filling():
    def entity_share(prefer: bool) -> float:
        m = masker(prefer_entities=prefer)
        ent = {p for e in m.extract(FIG7) for p in e.positions}
        picks = [m.select(FIG7, random.Random(s), 6)[0] for s in range(200)]
        return sum(len(ent & set(c)) for c in picks) / sum(len(c) for c in picks)

    preferred, uniform = entity_share(True), entity_share(False)
    assert preferred > uniform + 0.1, (preferred, uniform)


def test_determinism_by_seed():
    m = masker(plain_random_share=0.3)
    runs = [m.select(FIG7, random.Random(7), 5) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert len({tuple(m.select(FIG7, random.Random(s), 5)[0]) for s in range(20)}) > 3


def test_plain_random_share_one_is_plain_whole_word_masking():
    m = masker(plain_random_share=1.0)
    for seed in range(50):
        chosen, stats = m.select(FIG7, random.Random(seed), 4)
        assert stats["protected"] == 0 and len(chosen) == 4
        masked = set(chosen)
        for word, pos in m.words(FIG7):
            assert set(pos) <= masked or not set(pos) & masked, f"{word} split by whole-word masking"


def test_plain_random_share_is_honoured_on_average():
    m = masker(plain_random_share=0.5)
    protected = sum(m.select(FIG7, random.Random(s), 5)[1]["protected"] > 0 for s in range(400))
    # entity mode always protects something here (any first target has an associate >= 8 except quantities)
    assert 100 < protected < 300


def test_no_entities_falls_back_to_random_masking():
    tokens = "[CLS] the cat sat on the mat [SEP]".split()
    chosen, stats = masker().select(tokens, random.Random(0), 2)
    assert len(chosen) == 2 and stats == {"entities": 0, "masked_entities": 0, "protected": 0}


def test_entity_longer_than_budget_is_still_the_target():
    tokens, m = "[CLS] early enhancement was seen [SEP]".split(), masker()
    for seed in range(20):
        chosen, stats = m.select(tokens, random.Random(seed), 1)
        # condition 2 holds over an exact budget: the only entity is masked whole, one token over
        assert chosen == [1, 2] and stats["masked_entities"] == 1


def test_budget_is_a_floor_when_only_longer_units_are_left():
    # budget 3: hcc (2 pieces) first, then only 2-piece units are left: one more overshoots to 4
    tokens, m = "[CLS] hc ##c wa ##s ca ##t [SEP]".split(), masker()
    for seed in range(20):
        chosen, stats = m.select(tokens, random.Random(seed), 3)
        assert len(chosen) == 4 and {1, 2} <= set(chosen) and stats["masked_entities"] == 1


def test_phrases_do_not_span_special_tokens():
    tokens = "[CLS] the early [SEP] enhancement [SEP]".split()
    assert masker().extract(tokens) == []


# FIG. 19 / FIG. 23: the four texts of the patent's Embodiment 3 example.
REPORT = ["tumor having a size of a diameter of 6 cm is recognized in a liver s3 .",
          "early enhancement is shown , and washout is shown .",
          "hcc is suspected .",
          "no significant change in a cyst of a right kidney ."]


def test_same_type_texts_of_embodiments_3_1_and_3_2():
    texts = [t.split() for t in REPORT]
    by_assoc = masker(same_type_grouping="association")
    info = by_assoc.describe(texts)
    hcc = next(e for e in info[2].entities if e.text == "hcc")
    size = next(e for e in info[0].entities if e.text == "size")
    # FIG. 20: with hcc the target, the tumor and the enhancement/washout texts are of its type
    assert by_assoc.same_type(info[:3], 2, hcc) == [0, 1, 2]
    # a quantity has no associate >= 8 in FIG. 8: its text stays alone
    assert by_assoc.same_type(info, 0, size) == [0]
    # FIG. 8 is a table of types: the kidney text's cyst (lesion name, 9 with a disease name) makes
    # it of hcc's type too, where the patent's FIG. 19 leaves it out (docs/METHODS.md)
    assert by_assoc.same_type(info, 2, hcc) == [0, 1, 2, 3]
    # FIG. 23 / 24 by the organ rule table: the text naming no organ follows the liver text before it
    by_organ = masker(same_type_grouping="organ")
    info = by_organ.describe(texts)
    assert [t.organ for t in info] == ["liver", "liver", "liver", "kidney"]
    assert by_organ.same_type(info, 2, hcc) == [0, 1, 2]
    assert by_organ.same_type(info, 3, info[3].entities[0]) == [3]
    assert [t.organ for t in by_organ.describe([["the", "cat", "sat"], ["in", "the", "kidney"]])] == [None, "kidney"]


def test_grouped_inputs_keep_hcc_with_its_texts_and_never_with_the_kidney_text():
    """Embodiment 3_2 on the patent's four texts, beside three other reports: in every instance built
    (120 passes, NSP included), a masked hcc has both its liver texts in its input and the kidney
    text never shares an input with it; no input mixes two organs."""
    from orchestrator.instances.config import Params, Specials
    from orchestrator.instances.grouped import create_grouped_instances

    others = [["a nodule in liver s6 shows arterial enhancement .", "hepatocellular carcinoma is likely ."],
              ["a mass is seen in the right lung .", "lung cancer is considered ."],
              ["the patient was referred for follow up .", "the study was compared with the prior one ."]]
    docs = [[t.split() for t in REPORT]] + [[t.split() for t in d] for d in others]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted({w for d in docs for t in d for w in t})
    index = {t: i for i, t in enumerate(vocab)}
    ids = [[[index[w] for w in t] for t in d] for d in docs]
    m = masker(same_type_grouping="organ")
    organ_of = {tuple(t): info.organ for d in docs for t, info in zip(d, m.describe(d))}
    instances = create_grouped_instances(ids, ["r"] * 4, 120, Params(64, 0.1, 0.15, 20, False),
                                         Specials.from_vocab(index), random.Random(0), m, vocab)
    liver, enhancement, hcc_text, kidney = (tuple(t.split()) for t in REPORT)

    def holds(words: list[str], text: tuple) -> int | None:
        n = len(text)
        return next((k for k in range(len(words) - n + 1) if tuple(words[k:k + n]) == text), None)

    hcc_masked = random_next = 0
    for x in instances:
        ids_ = list(x.input_ids)
        for pos, label in zip(x.masked_lm_positions, x.masked_lm_ids):
            ids_[pos] = label
        words = [vocab[t] for t in ids_]
        present = {text for text in organ_of if holds(words, text) is not None}
        assert len({organ_of[t] for t in present} - {None}) <= 1, words
        at = holds(words, hcc_text)
        if at is not None:
            assert kidney not in present, words
            if at in x.masked_lm_positions:  # hcc is the text's first token
                hcc_masked += 1
                random_next += x.is_random_next
                assert liver in present and enhancement in present, words
    assert hcc_masked >= 15 and 0 < random_next < hcc_masked


def test_grouped_next_document_gives_a_lone_text_its_documents_next_texts_half_the_time():
    """Under grouping a group of one text always got a random next segment (Embodiment 3), so NSP's share of
    random pairs rose from BERT's 0.62 to 0.85 on the PubMed sample (session 54). ``grouped_next: document``
    gives such a text its document's following texts as a real next segment on a fair coin: here every text
    is of its own organ (every group is one text), so within_group makes every pair random and document about
    half of those that have a next text; a real next's A is the text and its B starts with the text after it.
    The default's key and its instances are what they were (the option is left out of the key)."""
    from orchestrator.instances.config import InstanceConfig, Params, Specials
    from orchestrator.instances.grouped import create_grouped_instances

    texts = ["a nodule in liver s6 shows arterial enhancement .", "a cyst is seen in the left kidney .",
             "a mass is seen in the right lung ."]
    docs = [[t.split() for t in texts], [t.split() for t in reversed(texts)]]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted({w for d in docs for t in d for w in t})
    index = {t: i for i, t in enumerate(vocab)}
    ids = [[[index[w] for w in t] for t in d] for d in docs]

    def build(**kw):
        return create_grouped_instances(ids, ["r"] * 2, 200, Params(64, 0.0, 0.15, 20, False),
                                        Specials.from_vocab(index), random.Random(0),
                                        masker(same_type_grouping="organ", **kw), vocab)

    assert all(x.is_random_next for x in build())
    paired = build(grouped_next="document")
    real = [x for x in paired if not x.is_random_next]
    assert 0.55 < 1 - len(real) / len(paired) < 0.78  # 1/3 of the texts are last (always random), 2/3 half
    for x in real:
        words = [vocab[t] for t in x.input_ids]
        for pos, label in zip(x.masked_lm_positions, x.masked_lm_ids):
            words[pos] = vocab[label]
        a, b = " ".join(words[1:words.index("[SEP]")]), " ".join(words[words.index("[SEP]") + 1:-1])
        assert any(b.startswith(d[d.index(a) + 1]) for d in (texts, texts[::-1]) if a in d[:-1]), (a, b)

    def key(**kw):
        return InstanceConfig(entity_masking=EntityMaskingConfig(same_type_grouping="organ", **kw)).output_fields()

    assert "grouped_next" not in key()["entity_masking"] and key() == key(grouped_next="within_group")
    assert key(grouped_next="document")["entity_masking"]["grouped_next"] == "document"
    with pytest.raises(ConfigError, match="grouped_next is read only with same_type_grouping"):
        EntityMaskingConfig(grouped_next="document")


def test_grouped_next_any_type_draws_a_random_next_segment_of_any_type_as_bert_does():
    """``grouped_next: any_type`` (session 57: what in grouped inputs makes NSP hurt?) keeps Embodiment 3's pairs
    but draws a random next segment as BERT does, from another document whatever its type: here every group is
    one text of its own organ, so under within_group every B is a text of A's organ, and under any_type about
    two in three are of another organ; each B is consecutive texts of the other document."""
    from orchestrator.instances.config import InstanceConfig, Params, Specials
    from orchestrator.instances.grouped import create_grouped_instances

    texts = ["a nodule in liver s6 shows arterial enhancement .", "a cyst is seen in the left kidney .",
             "a mass is seen in the right lung ."]
    organ = dict(zip(texts, ("liver", "kidney", "lung")))
    docs = [[t.split() for t in texts], [t.split() for t in reversed(texts)]]
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted({w for d in docs for t in d for w in t})
    index = {t: i for i, t in enumerate(vocab)}
    ids = [[[index[w] for w in t] for t in d] for d in docs]

    def organs_of_pairs(**kw) -> list[tuple[str, str]]:
        instances = create_grouped_instances(ids, ["r"] * 2, 200, Params(64, 0.0, 0.15, 20, False),
                                             Specials.from_vocab(index), random.Random(0),
                                             masker(same_type_grouping="organ", **kw), vocab)
        pairs = []
        for x in instances:
            assert x.is_random_next
            words = [vocab[t] for t in x.input_ids]
            for pos, label in zip(x.masked_lm_positions, x.masked_lm_ids):
                words[pos] = vocab[label]
            a, b = " ".join(words[1:words.index("[SEP]")]), " ".join(words[words.index("[SEP]") + 1:-1])
            if not b:  # within_group: no text of A's organ drawn from another document in 10 tries (BERT's)
                pairs.append((organ[a], None))
                continue
            first = next(t for t in texts if b.startswith(t))
            assert any(" ".join(d[d.index(first):]).startswith(b) for d in (texts, texts[::-1]))  # consecutive
            pairs.append((organ[a], organ[first]))
        return pairs

    assert all(b in (a, None) for a, b in organs_of_pairs())
    mixed = organs_of_pairs(grouped_next="any_type")
    assert None not in {b for _, b in mixed} and 0.5 < sum(a != b for a, b in mixed) / len(mixed) < 0.85
    key = InstanceConfig(entity_masking=EntityMaskingConfig(same_type_grouping="organ", grouped_next="any_type"))
    assert key.output_fields()["entity_masking"]["grouped_next"] == "any_type"


def test_custom_dictionary_and_association(tmp_path: Path):
    terms = tmp_path / "terms.yaml"
    terms.write_text("types:\n  chemical:\n    terms: [cisplatin, Doxorubicin]\n"
                     "  disease:\n    terms: [nephrotoxicity, heart failure]\n", encoding="utf-8")
    table = tmp_path / "assoc.yaml"
    table.write_text("default: 0\npairs:\n  - [chemical, disease, 9]\n", encoding="utf-8")
    m = masker(dictionaries=(str(terms),), association=str(table))
    tokens = "[CLS] ci ##sp ##lat ##in causes nephro ##to ##xi ##city and heart failure [SEP]".split()
    assert [(e.text, e.type) for e in m.extract(tokens)] == [
        ("cisplatin", "chemical"), ("nephrotoxicity", "disease"), ("heart failure", "disease")]
    for seed in range(50):
        chosen, stats = m.select(tokens, random.Random(seed), 4)
        masked = set(chosen)
        chem_masked = {1, 2, 3, 4} <= masked
        disease_masked = bool(masked & {6, 7, 8, 9, 11, 12})
        assert not (chem_masked and disease_masked)


def test_bad_files_name_file_and_line(tmp_path: Path):
    terms = tmp_path / "terms.yaml"
    terms.write_text("types:\n  a:\n    terms: [x, y]\n  b:\n    terms:\n      - z\n      - X\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"terms.yaml:7: term 'X' typed 'b' here but 'a'"):
        masker(dictionaries=(str(terms),))
    terms.write_text("types:\n  a:\n    terms: [x]\n", encoding="utf-8")
    table = tmp_path / "assoc.yaml"
    table.write_text("pairs:\n  - [a, a, 3]\n  - [a, nope, 5]\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"assoc.yaml:3: type 'nope' is in no dictionary"):
        masker(dictionaries=(str(terms),), association=str(table))
    table.write_text("pairs:\n  - [a, a]\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"assoc.yaml:2: bad pair"):
        load_association(table)
    with pytest.raises(ConfigError, match="not found"):
        EntityMaskingConfig(dictionaries=(str(tmp_path / "missing.yaml"),))
    with pytest.raises(ConfigError, match="plain_random_share"):
        EntityMaskingConfig(plain_random_share=1.5)
    with pytest.raises(ConfigError, match="organ_rules is read only with same_type_grouping: organ"):
        EntityMaskingConfig(organ_rules=str(terms))


def test_split_words_matches_bert_basic_tokenizer():
    assert split_words("Liver S3, 6.5cm") == ("liver", "s3", ",", "6", ".", "5cm")


def test_patterns_match_whole_words_of_wordpiece_numbers():
    tokens = "[CLS] a 6 . 5 cm nodule and a 12 ##mm cyst near 3 x 2 cm mass [SEP]".split()
    found = [(e.text, e.type) for e in masker().extract(tokens)]
    assert found == [("6 . 5 cm", "quantity"), ("nodule", "lesion_name"), ("12mm", "quantity"),
                     ("cyst", "lesion_name"), ("3 x 2 cm", "quantity"), ("mass", "lesion_name")]


def test_term_level_association_relates_terms_of_one_type(tmp_path: Path):
    """association_level: term — one type (a one-task extractor's), the table relates terms: cisplatin
    keeps carboplatin visible, never doxorubicin; a type table would have one chemical-chemical entry."""
    terms = tmp_path / "terms.yaml"
    terms.write_text("types:\n  chemical:\n    terms: [cisplatin, carboplatin, doxorubicin]\n", encoding="utf-8")
    table = tmp_path / "assoc.yaml"
    table.write_text('default: 0\npairs:\n  - ["cisplatin", "carboplatin", 9.5]\n', encoding="utf-8")
    tokens = "[CLS] cisplatin and carboplatin but not doxorubicin were given to the mice today [SEP]".split()
    pos = {"cisplatin": 1, "carboplatin": 3, "doxorubicin": 6}
    m = masker(dictionaries=(str(terms),), association=str(table), association_level="term")
    assert {m.key(e) for e in m.extract(tokens)} == set(pos)
    seen = {"cisplatin+doxorubicin": 0}
    for seed in range(200):
        masked = set(m.select(tokens, random.Random(seed), 3)[0])
        if pos["cisplatin"] in masked or pos["carboplatin"] in masked:
            assert not {pos["cisplatin"], pos["carboplatin"]} <= masked
        seen["cisplatin+doxorubicin"] += {pos["cisplatin"], pos["doxorubicin"]} <= masked
    assert seen["cisplatin+doxorubicin"] > 0  # unassociated terms are masked together
    with pytest.raises(InputError, match="cisplatin"):  # a term table is not a type table
        masker(dictionaries=(str(terms),), association=str(table))
