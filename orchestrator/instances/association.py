"""The degree of association between entity types, derived from the corpus (issue 15; seed 003's
Embodiment 2 derives it, FIG. 8 shows it on a 0-10 scale).

Co-occurrence counts of the extracted types, per window (a sentence, or a whole document):

    n           windows with at least one token
    c(a)        windows holding an entity of type a
    c(a, b)     windows holding both a and b; for a == b, two or more entities of type a

and the normalised PMI of each pair (Bouma 2009):

    NPMI(a, b) = log(p(a, b) / (p(a) p(b))) / -log p(a, b),    p(x) = c(x) / n

NPMI, not PMI: PMI is unbounded and largest for the rarest pairs, so any map onto 0-10 needs an
arbitrary cap; NPMI is 1 when two types only ever occur together, 0 when independent, -1 when they
never meet. The degree is ``10 x max(0, NPMI)`` rounded to 3 decimals: independence and avoidance
are both "not associated" (0, as FIG. 8's QUANTITY-PROPERTY OF LESION), always together is 10, and
the patent's threshold 8 keeps visible the types that co-occur far beyond chance. Pairs seen
together in fewer than ``min_count`` windows are left out (``default`` 0).

Counts are integers summed over documents, so the table does not depend on how the pass was split.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.instances.entity_masking import AssociationTable

#: Version of the derivation, part of the instances key when the association is derived.
ASSOCIATION_DERIVATION_VERSION = 1
#: The derived table's file name beside the instances.
ASSOCIATION_FILE = "association.yaml"


@dataclass
class Cooccurrence:
    """Window and type counts; add windows, merge partial counts (integer sums, order-free)."""
    windows: int = 0
    types: Counter = field(default_factory=Counter)
    pairs: Counter = field(default_factory=Counter)  # keys: (a, b) with a <= b

    def add(self, mentions: Iterable[str]) -> None:
        """One window, given the type of each entity in it (repeats allowed)."""
        per_type = Counter(mentions)
        self.windows += 1
        present = sorted(per_type)
        self.types.update(present)
        for i, a in enumerate(present):
            if per_type[a] >= 2:
                self.pairs[(a, a)] += 1
            for b in present[i + 1:]:
                self.pairs[(a, b)] += 1

    def add_document(self, sentences: Sequence[Sequence[str]], window: str) -> None:
        """One document's sentences (each as its entities' types); sentences without tokens are not given."""
        if window == "sentence":
            for mentions in sentences:
                self.add(mentions)
        elif sentences:
            self.add([t for mentions in sentences for t in mentions])

    def merge(self, other: Cooccurrence) -> Cooccurrence:
        self.windows += other.windows
        self.types.update(other.types)
        self.pairs.update(other.pairs)
        return self

    def to_dict(self) -> dict:
        return {"windows": self.windows, "types": dict(sorted(self.types.items())),
                "pairs": [[a, b, c] for (a, b), c in sorted(self.pairs.items())]}

    @classmethod
    def from_dict(cls, data: dict) -> Cooccurrence:
        return cls(data["windows"], Counter(data["types"]), Counter({(a, b): c for a, b, c in data["pairs"]}))


def npmi(c_ab: int, c_a: int, c_b: int, n: int) -> float:
    """Normalised PMI from window counts: -1 when the pair never co-occurs, 1 when it is in every window."""
    if c_ab == 0:
        return -1.0
    if c_ab == n:
        return 1.0
    p_ab = c_ab / n
    return math.log(p_ab / ((c_a / n) * (c_b / n))) / -math.log(p_ab)


def degree(value: float) -> float:
    """NPMI onto FIG. 8's 0-10 scale: 10 x max(0, NPMI), 3 decimals."""
    return round(10.0 * max(0.0, value), 3)


def derive_association(counts: Cooccurrence, min_count: int) -> tuple[AssociationTable, list[dict]]:
    """The table (pairs with ``c(a, b) >= min_count``, default 0) and every counted pair's statistics."""
    pairs: dict[frozenset[str], float] = {}
    rows = []
    for (a, b), c_ab in sorted(counts.pairs.items()):
        value = npmi(c_ab, counts.types[a], counts.types[b], counts.windows)
        kept = c_ab >= min_count
        if kept:
            pairs[frozenset((a, b))] = degree(value)
        rows.append({"pair": [a, b], "together": c_ab, "npmi": round(value, 6), "degree": degree(value),
                     "kept": kept})
    return AssociationTable(pairs=pairs, default=0.0), rows


def table_pairs(table: AssociationTable) -> list[list]:
    """``[[a, b, degree], ...]`` sorted, a <= b (a pair of one type is the set {a}: [a, a, degree])."""
    return sorted((sorted(pair) * 2)[:2] + [value] for pair, value in table.pairs.items())


def write_association(table: AssociationTable, path: str | Path, header: Sequence[str] = ()) -> Path:
    """``table`` in the shipped tables' format (``default``, ``pairs: [[a, b, degree], ...]``), pairs sorted."""
    items = table_pairs(table)
    lines = [f"# {line}" for line in header] + [f"default: {table.default:g}", "pairs:" + ("" if items else " []")]
    lines += [f"  - {json.dumps(item)}" for item in items]
    path = Path(path)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


__all__ = ["ASSOCIATION_DERIVATION_VERSION", "ASSOCIATION_FILE", "Cooccurrence", "degree", "derive_association",
           "npmi", "table_pairs",
           "write_association"]
