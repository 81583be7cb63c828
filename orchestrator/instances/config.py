"""What the instances stage is told (``InstanceConfig``) and what its algorithms share: BERT's
parameters of one run (``Params``) and the vocabulary's special ids (``Specials``)."""
from __future__ import annotations

import dataclasses
from typing import Literal

import numpy as np

from orchestrator.core.config import check_number, field, to_dict
from orchestrator.core.errors import ConfigError
from orchestrator.instances.association import ASSOCIATION_DERIVATION_VERSION
from orchestrator.instances.entity_masking import ENTITY_MASKING_VERSION, EntityMaskingConfig

Masking = Literal["static", "dynamic"]


@dataclasses.dataclass(frozen=True)
class InstanceConfig:
    max_seq_lengths: tuple[int, ...] = field((128,), help="one instances/len<L>/ directory per length "
                                                         "(seed 000: 128, then 512)")
    short_seq_prob: float = field(0.1, help="probability of a shorter random target length (BERT: 0.1)")
    masked_lm_prob: float = field(0.15, help="share of tokens masked (BERT: 0.15); with entity_masking its "
                                             "masked_fraction applies instead")
    max_predictions_per_seq: int = field(0, help="cap on masked tokens; 0 = BERT's ratio, 20 per 128 tokens. "
                                                 "Not applied with entity_masking (its condition 1 is a floor)")
    whole_word_mask: bool = field(False, help="mask all pieces of a word together")
    masking: Masking = field("static", help="static: masks drawn here, dupe_factor times; dynamic: "
                                            "unmasked instances, masks drawn at load time (dynamic_mask) by "
                                            "BERT's random rule, so not with entity_masking")
    entity_masking: EntityMaskingConfig | None = field(
        None, help="entity-aware target selection (seed 003); null = BERT's random masking")
    exact_reference_rng: bool = field(
        False, help="run BERT's per-instance Python algorithm, random call for random call as the reference "
                    "port (slow; for equivalence checks). Default: the vectorised path, same distributions. "
                    "Entity masking always uses the per-instance path")
    seed: int = field(12345, help="seed of instance creation; each unit's RNG is seeded by (seed, length, unit)")
    workers: int = field(0, help="Ray tasks building units at once; 0 = one per CPU of the Ray cluster "
                                 "(at most one per unit)")
    cpus_per_worker: float = field(0.5, help="CPUs reserved per task at the least; fractional so that reads "
                                             "can be scheduled beside them on a 2-core machine")
    pretokenize: Literal["auto", "none", "mecab"] = field(
        "auto", help="word splitting before WordPiece: auto = what the vocabulary directory declares (a "
                     "BertJapaneseTokenizer with MeCab: mecab; otherwise none), so instances always split words as "
                     "the vocabulary and fine-tuning do; none / mecab = require that, and fail when the vocabulary "
                     "says otherwise (vocab.pretokenize sets it)")

    def __post_init__(self) -> None:
        if not self.max_seq_lengths or any(n < 8 for n in self.max_seq_lengths):
            raise ConfigError("instances.max_seq_lengths must be non-empty, each >= 8")
        if len(set(self.max_seq_lengths)) != len(self.max_seq_lengths):
            raise ConfigError("instances.max_seq_lengths has duplicates")
        check_number("instances.short_seq_prob", self.short_seq_prob, low=0, high=1)
        check_number("instances.masked_lm_prob", self.masked_lm_prob, low=0, high=1, low_open=True, high_open=True)
        if self.max_predictions_per_seq < 0:
            raise ConfigError("instances.max_predictions_per_seq must be >= 0")
        if self.workers < 0:
            raise ConfigError("instances.workers must be >= 0")
        check_number("instances.cpus_per_worker", self.cpus_per_worker, low=0, low_open=True)
        if self.entity_masking is not None and self.masking == "dynamic":
            # Masks drawn at load time come from mask_batch (BERT's random rule, in the pretraining
            # collator): it has no entities, association table or grouping, so the entity-aware
            # choice would be silently dropped.
            raise ConfigError("instances.masking: dynamic cannot be combined with instances.entity_masking: "
                              "dynamic masks are drawn at load time by BERT's random rule, which knows no "
                              "entities; use instances.masking: static (masks drawn here, dupe_factor times) "
                              "or set instances.entity_masking: null")

    def max_predictions(self, max_seq_length: int) -> int:
        return self.max_predictions_per_seq or max(1, round(max_seq_length * 20 / 128))

    def masking_capped(self, max_seq_length: int) -> str:
        """What the cap takes from ``masked_lm_prob`` in an instance of ``max_seq_length`` tokens ("" when
        nothing): BERT's rule masks ``min(cap, round(length x prob))`` tokens, so ``masked_lm_prob: 0.3`` under
        the default cap (20 per 128) masks 15.6 %. Entity masking has no cap."""
        cap, asked = self.max_predictions(max_seq_length), round(max_seq_length * self.masked_lm_prob)
        if self.entity_masking is not None or asked <= cap:
            return ""
        return (f"instances.masked_lm_prob {self.masked_lm_prob:g} asks {asked} masked tokens of a {max_seq_length}-"
                f"token instance; max_predictions_per_seq caps them at {cap} ({cap / max_seq_length:.1%}"
                f"{'' if self.max_predictions_per_seq else ', its default of 20 per 128'}): raise "
                f"instances.max_predictions_per_seq to {asked} to mask what masked_lm_prob says")

    def output_fields(self) -> dict:
        """The settings one length's instances depend on: not where or how many at once they are built.

        With entity masking, also the version of its algorithm (``ENTITY_MASKING_VERSION``): the same
        settings give other instances when it changes; and the contents of the tables it reads. Without it
        the fields are unchanged. The derived association's fields (``association_*``) and its version enter
        only when it is derived, so the keys of table configs stay what they were before derivation existed."""
        # pretokenize is the vocabulary's (in the vocabulary's key); here it only checks it
        out = {k: v for k, v in to_dict(self).items()
               if k not in ("max_seq_lengths", "workers", "cpus_per_worker", "pretokenize")}
        if self.entity_masking is not None:
            out["entity_masking_version"] = ENTITY_MASKING_VERSION
            if tables := self.entity_masking.table_digests():  # a config of none keeps the key it had
                out["entity_masking_tables"] = tables
            if self.entity_masking.association_method == "table":
                for k in ("association_method", "association_window", "association_min_count"):
                    del out["entity_masking"][k]
            if self.entity_masking.association_level == "type":  # keys from before the option stay
                del out["entity_masking"]["association_level"]
            if self.entity_masking.grouped_next == "within_group":  # the same
                del out["entity_masking"]["grouped_next"]
            else:
                out["association_derivation_version"] = ASSOCIATION_DERIVATION_VERSION
        return out

    def resolved_workers(self, units: int) -> int:
        """Tasks to run at once: as configured, or one per cluster CPU; never more than there are units."""
        import ray  # heavy: ray

        n = self.workers or max(1, int(ray.cluster_resources().get("CPU", 1)))
        return max(1, min(n, units))


