"""Metric known answers, and parity with ncbi-nlp/BLUE_Benchmark's eval_*.py computations
(ported below as references, bugs included, on fixed predictions)."""
from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import confusion_matrix

from orchestrator.finetune.metrics import (
    METRICS,
    accuracy,
    example_based_prf,
    hoc_example_f1,
    macro_f1,
    micro_f1_positive,
    micro_prf,
    ner_counts,
    ner_f1,
    ner_per_tag,
    ner_report,
    pearson,
)


# ---- references ported from BLUE_Benchmark (blue/eval_hoc.py, blue/eval_rel.py + ext/pmetrics.py)
def blue_hoc_get_p_r_f_arrary(pred: np.ndarray, gold: np.ndarray):
    prc_list, rec_list = [], []
    for i in range(pred.shape[0]):
        p = {j for j in range(pred.shape[1]) if pred[i, j] == 1}
        g = {j for j in range(pred.shape[1]) if gold[i, j] == 1}
        tt = len(g & p)
        prc_list.append(0 if not p else tt / len(p))
        rec_list.append(tt / len(g))
    mp, mr = np.mean(prc_list), np.mean(rec_list)
    return mp, mr, (2 * mp * mr / (mp + mr) if mp + mr else 0.0)


def blue_eval_rel_micro_f1(gold: list[str], pred: list[str]) -> float:
    labels = sorted(set(gold) | set(pred))  # BLUE: label set depends on the predictions
    cm = confusion_matrix([labels.index(x) for x in gold], [labels.index(x) for x in pred],
                          labels=list(range(len(labels))))
    tp = np.diag(cm)
    fp = cm.sum(axis=0) - tp
    fn = cm.sum(axis=1) - tp
    keep = [i for i, x in enumerate(labels) if x != "false"]  # BLUE drops only 'false'
    TP, FP, FN = tp[keep].sum(), fp[keep].sum(), fn[keep].sum()
    p = TP / (TP + FP) if TP + FP else 0.0
    r = TP / (TP + FN) if TP + FN else 0.0
    return 2 * p * r / (p + r) if p + r else 0.0


def test_every_metric_declares_its_direction():
    assert METRICS.names() == ["accuracy", "hoc_example_f1", "macro_f1", "micro_f1_positive", "ner_f1",
                              "pearson"]
    assert all(METRICS.get(n).higher_is_better and METRICS.get(n).mode == "max" for n in METRICS.names())


