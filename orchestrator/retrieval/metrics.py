"""Nearest-neighbour retrieval by cosine, and precision@k (seed 002, Table 6). Pure numpy.

Source unit *i* is a hit at *k* when its translation, target unit *i*, is among the *k* targets most
cosine-similar to it. ``gold_ranks`` gives the 0-based rank of the translation among all targets:
the number of targets scoring strictly higher, plus the number of *earlier* targets scoring exactly
the same (a tie goes to the lower index, as a stable sort would place it), so the result never
depends on how a library breaks ties. P@k is the share of sources whose rank is below k.

With ``groups`` (one label per target), targets of the gold's group are all the translation: a target
text that occurs twice (XQuAD repeats a few questions word for word, e.g. "Who won Super Bowl
XLIX?") is one answer, ranked where its best-scoring copy is, and its other copies are not
counted as targets ranked above it. Without it every target is distinct.
"""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Rows of the similarity matrix computed at once (bounds memory to BLOCK x targets floats).
BLOCK = 1024


def unit_rows(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero: cosine 0 with everything)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, eps)


def gold_ranks(source: np.ndarray, target: np.ndarray, groups: np.ndarray | None = None,
               block: int = BLOCK) -> np.ndarray:
    """For each source row i, the 0-based rank of target row i by cosine similarity (ties: lower index
    first); with ``groups``, of the best-scoring target of i's group, among the targets of other groups."""
    if source.ndim != 2 or target.ndim != 2 or source.shape != target.shape:
        raise ValueError(f"source and target must be aligned matrices of the same shape, got {source.shape} and "
                         f"{target.shape}")
    s, t = unit_rows(source), unit_rows(target)
    n = len(s)
    groups = np.arange(n) if groups is None else np.asarray(groups)
    if groups.shape != (n,):
        raise ValueError(f"groups must hold one label per target ({n}), got shape {groups.shape}")
    ranks = np.empty(n, dtype=np.int64)
    columns = np.arange(n)[None, :]
    for start in range(0, n, block):
        stop = min(start + block, n)
        sims = s[start:stop] @ t.T  # (rows, n)
        same = groups[None, :] == groups[start:stop, None]  # the gold and its identical copies
        gold_sims = np.where(same, sims, -np.inf)
        best = gold_sims.argmax(axis=1)[:, None]  # the first of the best-scoring copies
        gold = np.take_along_axis(gold_sims, best, axis=1)
        higher = ((sims > gold) & ~same).sum(axis=1)
        earlier_ties = ((sims == gold) & ~same & (columns < best)).sum(axis=1)
        ranks[start:stop] = higher + earlier_ties
    return ranks


def text_groups(texts) -> np.ndarray:
    """One label per text, equal for identical texts (the label of the first occurrence)."""
    first: dict[str, int] = {}
    return np.array([first.setdefault(t, i) for i, t in enumerate(texts)], dtype=np.int64)


def precision_at_k(source: np.ndarray, target: np.ndarray, ks: Iterable[int] = (1, 5),
                   groups: np.ndarray | None = None) -> dict[int, float]:
    """{k: share of source rows whose translation is among their k nearest targets by cosine} (``groups``:
    see ``gold_ranks``)."""
    ranks = gold_ranks(source, target, groups)
    return {int(k): float((ranks < k).mean()) for k in ks}


__all__ = ["gold_ranks", "precision_at_k", "text_groups", "unit_rows"]
