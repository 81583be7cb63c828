"""AmpV: an uncased WordPiece vocabulary trained with the small corpus amplified (seed 000).

Without amplification most word pieces come from the large general corpus and domain terms
are shattered (``appendicitis`` -> app ##end ##ici ##tis). AmpV trains on the large corpus
plus the small corpus repeated round(size_large / size_small) times (Fig. 3 lines 8-13); the
repetition is a generator re-reading the small corpus, so no copy is ever written.

The output directory is a Hugging Face tokenizer (vocab.txt, tokenizer.json,
tokenizer_config.json, loadable with AutoTokenizer/BertTokenizer) plus ``vocab_report.json``:
how much of the vocabulary AmpV changed (seed 000 reports 25.8 %, 29.8 %, 10.3 %), the share
of domain terms kept as one token with and without AmpV (seed 000 Table 1), and the fraction
of target-text words split into several pieces ("continued words", seed 002).

With ``pretokenize: mecab`` (Japanese, seed 000's Japanese models) every sentence is first split
into words by MeCab (``orchestrator.core.pretokenize.MecabWords``: NFKC, unidic-lite, lower-cased)
and WordPiece is trained on those words alone: no piece ever spans two MeCab words. The directory is
then a ``BertJapaneseTokenizer`` one (vocab.txt + tokenizer_config.json, no tokenizer.json), which
``AutoTokenizer`` loads with MeCab in front, so fine-tuning splits words the same way.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.core.config import field, to_dict
from orchestrator.core.cost import duration
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import atomic_write_json, atomic_write_text
from orchestrator.core.pretokenize import PRETOKENIZERS, MecabWords, Pretokenize, japanese_tokenizer_config
from orchestrator.formats import read, text_units
from orchestrator.vocab.quality import QualityConfig, measure, word_counts

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_WORD = re.compile(r"[a-z][a-z0-9-]*[a-z0-9]")


@dataclasses.dataclass(frozen=True)
class VocabConfig:
    vocab_size: int = field(32000, help="WordPiece vocabulary size (32K in seed 000)")
    ampv: bool = field(True, help="amplify the small corpus round(size_large/size_small) times")
    min_frequency: int = field(2, help="minimum pair frequency for a merge")
    limit_alphabet: int = field(1000, help="maximum distinct initial characters kept (BERT: 1000)")
    report: bool = field(True, help="also train the plain (non-amplified) vocabulary and write vocab_report.json")
    term_list: str = field("", help="file with one domain term per line for the report; empty = the "
                                    "`auto_terms` words most over-represented in the small corpus")
    auto_terms: int = field(200, help="size of the automatic domain term list")
    target_paths: tuple[str, ...] = field((), help="target files whose words are checked for continued words: "
                                                   "plain text (a unit per line) or task files (BLUE TSV, IOB, "
                                                   "BLUE 4-column NER: a unit per sentence), format sniffed; "
                                                   "empty = sentences of the small corpus")
    max_target_lines: int = field(5000, help="units (lines / sentences) of target text read for the report")
    from_model: str = field("", help="a Hugging Face BERT directory: use its WordPiece tokenizer as it is (cased "
                                     "stays cased, accents stay) instead of training one, to continue that model "
                                     "(pretrain.model.init_from) on its own vocabulary; the other vocab keys are "
                                     "then unused")
    pretokenize: Pretokenize = field("none", help="word splitting before WordPiece: none (BERT's: whitespace, "
                                                  "punctuation, each CJK character alone) or mecab (Japanese: "
                                                  "MeCab words via fugashi + unidic-lite, NFKC, as seed 000's "
                                                  "Japanese models; saved as a BertJapaneseTokenizer, so fine-tuning "
                                                  "and instances split words the same way). With mecab, raise "
                                                  "limit_alphabet to cover the script (Tohoku's BERT: 6129)")
    quality: QualityConfig = field(default_factory=QualityConfig,
                                   help="tokenizer quality per language (seed 002, Fig. 3): continued words and "
                                        "fertility of this vocabulary and of the given tokenizers")

    def identity(self) -> dict:
        """The config as the stage's content key sees it: ``quality`` only when it measures something
        and ``pretokenize`` only when not none, so a vocabulary built before either existed keeps its key."""
        data = to_dict(self)
        if not self.quality.active:
            del data["quality"]
        if self.pretokenize == "none":  # the same for pretokenize (keys of vocabularies from before it)
            del data["pretokenize"]
        return data

    def __post_init__(self) -> None:
        if self.pretokenize not in PRETOKENIZERS:
            raise ConfigError(f"vocab.pretokenize {self.pretokenize!r}: one of {list(PRETOKENIZERS)}")
        if self.vocab_size < len(SPECIAL_TOKENS) + 30:
            raise ConfigError(f"vocab.vocab_size {self.vocab_size} is too small (>= 35)")
        if self.min_frequency < 1 or self.limit_alphabet < 1 or self.auto_terms < 1 or self.max_target_lines < 1:
            raise ConfigError("vocab.min_frequency, limit_alphabet, auto_terms, max_target_lines must be >= 1")


def amplification_factor(small_bytes: int, large_bytes: int) -> int:
    """round(size_large / size_small), at least 1 (Fig. 3 line 10 uses int(); the text says 'the same size')."""
    if small_bytes <= 0:
        raise ValueError("small corpus is empty")
    return max(1, round(large_bytes / small_bytes))


def amplified(small: Callable[[], Iterable[str]], large: Callable[[], Iterable[str]], factor: int) -> Iterator[str]:
    """The small corpus ``factor`` times, then the large one, re-read on each pass (no copies)."""
    for _ in range(factor):
        yield from small()
    yield from large()


Texts = Iterable[str] | Callable[[], Iterable[str]]


@dataclasses.dataclass(frozen=True)
class Alphabet:
    """What the trainer starts from: every character of the words, and ``##c`` for each character seen
    inside a word (after the first). Given to it in a fixed order, they make its training deterministic."""

    chars: tuple[str, ...]
    continuing: tuple[str, ...]


def survey_alphabet(texts: Iterable[str], cfg: VocabConfig) -> Alphabet:
    """The alphabet of ``texts`` as the trainer sees it (normalised, split into words): one pass of the
    trainer with no merges and no limit on the alphabet. Its sets do not depend on how often a text
    comes, so the texts need not be amplified."""
    tok = _trainer_run(texts, cfg, vocab_size=1, limit_alphabet=1 << 30, specials=SPECIAL_TOKENS)
    vocab = [t for t in tok.get_vocab() if t not in SPECIAL_TOKENS]
    return Alphabet(tuple(sorted(t for t in vocab if len(t) == 1)),
                    tuple(sorted(t for t in vocab if len(t) == 3 and t.startswith("##"))))


def train_wordpiece(texts: Texts, cfg: VocabConfig, alphabet: Alphabet | None = None):
    """An uncased BERT WordPiece tokenizer (tokenizers.Tokenizer) trained on ``texts`` (an iterable, or a
    callable returning a fresh iterator over them); with ``pretokenize: mecab`` the texts are MeCab words
    joined by spaces (``MecabWords.joined``, already normalised and lower-cased) and the tokenizer splits
    at whitespace only.

    Deterministic: the same texts give the same vocabulary in every process. The ``tokenizers`` trainer
    (0.23) numbers the ``##c`` pieces in the order it iterates a hash map of the words, random per
    process, and breaks ties between pairs of equal count by those numbers (huggingface/tokenizers#1794),
    so 63 of 3,000 tokens of the tiny preset changed from run to run. Here the ``##c`` pieces are given to
    it first, sorted (``alphabet``, surveyed from ``texts`` when not given: one more pass, without
    merges), so every id and every tie is fixed. When the words hold more characters than
    ``limit_alphabet``, the characters kept are chosen here too (most frequent first, ties by code
    point), counted over ``texts`` in Python, since the trainer breaks those ties at random as well."""
    again: Callable[[], Iterable[str]]
    if callable(texts):
        again = texts
    else:
        texts = texts if isinstance(texts, (list, tuple)) else list(texts)
        again = lambda: texts  # noqa: E731
    alphabet = alphabet or survey_alphabet(again(), cfg)
    continuing, initial, limit = alphabet.continuing, (), cfg.limit_alphabet
    if len(alphabet.chars) > cfg.limit_alphabet:
        counts = _char_counts(again(), cfg)
        kept = sorted(alphabet.chars, key=lambda c: (-counts[c], c))[:cfg.limit_alphabet]
        continuing = tuple(t for t in continuing if t[2:] in set(kept))
        initial, limit = tuple(sorted(kept)), len(kept)
    trained = _trainer_run(again(), cfg, vocab_size=cfg.vocab_size, limit_alphabet=limit,
                           specials=(*SPECIAL_TOKENS, *continuing), initial_alphabet=initial)
    return _wordpiece_tokenizer(canonical_vocab(trained.get_vocab()), cfg)


def _trainer_run(texts: Iterable[str], cfg: VocabConfig, *, vocab_size: int, limit_alphabet: int,
                 specials: Iterable[str], initial_alphabet: Iterable[str] = ()):
    """One run of the ``tokenizers`` WordPiece trainer with BERT's normalisation (or on MeCab words)."""
    from tokenizers import BertWordPieceTokenizer, Tokenizer, models, pre_tokenizers, trainers  # heavy: tokenizers

    if cfg.pretokenize == "mecab":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=cfg.min_frequency,
                                            limit_alphabet=limit_alphabet, special_tokens=list(specials),
                                            initial_alphabet=list(initial_alphabet),
                                            continuing_subword_prefix="##", show_progress=False)
        tok.train_from_iterator(texts, trainer)
        return tok
    tok = BertWordPieceTokenizer(lowercase=True, clean_text=True, handle_chinese_chars=True, strip_accents=None)
    tok.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=cfg.min_frequency,
                            limit_alphabet=limit_alphabet, special_tokens=list(specials),
                            initial_alphabet=list(initial_alphabet), wordpieces_prefix="##", show_progress=False)
    return tok._tokenizer


