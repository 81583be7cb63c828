"""BERT's instance algorithm as pure functions: invariants, determinism, and equality with the reference port."""
from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import numpy as np
import pytest

from orchestrator.instances.config import InstanceConfig, MaskingRule, Params, Specials
from orchestrator.instances.exact import create_training_instances, truncate_seq_pair
from orchestrator.instances.masking import mask_batch

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
    from orchestrator.instances.parquet import summarize

    ref = _load_reference()
    ours, _ = _build(corpus, vocab, seed=12345, length=64, dupe=3, wwm=wwm)
    cuts, truncate = [], ref.truncate_seq_pair

    def counted(tokens_a, tokens_b, max_num_tokens, rng):  # BERT's own truncation, its cuts counted
        packed = len(tokens_a) + len(tokens_b)
        truncate(tokens_a, tokens_b, max_num_tokens, rng)
        cuts.append(packed - len(tokens_a) - len(tokens_b))

    ref.truncate_seq_pair = counted
    theirs = ref.instances_from_documents([list(map(list, d)) for d in corpus], vocab, 64, 3, 0.1, 0.15, 10,
                                          random.Random(12345), wwm)
    assert len(ours) == len(theirs) == len(cuts) > 100
    # the tokens truncation cut, and the instances it cut, as the manifest counts them (issue: it counted the
    # tokens kept only; at length 64 BERT's truncation cuts a share of the pairs it packs)
    summary = summarize(ours)
    assert summary["cut"] == sum(x.cut for x in ours) == sum(cuts) > 1000
    assert summary["pairs_cut"] == sum(c > 0 for c in cuts) > 100
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
    ids = np.array([list(instances[0].input_ids)])
    chosen, labels = mask_batch(ids, np.array([ids.shape[1]]), MaskingRule(), sp, sp.continuation_mask(),
                                np.random.default_rng(0))
    assert chosen.any() and [instances[0].input_ids[p] for p in np.flatnonzero(chosen[0])] == list(labels)


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


def test_a_masked_lm_prob_the_cap_takes_from_is_said_by_the_dry_run(vocab):
    """BERT masks min(max_predictions_per_seq, round(length x masked_lm_prob)) tokens: masked_lm_prob 0.3 under
    the default cap (20 per 128) masks 15.6 % of a full instance, which the dry run and the stage said nowhere
    (the manifest recorded 0.3). BERT's own settings, and entity masking (no cap), say nothing."""
    from orchestrator.instances.entity_masking import EntityMaskingConfig
    from orchestrator.instances.stage import plan_instances

    sp = Specials.from_vocab({t: i for i, t in enumerate(vocab)})
    cfg = InstanceConfig(max_seq_lengths=(64, 128), masked_lm_prob=0.3)
    ids = np.array([[sp.cls] + [sp.vocab_size - 150 + i % 100 for i in range(126)] + [sp.sep]])
    rule = MaskingRule(cfg.masked_lm_prob, cfg.max_predictions(128), False)
    chosen, _ = mask_batch(ids, np.array([128]), rule, sp, sp.continuation_mask(), np.random.default_rng(0))
    assert chosen.sum() == 20  # not the 38 asked
    said = plan_instances(cfg).split("\n")
    assert said[2] == ("instances.masked_lm_prob 0.3 asks 38 masked tokens of a 128-token instance; "
                       "max_predictions_per_seq caps them at 20 (15.6%, its default of 20 per 128): raise "
                       "instances.max_predictions_per_seq to 38 to mask what masked_lm_prob says")
    assert len(said) == 3 and "asks 19 masked tokens of a 64-token instance" in said[1]
    assert "caps them at 40 (31.2%)" in InstanceConfig(max_predictions_per_seq=40, masked_lm_prob=0.5
                                                         ).masking_capped(128)
    assert not any(InstanceConfig().masking_capped(n) for n in (8, 64, 128, 512))
    assert not InstanceConfig(masked_lm_prob=0.3, entity_masking=EntityMaskingConfig()).masking_capped(128)


def test_entity_masker_hook_chooses_targets():
    from orchestrator.instances.entity_masking import EntityMasker, EntityMaskingConfig

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


# ---------------------------------------------------------------------------------------------
# The vectorised path (default): same algorithm, same distributions, its own random stream


