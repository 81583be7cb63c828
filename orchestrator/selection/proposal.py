"""From similarity scores to mixing weights: the rules that turn seed 004's measures into a proposal.

    weights = propose_weights({"pubmed": {"jsd": 0.57, ...}, "wiki": {"jsd": 0.75, ...}}, WeightingConfig())
    # {"pubmed": 0.86, "wiki": 0.14}: softmax of -JSD / 0.1

Seed 004 stops at nominating sources (a measure that correlates with the gain); it gives no rule
for mixing them. The rules here are this project's, registered in ``WEIGHTINGS``:

- ``softmax`` (default, on JSD, temperature 0.1): ``w_i ∝ exp(c_i / T)`` with the closeness
  ``c_i`` = -JSD, -ln PPL (the cross-entropy per word, in nats) or +TVC. JSD is the default because
  it is the measure seed 004 found most correlated with the gain (0.519; PPL 0.481, TVC 0.436).
  JSD lies in [0, 1] and the candidates here differ by 0.05-0.25 (PubMed 0.57, WikiText 0.75,
  Shakespeare 0.81 against BC5CDR + HoC text), so T = 0.1 gives a source 0.1 further from the target
  e^-1 = 0.37 times the weight: the closest source leads without the others vanishing, which keeps
  some general text (source diversity matters as well as similarity, Ruder & Plank 2017, cited by
  the seed). T -> 0 is top-1, T -> infinity uniform. On PPL, T = 1 gives ``w ∝ 1 / PPL``.
- ``top_k``: the k closest sources by the measure, equal weights (seed 004's "nominate" read
  literally: pretrain on the nearest source(s) only).
- ``uniform``: every candidate the same weight (the baseline a proposal should beat).

TTR has no direction (it measures diversity, not closeness) and is refused as the rule's measure.
Pure functions; ``orchestrator.workflows.propose_mix`` writes the weights as a corpus config the chain runs.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from orchestrator.core.config import field, is_number
from orchestrator.core.errors import ConfigError
from orchestrator.core.registry import Registry

#: How each measure becomes a closeness (higher = closer to the target).
CLOSENESS: dict[str, Callable[[float], float]] = {
    "jsd": lambda v: -v,
    "ppl": lambda v: -math.log(v),
    "tvc": lambda v: v,
}


@dataclasses.dataclass(frozen=True)
class WeightingConfig:
    name: str = field("softmax", help="the rule: softmax (w ∝ exp(closeness / temperature)) | top_k (the k closest, "
                                      "equal weights) | uniform")
    measure: str = field("jsd", help="the measure the rule reads: jsd (seed 004's strongest correlate of the gain) "
                                     "| ppl (closeness -ln PPL) | tvc")
    temperature: float = field(0.1, help="softmax: in the measure's units (JSD, TVC; nats for PPL); a source 1 "
                                         "temperature further from the target gets e^-1 of the weight")
    k: int = field(1, help="top_k: how many of the closest sources")
    min_weight: float = field(0.0, help="weights below this are set to 0 and the rest renormalised (a source "
                                        "with weight 0 is left out of the corpus)")

    def __post_init__(self) -> None:
        WEIGHTINGS.get(self.name)  # unknown rule: ConfigError with a suggestion
        if self.measure not in CLOSENESS:
            raise ConfigError(f"weighting.measure: {self.measure!r}; one of {sorted(CLOSENESS)} (TTR measures "
                              "diversity, not closeness to the target)")
        if not self.temperature > 0:
            raise ConfigError(f"weighting.temperature must be > 0, got {self.temperature}")
        if self.k < 1:
            raise ConfigError(f"weighting.k must be >= 1, got {self.k}")
        if not 0.0 <= self.min_weight < 1.0:
            raise ConfigError(f"weighting.min_weight must be in [0, 1), got {self.min_weight}")


Rule = Callable[[Mapping[str, float], WeightingConfig], dict[str, float]]
WEIGHTINGS: Registry[Rule] = Registry("weighting rule")


@WEIGHTINGS.register("softmax")
def softmax(closeness: Mapping[str, float], cfg: WeightingConfig) -> dict[str, float]:
    top = max(closeness.values())
    raw = {name: math.exp((c - top) / cfg.temperature) for name, c in closeness.items()}
    norm = sum(raw.values())
    return {name: v / norm for name, v in raw.items()}


@WEIGHTINGS.register("top_k")
def top_k(closeness: Mapping[str, float], cfg: WeightingConfig) -> dict[str, float]:
    ranked = sorted(closeness, key=lambda name: (-closeness[name], name))  # ties: by name, reproducibly
    chosen = set(ranked[:cfg.k])
    return {name: (1.0 / len(chosen) if name in chosen else 0.0) for name in closeness}


@WEIGHTINGS.register("uniform")
def uniform(closeness: Mapping[str, float], cfg: WeightingConfig) -> dict[str, float]:
    return {name: 1.0 / len(closeness) for name in closeness}


def propose_weights(scores: Mapping[str, Mapping[str, float]], cfg: WeightingConfig) -> dict[str, float]:
    """Mixing weights (summing to 1) over the sources of ``scores`` ({source: {measure: value}}),
    by the rule ``cfg.name`` on ``cfg.measure``; weights under ``cfg.min_weight`` become 0."""
    if not scores:
        raise ConfigError("no scored sources to weight")
    closeness = {}
    for name, measures in scores.items():
        value = measures.get(cfg.measure)
        if not is_number(value) or (cfg.measure == "ppl" and value <= 0):
            raise ConfigError(f"source {name!r} has no usable {cfg.measure} score ({value!r})")
        closeness[name] = CLOSENESS[cfg.measure](float(value))
    weights = WEIGHTINGS.get(cfg.name)(closeness, cfg)
    kept = {name: w for name, w in weights.items() if w >= cfg.min_weight}
    if not kept:  # the threshold removed everything: keep the largest
        best = max(weights, key=lambda name: (weights[name], name))
        kept = {best: weights[best]}
    norm = sum(kept.values())
    return {name: (kept[name] / norm if name in kept else 0.0) for name in weights}


__all__ = ["WeightingConfig", "WEIGHTINGS", "CLOSENESS", "propose_weights"]
