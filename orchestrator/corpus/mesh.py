"""Seed 000's corpus selection (Table A2): PubMed articles chosen by their MeSH tree numbers and year.

An article is kept when one of its MeSH descriptors has a tree number under an ``include`` prefix and
none has one under an ``exclude`` prefix ("If an article has an 'Included' tree number but does not
have an 'Excluded' one, it is considered a target article"), and its publication year is within
``year_from``..``year_to`` ("to adjust the corpus size of sP, we sampled articles published after
2010"). PubMed records name descriptors by UI; the tree numbers come from NLM's descriptor file
(``desc<year>.xml``), which the user provides. A prefix is a category letter (``C``: every tree
number starting with C) or a tree number (``B01.650``: itself and everything below it).
"""
from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError
from orchestrator.formats.pubmed import mesh_tree_numbers

TREE_PREFIX = re.compile(r"[A-Z](\d{2}(\.\d{3})*)?")


@dataclasses.dataclass(frozen=True)
class MeshSelect:
    descriptors: str = field("", help="NLM's MeSH descriptor file (desc<year>.xml) mapping descriptor UIs to tree "
                                      "numbers; needed by include/exclude")
    include: tuple[str, ...] = field((), help="tree-number prefixes an article needs one of (C, A13, B01.650); "
                                              "empty = every article not excluded")
    exclude: tuple[str, ...] = field((), help="tree-number prefixes an article must have none of")
    year_from: int = field(0, help="keep articles published in this year or later (PubDate; an article "
                                         "without a year is left out when a bound is set); 0 = no bound")
    year_to: int = field(0, help="keep articles published in this year or earlier; 0 = no bound")
    invert: bool = field(False, help="keep the articles the rule rejects instead (seed 000's oP: the PubMed "
                                     "articles that are not fP)")

    @property
    def active(self) -> bool:
        return bool(self.include or self.exclude or self.year_from or self.year_to)  # invert alone: keeps none

    def __post_init__(self) -> None:
        for prefix in (*self.include, *self.exclude):
            if not TREE_PREFIX.fullmatch(prefix):
                raise ConfigError(f"mesh prefix {prefix!r} is not a MeSH tree number or category letter "
                                  "(such as C, A13, B01.650)")
        if (self.include or self.exclude) and not self.descriptors:
            raise ConfigError("mesh.include / mesh.exclude need mesh.descriptors: NLM's desc<year>.xml (the "
                              "tree numbers of each descriptor UI)")
        if self.year_from < 0 or self.year_to < 0 or (self.year_from and self.year_to and
                                                      self.year_from > self.year_to):
            raise ConfigError(f"mesh.year_from {self.year_from} / year_to {self.year_to}: years >= 0, from <= to")
        if self.invert and not self.active:
            raise ConfigError("mesh.invert negates a selection: give include, exclude or a year bound")


def under(tree: str, prefix: str) -> bool:
    """Whether tree number ``tree`` is ``prefix`` or below it (a letter: its whole category)."""
    if len(prefix) == 1:
        return tree[:1] == prefix
    return tree == prefix or tree.startswith(prefix + ".")


def selected(uis: list[str], year: str, trees: dict[str, tuple[str, ...]], cfg: MeshSelect) -> bool:
    """Table A2's rule for one article (its descriptors' tree numbers, its publication year); with
    ``cfg.invert`` its negation."""
    return _rule(uis, year, trees, cfg) != cfg.invert


def _rule(uis: list[str], year: str, trees: dict[str, tuple[str, ...]], cfg: MeshSelect) -> bool:
    if cfg.year_from or cfg.year_to:
        if not year.isdigit():
            return False
        if (cfg.year_from and int(year) < cfg.year_from) or (cfg.year_to and int(year) > cfg.year_to):
            return False
    if not (cfg.include or cfg.exclude):
        return True
    numbers = [t for ui in uis for t in trees.get(ui, ())]
    if any(under(t, p) for t in numbers for p in cfg.exclude):
        return False
    return not cfg.include or any(under(t, p) for t in numbers for p in cfg.include)


def descriptor_trees(path: str | Path) -> dict[str, tuple[str, ...]]:
    """The descriptor file's tree numbers, parsed once per process and file version."""
    p = Path(path)
    stat = p.stat() if p.is_file() else None
    return _cached(str(p.resolve()), stat.st_mtime_ns if stat else 0, stat.st_size if stat else 0)


@functools.lru_cache(maxsize=2)
def _cached(path: str, mtime_ns: int, size: int) -> dict[str, tuple[str, ...]]:
    return mesh_tree_numbers(path)