def _wordpiece_tokenizer(vocab: dict[str, int], cfg: VocabConfig):
    """The tokenizer of a trained vocabulary, as saved: the ``##c`` pieces given to the trainer are
    ordinary tokens again (only BERT's five are special)."""
    from tokenizers import BertWordPieceTokenizer, Tokenizer, models, pre_tokenizers  # heavy: tokenizers

    if cfg.pretokenize == "mecab":
        tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
        tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        tok.add_special_tokens(list(SPECIAL_TOKENS))
        return tok
    return BertWordPieceTokenizer(vocab, lowercase=True, clean_text=True, handle_chinese_chars=True,
                                  strip_accents=None, wordpieces_prefix="##")._tokenizer


def _char_counts(texts: Iterable[str], cfg: VocabConfig) -> Counter:
    """How often each character occurs in the words of ``texts``, normalised as the trainer does."""
    from tokenizers import normalizers  # heavy: tokenizers

    normalize = (str if cfg.pretokenize == "mecab" else
                 normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                            lowercase=True).normalize_str)
    counts: Counter = Counter()
    for text in texts:
        counts.update(normalize(text))
    return counts


def warn_if_small(size: int, cfg: VocabConfig) -> bool:
    """Warn (and return True) when the trainer stopped short of ``cfg.vocab_size``: it merges pieces
    until none left occurs ``min_frequency`` times, so a corpus with too few distinct words gives fewer."""
    if size >= cfg.vocab_size:
        return False
    log.warning("vocab: %d tokens, not the %d asked (vocab.vocab_size): the corpus has too few distinct words "
                "for more: no pair of pieces left occurs vocab.min_frequency=%d times. Give more text, or a smaller "
                "vocab.vocab_size (a check of the corpus: is it the text you meant?)", size, cfg.vocab_size,
                cfg.min_frequency)
    return True


