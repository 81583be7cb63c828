"""BLUE's metrics, computed with scipy / scikit-learn / seqeval, each declaring its direction.

Parity with ncbi-nlp/BLUE_Benchmark's ``blue/eval_*.py`` (tests port those computations), with
their known bugs fixed:

* HoC (``eval_hoc.py``): ``get_p_r_f_arrary`` returns (precision, recall, f) but the caller
  unpacks ``r, p, f1`` so precision and recall are printed swapped; F1 is unaffected. Here
  they are returned by name. A document whose gold set is empty made BLUE divide by zero;
  here its recall counts 0 (BLUE's HoC splits have no such document).
* Relations (``eval_rel.py``): the label set is ``sorted(labels seen in gold or predictions)``
  and only ``'false'`` is dropped before the micro average, so DDI's ``DDI-false`` was
  counted as a positive class and an unseen class changed the label indices. Here the label
  set is the task's declared one and every ``negative_labels`` class is excluded.
* A constant prediction has no Pearson correlation (scipy returns NaN); it scores 0.0 here so
  a sweep can rank it against real predictions.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from orchestrator.core.registry import Registry

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Metric:
    """A scoring function and its direction; Tune's ``mode`` is derived from ``higher_is_better``;
    ``per_document``: it scores documents (``Example.doc``), so a sample of its split takes whole documents."""

    name: str
    higher_is_better: bool
    fn: Callable[..., float]
    per_document: bool = False

    @property
    def mode(self) -> str:
        return "max" if self.higher_is_better else "min"

    def __call__(self, gold: Sequence, pred: Sequence, **kwargs: Any) -> float:
        return float(self.fn(gold, pred, **kwargs))


METRICS: Registry[Metric] = Registry("metric")


def _register(name: str, higher_is_better: bool = True, per_document: bool = False):
    def add(fn: Callable[..., float]) -> Callable[..., float]:
        METRICS.add(name, Metric(name, higher_is_better, fn, per_document))
        return fn

    return add


@_register("pearson")
def pearson(gold: Sequence[float], pred: Sequence[float], **_: Any) -> float:
    """Pearson's r (BLUE ``eval_sts.py``: ``pandas.Series.corr``); 0.0 for a constant input, and for
    predictions that are not all finite (a diverged model: said in a warning; pandas would drop those
    pairs and score the model on the rest)."""
    from scipy.stats import pearsonr  # heavy: scipy

    gold_a, pred_a = np.asarray(gold, dtype=float), np.asarray(pred, dtype=float)
    if not np.isfinite(pred_a).all():
        log.warning("pearson: %d of %d predictions are NaN or infinite (a diverged model): scored 0.0",
                    int((~np.isfinite(pred_a)).sum()), len(pred_a))
        return 0.0
    if len(gold_a) < 2 or np.ptp(gold_a) == 0 or np.ptp(pred_a) == 0:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = pearsonr(gold_a, pred_a).statistic
    return 0.0 if math.isnan(r) else float(r)


@_register("accuracy")
def accuracy(gold: Sequence, pred: Sequence, **_: Any) -> float:
    """Overall accuracy (MedNLI; DocClsJp's micro-accuracy)."""
    from sklearn.metrics import accuracy_score  # heavy: sklearn

    return float(accuracy_score(list(gold), list(pred)))


@_register("micro_f1_positive")
def micro_f1_positive(gold: Sequence[str], pred: Sequence[str], *, labels: Sequence[str] = (),
                      negative_labels: Sequence[str] = (), **_: Any) -> float:
    """Micro-F1 over the positive relation classes of the task's declared label set
    (ChemProt CPR:3,4,5,6,9; DDI without DDI-false; i2b2 without false)."""
    from sklearn.metrics import precision_recall_fscore_support  # heavy: sklearn

    positive = [x for x in (labels or sorted(set(gold) | set(pred))) if x not in set(negative_labels)]
    _, _, f1, _ = precision_recall_fscore_support(list(gold), list(pred), labels=positive, average="micro",
                                                  zero_division=0)
    return float(f1)


@_register("macro_f1")
def macro_f1(gold: Sequence[str], pred: Sequence[str], *, labels: Sequence[str] = (),
             negative_labels: Sequence[str] = (), **_: Any) -> float:
    """Unweighted mean of the per-class F1 (seed 004's classification tasks) over the classes that
    occur in gold or predictions (scikit-learn's ``average='macro'``), in the task's declared order,
    negative classes excluded; a class seen nowhere in a split is left out, not scored 0."""
    from sklearn.metrics import f1_score  # heavy: sklearn

    seen = set(gold) | set(pred)
    classes = [x for x in (labels or sorted(seen)) if x in seen and x not in set(negative_labels)]
    if not classes:
        return 0.0
    return float(f1_score(list(gold), list(pred), labels=classes, average="macro", zero_division=0))


@_register("ner_f1")
def ner_f1(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]], **_: Any) -> float:
    """Entity-level F1, an entity counting when its span and type equal a gold one's (BLUE's "strict" F1), the
    tags chunked as CoNLL's conlleval does (seqeval's default mode, not its IOB2 ``mode="strict"``)."""
    from seqeval.metrics import f1_score  # heavy: seqeval

    return float(f1_score([list(g) for g in gold], [list(p) for p in pred], zero_division=0))


