"""The word-cache encoder gives exactly the tokenizer's ids, whichever path each sentence takes."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from orchestrator.instances.encoding import SentenceEncoder
from orchestrator.vocab.wordpiece import VocabConfig, train_wordpiece

SAMPLE = Path(__file__).resolve().parents[1] / "orchestrator" / "sample_data" / "corpus"

EDGE_CASES = [
    "", "   ", "Hello, World!", "IL-2-induced T-cell (CD4+) proliferation; p < 0.05.",
    "tab\tand\nnewline\rreturn", "bell\x07 and \x0bvertical\x0c feed\x1f end\x7f.",
    "a [MASK] token and [CLS] text", "[mask] lower-case is plain text",
    "accented café naïve Ärzte", "Greek α-helix β-sheet ±5 µg", "中文字符 and 日本", "emoji 🧬 here",
    "x" * 150 + " long word", "...!!!???", "don't isn't e.g. i.e. U.S.A.", "1,000,000.50 and 3.14e-10",
    "UPPER lower MiXeD", "under_score back\\slash {brace} |pipe| ~tilde^ `tick`",
]


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    lines = []
    for name in ("in_domain.txt", "general.txt"):
        lines += [line.strip() for line in (SAMPLE / name).read_text(encoding="utf-8").splitlines() if line.strip()]
    return lines


@pytest.fixture(scope="module")
def bert_tokenizer(sentences):
    return train_wordpiece(sentences, VocabConfig(vocab_size=800, report=False))


def _reference(tokenizer, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def _split(ids: np.ndarray, starts: np.ndarray) -> list[list[int]]:
    assert ids.dtype == np.int32 and starts[0] == 0 and starts[-1] == len(ids)
    return [ids[a:b].tolist() for a, b in zip(starts[:-1], starts[1:])]


def test_word_cache_path_matches_the_tokenizer_on_corpus_text_and_edge_cases(bert_tokenizer, sentences):
    encoder = SentenceEncoder(bert_tokenizer)
    assert encoder.word_tokenizer is not None  # the shortcut is really taken for a BERT tokenizer
    texts = sentences + EDGE_CASES + [s.upper() for s in sentences[:50]]
    assert _split(*encoder.encode_flat(texts)) == _reference(bert_tokenizer, texts)
    # only ASCII sentences without added-token text take the shortcut; both kinds were mixed above
    assert any(not t.isascii() for t in texts) and any("[MASK]" in t for t in texts)


def test_all_ascii_none_ascii_and_empty_inputs(bert_tokenizer):
    encoder = SentenceEncoder(bert_tokenizer)
    for texts in ([], [""], ["café", "α"], ["plain words only", "and more"]):
        assert _split(*encoder.encode_flat(texts)) == _reference(bert_tokenizer, texts)


def test_cased_tokenizer_keeps_case_on_the_shortcut(sentences):
    tok = Tokenizer(models.WordPiece({"[UNK]": 0, "The": 1, "the": 2, "Cell": 3, "cell": 4, ",": 5, "##s": 6},
                                     unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=False, strip_accents=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    encoder = SentenceEncoder(tok)
    assert encoder.word_tokenizer is not None and not encoder.lowercase
    texts = ["The cells, the Cells", "THE cell", "the\tCell\x01s"]
    ids = _split(*encoder.encode_flat(texts))
    assert ids == _reference(tok, texts)
    assert ids[0] == [1, 4, 6, 5, 2, 3, 6]


def test_other_tokenizers_fall_back_to_the_tokenizer(bert_tokenizer):
    tok = Tokenizer.from_str(bert_tokenizer.to_str())
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()  # punctuation stays inside words: no shortcut
    encoder = SentenceEncoder(tok)
    assert encoder.word_tokenizer is None
    texts = ["IL-2, p<0.05", "two words"]
    assert _split(*encoder.encode_flat(texts)) == _reference(tok, texts)


def test_sentences_with_added_token_text_go_through_the_tokenizer(bert_tokenizer):
    from tokenizers import AddedToken

    tok = Tokenizer.from_str(bert_tokenizer.to_str())
    tok.add_tokens([AddedToken("gene-x", normalized=True), AddedToken("<E1>", normalized=False)])
    encoder = SentenceEncoder(tok)
    texts = ["the GENE-X locus", "marker <E1> here", "no marker"]
    ids = _split(*encoder.encode_flat(texts))
    assert ids == _reference(tok, texts)
    assert tok.token_to_id("gene-x") in ids[0] and tok.token_to_id("<E1>") in ids[1]


def test_word_cache_carries_across_calls_and_resets_at_its_bound(bert_tokenizer, sentences):
    encoder = SentenceEncoder(bert_tokenizer, max_cached_words=300)
    batches = [sentences[i:i + 40] for i in range(0, 400, 40)]
    sizes = []
    for batch in batches:  # later batches reuse words of earlier ones; the bound forces resets
        assert _split(*encoder.encode_flat(batch)) == _reference(bert_tokenizer, batch)
        sizes.append(len(encoder._codes))
    assert max(sizes) > 300 and min(sizes[1:]) < max(sizes)  # it grew past the bound and was rebuilt


def test_arrow_columns_chunked_sliced_or_with_nulls_encode_like_lists(bert_tokenizer, sentences):
    import pyarrow as pa

    encoder = SentenceEncoder(bert_tokenizer)
    texts = sentences[:30] + EDGE_CASES
    chunked = pa.chunked_array([pa.array(texts[:20]), pa.array(texts[20:])])
    assert _split(*encoder.encode_flat(chunked)) == _reference(bert_tokenizer, texts)
    sliced = pa.array(["skip me"] + texts)[1:]
    assert _split(*encoder.encode_flat(sliced)) == _reference(bert_tokenizer, texts)
    assert _split(*encoder.encode_flat(pa.array(["a b", None]))) == _reference(bert_tokenizer, ["a b", ""])


def test_word_tokenizing_falls_back_per_word_when_words_do_not_map_one_to_one(bert_tokenizer):
    """``_tokenize_words`` encodes new words joined by spaces and splits the pieces by word id; a
    "word" the pre-tokenizer splits again, or one without pieces, must not shift the others."""
    encoder = SentenceEncoder(bert_tokenizer)
    words = ["protein", "il-2", "", "cell", "a.b"]  # "il-2" and "a.b" are 3 pre-tokens each; "" none
    ids, starts = encoder._tokenize_words(words)
    expected = [bert_tokenizer.encode(w, add_special_tokens=False).ids for w in words]
    assert _split(ids, starts) == expected
    assert expected[2] == [] and len(expected[1]) >= 3
    ids, starts = encoder._tokenize_words(["protein", "cell"])  # the one-encoding path
    assert _split(ids, starts) == [bert_tokenizer.encode(w, add_special_tokens=False).ids for w in ("protein", "cell")]