def canonical_vocab(tokens: Iterable[str]) -> dict[str, int]:
    """Special tokens first, then every other token in code-point order.

    The trainer's id order is not reproducible (it changes from process to process), and ids are
    what instances store. WordPiece tokenization depends on the token set only (made reproducible
    by ``train_wordpiece``), so renumbering canonically makes vocab.txt, its sha256 and the
    instances reproducible.
    """
    rest = sorted(t for t in set(tokens) if t not in SPECIAL_TOKENS)
    return {t: i for i, t in enumerate([*SPECIAL_TOKENS, *rest])}


def save_tokenizer(tokenizer, out_dir: Path, pretokenize: str = "none") -> Path:
    """Write a Hugging Face BERT tokenizer directory (vocab.txt, tokenizer.json, tokenizer_config.json);
    with ``pretokenize: mecab`` a BertJapaneseTokenizer one (vocab.txt, tokenizer_config.json)."""
    from transformers import BertJapaneseTokenizer, BertTokenizer  # heavy: transformers

    vocab = canonical_vocab(tokenizer.get_vocab())
    atomic_write_text(out_dir / "vocab.txt", "".join(t + "\n" for t in vocab))
    if pretokenize == "mecab":
        hf = BertJapaneseTokenizer(vocab_file=str(out_dir / "vocab.txt"), **japanese_tokenizer_config(True))
    else:
        hf = BertTokenizer(vocab=vocab, do_lower_case=True)
    hf.save_pretrained(str(out_dir))
    atomic_write_text(out_dir / "vocab.txt", "".join(t + "\n" for t in vocab))
    return out_dir