def test_pearson_known_answer_and_constant_prediction():
    assert pearson([1, 2, 3, 4], [2, 4, 6, 8]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert pearson([1.0, 2.0, 4.0], [1.0, 3.0, 2.0]) == pytest.approx(3 / np.sqrt(84))  # cov 1, var 42/9 and 2
    import pandas as pd  # BLUE eval_sts.py: true_df['score'].corr(pred_df['score'])
    gold, pred = [0.2, 1.4, 3.0, 2.2, 4.0], [0.5, 1.0, 2.5, 2.9, 3.1]
    assert pearson(gold, pred) == pytest.approx(pd.Series(gold).corr(pd.Series(pred)))
    assert pearson([1, 2, 3], [2, 2, 2]) == 0.0  # constant baseline: no correlation


def test_pearson_of_predictions_that_are_not_finite_is_zero_and_said(caplog):
    """A diverged model's NaN or infinite predictions score 0.0, as a constant prediction does, with a
    warning (it used to be silent; pandas would score the finite pairs alone: 1.0 here)."""
    with caplog.at_level("WARNING", logger="orchestrator.finetune.metrics"):
        assert pearson([1, 2, 3], [1, float("nan"), 3]) == 0.0
        assert pearson([1, 2, 3], [1, float("inf"), 3]) == 0.0
    assert [r.getMessage() for r in caplog.records] == [
        "pearson: 1 of 3 predictions are NaN or infinite (a diverged model): scored 0.0"] * 2


def test_accuracy_known_answer():
    assert accuracy(["a", "b", "c", "a"], ["a", "b", "a", "a"]) == 0.75


def test_macro_f1_known_answer():
    gold = ["a", "a", "a", "b", "c", "c"]
    pred = ["a", "a", "b", "b", "c", "a"]
    # a: P 2/3 R 2/3 F 2/3; b: P 1/2 R 1 F 2/3; c: P 1 R 1/2 F 2/3 -> macro 2/3 (micro = accuracy 4/6 too)
    assert macro_f1(gold, pred, labels=("a", "b", "c")) == pytest.approx(2 / 3)
    gold, pred = ["a", "a", "a", "b"], ["a", "a", "a", "a"]  # a: F 6/7, b: F 0 -> 3/7; accuracy would say .75
    assert macro_f1(gold, pred, labels=("a", "b", "z")) == pytest.approx(3 / 7)  # z seen nowhere: left out
    assert macro_f1(gold, pred, labels=("a", "b"), negative_labels=("a",)) == 0.0  # b alone
    assert METRICS.get("macro_f1").mode == "max"


def test_ner_strict_span_f1_known_answer():
    gold = [["B-Chemical", "I-Chemical", "O", "B-Chemical"]]
    pred = [["B-Chemical", "O", "O", "B-Chemical"]]  # one boundary error: 1 of 2 spans correct
    assert ner_f1(gold, pred) == pytest.approx(0.5)
    # "strict" as BLUE's eval_ner.py means it (span and type equal), the tags chunked as conlleval does: an entity
    # predicted from an I- is that entity (docs/METHODS.md), where seqeval's IOB2 mode="strict" would drop it
    assert ner_f1([["B-Chemical", "I-Chemical", "O"]], [["I-Chemical", "I-Chemical", "O"]]) == 1.0
    assert ner_f1([["B-Chemical", "I-Chemical", "O"]], [["I-Disease", "I-Chemical", "O"]]) == 0.0
    report = ner_report(gold, pred)
    assert report["Chemical"]["precision"] == 0.5 and report["Chemical"]["support"] == 2


def test_ner_entity_counts_give_micro_precision_not_the_support_weighted_mean():
    gold = [["B-Chemical", "I-Chemical", "O", "B-Disease"], ["B-Chemical", "O", "O", "O"]]
    pred = [["B-Chemical", "O", "B-Chemical", "B-Disease"], ["B-Chemical", "O", "B-Disease", "B-Disease"]]
    counts = ner_counts(gold, pred)
    # Chemical: gold 2, predicted 3 (one boundary error, one spurious), 1 exact; Disease: gold 1, predicted 3, 1 exact
    assert counts == {"Chemical": {"tp": 1, "predicted": 3, "gold": 2}, "Disease": {"tp": 1, "predicted": 3, "gold": 1}}
    report = ner_report(gold, pred)
    for kind, row in counts.items():  # the counts reproduce seqeval's per-type precision and recall
        assert report[kind]["precision"] == pytest.approx(row["tp"] / row["predicted"])
        assert report[kind]["recall"] == pytest.approx(row["tp"] / row["gold"])
    micro = micro_prf(counts.values())
    assert micro["precision"] == pytest.approx(2 / 6) and micro["recall"] == pytest.approx(2 / 3)
    assert micro["precision"] == pytest.approx(report["micro avg"]["precision"])
    assert micro["f1"] == pytest.approx(ner_f1(gold, pred))
    per_tag = ner_per_tag(gold, pred)
    assert per_tag["Disease"] == {"precision": pytest.approx(1 / 3), "recall": 1.0, "f1": pytest.approx(0.5),
                                  "support": 1, "tp": 1, "predicted": 3}
    gold2, pred2 = [["B-Chemical", "O", "B-Disease"]] * 1, [["B-Chemical", "B-Chemical", "B-Disease"]]
    # Chemical P 1/2 (support 1), Disease P 1 (support 1): the support-weighted mean the report showed
    # before is 0.75; micro precision is 2 of 3 predicted entities
    assert micro_prf(ner_counts(gold2, pred2).values())["precision"] == pytest.approx(2 / 3)


def test_relation_micro_f1_matches_blue_on_chemprot():
    gold = ["CPR:3", "CPR:4", "false", "CPR:9", "false", "CPR:4", "CPR:6"]
    pred = ["CPR:3", "false", "CPR:4", "CPR:9", "false", "CPR:4", "CPR:5"]
    labels = ("CPR:3", "CPR:4", "CPR:5", "CPR:6", "CPR:9", "false")
    ours = micro_f1_positive(gold, pred, labels=labels, negative_labels=("false",))
    assert ours == pytest.approx(blue_eval_rel_micro_f1(gold, pred))
    assert ours == pytest.approx(2 * (3 / 5) * (3 / 5) / (6 / 5))  # TP 3, FP 2, FN 2


def test_relation_micro_f1_fixes_blue_ddi_false():
    gold = ["DDI-false", "DDI-false", "DDI-effect", "DDI-int"]
    pred = ["DDI-false", "DDI-false", "DDI-false", "DDI-int"]
    labels = ("DDI-advise", "DDI-effect", "DDI-int", "DDI-mechanism", "DDI-false")
    ours = micro_f1_positive(gold, pred, labels=labels, negative_labels=("DDI-false",))
    assert ours == pytest.approx(2 / 3)  # TP 1 (int), FP 0, FN 1 (effect)
    assert blue_eval_rel_micro_f1(gold, pred) == pytest.approx(0.75)  # BLUE counted DDI-false as positive


def test_hoc_example_based_f1_matches_blue_and_names_p_r_correctly():
    rng = np.random.default_rng(0)
    gold = (rng.random((30, 10)) < 0.3).astype(int)
    gold[gold.sum(axis=1) == 0, 0] = 1  # BLUE's gold documents always have a label
    pred = (rng.random((30, 10)) < 0.3).astype(int)
    blue_p, blue_r, blue_f = blue_hoc_get_p_r_f_arrary(pred, gold)
    ours = example_based_prf(gold, pred)
    assert (ours.precision, ours.recall, ours.f1) == pytest.approx((blue_p, blue_r, blue_f))
    # BLUE's eval_hoc unpacks this as ``r, p, f1`` and prints P and R swapped; they differ here:
    assert ours.precision != pytest.approx(ours.recall)


def test_hoc_scores_documents_not_sentences():
    # two sentences of doc A (labels {0} and {1}), one of doc B ({2})
    gold = [(0,), (1,), (2,)]
    pred = [(1,), (0,), ()]  # per sentence all wrong, per document A is perfect
    f1 = hoc_example_f1(gold, pred, labels=[str(i) for i in range(3)], docs=["A", "A", "B"])
    # doc A: P=1 R=1; doc B: P=0 (nothing predicted) R=0 -> mean P .5, mean R .5 -> F1 .5
    assert f1 == pytest.approx(0.5)
