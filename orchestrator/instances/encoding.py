"""Sentence ids as flat arrays, with a word-cache fast path for BERT WordPiece tokenizers.

Instance creation tokenizes every sentence of the corpus, and that was the largest share of its
time. A BERT tokenizer (``BertNormalizer`` -> ``BertPreTokenizer`` -> ``WordPiece``) maps each
word independently, and a corpus repeats its words: a 250 KB PubMed shard has ~44K words and
punctuation marks but ~5K distinct ones, and most of those recur in the next shard. For ASCII
text the normalizer reduces to lower-casing (plus dropping control characters and turning tabs
and newlines into spaces), and the pre-tokenizer to splitting at whitespace and at each ASCII
punctuation character. So :meth:`SentenceEncoder.encode_flat` does those steps with Arrow
compute kernels over the whole column of sentences, sends only words it has not seen before
through the tokenizer, and gathers the pieces with numpy: the same ids (tested against the
tokenizer, edge cases included), several times faster than ``encode_batch_fast`` on one thread
(``benchmarks/instances_vs_reference.py`` measures the stage it serves).

Sentences the shortcut does not cover -- any non-ASCII character, or the text of an added
(special) token such as ``[MASK]`` -- and tokenizers of other shapes go through the tokenizer
itself, so the result never depends on which path a sentence took.

A MeCab tokenizer directory (Japanese, ``orchestrator.core.pretokenize``) has no ``tokenizer.json``:
:class:`MecabSentenceEncoder` splits each sentence into words with the ``MecabTokenizer`` the
directory's ``BertJapaneseTokenizer`` uses and maps each distinct word once to its WordPiece pieces,
giving the ids ``AutoTokenizer`` gives (tested).
"""
from __future__ import annotations

import itertools
import json
from typing import Any

import numpy as np

# ASCII punctuation as BERT defines it (!"#$%&'()*+,-./ :;<=>?@ [\]^_` {|}~): each one is a token
_PUNCT = r"([!-/:-@\[-`{-~])"
# BertNormalizer(clean_text) on ASCII: control characters go, tab, newline and return become spaces
_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]"
_SPACE = r"[\t\n\r]"