def vocab_tokens(tokenizer) -> set[str]:
    return set(tokenizer.get_vocab())


def changed_share(ampv: set[str], plain: set[str]) -> float:
    """Percentage of AmpV tokens that are not in the plain vocabulary."""
    return 100.0 * len(ampv - plain) / max(1, len(ampv))


def kept_whole(tokenizer, terms: list[str]) -> float:
    """Share of terms whose every word is a single vocabulary token (seed 000 Table 1)."""
    if not terms:
        return 0.0
    whole = 0
    for enc in tokenizer.encode_batch(terms, add_special_tokens=False):
        words = [w for w in enc.word_ids if w is not None]
        if enc.tokens and "[UNK]" not in enc.tokens and len(words) == len(set(words)):
            whole += 1
    return whole / len(terms)


def continued_words(tokenizer, texts: list[str]) -> float:
    """Fraction of words split into several pieces (Rust et al. 2020, seed 002), words as
    ``orchestrator.vocab.quality.words`` defines them (the same for every tokenizer)."""
    return measure(tokenizer, word_counts(texts))["continued_words"] or 0.0


def ascii_words(text: str) -> list[str]:
    """Lower-cased ASCII words of at least 5 letters: the candidates for domain terms."""
    return [w for w in _WORD.findall(text.lower()) if len(w) >= 5]


def mecab_terms(joined: str) -> list[str]:
    """Candidate domain terms of MeCab-split text (words joined by spaces): words of at least two
    letters or digits (kanji and kana count as letters)."""
    return [w for w in joined.split() if len(w) >= 2 and w.isalnum()]


def domain_terms(small_texts: Iterable[str], large_texts: Iterable[str], n: int, min_count: int = 3,
                 words: Callable[[str], list[str]] = ascii_words) -> list[str]:
    """Words most over-represented in the small corpus (log-ratio of smoothed relative frequencies).

    A documented proxy for a curated term list when none is given.
    """
    small = Counter(w for t in small_texts for w in words(t))
    large = Counter(w for t in large_texts for w in words(t))
    s_total, l_total = sum(small.values()) or 1, sum(large.values()) or 1
    scored = [(math.log((c + 1) / s_total) - math.log((large[w] + 1) / l_total), w)
              for w, c in small.items() if c >= min_count]
    return [w for _, w in sorted(scored, key=lambda x: (-x[0], x[1]))[:n]]


def read_terms(path: str | Path) -> list[str]:
    """One term per non-blank line (strict UTF-8: a bad byte names its line)."""
    path = Path(path)
    if not path.is_file():
        raise InputError(path, "term list does not exist")
    terms = [passage.text for passage in read(path, "text")] if path.stat().st_size else []
    if not terms:
        raise InputError(path, "term list is empty", expected="one term per line")
    return terms


def read_target_lines(paths: Iterable[str], limit: int) -> list[str]:
    """Up to ``limit`` text units of the target files, each read by its sniffed format
    (``orchestrator.formats.text_units``): lines of plain text, the sentence columns of BLUE TSV
    rows, the tokens of each sentence of an IOB / BLUE NER file joined by spaces."""
    out: list[str] = []
    for raw in paths:
        path = Path(raw)
        if not path.is_file():
            raise InputError(path, "vocab target file does not exist")
        for unit in text_units(path):
            out.append(unit)
            if len(out) >= limit:
                return out
    return out


def build_report(ampv_tok, plain_tok, terms: list[str], targets: list[str], factor: int) -> dict:
    """Everything vocab_report.json holds; pure given the two tokenizers."""
    a, p = vocab_tokens(ampv_tok), vocab_tokens(plain_tok)
    return {
        "amplification_factor": factor,
        "vocab_size": len(a),
        "changed_tokens_percent": round(changed_share(a, p), 3),
        "terms": len(terms),
        "terms_whole_ampv": round(kept_whole(ampv_tok, terms), 4),
        "terms_whole_plain": round(kept_whole(plain_tok, terms), 4),
        "target_lines": len(targets),
        "continued_words_ampv": round(continued_words(ampv_tok, targets), 4),
        "continued_words_plain": round(continued_words(plain_tok, targets), 4),
        "example_terms": {t: {"ampv": ampv_tok.encode(t, add_special_tokens=False).tokens,
                              "plain": plain_tok.encode(t, add_special_tokens=False).tokens} for t in terms[:10]},
    }


