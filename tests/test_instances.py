"""BERT's instance algorithm as pure functions: invariants, determinism, and equality with the reference port."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

from orchestrator.text.instances import (InstanceConfig, Params, Specials, create_training_instances,
                                         dynamic_mask, truncate_seq_pair)

ROOT = Path(__file__).resolve().parents[1]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _load_reference():
    spec = importlib.util.spec_from_file_location(
        "reference_create_pretraining_data", ROOT / "benchmarks" / "reference_create_pretraining_data.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def vocab() -> list[str]:
    words = [f"w{i}" for i in range(300)]
    pieces = [f"##p{i}" for i in range(100)]
    return SPECIAL + words + pieces


@pytest.fixture(scope="module")
def corpus(vocab) -> list[list[list[str]]]:
    """60 documents of 1-12 sentences; words optionally followed by ## continuation pieces."""
    rng = random.Random(7)
    words = [t for t in vocab if t.startswith("w")]
    pieces = [t for t in vocab if t.startswith("##")]
    docs = []
    for _ in range(60):
        doc = []
        for _ in range(rng.randint(1, 12)):
            sent = []
            for _ in range(rng.randint(3, 30)):
                sent.append(rng.choice(words))
                if rng.random() < 0.3:
                    sent.extend(rng.choice(pieces) for _ in range(rng.randint(1, 2)))
            doc.append(sent)
        docs.append(doc)
    return docs


def _ids(corpus, vocab):
    index = {t: i for i, t in enumerate(vocab)}
    return [[[index[t] for t in s] for s in d] for d in corpus]


def _build(corpus, vocab, seed=1, length=64, dupe=2, wwm=False, static=True):
    sp = Specials.from_vocab({t: i for i, t in enumerate(vocab)})
    p = Params(length, 0.1, 0.15, InstanceConfig().max_predictions(length), wwm, static)
    return create_training_instances(_ids(corpus, vocab), [f"s{i % 2}" for i in range(len(corpus))], dupe, p, sp,
                                     random.Random(seed)), sp


@pytest.mark.parametrize("wwm", [False, True])
def test_identical_to_reference_port(corpus, vocab, wwm):
    """Same token lists, same seed: the id-based port yields the reference's instances exactly."""
    ref = _load_reference()
    ours, _ = _build(corpus, vocab, seed=12345, length=64, dupe=3, wwm=wwm)
    theirs = ref.instances_from_documents([list(map(list, d)) for d in corpus], vocab, 64, 3, 0.1, 0.15, 10,
                                          random.Random(12345), wwm)
    assert len(ours) == len(theirs) > 100
    for a, b in zip(ours, theirs):
        assert [vocab[i] for i in a.input_ids] == b.tokens
        assert list(a.token_type_ids) == b.segment_ids
        assert list(a.masked_lm_positions) == b.masked_lm_positions
        assert [vocab[i] for i in a.masked_lm_ids] == b.masked_lm_labels
        assert a.is_random_next == b.is_random_next


def test_layout_lengths_and_segments(corpus, vocab):
    instances, sp = _build(corpus, vocab, length=64)
    for x in instances:
        assert len(x.input_ids) <= 64
        original = list(x.input_ids)
        for pos, label in zip(x.masked_lm_positions, x.masked_lm_ids):
            original[pos] = label  # BERT's 10 % random replacement may draw any token, [SEP] included
        assert original[0] == sp.cls and original[-1] == sp.sep
        seps = [i for i, t in enumerate(original) if t == sp.sep]
        assert len(seps) == 2  # [CLS] A [SEP] B [SEP]
        a_len = seps[0] - 1
        assert a_len >= 1 and len(x.input_ids) - seps[0] - 2 >= 1
        assert list(x.token_type_ids) == [0] * (a_len + 2) + [1] * (len(x.input_ids) - a_len - 2)
        assert len(x.masked_lm_positions) <= 10
        assert all(original[p] not in (sp.cls, sp.sep) for p in x.masked_lm_positions)
        assert list(x.masked_lm_positions) == sorted(set(x.masked_lm_positions))


def test_mask_rate_80_10_10_and_nsp_half(corpus, vocab):
    instances, sp = _build(corpus, vocab, length=128, dupe=5)
    tokens = sum(len(x.input_ids) for x in instances)
    masked = sum(len(x.masked_lm_positions) for x in instances)
    assert 0.12 < masked / tokens < 0.16  # 15 %, capped by max_predictions and rounding
    mask = same = other = 0
    for x in instances:
        for pos, label in zip(x.masked_lm_positions, x.masked_lm_ids):
            if x.input_ids[pos] == sp.mask:
                mask += 1
            elif x.input_ids[pos] == label:
                same += 1
            else:
                other += 1
    n = mask + same + other
    assert abs(mask / n - 0.8) < 0.03 and abs(same / n - 0.1) < 0.03 and abs(other / n - 0.1) < 0.03