def ner_report(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, dict[str, float]]:
    """Per-tag precision / recall / F1 / support, plus micro avg (seed 001's NER tables)."""
    from seqeval.metrics import classification_report  # heavy: seqeval

    report = classification_report([list(g) for g in gold], [list(p) for p in pred], output_dict=True,
                                   zero_division=0)
    return {tag: {k: float(v) for k, v in row.items()} for tag, row in report.items()}


def ner_counts(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, dict[str, int]]:
    """Per entity type: exactly matched entities (tp), predicted entities and gold entities, chunked
    as seqeval's default mode chunks them, so they reproduce its per-type precision and recall."""
    from seqeval.metrics.sequence_labeling import get_entities  # heavy: seqeval

    def entities(seqs: Sequence[Sequence[str]]) -> set[tuple[int, str, int, int]]:
        return {(i, kind, start, end) for i, seq in enumerate(seqs) for kind, start, end in get_entities(list(seq))}

    true, found = entities(gold), entities(pred)
    out: dict[str, dict[str, int]] = {}
    for name, group in (("gold", true), ("predicted", found), ("tp", true & found)):
        for _, kind, _, _ in group:
            row = out.setdefault(kind, {"tp": 0, "predicted": 0, "gold": 0})
            row[name] += 1
    return out


def micro_prf(counts: Iterable[Mapping[str, int]]) -> dict[str, float]:
    """Micro precision / recall / F1 from per-type entity counts (tp, predicted, gold) summed."""
    tp = pred = gold = 0
    for row in counts:
        tp, pred, gold = tp + row["tp"], pred + row["predicted"], gold + row["gold"]
    p = tp / pred if pred else 0.0
    r = tp / gold if gold else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0}


def ner_per_tag(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, dict[str, float]]:
    """Entity types only, keys named for results.json: {type: {precision, recall, f1, support, tp,
    predicted}}; tp and predicted (entity counts) let micro precision be computed over types later."""
    names = {"precision": "precision", "recall": "recall", "f1-score": "f1", "support": "support"}
    counts = ner_counts(gold, pred)
    return {tag: {**{names[k]: v for k, v in row.items() if k in names},
                  "tp": counts.get(tag, {}).get("tp", 0), "predicted": counts.get(tag, {}).get("predicted", 0)}
            for tag, row in ner_report(gold, pred).items() if not tag.endswith(" avg")}


@dataclasses.dataclass(frozen=True)
class ExampleBasedPRF:
    precision: float
    recall: float
    f1: float


def example_based_prf(gold: np.ndarray, pred: np.ndarray) -> ExampleBasedPRF:
    """Per-document precision and recall averaged over documents, F1 of the two means
    (BLUE HoC: 2 * mean P * mean R / (mean P + mean R)); inputs are 0/1 matrices docs x labels."""
    from sklearn.metrics import precision_score, recall_score  # heavy: sklearn

    gold = np.asarray(gold, dtype=int)
    pred = np.asarray(pred, dtype=int)
    p = float(precision_score(gold, pred, average="samples", zero_division=0))
    r = float(recall_score(gold, pred, average="samples", zero_division=0))
    f = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return ExampleBasedPRF(precision=p, recall=r, f1=f)


@_register("hoc_example_f1", per_document=True)
def hoc_example_f1(gold: Sequence[Sequence[int]], pred: Sequence[Sequence[int]], *, labels: Sequence[str] = (),
                   docs: Sequence[str] | None = None, **_: Any) -> float:
    """HoC F1 at document level: sentence label sets are OR-ed per document (``docs``), gold and
    predicted alike, then scored example-based."""
    n = len(labels) or 1 + max([i for s in list(gold) + list(pred) for i in s], default=0)
    gold_m, pred_m = documents_to_matrix(gold, pred, docs, n)
    return example_based_prf(gold_m, pred_m).f1


def documents_to_matrix(gold: Sequence[Sequence[int]], pred: Sequence[Sequence[int]],
                        docs: Sequence[str] | None, n_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """Union of each document's sentence label sets, as two 0/1 matrices (documents x labels)."""
    docs = list(docs) if docs is not None else [str(i) for i in range(len(gold))]
    order: dict[str, int] = {}
    for d in docs:
        order.setdefault(d, len(order))
    gold_m = np.zeros((len(order), n_labels), dtype=int)
    pred_m = np.zeros((len(order), n_labels), dtype=int)
    for d, g, p in zip(docs, gold, pred):
        gold_m[order[d], list(g)] = 1
        pred_m[order[d], list(p)] = 1
    return gold_m, pred_m