#: A pass's time per byte, relative to a training pass's: counting the domain terms reads the corpus at about 5-7x
#: the rate (6.6 s where the passes before took 40-47 s; 24 s after 1m48s-2m28s: the time left it said at the third
#: pass was 5x too long, probe G5); surveying the alphabet takes about a training pass's time
TERMS_PASS_COST = 0.2


class _PassProgress:
    """The vocabulary stage's passes over the corpus, each said when it ends: done / total, its time,
    and the time left, estimated from the work the passes still do (bytes x the pass's relative cost) at the rate
    of those done."""

    def __init__(self, passes: list[tuple[str, int, float]]):
        self.passes, self.done, self.read, self.started = passes, 0, 0.0, time.perf_counter()

    def __call__(self, run: Callable[[], Any]) -> Any:
        name, size, cost = self.passes[self.done]
        began = time.perf_counter()
        out = run()
        self.done, self.read = self.done + 1, self.read + size * cost
        elapsed = time.perf_counter() - self.started
        left = sum(b * c for _, b, c in self.passes[self.done:]) * elapsed / max(self.read, 1)
        log.info("vocab: pass %d/%d, %s, done in %s%s", self.done, len(self.passes), name,
                 duration(time.perf_counter() - began),
                 f"; about {duration(left)} left" if self.done < len(self.passes) else "")
        return out


def build_vocabulary(cfg: VocabConfig, small: Callable[[], Iterable[str]], large: Callable[[], Iterable[str]],
                     small_bytes: int, large_bytes: int, out_dir: Path) -> dict:
    """Train (AmpV or plain) into ``out_dir``; with ``cfg.report`` also the other one for the report.

    ``small``/``large`` are callables returning fresh iterators over the sentences of each side.
    Returns the report (also written to vocab_report.json when ``cfg.report``).
    """
    factor = amplification_factor(small_bytes, large_bytes) if cfg.ampv else 1
    terms_of, split = ascii_words, (lambda text: text)
    if cfg.pretokenize == "mecab":  # every text as its MeCab words, joined by spaces (each pass splits again)
        split, terms_of = MecabWords(lowercase=True).joined, mecab_terms
        small_raw, large_raw = small, large
        small, large = (lambda: map(split, small_raw())), (lambda: map(split, large_raw()))
    log.info("vocab: training WordPiece (%d tokens%s), small corpus x%d", cfg.vocab_size,
             ", on MeCab words" if cfg.pretokenize == "mecab" else "", factor)
    amp_factor = amplification_factor(small_bytes, large_bytes)
    other_factor = 1 if cfg.ampv else amp_factor
    passes = [("the alphabet", small_bytes + large_bytes, 1.0),
              ("the vocabulary", small_bytes * factor + large_bytes, 1.0)]
    if cfg.report:  # vocab.report: the other vocabulary, and the domain terms, for vocab_report.json
        passes.append((f"the report's {'plain' if cfg.ampv else 'AmpV'} vocabulary",
                       small_bytes * other_factor + large_bytes, 1.0))
        if not cfg.term_list:
            passes.append(("the report's domain terms", small_bytes + large_bytes, TERMS_PASS_COST))
    step = _PassProgress(passes)
    alphabet = step(lambda: survey_alphabet(amplified(small, large, 1), cfg))  # the same for both vocabularies
    main = step(lambda: train_wordpiece(lambda: amplified(small, large, factor), cfg, alphabet))
    warn_if_small(main.get_vocab_size(), cfg)
    save_tokenizer(main, out_dir, cfg.pretokenize)
    report: dict = {"ampv": cfg.ampv, "amplification_factor": factor, "vocab_size": main.get_vocab_size()}
    if cfg.report:
        other = step(lambda: train_wordpiece(lambda: amplified(small, large, other_factor), cfg, alphabet))
        ampv_tok, plain_tok = (main, other) if cfg.ampv else (other, main)
        if cfg.term_list:
            terms = [split(t) for t in read_terms(cfg.term_list)]
        else:
            terms = step(lambda: domain_terms(small(), large(), cfg.auto_terms, words=terms_of))
        if cfg.target_paths:
            targets = [split(t) for t in read_target_lines(cfg.target_paths, cfg.max_target_lines)]
        else:
            targets = [s for _, s in zip(range(cfg.max_target_lines), small())]
        report = {"ampv": cfg.ampv, **build_report(ampv_tok, plain_tok, terms, targets, amp_factor)}
        atomic_write_json(out_dir / "vocab_report.json", report)
    return report