def _fast(corpus, vocab, seed=1, length=64, dupe=2, wwm=False, static=True, short_seq_prob=0.1):
    """Instances of the vectorised path as python rows, plus the merged summary."""
    import pyarrow as pa

    from orchestrator.instances.packing import TokenizedDocs, instance_batches
    from orchestrator.instances.parquet import merge_summaries

    sp = Specials.from_vocab({t: i for i, t in enumerate(vocab)})
    p = Params(length, short_seq_prob, 0.15, InstanceConfig().max_predictions(length), wwm, static)
    docs = TokenizedDocs.from_sentence_ids(_ids(corpus, vocab), [f"s{i % 2}" for i in range(len(corpus))])
    parts = list(instance_batches(docs, dupe, p, sp, sp.continuation_mask(), random.Random(seed), batch_size=256))
    table = pa.Table.from_batches([b for b, _ in parts])
    return table.to_pylist(), merge_summaries(s for _, s in parts), sp


def _originals(row):
    original = list(row["input_ids"])
    for pos, label in zip(row["masked_lm_positions"], row["masked_lm_ids"]):
        original[pos] = label
    return original


def test_fast_layout_lengths_segments_and_summary(corpus, vocab):
    from orchestrator.instances.packing import TokenizedDocs, plan_spans

    rows, summary, sp = _fast(corpus, vocab, length=64, dupe=3)
    # what truncation cut: every token of a packed pair past length - 3, counted again from the same packing
    rng = random.Random(1)
    rng.getrandbits(128)  # instance_batches seeds its numpy generator first
    docs = TokenizedDocs.from_sentence_ids(_ids(corpus, vocab), [f"s{i % 2}" for i in range(len(corpus))])
    spans = plan_spans(docs, 3, 64, 0.1, rng)
    excess = np.maximum(spans.a_len + spans.b_len - 61, 0)
    assert len(spans.a_len) == len(rows) and summary["cut"] == excess.sum() > 1000
    assert summary["pairs_cut"] == (excess > 0).sum() and summary["tokens"] - 3 * len(rows) + summary["cut"] == \
        (spans.a_len + spans.b_len).sum()
    assert summary["instances"] == len(rows) > 100
    assert summary["tokens"] == sum(len(r["input_ids"]) for r in rows)
    assert summary["masked"] == sum(len(r["masked_lm_positions"]) for r in rows)
    assert summary["random_next"] == sum(r["next_sentence_label"] for r in rows)
    assert {s: c["instances"] for s, c in summary["by_source"].items()} == {
        s: sum(r["source"] == s for r in rows) for s in ("s0", "s1")}
    for r in rows:
        original = _originals(r)
        assert len(original) <= 64 and original[0] == sp.cls and original[-1] == sp.sep
        seps = [i for i, t in enumerate(original) if t == sp.sep]
        assert len(seps) == 2 and seps[0] >= 2 and len(original) - seps[0] >= 3  # A and B non-empty
        assert r["token_type_ids"] == [0] * (seps[0] + 1) + [1] * (len(original) - seps[0] - 1)
        positions = r["masked_lm_positions"]
        assert positions == sorted(set(positions)) and 1 <= len(positions) <= 10
        assert len(positions) == min(10, max(1, round(len(original) * 0.15)))
        assert all(original[p] not in (sp.cls, sp.sep) for p in positions)


def test_fast_segments_are_runs_of_whole_sentences_or_truncated_pairs(vocab):
    """Segment A starts a sentence of the document; B continues it, or comes from another document."""
    rng = random.Random(5)
    docs = [[[f"w{d}"] + [f"w{100 + s}"] * rng.randint(3, 9) for s in range(rng.randint(2, 9))] for d in range(50)]
    rows, _, sp = _fast(docs, vocab, length=128, dupe=2, static=False, short_seq_prob=0.0)
    index = {t: i for i, t in enumerate(vocab)}
    doc_of = {index[f"w{d}"]: d for d in range(50)}
    for r in rows:
        ids = r["input_ids"]
        sep = ids.index(sp.sep)
        a, b = ids[1:sep], ids[sep + 1:-1]
        assert a[0] in doc_of  # not truncated (short documents): A starts at a sentence start
        a_docs = {doc_of[t] for t in a if t in doc_of}
        b_docs = {doc_of[t] for t in b if t in doc_of}
        assert len(a_docs) == 1 and len(b_docs) == 1
        if r["next_sentence_label"]:
            assert b_docs != a_docs  # 50 docs: 10 tries always find another one
        else:
            assert b_docs == a_docs