@dataclasses.dataclass(frozen=True)
class Specials:
    """Ids the algorithm needs: [CLS], [SEP], [MASK], [PAD], the vocabulary size, and word continuations."""

    cls: int
    sep: int
    mask: int
    vocab_size: int
    continuation: frozenset[int]
    pad: int = 0

    @classmethod
    def from_vocab(cls, vocab: dict[str, int]) -> Specials:
        return cls(cls=vocab["[CLS]"], sep=vocab["[SEP]"], mask=vocab["[MASK]"], vocab_size=len(vocab),
                   continuation=frozenset(i for t, i in vocab.items() if t.startswith("##")),
                   pad=vocab.get("[PAD]", 0))

    @classmethod
    def from_tokenizer(cls, tokenizer) -> Specials:
        """From a Hugging Face BERT tokenizer, whatever its special tokens are called."""
        vocab = tokenizer.get_vocab()
        return cls(cls=tokenizer.cls_token_id, sep=tokenizer.sep_token_id, mask=tokenizer.mask_token_id,
                   vocab_size=len(tokenizer), continuation=frozenset(i for t, i in vocab.items() if t.startswith("##")),
                   pad=tokenizer.pad_token_id)

    def to_dict(self) -> dict:
        """Plain values (the continuation ids as a sorted list), to travel to a Ray worker."""
        return {**dataclasses.asdict(self), "continuation": sorted(self.continuation)}

    @classmethod
    def from_dict(cls, data: dict) -> Specials:
        return cls(**{**data, "continuation": frozenset(data["continuation"])})

    def continuation_mask(self) -> np.ndarray:
        """``continuation`` as a bool lookup table over ids, for the vectorised whole-word masking."""
        mask = np.zeros(self.vocab_size, dtype=bool)
        mask[list(self.continuation)] = True
        return mask


@dataclasses.dataclass(frozen=True)
class MaskingRule:
    """Which tokens of an instance become masked-LM targets: BERT's ``masked_lm_prob`` of its length
    (at least one, at most ``max_predictions_per_seq``), whole words or single pieces. The instances
    manifest records it, so masks drawn at load time (``masking: dynamic``) follow the same rule."""

    masked_lm_prob: float = 0.15
    max_predictions_per_seq: int = 20
    whole_word_mask: bool = False


@dataclasses.dataclass(frozen=True)
class Params:
    max_seq_length: int
    short_seq_prob: float
    masked_lm_prob: float
    max_predictions_per_seq: int
    whole_word_mask: bool
    static_masking: bool = True

    @property
    def masking(self) -> MaskingRule:
        return MaskingRule(self.masked_lm_prob, self.max_predictions_per_seq, self.whole_word_mask)
