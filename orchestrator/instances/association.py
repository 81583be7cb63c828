"""The degree of association between entity types (seed 003; FIG. 8 shows it on a 0-10 scale): the
table the masking consults (``AssociationTable``), read from YAML (``load_association``: ``default``
and ``pairs: [[type_a, type_b, degree], ...]``; the patent's FIG. 8 is shipped) or derived from the
corpus (issue 15; the patent's Embodiment 2 derives it).

Derived, it rests on co-occurrence counts of the extracted types, per window (a sentence, or a whole document):

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

import yaml

from orchestrator.core.errors import InputError
from orchestrator.instances.entities import compose_yaml, yaml_mapping

#: Version of the derivation, part of the instances key when the association is derived.
ASSOCIATION_DERIVATION_VERSION = 1
#: The derived table's file name beside the instances.
ASSOCIATION_FILE = "association.yaml"


@dataclass(frozen=True)
class AssociationTable:
    """Symmetric degree of association between two entity types."""
    pairs: dict[frozenset[str], float]
    default: float

    def __call__(self, type_a: str, type_b: str) -> float:
        return self.pairs.get(frozenset((type_a, type_b)), self.default)


def load_association(path: str | Path, known_types: frozenset[str] | None = None) -> AssociationTable:
    """Read ``default`` and ``pairs: [[type_a, type_b, degree], ...]``; unknown types are errors."""
    path = Path(path)
    top = yaml_mapping(compose_yaml(path), path, "the file")
    default = 0.0
    if "default" in top:
        try:
            default = float(top["default"].value)
        except (TypeError, ValueError):
            raise InputError(path, "'default' must be a number", line=top["default"].start_mark.line + 1) from None
    if "pairs" not in top or not isinstance(top["pairs"], yaml.SequenceNode):
        raise InputError(path, "no 'pairs' list", line=1, expected="pairs: [[type_a, type_b, degree], ...]")
    pairs: dict[frozenset[str], float] = {}
    for item in top["pairs"].value:
        line = item.start_mark.line + 1
        values = [n.value for n in item.value] if isinstance(item, yaml.SequenceNode) else []
        if len(values) != 3:
            raise InputError(path, "bad pair", line=line, expected="[type_a, type_b, degree]")
        type_a, type_b, raw = values
        try:
            degree = float(raw)
        except ValueError:
            raise InputError(path, f"degree {raw!r} is not a number", line=line) from None
        for name in (type_a, type_b):
            if known_types is not None and name not in known_types:
                raise InputError(path, f"type {name!r} is in no dictionary", line=line,
                                 expected=f"one of {sorted(known_types)}")
        pairs[frozenset((type_a, type_b))] = degree
    return AssociationTable(pairs=pairs, default=default)


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
