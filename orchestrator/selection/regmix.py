"""RegMix's regression: from mixing weights to a proxy model's loss, and the simplex search for the best mixture.

    W = dirichlet_mixtures({"pubmed": 0.3, "wiki": 0.5, "shakespeare": 0.2}, k=16, concentration=1.0, seed=0)
    fit = fit_regression(W, losses, RegressionConfig())        # ridge on the Scheffe quadratic terms
    cv = cross_validate(W, losses, RegressionConfig())         # held-out Spearman rho of the predictions
    best = search_simplex(fit, n_sources=3, samples=100_000, top_k=100, seed=0)

RegMix (Liu et al., ICLR 2025) trains many small proxy models on random mixtures, fits a regression
from the mixture to the validation loss, simulates many mixtures with it and takes the mean of the
top-ranked ones as the proposal. The pieces here are pure numpy, tested on a known answer without
Ray or torch; ``orchestrator.workflows.proxy_search`` trains the proxies.

- ``dirichlet_mixtures``: RegMix samples around the token distribution of the sources; here
  Dirichlet(concentration x n x p), p = the sources' natural proportions (bytes), so the mean is the
  natural mixture and concentration 1 gives each source the spread of a flat Dirichlet on average.
- The regression is the Scheffe mixture model: y = sum_i b_i w_i (+ sum_{i<j} b_ij w_i w_j with
  ``features: quadratic``). Weights sum to one, so an intercept is collinear with them and left out.
  It is fitted by ridge least squares (``ridge`` on the coefficients). RegMix's strongest regressor is
  LightGBM; a linear model was its other one (and close to it for few domains). LightGBM is not a
  dependency of this project, and with 3 sources and ~16 proxies a smooth quadratic fits better than
  trees would.
- ``cross_validate``: k-fold (or leave-one-out) held-out predictions; the Spearman correlation of
  the held-out predictions with the measured losses says whether the regression ranks mixtures at all.
- ``search_simplex``: ``samples`` Dirichlet(1) mixtures plus the vertices, predicted; the mean of the
  ``top_k`` lowest predictions is the proposal (RegMix averages its top 100 of 100K simulated mixtures).
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from orchestrator.core.config import field
from orchestrator.core.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class RegressionConfig:
    features: Literal["linear", "quadratic"] = field(
        "quadratic", help="linear: y = sum b_i w_i; quadratic: plus the pairwise products w_i w_j (Scheffe's "
                          "mixture models; the weights sum to 1, so there is no separate intercept)")
    ridge: float = field(1e-4, help="L2 penalty on the coefficients (the features are in [0, 1])")
    folds: int = field(0, help="cross-validation folds; 0 = leave-one-out")
    samples: int = field(100_000, help="simplex search: mixtures simulated with the fitted regression")
    top_k: int = field(100, help="simplex search: the proposal is the mean of the top_k lowest-predicted mixtures "
                                 "(RegMix: 100); 1 = the single best")

    def __post_init__(self) -> None:
        if self.features not in ("linear", "quadratic"):
            raise ConfigError(f"regression.features {self.features!r}: one of linear, quadratic")
        if self.ridge < 0:
            raise ConfigError(f"regression.ridge must be >= 0, got {self.ridge}")
        if self.folds < 0 or self.folds == 1:
            raise ConfigError(f"regression.folds must be 0 (leave-one-out) or >= 2, got {self.folds}")
        if self.samples < 1 or not 1 <= self.top_k <= self.samples:
            raise ConfigError(f"regression: need samples >= 1 and 1 <= top_k <= samples, got samples "
                              f"{self.samples}, top_k {self.top_k}")


@dataclasses.dataclass(frozen=True)
class Fit:
    """A fitted regression: ``predict(W)`` for mixtures W [m, n]."""

    coef: np.ndarray
    features: str

    def predict(self, weights: np.ndarray) -> np.ndarray:
        return design(np.atleast_2d(weights), self.features) @ self.coef


def natural_proportions(sizes: Mapping[str, float]) -> dict[str, float]:
    total = float(sum(sizes.values()))
    if not sizes or total <= 0:
        raise ConfigError("natural proportions need at least one source of positive size")
    return {name: float(v) / total for name, v in sizes.items()}


def dirichlet_mixtures(prior: Mapping[str, float], k: int, concentration: float, seed: int) -> np.ndarray:
    """``k`` mixtures [k, n] drawn from Dirichlet(concentration * n * prior) (columns in ``prior``'s order)."""
    p = np.array(list(natural_proportions(prior).values()))
    if k < 1 or not concentration > 0:
        raise ConfigError(f"need k >= 1 and concentration > 0, got k {k}, concentration {concentration}")
    alpha = np.maximum(concentration * len(p) * p, 1e-3)
    return np.random.default_rng(seed).dirichlet(alpha, size=k)


def design(weights: np.ndarray, features: str) -> np.ndarray:
    """The regression's columns: the weights, and with ``quadratic`` every product w_i w_j (i < j)."""
    cols = [weights]
    if features == "quadratic":
        pairs = list(itertools.combinations(range(weights.shape[1]), 2))
        if pairs:
            cols.append(np.stack([weights[:, i] * weights[:, j] for i, j in pairs], axis=1))
    return np.concatenate(cols, axis=1)


def fit_regression(weights: np.ndarray, losses: Sequence[float], cfg: RegressionConfig) -> Fit:
    """Ridge least squares of ``losses`` on ``design(weights)``."""
    X, y = design(np.asarray(weights, float), cfg.features), np.asarray(losses, float)
    if len(y) != len(X) or len(y) < 2:
        raise ConfigError(f"regression needs >= 2 mixtures with one loss each, got {len(X)} mixtures, {len(y)} losses")
    coef = np.linalg.solve(X.T @ X + cfg.ridge * np.eye(X.shape[1]), X.T @ y)
    return Fit(coef=coef, features=cfg.features)


def ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks from 1, ties given their mean rank."""
    v = np.asarray(values, float)
    order = np.argsort(v, kind="mergesort")
    r = np.empty(len(v))
    r[order] = np.arange(1, len(v) + 1)
    for value in np.unique(v):
        tied = v == value
        if tied.sum() > 1:
            r[tied] = r[tied].mean()
    return r


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (Pearson of the ranks); NaN when either side is constant."""
    ra, rb = ranks(a), ranks(b)
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def cross_validate(weights: np.ndarray, losses: Sequence[float], cfg: RegressionConfig, seed: int = 0) -> dict:
    """Held-out predictions by k-fold (``cfg.folds``, shuffled by ``seed``) or leave-one-out, and their
    Spearman correlation, Pearson correlation and mean absolute error against the measured losses."""
    W, y = np.asarray(weights, float), np.asarray(losses, float)
    n = len(y)
    folds = n if cfg.folds == 0 else min(cfg.folds, n)
    if n < 3:
        raise ConfigError(f"cross-validation needs >= 3 proxies, got {n}")
    order = np.arange(n) if folds == n else np.random.default_rng(seed).permutation(n)
    predicted = np.empty(n)
    for f in range(folds):
        held = order[f::folds]
        train = np.setdiff1d(np.arange(n), held)
        predicted[held] = fit_regression(W[train], y[train], cfg).predict(W[held])
    pearson = float(np.corrcoef(predicted, y)[0, 1]) if predicted.std() > 0 and y.std() > 0 else float("nan")
    return {"folds": folds, "spearman": spearman(predicted, y), "pearson": pearson,
            "mae": float(np.abs(predicted - y).mean()), "predicted": predicted.tolist()}


def search_simplex(fit: Fit, n_sources: int, cfg: RegressionConfig, seed: int = 0) -> tuple[np.ndarray, float]:
    """The proposal: the mean of the ``top_k`` lowest-predicted of ``samples`` Dirichlet(1) mixtures
    (the vertices included), and the regression's prediction for it."""
    rng = np.random.default_rng(seed)
    candidates = np.concatenate([np.eye(n_sources), rng.dirichlet(np.ones(n_sources), size=cfg.samples)])
    predicted = fit.predict(candidates)
    top = np.argsort(predicted, kind="mergesort")[:cfg.top_k]
    best = candidates[top].mean(axis=0)
    best = best / best.sum()
    return best, float(fit.predict(best)[0])


__all__ = ["RegressionConfig", "Fit", "natural_proportions", "dirichlet_mixtures", "design", "fit_regression",
           "ranks", "spearman", "cross_validate", "search_simplex"]