def test_fast_mask_rate_80_10_10_nsp_half_like_the_reference(corpus, vocab):
    rows, summary, sp = _fast(corpus, vocab, length=128, dupe=5)
    exact, _ = _build(corpus, vocab, length=128, dupe=5)
    exact_masked = sum(len(x.masked_lm_positions) for x in exact) / sum(len(x.input_ids) for x in exact)
    assert abs(summary["masked"] / summary["tokens"] - exact_masked) < 0.005
    mask = same = other = 0
    for r in rows:
        for pos, label in zip(r["masked_lm_positions"], r["masked_lm_ids"]):
            token = r["input_ids"][pos]
            mask += token == sp.mask
            same += token == label
            other += token not in (sp.mask, label)
    n = mask + same + other
    assert abs(mask / n - 0.8) < 0.02 and abs(same / n - 0.1) < 0.02 and abs(other / n - 0.1) < 0.02
    exact_next = sum(x.is_random_next for x in exact) / len(exact)
    assert abs(summary["random_next"] / summary["instances"] - exact_next) < 0.04


def test_fast_nsp_is_half_random_with_multi_sentence_chunks(vocab):
    rng = random.Random(11)
    words = [t for t in vocab if t.startswith("w")]
    docs = [[[rng.choice(words) for _ in range(rng.randint(8, 16))] for _ in range(30)] for _ in range(40)]
    # without short targets (which make single-sentence chunks, always random next) the coin decides;
    # a document's last chunk can still be a single sentence, so both paths sit a little above 50 %
    fast = [_fast(docs, vocab, seed=seed, length=128, dupe=3, short_seq_prob=0.0)[1] for seed in range(4)]
    fast_rate = sum(s["random_next"] for s in fast) / sum(s["instances"] for s in fast)
    sp = Specials.from_vocab({t: i for i, t in enumerate(vocab)})
    exact = [x.is_random_next for seed in range(4) for x in create_training_instances(
        _ids(docs, vocab), ["s"] * len(docs), 3, Params(128, 0.0, 0.15, 20, False, False), sp, random.Random(seed))]
    assert sum(s["instances"] for s in fast) > 2000
    assert 0.47 < fast_rate < 0.57 and abs(fast_rate - sum(exact) / len(exact)) < 0.03


def test_fast_length_distribution_matches_the_reference_incl_short_sequences(corpus, vocab):
    """Instance counts, mean length, the share of short instances (short_seq_prob) and of the tokens truncation
    cut match the exact path."""
    def stats(lengths):
        return len(lengths), sum(lengths) / len(lengths), sum(n < 32 for n in lengths) / len(lengths)

    means = {}
    for short_seq_prob in (0.1, 0.5):
        built = [_fast(corpus, vocab, seed=seed, length=128, dupe=5, static=False, short_seq_prob=short_seq_prob)
                 for seed in range(4)]
        fast = [len(r["input_ids"]) for rows, _, _ in built for r in rows]
        sp = Specials.from_vocab({t: i for i, t in enumerate(vocab)})
        p = Params(128, short_seq_prob, 0.15, 20, False, False)
        instances = [x for seed in range(4) for x in create_training_instances(
            _ids(corpus, vocab), ["s"] * len(corpus), 5, p, sp, random.Random(seed))]
        exact = [len(x.input_ids) for x in instances]
        (n_f, mean_f, short_f), (n_e, mean_e, short_e) = stats(fast), stats(exact)
        assert abs(n_f / n_e - 1) < 0.05 and abs(mean_f / mean_e - 1) < 0.05
        assert abs(short_f - short_e) < 0.03
        cut_f, cut_e = sum(s["cut"] for _, s, _ in built) / sum(fast), sum(x.cut for x in instances) / sum(exact)
        assert cut_e > 0.01 and abs(cut_f / cut_e - 1) < 0.15
        assert max(fast) <= 128
        means[short_seq_prob] = mean_f
    assert means[0.5] < 0.9 * means[0.1]  # the knob moves the distribution


def test_fast_whole_word_masking_masks_every_piece_of_a_word(corpus, vocab):
    rows, _, sp = _fast(corpus, vocab, wwm=True, dupe=3)
    checked = 0
    for r in rows:
        masked = set(r["masked_lm_positions"])
        original = _originals(r)
        for pos in masked:
            if original[pos] in sp.continuation and original[pos - 1] not in (sp.cls, sp.sep):
                assert pos - 1 in masked
                checked += 1
            if pos + 1 < len(original) and original[pos + 1] in sp.continuation:
                assert pos + 1 in masked
        assert len(masked) <= 10
    assert checked > 50