class SentenceEncoder:
    """Encodes lists of sentences into (ids, sentence offsets); see the module docstring.

    The word cache lives as long as the encoder (one per Ray worker process and run), so each
    distinct word is tokenized once per worker, not once per shard; it is dropped and rebuilt
    when it holds more than ``max_cached_words`` words (~60 MB at the default).
    """

    def __init__(self, tokenizer: Any, max_cached_words: int = 500_000):
        from tokenizers import Tokenizer  # heavy: tokenizers

        # A published tokenizer.json may pad and truncate every encoding (MiniLM's: to 128 tokens);
        # sentences are encoded whole and packed into instances here.
        tokenizer.no_padding()
        tokenizer.no_truncation()
        self.tokenizer = tokenizer
        spec = json.loads(tokenizer.to_str())
        normalizer, pre, model = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}, spec.get("model") or {}
        self.word_tokenizer = None
        if (normalizer.get("type") == "BertNormalizer" and normalizer.get("clean_text", True)
                and pre.get("type") == "BertPreTokenizer" and model.get("type") == "WordPiece"):
            self.lowercase = bool(normalizer.get("lowercase", True))
            self.word_tokenizer = Tokenizer.from_str(tokenizer.to_str())
            self.word_tokenizer.normalizer = None  # words arrive normalized
            # added tokens are matched before the normalizer (on the lower-cased text when "normalized")
            added = spec.get("added_tokens", [])
            self.added_raw = [t["content"] for t in added if not t.get("normalized")]
            self.added_normalized = [t["content"].lower() for t in added if t.get("normalized")]
            self.max_cached_words = max_cached_words
            self._reset_cache()

    def encode_flat(self, sentences: Any) -> tuple[np.ndarray, np.ndarray]:
        """All sentences' ids concatenated (int32) and sentence ``s``'s span ``starts[s]:starts[s + 1]``.

        ``sentences`` is an Arrow string array (a parquet column, no copy) or a sequence of str.
        """
        import pyarrow as pa  # heavy: pyarrow
        import pyarrow.compute as pc

        column = sentences if isinstance(sentences, (pa.Array, pa.ChunkedArray)) else pa.array(sentences, pa.string())
        column = pc.fill_null(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column, "")
        if self.word_tokenizer is None:
            return self._encode_with_tokenizer(column)
        no_added = np.ones(len(column), dtype=bool)  # added tokens are matched in the raw text: tokenizer
        for token in self.added_raw:
            no_added &= ~pc.match_substring(column, token).to_numpy(zero_copy_only=False)
        for token in self.added_normalized:
            no_added &= ~pc.match_substring(column, token, ignore_case=True).to_numpy(zero_copy_only=False)
        ascii_ = pc.string_is_ascii(column).to_numpy(zero_copy_only=False)
        fast = np.flatnonzero(ascii_ & no_added)
        parts = [(*self._encode_words(column.take(pa.array(fast))), fast)]
        if len(fast) == len(column):
            return parts[0][0], parts[0][1]
        # Non-ASCII sentences that the normalizer turns into ASCII ("rôle" -> "role") take the
        # shortcut after normalizing; the rest go through the tokenizer.
        candidates = np.flatnonzero(~ascii_ & no_added)
        normalized = [self.tokenizer.normalizer.normalize_str(t) for t in column.take(pa.array(candidates)).to_pylist()]
        to_ascii = np.fromiter(map(str.isascii, normalized), dtype=bool, count=len(normalized))
        if to_ascii.any():
            parts.append((*self._encode_words(pa.array([t for t, ok in zip(normalized, to_ascii) if ok], pa.string())),
                          candidates[to_ascii]))
        slow = np.sort(np.concatenate([np.flatnonzero(~no_added), candidates[~to_ascii]]))
        parts.append((*self._encode_with_tokenizer(column.take(pa.array(slow))), slow))
        # merge the parts back into sentence order
        lengths = np.zeros(len(column), dtype=np.int64)
        for _, part_starts, rows in parts:
            lengths[rows] = np.diff(part_starts)
        out_starts = np.concatenate([[0], np.cumsum(lengths)])
        out = np.empty(int(out_starts[-1]), dtype=np.int32)
        for part_ids, part_starts, rows in parts:
            out[run_indices(out_starts[rows], np.diff(part_starts))] = part_ids
        return out, out_starts

    def _encode_with_tokenizer(self, column: Any) -> tuple[np.ndarray, np.ndarray]:
        texts = column.to_pylist()
        return _flatten([e.ids for e in self.tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
                        if texts else [])

    def _encode_words(self, column: Any) -> tuple[np.ndarray, np.ndarray]:
        """ASCII sentences -> ids: normalize and split with Arrow kernels; only new words hit the tokenizer."""
        import pyarrow.compute as pc  # heavy: pyarrow

        if self.lowercase:
            column = pc.ascii_lower(column)
        if pc.any(pc.match_substring_regex(column, r"[\x00-\x1f\x7f]")).as_py():
            column = pc.replace_substring_regex(pc.replace_substring_regex(column, _CONTROL, ""), _SPACE, " ")
        words = pc.ascii_split_whitespace(pc.replace_substring_regex(column, _PUNCT, r" \1 "))
        words_per_sentence = pc.list_value_length(words).to_numpy(zero_copy_only=False).astype(np.int64)
        encoded = pc.dictionary_encode(pc.list_flatten(words))
        if len(self._codes) > self.max_cached_words:
            self._reset_cache()
        codes, known = self._codes, len(self._codes)
        distinct = encoded.dictionary.to_pylist()
        global_code = np.fromiter((codes.setdefault(w, len(codes)) for w in distinct), dtype=np.int64,
                                  count=len(distinct))
        if len(codes) > known:  # tokenize the words seen for the first time, in code order
            new = np.flatnonzero(global_code >= known)
            ids, starts = self._tokenize_words([distinct[i] for i in new.tolist()])
            self._piece_ids = np.concatenate([self._piece_ids, ids])
            self._piece_starts = np.concatenate([self._piece_starts, self._piece_starts[-1] + starts[1:]])
        word = global_code[encoded.indices.to_numpy(zero_copy_only=False)]
        n_pieces = np.diff(self._piece_starts)[word]
        ids = self._piece_ids[run_indices(self._piece_starts[word], n_pieces)]
        token_end = np.concatenate([[0], np.cumsum(n_pieces)])
        return ids, token_end[np.concatenate([[0], np.cumsum(words_per_sentence)])]

    def _tokenize_words(self, words: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Each word's pieces, from one encoding of all of them joined by spaces (one Encoding object,
        not one per word); ``word_ids`` says which word each piece belongs to."""
        encoding = self.word_tokenizer.encode(" ".join(words), add_special_tokens=False)
        word_of = np.asarray(encoding.word_ids, dtype=np.int64)
        pieces_per_word = np.bincount(word_of, minlength=len(words))
        if len(pieces_per_word) != len(words) or (pieces_per_word == 0).any() or (np.diff(word_of) < 0).any():
            # not one pre-tokenizer word per word (never seen): tokenize them one by one
            return _flatten([e.ids for e in self.word_tokenizer.encode_batch_fast(words, add_special_tokens=False)])
        return np.asarray(encoding.ids, dtype=np.int32), np.concatenate([[0], np.cumsum(pieces_per_word)])

    def _reset_cache(self) -> None:
        self._codes: dict[str, int] = {}                 # word -> its entry in the piece table
        self._piece_ids = np.zeros(0, dtype=np.int32)   # the pieces of every cached word, in code order
        self._piece_starts = np.zeros(1, dtype=np.int64)


class MecabSentenceEncoder:
    """``encode_flat`` for a MeCab tokenizer: MeCab words (``MecabWords``), then each word's pieces from
    ``pieces`` (the directory's WordPiece, ``orchestrator.core.pretokenize.piece_tokenizer``), each
    distinct word tokenized once per encoder (the cache is dropped past ``max_cached_words``)."""

    def __init__(self, words: Any, pieces: Any, max_cached_words: int = 500_000):
        pieces.no_padding()
        pieces.no_truncation()
        self.words, self.pieces, self.max_cached_words = words, pieces, max_cached_words
        self.cache: dict[str, list[int]] = {}

    def encode_flat(self, sentences: Any) -> tuple[np.ndarray, np.ndarray]:
        """All sentences' ids concatenated (int32) and sentence ``s``'s span ``starts[s]:starts[s + 1]``."""
        texts = sentences.to_pylist() if hasattr(sentences, "to_pylist") else list(sentences)
        split = [self.words(text or "") for text in texts]
        if len(self.cache) > self.max_cached_words:
            self.cache = {}
        new = list(dict.fromkeys(w for words in split for w in words if w not in self.cache))
        if new:
            for word, enc in zip(new, self.pieces.encode_batch_fast(new, add_special_tokens=False)):
                self.cache[word] = enc.ids
        cache = self.cache
        return _flatten([[i for w in words for i in cache[w]] for words in split])


def run_indices(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """``starts[i] .. starts[i] + lengths[i] - 1`` for every i, concatenated: a ragged gather (or
    scatter) as one numpy index."""
    lengths = np.asarray(lengths, dtype=np.int64)
    first_out = np.cumsum(lengths) - lengths
    return np.repeat(np.asarray(starts, dtype=np.int64) - first_out, lengths) + np.arange(int(lengths.sum()))


def _flatten(id_lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int32, count=int(lengths.sum()))
    return ids, np.concatenate([[0], np.cumsum(lengths)])
