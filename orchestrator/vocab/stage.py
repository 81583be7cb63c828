"""The vocabulary stage: a finished corpus -> an (AmpV) WordPiece tokenizer directory.

    build_vocab(cfg, corpus_dir, out_dir)   # out_dir: vocab.txt, tokenizer.json, ..., vocab_report.json

The small side of the corpus is the shards of sources with role small/domain, the large side
the rest (``orchestrator.core.artifacts.SMALL_ROLES``); AmpV needs both, so a corpus with one side
only gets a plain vocabulary and no report.

With ``vocab.quality`` set, the stage also measures its tokenizer and the given ones on each
language's text (``orchestrator.vocab.quality``: continued words, fertility) and writes
``tokenizer_quality.json`` and ``tokenizer_quality.md`` (the table is also in vocab_report.json).

The stage's key (``vocab_key``) holds its input files' paths and contents; an output made from files of the same
contents at other paths is found by the paths its manifest records.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path

from orchestrator.core.artifacts import ShardInfo, load_plan, shard_sentences, write_vocab_txt
from orchestrator.core.errors import InputError
from orchestrator.core.manifest import (
    atomic_write_json,
    atomic_write_text,
    file_digests,
    file_sha256,
    hash_inputs,
    write_manifest,
)
from orchestrator.core.pretokenize import pretokenize_of
from orchestrator.core.reuse import TOKENIZER_FILES, content_key, relocated_key
from orchestrator.vocab.quality import (
    CORPUS_KIND,
    OWN_TOKENIZER,
    QualityConfig,
    TextSet,
    load_tokenizer,
    load_tokenizers,
    quality_inputs,
    quality_table,
    read_text_sets,
    render_markdown,
)
from orchestrator.vocab.wordpiece import VocabConfig, build_vocabulary, read_target_lines, read_terms

log = logging.getLogger(__name__)

SPECIAL_TOKENS_MAP = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                      "mask_token": "[MASK]"}


def model_tokenizer_files(model_dir: str | Path) -> list[Path]:
    """The tokenizer files of a Hugging Face BERT directory; it must have a WordPiece vocabulary: a ``vocab.txt``,
    or a ``tokenizer.json`` of a WordPiece model (what transformers 5's ``save_pretrained`` writes alone)."""
    model_dir = Path(model_dir)
    if not (model_dir / "vocab.txt").is_file() and _wordpiece_json(model_dir) is None:
        raise InputError(model_dir, "vocab.from_model: no vocab.txt here, nor a tokenizer.json of a WordPiece model",
                         expected="a Hugging Face BERT directory with its WordPiece vocabulary")
    return [model_dir / name for name in TOKENIZER_FILES if (model_dir / name).is_file()]


def _wordpiece_json(model_dir: Path) -> dict | None:
    """``tokenizer.json``'s WordPiece model (its vocabulary: token -> id), or None."""
    try:
        model = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8")).get("model") or {}
    except (OSError, ValueError, AttributeError):
        return None
    return model if model.get("type") == "WordPiece" and isinstance(model.get("vocab"), dict) else None


def copy_model_tokenizer(model_dir: str | Path, out_dir: Path, pretokenize: str = "none") -> dict:
    """``vocab.from_model``: the model's tokenizer files into ``out_dir`` unchanged (a directory with
    only vocab.txt gets the tokenizer.json its tokenizer_config implies, written by transformers; a
    MeCab one, a BertJapaneseTokenizer, has none and gets none). ``pretokenize`` other than none
    must be what the model's tokenizer does. Returns the manifest's counts."""
    from transformers import AutoTokenizer  # heavy: transformers

    files = model_tokenizer_files(model_dir)
    model_pretokenize = pretokenize_of(model_dir)
    if pretokenize != "none" and pretokenize != model_pretokenize:
        raise InputError(Path(model_dir) / "tokenizer_config.json",
                         f"vocab.pretokenize is {pretokenize} but this tokenizer's word splitting is "
                         f"{model_pretokenize}", expected=f"a {pretokenize} tokenizer (or vocab.pretokenize: none, "
                                                          "which takes the model's as it is)")
    for path in files:
        shutil.copyfile(path, out_dir / path.name)
    if not (out_dir / "vocab.txt").is_file():  # a tokenizer.json alone: its vocabulary in id order
        write_vocab_txt(out_dir, _wordpiece_json(out_dir)["vocab"])
    tokenizer = AutoTokenizer.from_pretrained(str(out_dir))
    if not (out_dir / "tokenizer.json").is_file() and model_pretokenize == "none":
        tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    elif model_pretokenize == "none" and (saved := _normalizer(out_dir)) != (loaded := _normalizer(tokenizer)):
        # tokenizer_config.json's do_lower_case / strip_accents win over tokenizer.json's normalizer as the model
        # loads (fine-tuning, pretrain/final); the instances read tokenizer.json: it is written as the model loads
        log.warning("vocab.from_model: %s's normalizer (%s) is not what its tokenizer_config.json makes of it (%s), "
                    "as transformers loads the model; the instances are tokenised as the model loads",
                    Path(model_dir) / "tokenizer.json", saved, loaded)
        tokenizer.backend_tokenizer.save(str(out_dir / "tokenizer.json"))
    if not (out_dir / "special_tokens_map.json").is_file():
        atomic_write_json(out_dir / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
    missing = [t for t in SPECIAL_TOKENS_MAP.values() if t not in tokenizer.get_vocab()]
    if missing:
        raise InputError(Path(model_dir) / "vocab.txt", f"lacks BERT's special tokens {missing}",
                         expected="a BERT WordPiece vocabulary ([PAD], [UNK], [CLS], [SEP], [MASK])")
    if model_pretokenize == "mecab":
        lowercase = bool(tokenizer.do_lower_case)
    else:
        normalizer = json.loads((out_dir / "tokenizer.json").read_text(encoding="utf-8")).get("normalizer") or {}
        lowercase = bool(normalizer.get("lowercase", False))
    return {"vocab_size": len(tokenizer), "vocab_sha256": file_sha256(out_dir / "vocab.txt"),
            "lowercase": lowercase, "pretokenize": model_pretokenize, "from_model": str(Path(model_dir).resolve())}


def _normalizer(source) -> dict | None:
    """The normalizer of a directory's tokenizer.json, or of a loaded fast tokenizer."""
    text = (source / "tokenizer.json").read_text(encoding="utf-8") if isinstance(source, Path) else \
        source.backend_tokenizer.to_str()
    return json.loads(text).get("normalizer")


def vocab_key(vocab: VocabConfig, corpus_key: str, place: Callable[[str], Path] | None = None) -> str:
    """The vocabulary stage's key: its config, the sha256 of its target files or, with ``from_model``, of the
    model's tokenizer files alone (arms on other corpora share it), those of the quality table's texts and
    tokenizers when it measures any, and the corpus's key. With ``place`` (the folder an output of a key is in):
    or the key of a finished vocabulary output there or beside it that this config made from files of these
    contents at other paths (``core.reuse.relocated_key``): a checkout cloned elsewhere (its bundled target files),
    a model in another environment, data copied to another disk (``_key_at``)."""
    # the tokenizer-quality table's inputs only when it has any (default keys stay what they were)
    quality = hash_inputs(quality_inputs(vocab.quality)) if vocab.quality.active else None
    digests = hash_inputs(model_tokenizer_files(vocab.from_model) if vocab.from_model else vocab.target_paths)
    key = _key(vocab, vocab, digests, corpus_key, quality, {})
    if place is None:
        return key
    return relocated_key("vocab", key, place(key), lambda made: _key_at(vocab, digests, corpus_key, quality, made))


def term_list(cfg: VocabConfig) -> list[str]:
    """The term list, recorded among a vocabulary output's inputs: its contents are in no key, and
    ``_same_term_list`` reads them there when the output is looked for from another path."""
    return [cfg.term_list] if cfg.term_list else []


def _key(vocab: VocabConfig, at: VocabConfig, digests: dict[str, str], corpus_key: str, quality: dict | None,
         moved: dict[str, str]) -> str:
    """``vocab_key`` with the paths of ``at`` (``vocab``'s, or an earlier output's); each file's sha256 is named by
    its path in ``moved`` ({path now: path then}), a file not in ``moved`` by its path now."""
    named = [{moved.get(path, path): sha for path, sha in quality.items()}] if quality is not None else []
    if vocab.from_model:  # each file named under the model's path: {<model>/vocab.txt: sha256, ...}
        files = {str(Path(at.from_model) / Path(name).name): sha for name, sha in digests.items()}
        return content_key("vocab", at.identity(), files, *named, *([corpus_key] if vocab.quality.corpus_lines else []))
    files = {moved.get(path, path): sha for path, sha in digests.items()}
    return content_key("vocab", at.identity(), files, corpus_key, *named)


def _key_at(vocab: VocabConfig, digests: dict[str, str], corpus_key: str, quality: dict | None,
            made: dict) -> str | None:
    """This config's key with the paths an earlier vocabulary output's manifest (``made``) records in place of its
    own: the target files, ``from_model``, the term list, the quality table's texts and tokenizers; the files'
    contents read where they are now. None when the two are not comparable, or the term list (whose contents are
    in no key) has other contents now."""
    at = _paths_at(vocab, made.get("config"))
    if at is None or not _same_term_list(vocab.term_list, at.term_list, made.get("inputs")):
        return None
    pairs = [*zip(vocab.target_paths, at.target_paths),
             *((vocab.quality.texts[name], at.quality.texts[name]) for name in vocab.quality.texts),
             *((Path(vocab.quality.tokenizers[name]) / file, Path(at.quality.tokenizers[name]) / file)
               for name in vocab.quality.tokenizers for file in TOKENIZER_FILES)]
    return _key(vocab, at, digests, corpus_key, quality, {str(Path(now)): str(Path(then)) for now, then in pairs})


def _paths_at(vocab: VocabConfig, made) -> VocabConfig | None:
    """``vocab`` with the paths of ``made`` (an earlier output's config as its manifest holds it), or None when that
    names other target files, model, term list, texts or tokenizers (by number, or by name) than this config."""
    if not isinstance(made, dict):
        return None
    targets, model, terms = made.get("target_paths"), made.get("from_model"), made.get("term_list")
    if not (isinstance(targets, list) and len(targets) == len(vocab.target_paths) and _strings(targets)
            and isinstance(model, str) and bool(model) == bool(vocab.from_model)
            and isinstance(terms, str) and bool(terms) == bool(vocab.term_list)):
        return None
    quality = vocab.quality
    if quality.active:  # else its paths are in no key (``VocabConfig.identity``)
        recorded = made.get("quality") if isinstance(made.get("quality"), dict) else {}
        texts, tokenizers = recorded.get("texts"), recorded.get("tokenizers")
        if not (isinstance(texts, dict) and texts.keys() == quality.texts.keys() and _strings(texts.values())
                and isinstance(tokenizers, dict) and tokenizers.keys() == quality.tokenizers.keys()
                and _strings(tokenizers.values())):
            return None
        quality = dataclasses.replace(quality, texts=dict(texts), tokenizers=dict(tokenizers))
    return dataclasses.replace(vocab, target_paths=tuple(targets), from_model=model, term_list=terms, quality=quality)


def _strings(values) -> bool:
    return all(isinstance(v, str) for v in values)


def _same_term_list(now: str, then: str, recorded) -> bool:
    """Whether the term list at ``now`` holds what the earlier output's at ``then`` did: the same path (its key
    holds it as before), or the sha256 its manifest records (``recorded``: its inputs) for it, or, for an output
    made before the term list was recorded, that of the file still at ``then`` (a first clone beside a second)."""
    if now == then:
        return True
    if not Path(now).is_file():
        return False
    sha = recorded.get(str(Path(then))) if isinstance(recorded, dict) else None
    if sha is None and Path(then).is_file():
        sha = file_digests([Path(then)], by_path=True)[str(Path(then))]
    return sha == file_digests([Path(now)], by_path=True)[str(Path(now))]


def build_vocab(cfg: VocabConfig, corpus_dir: Path, out_dir: Path) -> Path:
    """Train the vocabulary on the corpus stage's shards into ``out_dir`` (or, with
    ``cfg.from_model``, take that model's tokenizer as it is)."""
    if cfg.from_model:
        counts = copy_model_tokenizer(cfg.from_model, out_dir, cfg.pretokenize)
        shards = load_plan(corpus_dir, documents=False)[0] if cfg.quality.corpus_lines else []
        quality = write_quality(cfg.quality, out_dir, shards)
        write_manifest(out_dir, stage="vocab", config=cfg, inputs=[*model_tokenizer_files(cfg.from_model),
                                                                   *term_list(cfg)],
                       counts=counts, extra={"tokenizer_quality": quality} if quality else None)
        log.info("vocab: the tokenizer of %s as it is (%d tokens, %s)", cfg.from_model, counts["vocab_size"],
                 "uncased" if counts["lowercase"] else "cased")
        return out_dir
    shards, _ = load_plan(corpus_dir, documents=False)
    small = [s for s in shards if s.is_small]
    large = [s for s in shards if not s.is_small]
    if not small or not large:  # AmpV needs both sides; a single-sided corpus gets a plain vocabulary
        small, large = shards, []
        cfg = dataclasses.replace(cfg, ampv=False, report=False)
    report = build_vocabulary(cfg, lambda: shard_sentences([s.path for s in small]),
                              lambda: shard_sentences([s.path for s in large]),
                              sum(s.n_bytes for s in small), max(1, sum(s.n_bytes for s in large)), out_dir)
    atomic_write_json(out_dir / "special_tokens_map.json", SPECIAL_TOKENS_MAP)
    counts = {"vocab_size": report["vocab_size"], "amplification_factor": report["amplification_factor"],
              "vocab_sha256": file_sha256(out_dir / "vocab.txt"), "pretokenize": cfg.pretokenize}
    quality = write_quality(cfg.quality, out_dir, shards)
    extra: dict = {"report": {k: v for k, v in report.items() if k != "example_terms"}}
    if quality:
        extra["tokenizer_quality"] = quality
        if (out_dir / "vocab_report.json").is_file():
            atomic_write_json(out_dir / "vocab_report.json", {**report, "tokenizer_quality": quality})
    write_manifest(out_dir, stage="vocab", config=cfg, inputs=[corpus_dir, *term_list(cfg)], counts=counts,
                   extra=extra)
    log.info("vocab: %s", {k: v for k, v in report.items() if k != "example_terms"})
    return out_dir


def corpus_text_sets(shards: list[ShardInfo], lines: int) -> list[TextSet]:
    """Up to ``lines`` sentences of each language of the corpus (its shards in order), kind 'corpus'."""
    by_language: dict[str, list[str]] = {}
    for s in shards:
        by_language.setdefault(s.language, []).append(s.path)
    return [TextSet(lang, CORPUS_KIND, tuple(sentence for _, sentence in zip(range(lines), shard_sentences(paths))))
            for lang, paths in sorted(by_language.items())]


def write_quality(cfg: QualityConfig, out_dir: Path, shards: list[ShardInfo]) -> list[dict]:
    """The tokenizer-quality table of the tokenizer in ``out_dir`` (named 'vocab') and ``cfg.tokenizers``
    on ``cfg.texts`` and the corpus's languages, written as tokenizer_quality.json / .md; [] when
    ``cfg`` has no text to measure on."""
    if not cfg.active:
        return []
    texts = read_text_sets(cfg.texts, cfg.max_lines)
    if cfg.corpus_lines:
        texts += corpus_text_sets(shards, cfg.corpus_lines)
    tokenizers = {OWN_TOKENIZER: load_tokenizer(out_dir), **load_tokenizers(cfg.tokenizers)}
    rows = quality_table(tokenizers, texts)
    atomic_write_json(out_dir / "tokenizer_quality.json", rows)
    atomic_write_text(out_dir / "tokenizer_quality.md", render_markdown(rows))
    log.info("vocab: tokenizer quality of %s on %d text set(s) written", ", ".join(tokenizers), len(texts))
    return rows


def plan_vocab(cfg: VocabConfig, small_bytes: int, large_bytes: int) -> str:
    """Dry run: what would be trained; the target files (and a term list) are read as the report will."""
    quality = ""
    if cfg.quality.active:  # the texts and tokenizers load as the stage will load them
        texts = read_text_sets(cfg.quality.texts, cfg.quality.max_lines)
        names = [OWN_TOKENIZER, *load_tokenizers(cfg.quality.tokenizers)]
        quality = (f"; tokenizer quality of {', '.join(names)} on "
                   + ", ".join([f"{t.language}:{t.kind} ({len(t.lines)} units)" for t in texts]
                               + ([f"up to {cfg.quality.corpus_lines} corpus sentences per language"]
                                  if cfg.quality.corpus_lines else [])))
    if cfg.from_model:
        files = model_tokenizer_files(cfg.from_model)
        return f"vocab: the tokenizer of {cfg.from_model} as it is ({', '.join(p.name for p in files)}){quality}"
    targets = read_target_lines(cfg.target_paths, cfg.max_target_lines) if cfg.target_paths else []
    terms = read_terms(cfg.term_list) if cfg.term_list else []
    extra = (f", report on {len(targets)} target text units" if cfg.target_paths else "") + (
        f" and {len(terms)} terms" if terms else "")
    words = ", on MeCab words (unidic-lite)" if cfg.pretokenize == "mecab" else ""
    if small_bytes and large_bytes and cfg.ampv:
        return (f"vocab: AmpV, small corpus x{max(1, round(large_bytes / small_bytes))}, size {cfg.vocab_size}"
                f"{words}{extra}{quality}")
    return f"vocab: plain WordPiece, size {cfg.vocab_size}{words}{extra}{quality}"