def test_fast_deterministic_by_seed_and_batch_size_free(corpus, vocab):
    import pyarrow as pa

    from orchestrator.instances.packing import TokenizedDocs, instance_batches

    a, _, _ = _fast(corpus, vocab, seed=3)
    b, _, _ = _fast(corpus, vocab, seed=3)
    c, _, _ = _fast(corpus, vocab, seed=4)
    assert a == b and a != c
    sp = Specials.from_vocab({t: i for i, t in enumerate(vocab)})
    docs = TokenizedDocs.from_sentence_ids(_ids(corpus, vocab), [f"s{i % 2}" for i in range(len(corpus))])
    p = Params(64, 0.1, 0.15, 10, False, False)  # unmasked: the layout does not depend on batching
    one = pa.Table.from_batches([x for x, _ in instance_batches(docs, 2, p, sp, sp.continuation_mask(),
                                                                random.Random(3), batch_size=10_000)])
    many = pa.Table.from_batches([x for x, _ in instance_batches(docs, 2, p, sp, sp.continuation_mask(),
                                                                 random.Random(3), batch_size=7)])
    assert one.equals(many)


def test_truncate_spans_removes_what_truncate_seq_pair_removes():
    """Same lengths as BERT's loop for every (len A, len B), and a fair front/back split."""
    import numpy as np

    from orchestrator.instances.packing import Spans, truncate_spans

    pairs = [(la, lb) for la in range(1, 40) for lb in range(1, 40)]
    for la, lb in pairs:
        a, b = list(range(la)), list(range(lb))
        truncate_seq_pair(a, b, 30, random.Random(0))
        z = np.zeros(1, dtype=np.int64)
        out = truncate_spans(Spans(z + 100, z + la, z + 500, z + lb, np.zeros(1, bool), z), 30,
                             np.random.default_rng(0))
        assert (out.a_len[0], out.b_len[0]) == (len(a), len(b))
        assert 100 <= out.a_start[0] <= 100 + la - len(a) and 500 <= out.b_start[0] <= 500 + lb - len(b)
    n = 20_000
    z = np.zeros(n, dtype=np.int64)
    out = truncate_spans(Spans(z, z + 60, z, z + 10, np.zeros(n, bool), z), 30, np.random.default_rng(1))
    assert (out.a_len == 20).all() and (out.b_len == 10).all()
    assert abs(out.a_start.mean() - 20) < 0.2  # 40 coins, front or back


def test_tokenized_docs_select_and_concat_keep_the_right_tokens():
    import numpy as np

    from orchestrator.instances.packing import TokenizedDocs

    docs = [[[1, 2], [3]], [], [[4, 5, 6], [], [7]], [[8]]]
    td = TokenizedDocs.from_sentence_ids(docs, ["a", "b", "c", "d"])
    assert td.n_docs == 4 and td.ids.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    picked = td.select([3, 0, 2])
    assert picked.sources == ["d", "a", "c"] and picked.ids.tolist() == [8, 1, 2, 3, 4, 5, 6, 7]
    assert np.diff(picked.sent_starts).tolist() == [1, 2, 1, 3, 1]
    both = TokenizedDocs.concat([picked, td.select([1, 3])])
    assert both.n_docs == 5 and both.sources == ["d", "a", "c", "b", "d"]
    assert both.ids.tolist() == [8, 1, 2, 3, 4, 5, 6, 7, 8]
    assert np.diff(both.doc_starts).tolist() == [1, 2, 2, 0, 1]


