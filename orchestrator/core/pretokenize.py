"""Word splitting before WordPiece, as a tokenizer directory declares it: none (BERT's own rules) or
MeCab (Japanese, seed 000's Japanese models).

Japanese has no spaces between words, so seed 000 (like Tohoku's Japanese BERT) splits text into
words with MeCab and then words into WordPiece pieces. A Hugging Face ``tokenizers`` pre-tokenizer
cannot call MeCab, so a MeCab vocabulary is saved in the format transformers reads natively for this,
``BertJapaneseTokenizer`` (as cl-tohoku/bert-base-japanese-v2 ships it)::

    vocab.txt
    tokenizer_config.json   {"tokenizer_class": "BertJapaneseTokenizer", "word_tokenizer_type": "mecab",
                             "subword_tokenizer_type": "wordpiece", "mecab_kwargs": {"mecab_dic": "unidic_lite"},
                             "do_lower_case": true, "model_input_names": [..., "token_type_ids", ...]}

with no ``tokenizer.json``. ``AutoTokenizer.from_pretrained`` then returns that tokenizer (fugashi
+ unidic-lite, no system MeCab), so fine-tuning, augmentation and any other user of a model
directory split words exactly as pretraining did; pretraining copies the files into every
checkpoint and ``final/``. The instances stage does not go through the slow Python tokenizer: it
splits words with the same ``MecabTokenizer`` object and maps each word to its pieces with a
``tokenizers`` WordPiece built from ``vocab.txt`` (``piece_tokenizer``), the same greedy
longest-match algorithm, so the ids are the same (tested against ``AutoTokenizer``).

``BertJapaneseTokenizer`` also keeps BERT's special tokens whole wherever they occur in the text, and
normalises (NFKC) and lower-cases each chunk between them before MeCab sees it; ``MecabWords`` does
the same.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Literal

from orchestrator.core.errors import InputError

Pretokenize = Literal["none", "mecab"]
PRETOKENIZERS: tuple[str, ...] = ("none", "mecab")
#: The MeCab dictionary: unidic-lite (a PyPI package), as cl-tohoku/bert-base-japanese-v2 uses.
MECAB_DIC = "unidic_lite"
JAPANESE_CLASS = "BertJapaneseTokenizer"
#: BertJapaneseTokenizer in transformers 5 lists no token_type_ids among its inputs; a saved config
#: names them, so sentence pairs get BERT's segment ids as in pretraining.
MODEL_INPUT_NAMES = ["input_ids", "token_type_ids", "attention_mask"]
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def japanese_tokenizer_config(lowercase: bool) -> dict:
    """The keys of ``tokenizer_config.json`` that make a WordPiece vocabulary a MeCab one."""
    return {"tokenizer_class": JAPANESE_CLASS, "word_tokenizer_type": "mecab", "subword_tokenizer_type": "wordpiece",
            "mecab_kwargs": {"mecab_dic": MECAB_DIC}, "do_lower_case": lowercase,
            "model_input_names": MODEL_INPUT_NAMES}


def read_tokenizer_config(tokenizer_dir: str | Path) -> dict:
    path = Path(tokenizer_dir) / "tokenizer_config.json"
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(path, f"not JSON: {exc}", expected="a Hugging Face tokenizer_config.json") from None
    if not isinstance(data, dict):
        raise InputError(path, "not a JSON object", expected="a Hugging Face tokenizer_config.json")
    return data


def pretokenize_of(tokenizer_dir: str | Path) -> str:
    """'mecab' for a BertJapaneseTokenizer directory that splits words with MeCab, else 'none'.

    Other Japanese word splitters (Sudachi, Juman++, character vocabularies) are refused: the
    instances stage could not reproduce them."""
    data = read_tokenizer_config(tokenizer_dir)
    if data.get("tokenizer_class") != JAPANESE_CLASS:
        return "none"
    word = data.get("word_tokenizer_type", "basic") if data.get("do_word_tokenize", True) else "none"
    subword = data.get("subword_tokenizer_type", "wordpiece") if data.get("do_subword_tokenize", True) else "none"
    if word != "mecab" or subword != "wordpiece":
        raise InputError(Path(tokenizer_dir) / "tokenizer_config.json",
                         f"BertJapaneseTokenizer with word_tokenizer_type {word!r} and subword_tokenizer_type "
                         f"{subword!r}", expected="word_tokenizer_type 'mecab' with subword_tokenizer_type 'wordpiece'")
    return "mecab"


class MecabWords:
    """Text -> MeCab words, exactly as ``BertJapaneseTokenizer.tokenize`` splits it before WordPiece:
    BERT's special tokens kept whole, every other chunk NFKC-normalised, split by MeCab (fugashi,
    the dictionary the config names; unidic-lite by default) and lower-cased when uncased.

    Built from a tokenizer directory's config (``from_dir``) or for a new vocabulary (``lowercase``)."""

    def __init__(self, lowercase: bool = True, mecab_kwargs: dict | None = None,
                 specials: tuple[str, ...] = SPECIAL_TOKENS):
        # transformers' MecabTokenizer is the one fine-tuning runs: using it here keeps the two equal
        from transformers.models.bert_japanese.tokenization_bert_japanese import MecabTokenizer  # heavy: transformers

        self.lowercase = lowercase
        self.mecab_kwargs = dict(mecab_kwargs if mecab_kwargs is not None else {"mecab_dic": MECAB_DIC})
        self.specials = tuple(specials)
        self.mecab = MecabTokenizer(do_lower_case=lowercase, **self.mecab_kwargs)
        # longest first: transformers' trie matches the longest special token at each position
        self._special = re.compile("(" + "|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True))
                                   + ")") if specials else None

    @classmethod
    def from_dir(cls, tokenizer_dir: str | Path) -> MecabWords:
        data = read_tokenizer_config(tokenizer_dir)
        specials = {str(t["content"]) for t in (data.get("added_tokens_decoder") or {}).values()
                    if isinstance(t, dict) and t.get("content")}
        specials |= {str(data[k]) for k in ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
                     if isinstance(data.get(k), str)}
        return cls(lowercase=bool(data.get("do_lower_case", False)), mecab_kwargs=data.get("mecab_kwargs"),
                   specials=tuple(sorted(specials or SPECIAL_TOKENS)))

    def __call__(self, text: str) -> list[str]:
        if self._special is None:
            return self.mecab.tokenize(text)
        words: list[str] = []
        for i, chunk in enumerate(self._special.split(text)):
            if i % 2:
                words.append(chunk)  # a special token, kept whole
            elif chunk:
                words.extend(self.mecab.tokenize(chunk))
        return words

    def joined(self, text: str) -> str:
        """The words joined by single spaces: what a whitespace-splitting WordPiece takes."""
        return " ".join(self(text))


def piece_tokenizer(tokenizer_dir: str | Path):
    """The WordPiece half of a MeCab tokenizer directory as a ``tokenizers.Tokenizer``: ``vocab.txt``,
    words split at whitespace only, no normalizer (``MecabWords`` normalised them), the unknown token
    for a word of more than 100 characters or one the vocabulary cannot spell (as transformers'
    ``WordpieceTokenizer``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers  # heavy: tokenizers

    vocab = Path(tokenizer_dir) / "vocab.txt"
    if not vocab.is_file():
        raise InputError(vocab, "no vocab.txt", expected="the WordPiece vocabulary of a MeCab tokenizer directory")
    unk = read_tokenizer_config(tokenizer_dir).get("unk_token")
    unk = unk if isinstance(unk, str) else "[UNK]"
    tokenizer = Tokenizer(models.WordPiece.from_file(str(vocab), unk_token=unk, max_input_chars_per_word=100))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tokenizer
