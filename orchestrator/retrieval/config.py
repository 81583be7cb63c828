"""The retrieval evaluation's settings: what text, how it is embedded, which models.

``RetrievalSpec`` is what an experiment's ``retrieval:`` section holds (its arms give the models);
``orchestrator.workflows.retrieval.RetrievalConfig`` adds what the job alone needs (its run directory,
MLflow, Ray). Imports configs only: torch comes in with ``orchestrator.retrieval.embed``.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Literal

from orchestrator.core.config import check_number, field
from orchestrator.core.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclasses.dataclass(frozen=True)
class RetrievalSpec:
    texts: dict[str, str] = field(
        default_factory=dict, help="language -> file, all translations of each other: SQuAD JSON (XQuAD: one unit "
                                   "per paragraph, aligned by question ids) or one unit per line (line n of every "
                                   "file aligned); every pair of these languages is evaluated")
    pairs: dict[str, str] = field(
        default_factory=dict, help="'SRC-TGT' -> TSV of translation pairs (SRC unit<TAB>TGT unit per line, no header); "
                                   "evaluated in both directions")
    text_format: Literal["auto", "squad", "lines"] = field(
        "auto", help="format of the texts files: auto = squad for .json, lines otherwise")
    squad_unit: Literal["context", "question"] = field(
        "context", help="SQuAD JSON: embed each paragraph's context, or each question")
    max_units: int = field(0, help="the first N units of each parallel set only (0 = all): a quick look")
    pivot: str = field("en", help="the language of seed 002's Table 6 halves: X -> pivot above, pivot -> X below; "
                                  "pairs without it follow")
    top_k: tuple[int, ...] = field((1, 5), help="precision@k reported for each k (seed 002 reports P@1)")
    max_seq_length: int = field(128, help="sub-tokens per window, [CLS] and [SEP] included (capped at the model's "
                                          "max_position_embeddings); 128, the length seed 002 trains at")
    long_units: Literal["window", "truncate"] = field(
        "window", help="a unit longer than max_seq_length: 'window' embeds it in consecutive windows and averages "
                       "over all its sub-tokens; 'truncate' keeps its first window only")
    special_tokens: Literal["exclude", "include"] = field(
        "exclude", help="average over the unit's sub-tokens only (exclude [CLS]/[SEP], seed 002: 'all subtokens in the "
                        "sentence'), or over every non-padding position")
    batch_size: int = field(32, help="windows per forward pass")
    use_gpu: bool = field(False, help="embed on a GPU (each Ray task asks for gpus_per_task)")
    gpus_per_task: float = field(1.0, help="GPUs per embedding task with use_gpu (a fraction packs tasks onto one GPU)")
    cpus_per_task: float = field(1.0, help="CPUs per embedding task (its torch threads)")
    models: dict[str, str] = field(
        default_factory=dict, help="model name -> Hugging Face BERT directory (safetensors weights and its tokenizer); "
                                   "in an experiment: models compared beside the arms")

    def __post_init__(self) -> None:
        if self.max_units < 0:
            raise ConfigError(f"max_units must be >= 0 (0 = all), got {self.max_units}")
        if self.max_seq_length < 3:
            raise ConfigError(f"max_seq_length must be >= 3 ([CLS], a sub-token, [SEP]), got {self.max_seq_length}")
        if self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {self.batch_size}")
        if not self.top_k or any(k < 1 for k in self.top_k) or len(set(self.top_k)) != len(self.top_k):
            raise ConfigError(f"top_k must be distinct values >= 1, got {list(self.top_k)}")
        check_number("cpus_per_task", self.cpus_per_task, low=0, low_open=True)
        check_number("gpus_per_task", self.gpus_per_task, low=0, low_open=True)
        for name in self.models:
            if not _NAME.match(name):
                raise ConfigError(f"models: {name!r} is not a usable model name (letters, digits, . _ -)")
        if len(self.texts) == 1:
            raise ConfigError(f"texts: one language ({next(iter(self.texts))}) has nothing to be aligned with; give "
                              "two or more files that translate each other")
        for lang in self.texts:
            if not _NAME.match(lang):
                raise ConfigError(f"texts: {lang!r} is not a usable language name (letters, digits, . _ -)")
        seen = {(a, b) for a in self.texts for b in self.texts if a != b}
        for key in self.pairs:
            src, tgt = pair_languages(key)
            if (src, tgt) in seen:
                raise ConfigError(f"pairs.{key}: {src} and {tgt} are already a pair (of texts or another pairs "
                                  "entry); each language pair once")
            seen |= {(src, tgt), (tgt, src)}

    @property
    def enabled(self) -> bool:
        """An experiment runs the evaluation when its ``retrieval:`` section names text."""
        return bool(self.texts or self.pairs)

    def settings(self) -> dict:
        """What the scores depend on besides the models and the text files' contents."""
        return {k: v for k, v in dataclasses.asdict(self).items()
                if k in ("text_format", "squad_unit", "max_units", "top_k", "max_seq_length", "long_units",
                         "special_tokens", "texts", "pairs", "pivot")}


def pair_languages(key: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'); anything else is a ConfigError."""
    parts = key.split("-")
    if len(parts) != 2 or not all(_NAME.match(p) for p in parts) or parts[0] == parts[1]:
        raise ConfigError(f"pairs: {key!r} is not SRC-TGT (two different language names joined by one '-', e.g. "
                          "de-en; write a code such as pt-BR as pt_BR)")
    return parts[0], parts[1]


__all__ = ["RetrievalSpec", "pair_languages"]