def test_unit_worker_writes_both_paths_from_a_real_tokenizer(tmp_path):
    """UnitWorker (no Ray): the default vectorised path and exact_reference_rng write the same kind of shard,
    and the exact one is create_training_instances on the tokenizer's ids, instance for instance."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.core.config import to_dict
    from orchestrator.instances.workers import UnitWorker
    from orchestrator.vocab.wordpiece import VocabConfig, save_tokenizer, train_wordpiece

    rng = random.Random(0)
    words = "the kinase binds a protein in tumour cells and growth factors signal through receptors".split()
    docs = [[" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) + "." for _ in range(rng.randint(1, 8))]
            for _ in range(80)]
    save_tokenizer(train_wordpiece((s for d in docs for s in d), VocabConfig(vocab_size=300)), tmp_path / "vocab")
    shard = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"source": ["pubmed"] * len(docs), "sentences": docs}), shard)
    members = [{"path": str(shard), "rows": list(range(0, 80, 2))}]
    tables, summaries = {}, {}
    for exact in (False, True):
        out = tmp_path / f"out-{exact}"
        out.mkdir()
        worker = UnitWorker(str(tmp_path / "vocab"), str(out), 7, to_dict(InstanceConfig(exact_reference_rng=exact)),
                            64)
        summaries[exact] = worker.build_unit(3, members, 2)
        tables[exact] = pq.read_table(out / "part-000003.parquet")
    assert tables[True].schema == tables[False].schema
    assert summaries[False]["documents"] == summaries[True]["documents"] == 40
    assert abs(summaries[False]["instances"] / summaries[True]["instances"] - 1) < 0.15
    assert tables[False].num_rows == summaries[False]["instances"]
    from tokenizers import Tokenizer

    from orchestrator.instances.exact import unit_rng

    tok = Tokenizer.from_file(str(tmp_path / "vocab" / "tokenizer.json"))
    ids = [[tok.encode(s, add_special_tokens=False).ids for s in docs[r]] for r in range(0, 80, 2)]
    p = Params(64, 0.1, 0.15, InstanceConfig().max_predictions(64), False)
    expected = create_training_instances(ids, ["pubmed"] * 40, 2, p, Specials.from_vocab(tok.get_vocab()),
                                         unit_rng(7, 64, 3))
    assert tables[True].column("input_ids").to_pylist() == [list(x.input_ids) for x in expected]


def test_unit_worker_exact_form_follows_its_tokens_and_groups_when_asked(tmp_path):
    """The exact path takes the process's tokenized shard (ShardTokens), caches its list form beside
    it, re-derives it when the file is rewritten, and builds same-type groups when configured."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenizers import Tokenizer

    from orchestrator.core.config import to_dict
    from orchestrator.instances.workers import UnitWorker
    from orchestrator.vocab.wordpiece import VocabConfig, save_tokenizer, train_wordpiece

    docs = [["a liver tumor was seen.", "the cat sat.", "hcc showed washout."], ["", "one more sentence."]]
    save_tokenizer(train_wordpiece((s for d in docs * 20 for s in d), VocabConfig(vocab_size=200)),
                   tmp_path / "vocab")
    shard = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"source": ["a", "b"], "sentences": docs}), shard)
    tok = Tokenizer.from_file(str(tmp_path / "vocab" / "tokenizer.json"))
    worker = UnitWorker(str(tmp_path / "vocab"), str(tmp_path), 7, to_dict(InstanceConfig(exact_reference_rng=True)),
                        64)
    first = worker.tokenized_shard(str(shard))
    assert worker.tokenized_shard(str(shard)) is first
    assert [[list(s) for s in d] for d in first[0]] == [
        [tok.encode(s, add_special_tokens=False).ids for s in d if s] for d in docs]  # the empty one dropped
    assert first[1] == ["a", "b"]
    pq.write_table(pa.table({"source": ["c"], "sentences": [["the cat sat."]]}), shard)
    os.utime(shard, ns=(1, 1))
    again = worker.tokenized_shard(str(shard))
    assert again is not first and again[1] == ["c"] and len(again[0]) == 1

    pq.write_table(pa.table({"source": ["a", "b"], "sentences": docs}), shard)
    masking = {"entity_masking": {"same_type_grouping": "association", "plain_random_share": 0.0}}
    grouped = UnitWorker(str(tmp_path / "vocab"), str(tmp_path), 7, masking, 64)
    summary = grouped.build_unit(0, [{"path": str(shard), "rows": None}], dupe_factor=20)
    rows = pq.read_table(tmp_path / "part-000000.parquet").to_pylist()
    assert summary["instances"] == len(rows) and summary["entity"]["masked_entities"] > 0
    liver, cat, hcc = (tok.encode(s, add_special_tokens=False).ids for s in docs[0])

    def holds(ids: list[int], text: list[int]) -> bool:
        return any(ids[k:k + len(text)] == text for k in range(len(ids) - len(text) + 1))

    together = alone = 0
    for row in rows:
        ids = list(row["input_ids"])
        for pos, label in zip(row["masked_lm_positions"], row["masked_lm_ids"]):
            ids[pos] = label
        # the text without an entity never shares an input with the entity texts of its document
        assert not (holds(ids, cat) and (holds(ids, liver) or holds(ids, hcc)))
        together += holds(ids, liver) and holds(ids, hcc)
        alone += holds(ids, cat)
    # associated (anatomy/lesion - disease): grouped unless washout is the target
    assert together > 5 and alone >= 20
    assert summary["cut"] == summary["pairs_cut"] == 0  # short texts: nothing cut at 64
    # at 8 (5 tokens for A and B) truncation cuts grouped pairs too, and the summary counts it
    short = UnitWorker(str(tmp_path / "vocab"), str(tmp_path / "short"), 7, masking, 8)
    (tmp_path / "short").mkdir()
    cut = short.build_unit(0, [{"path": str(shard), "rows": None}], dupe_factor=20)
    ids = pq.read_table(tmp_path / "short" / "part-000000.parquet").column("input_ids").to_pylist()
    assert 0 < cut["pairs_cut"] <= sum(len(r) == 8 for r in ids) and cut["cut"] >= cut["pairs_cut"]