def test_next_sentence_is_random_half_of_the_time(vocab):
    """With multi-sentence chunks the coin decides: ~50 % random next (single-sentence chunks force it)."""
    rng = random.Random(11)
    words = [t for t in vocab if t.startswith("w")]
    docs = [[[rng.choice(words) for _ in range(rng.randint(8, 16))] for _ in range(30)] for _ in range(40)]
    instances, _ = _build(docs, vocab, length=128, dupe=3)
    random_next = sum(x.is_random_next for x in instances) / len(instances)
    assert len(instances) > 400 and 0.44 < random_next < 0.56


def test_whole_word_masking_masks_every_piece_of_a_word(corpus, vocab):
    instances, sp = _build(corpus, vocab, wwm=True, dupe=3)
    checked = 0
    for x in instances:
        masked = set(x.masked_lm_positions)
        original = list(x.input_ids)
        for pos, label in zip(x.masked_lm_positions, x.masked_lm_ids):
            original[pos] = label
        for pos in masked:
            # the word start before a masked continuation piece is masked as well, and vice versa
            if original[pos] in sp.continuation and original[pos - 1] not in (sp.cls, sp.sep):
                assert pos - 1 in masked  # (a piece right after [CLS]/[SEP] lost its word to truncation)
                checked += 1
            if pos + 1 < len(original) and original[pos + 1] in sp.continuation:
                assert pos + 1 in masked
    assert checked > 50


def test_deterministic_by_seed(corpus, vocab):
    a, _ = _build(corpus, vocab, seed=3)
    b, _ = _build(corpus, vocab, seed=3)
    c, _ = _build(corpus, vocab, seed=4)
    assert [list(x.input_ids) for x in a] == [list(x.input_ids) for x in b]
    assert [list(x.input_ids) for x in a] != [list(x.input_ids) for x in c]


def test_dynamic_masking_leaves_instances_unmasked_and_masks_at_load_time(corpus, vocab):
    instances, sp = _build(corpus, vocab, static=False)
    assert all(not x.masked_lm_positions and sp.mask not in x.input_ids for x in instances)
    ids, positions, labels = dynamic_mask(instances[0].input_ids, random.Random(0), sp, 0.15, 20)
    assert positions and len(ids) == len(instances[0].input_ids)
    assert [instances[0].input_ids[p] for p in positions] == list(labels)


def test_truncate_seq_pair_trims_the_longer_side():
    a, b = list(range(10)), list(range(3))
    truncate_seq_pair(a, b, 8, random.Random(0))
    assert len(a) + len(b) == 8 and len(b) == 3


def test_config_checks():
    from orchestrator.core.errors import ConfigError

    with pytest.raises(ConfigError):
        InstanceConfig(max_seq_lengths=(4,))
    with pytest.raises(ConfigError):
        InstanceConfig(masked_lm_prob=1.5)
    assert InstanceConfig().max_predictions(128) == 20 and InstanceConfig().max_predictions(512) == 80


def test_entity_masker_hook_chooses_targets():
    from orchestrator.text.entity_masking import EntityMasker, EntityMaskingConfig

    vocab = SPECIAL + ["the", "liver", "tumor", "shows", "early", "enhancement", "and", "washout", "in", "."]
    index = {t: i for i, t in enumerate(vocab)}
    sent = "the liver tumor shows early enhancement and washout in the liver .".split()
    docs = [[[index[t] for t in sent]] * 3 for _ in range(4)]
    sp = Specials.from_vocab(index)
    masker = EntityMasker(EntityMaskingConfig(plain_random_share=0.0))
    instances = create_training_instances(docs, ["s"] * 4, 2, Params(64, 0.0, 0.15, 10, False), sp,
                                          random.Random(0), masker, vocab)
    assert instances
    assert all(x.entity_stats is not None for x in instances)
    assert sum(x.entity_stats["entities"] for x in instances) > 0
    assert sum(x.entity_stats["masked_entities"] for x in instances) > 0


def test_same_type_grouping_puts_associated_sentences_next_to_each_other():
    from orchestrator.text.entity_masking import EntityMasker, EntityMaskingConfig
    from orchestrator.text.instances import group_sentences

    vocab = SPECIAL + ["a", "liver", "tumor", "cat", "sat", "hcc", "washout", "."]
    index = {t: i for i, t in enumerate(vocab)}
    sentences = ["a liver tumor .", "a cat sat .", "hcc washout .", "cat sat ."]
    doc = [[index[w] for w in s.split()] for s in sentences]
    masker = EntityMasker(EntityMaskingConfig(same_type_grouping=True))
    regrouped = [" ".join(vocab[t] for t in s) for s in group_sentences(doc, masker, vocab)]
    assert sorted(regrouped) == sorted(sentences)
    # the two sentences holding associated entities now sit side by side
    a, b = regrouped.index("a liver tumor ."), regrouped.index("hcc washout .")
    assert abs(a - b) == 1
