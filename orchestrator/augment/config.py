"""Configuration of the augmentation stage: the algorithm, the similarity model, Ray placement."""
from __future__ import annotations

import dataclasses
from typing import Literal

from orchestrator.core.config import check_number, field
from orchestrator.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class AugmentConfig:
    """The filtered-BERT algorithm. Defaults follow seed 001: 5 words, cosine > 0, one copy."""

    method: Literal["filtered_bert", "repeat"] = field(
        "filtered_bert", help="filtered_bert: seed 001's MLM replacements; repeat: the equal-steps control, "
                              "each planned sentence written unchanged (no MLM, no vectors), so the training "
                              "file holds as many sentences, and fine-tuning takes as many optimizer steps, as "
                              "with filtered_bert at the same multiple")
    words_per_sentence: int = field(5, help="k: words masked and replaced per sentence (seed 001: 5); "
                                            "fewer when a sentence has fewer eligible words")
    candidates: int = field(10, help="MLM proposals tried per masked word, best first, before the word is "
                                     "left unchanged ('predict again' up to this limit)")
    min_similarity: float = field(0.0, help="a proposal passes only if cosine(original, proposal) > this "
                                            "(seed 001: 0)")
    max_similarity: float = field(1.0, help="... and cosine <= this (below 1 rejects near-copies)")
    replace_entities: bool = field(False, help="also replace words inside entities (tag != O); the replacement "
                                               "carries the original word's tag")
    multiple: float = field(1.0, help="augmented sentences = round(training sentences x multiple); "
                                      "seed 001: 1 (as many augmented as original sentences)")
    include_original: bool = field(True, help="write the original sentences before the augmented ones")
    mask_mode: Literal["per_word", "joint"] = field(
        "per_word", help="per_word: each chosen word is masked alone in the original sentence (k forward "
                         "passes, as in seed 001's filter loop); joint: all k masked in one pass (k x cheaper)")
    min_word_length: int = field(2, help="words shorter than this, or without a letter, are never replaced")
    max_seq_length: int = field(128, help="word pieces per MLM input; longer sentences are windowed "
                                          "around the masked word")
    batch_size: int = field(64, help="most MLM inputs per forward pass (inputs of one length share a pass; "
                                     "an actor takes batch_size // 2 sentences per call)")
    seed: int = field(13, help="picks the words to replace; same seed, same output")

    def __post_init__(self):
        if self.words_per_sentence < 1:
            raise ConfigError("augment.words_per_sentence must be >= 1")
        if self.candidates < 1:
            raise ConfigError("augment.candidates must be >= 1")
        if not -1.0 <= self.min_similarity < self.max_similarity <= 1.0:
            raise ConfigError("augment needs -1 <= min_similarity < max_similarity <= 1 "
                              f"(got {self.min_similarity}, {self.max_similarity})")
        check_number("augment.multiple", self.multiple, low=0, low_open=True)
        if self.max_seq_length < 8 or self.batch_size < 1:
            raise ConfigError("augment.max_seq_length must be >= 8 and augment.batch_size >= 1")


@dataclasses.dataclass(frozen=True)
class SimilarityConfig:
    """fastText skipgram vectors for the filter: a file by path, or trained here (cached)."""

    vectors: str = field("", help="fastText .bin (subword vectors for any word) or .vec text file; "
                                  "empty = train skipgram vectors on `corpus`")
    corpus: tuple[str, ...] = field((), help="plain-text files to train on; empty = the task's training "
                                             "sentences (in-domain by construction)")
    dim: int = field(100, help="vector size")
    epochs: int = field(25, help="skipgram epochs; corpora of a few MB need many (measured on 1 MB of PubMed: "
                                 "with fastText's 5, cos(neutropenia, study) = 0.76; with 25, -0.04)")
    lr: float = field(0.05, help="skipgram's starting learning rate (fastText's default); lower it where "
                                 "training diverges (fastText's 'Encountered NaN' in every attempt)")
    min_count: int = field(2, help="words rarer than this get no own vector (subwords still cover them)")
    minn: int = field(3, help="shortest character n-gram (0 disables subwords)")
    maxn: int = field(6, help="longest character n-gram")
    bucket: int = field(200000, help="n-gram hash buckets; fastText's 2M default makes an 800 MB .bin")
    center: bool = field(True, help="subtract the vocabulary's mean vector before the cosine (small "
                                    "corpora give every pair a high raw cosine)")
    cache_dir: str = field("", help="where trained vectors are kept, keyed by corpus and settings; "
                                    "empty = <out_dir>/../fasttext_cache")

    def __post_init__(self):
        if self.dim < 2 or self.epochs < 1 or self.min_count < 1 or self.bucket < 1:
            raise ConfigError("similarity: dim >= 2, epochs >= 1, min_count >= 1, bucket >= 1")
        if not self.lr > 0:
            raise ConfigError(f"similarity.lr must be > 0, got {self.lr}")
        if self.minn and self.maxn < self.minn:
            raise ConfigError("similarity.maxn must be >= minn")


@dataclasses.dataclass(frozen=True)
class AugmentRayConfig:
    """Placement of the MLM actor pool. Whole CPUs per actor can deadlock a 2-core Ray Data
    pipeline (the actors hold every CPU and the read task never runs), hence fractions."""

    address: str = field("", help="Ray address; empty = RAY_ADDRESS or an embedded local Ray")
    actors: int = field(2, help="MLM actors (each loads the model once)")
    cpus_per_actor: float = field(0.5, help="CPUs reserved per actor (torch threads = max(1, int(this)))")
    gpus_per_actor: float = field(-1.0, help="-1 = 1 when the cluster has (or its autoscaler can start) GPUs "
                                             "else 0; fractions share a GPU")

    def __post_init__(self):
        if self.actors < 1:
            raise ConfigError("ray.actors must be >= 1")
        check_number("ray.cpus_per_actor", self.cpus_per_actor, low=0, low_open=True)
        if self.gpus_per_actor != -1:
            check_number("ray.gpus_per_actor (-1 = auto)", self.gpus_per_actor, low=0)


@dataclasses.dataclass(frozen=True)
class AugmentStageConfig:
    """The main job's augmentation stage: every NER task of the sweep is also fine-tuned on a
    filtered-BERT augmented copy of its training split, reported as a second model
    ``<model>+filtered-bert`` (same per-tag precision / recall / F1 as the original row)."""

    enabled: bool = field(False, help="augment the training split of every NER task of the sweep, once per model, "
                                      "and fine-tune on it too (rows <model>+filtered-bert)")
    model_dir: str = field("", help="MLM proposing replacements; empty = each swept model itself (needs an "
                                    "MLM head: this project's pretrain output has one)")
    augment: AugmentConfig = field(default_factory=AugmentConfig, help="the algorithm")
    similarity: SimilarityConfig = field(default_factory=SimilarityConfig, help="the similarity filter")
    ray: AugmentRayConfig = field(default_factory=AugmentRayConfig, help="actor pool placement")