def test_shard_tokens_reuses_a_shard_across_runs_and_rereads_a_rewritten_one(tmp_path):
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.instances.workers import ShardTokens
    from orchestrator.vocab.wordpiece import VocabConfig, save_tokenizer, train_wordpiece

    texts = ["the cell divides", "a protein binds the receptor", "the receptor is a protein"] * 20
    save_tokenizer(train_wordpiece(texts, VocabConfig(vocab_size=60, report=False)), tmp_path / "vocab")
    shard = tmp_path / "shard.parquet"
    pq.write_table(pa.table({"source": ["a", "b"], "sentences": [["the cell divides", ""], ["a protein"]]}), shard)
    tokens = ShardTokens(str(tmp_path / "vocab"))
    first = tokens.get(str(shard))
    assert tokens.get(str(shard)) is first  # the next length's pass pays no tokenization
    assert first.n_docs == 2 and len(first.sent_starts) == 3  # the empty sentence is dropped
    assert first.ids.tolist() == tokens.tokenizer.encode("the cell divides a protein", add_special_tokens=False).ids
    pq.write_table(pa.table({"source": ["a"], "sentences": [["the receptor binds"]]}), shard)
    os.utime(shard, ns=(1, 1))  # a different modification time even on a coarse clock
    again = tokens.get(str(shard))
    assert again is not first and again.n_docs == 1
    tokens.cache_bytes = again.nbytes  # room for one shard: the least recently used one goes
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"source": ["a"], "sentences": [["the cell binds the protein"]]}), other)
    tokens.get(str(other))
    assert [key[0] for key in tokens.cache] == [str(other)]


def test_plan_tasks_factoring_large_tasks_first_single_units_last():
    from orchestrator.instances.workers import plan_tasks

    def sizes(groups):
        return [len(g) for g in groups]

    # each round of `workers` equal tasks takes half the work left; the tail is single units
    assert sizes(plan_tasks([700_000] * 23, workers=2)) == [6, 6, 3, 3, 1, 1, 1, 1, 1]
    assert sizes(plan_tasks([700_000] * 23, workers=1)) == [12, 6, 3, 1, 1]
    seed_size = plan_tasks([50_000_000] * 40, workers=8)  # 10 MB shards x 5 passes
    assert sizes(seed_size)[:8] == [3] * 8 and sizes(seed_size)[-16:] == [1] * 16
    assert sizes(plan_tasks([100] * 1000, workers=4)) == [1000]  # 100 KB of work in all: one task
    assert plan_tasks([], workers=2) == [] and sizes(plan_tasks([5_000_000] * 2, workers=4)) == [1, 1]
    for work in ([700_000] * 23, [50_000_000] * 40, [9_000_000] + [1_000_000] * 9, [3, 1_000_000, 7]):
        groups = plan_tasks(work, workers=3)
        assert [u for g in groups for u in g] == list(range(len(work)))  # every unit once, in order
    # cut by work, not by count: a big unit is a task of its own
    assert plan_tasks([9_000_000] + [1_000_000] * 9, workers=2) == [[0], [1, 2, 3, 4, 5], [6], [7], [8], [9]]
