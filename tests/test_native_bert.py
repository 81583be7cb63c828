"""Fine-tuning's own BERT encoder (orchestrator/modeling/bert.py) computes transformers' BertModel bit for bit."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from orchestrator.modeling.bert import NativeBertModel, native_encoder


def _batch(vocab: int, padded: bool, pairs: bool) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(5, vocab, (4, 12), generator=g)
    mask = torch.ones_like(ids)
    if padded:
        for row, length in enumerate((12, 9, 5, 11)):
            mask[row, length:] = 0
            ids[row, length:] = 0
    batch = {"input_ids": ids, "attention_mask": mask}
    if pairs:
        batch["token_type_ids"] = (torch.arange(12) >= 6).long().expand(4, -1).clone()
    return batch


def _hf(model_dir: Path):
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(model_dir), dtype=torch.float32)


@pytest.mark.parametrize("padded, pairs", [(True, True), (False, False), (True, False)])
def test_outputs_and_gradients_equal_transformers_bit_for_bit(tiny_bert, padded, pairs):
    """Dropout on (train mode) and off, with and without padding (transformers gives sdpa no mask without it)
    and segment ids: the last hidden states and every parameter's gradient are equal, not close."""
    before = torch.get_rng_state()
    ours = native_encoder(tiny_bert)
    assert isinstance(ours, NativeBertModel) and not ours.training  # as from_pretrained gives it: eval mode
    assert torch.equal(before, torch.get_rng_state())  # built without drawing (meta device), as transformers loads
    theirs = _hf(tiny_bert)
    assert list(dict(ours.named_parameters())) == list(dict(theirs.named_parameters()))
    assert set(ours.state_dict()) == set(theirs.state_dict())
    batch = _batch(ours.config.vocab_size, padded, pairs)
    for train in (True, False):
        outs = []
        for model in (ours, theirs):
            model.train(train)
            model.zero_grad()
            torch.manual_seed(3)
            out = model(**batch).last_hidden_state
            (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
            outs.append((out.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
        (a, grads_a), (b, grads_b) = outs
        assert torch.equal(a, b), (train, (a - b).abs().max())
        assert set(grads_a) == set(grads_b) - {"pooler.dense.weight", "pooler.dense.bias"}  # ours does not run it
        assert all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


def test_a_checkpoint_with_heads_or_missing_weights_and_the_switch(tiny_bert, tmp_path, monkeypatch):
    """Pretraining's checkpoints (``bert.`` names, heads) load their encoder; a checkpoint without a weight
    BertModel has (its pooler) is left to transformers, which draws random ones; ORCH_NATIVE_BERT=0 too."""
    from safetensors.torch import load_file, save_file

    saved = load_file(str(tiny_bert / "model.safetensors"))
    heads = tmp_path / "heads"
    heads.mkdir()
    (heads / "config.json").write_text((tiny_bert / "config.json").read_text())
    save_file({**{f"bert.{k}": v for k, v in saved.items()}, "cls.predictions.bias": torch.zeros(3)},
              str(heads / "model.safetensors"))
    ours = native_encoder(heads)
    assert ours is not None and all(torch.equal(ours.state_dict()[k], v) for k, v in saved.items())
    no_pooler = tmp_path / "no_pooler"
    no_pooler.mkdir()
    (no_pooler / "config.json").write_text((tiny_bert / "config.json").read_text())
    save_file({k: v for k, v in saved.items() if not k.startswith("pooler.")}, str(no_pooler / "model.safetensors"))
    assert native_encoder(no_pooler) is None
    relative = tmp_path / "relative"
    relative.mkdir()
    config = json.loads((tiny_bert / "config.json").read_text())
    (relative / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    save_file(saved, str(relative / "model.safetensors"))
    assert native_encoder(relative) is None
    damaged = tmp_path / "damaged"  # transformers' load says what is wrong with it, as it always has
    damaged.mkdir()
    (damaged / "config.json").write_text("{not json")
    assert native_encoder(damaged) is None
    # a model probe (session 48): a config asking for eager attention, and shards beside a stray pickle (which
    # transformers leaves for the shards), were computed with SDPA / loaded from the pickle
    eager = tmp_path / "eager"
    eager.mkdir()
    (eager / "config.json").write_text(json.dumps({**config, "attn_implementation": "eager"}))
    save_file(saved, str(eager / "model.safetensors"))
    assert native_encoder(eager) is None and _hf(eager).config._attn_implementation == "eager"
    sharded = tmp_path / "sharded"
    _hf(tiny_bert).save_pretrained(sharded, max_shard_size="20KB")
    assert len(list(sharded.glob("model-*.safetensors"))) > 1
    torch.save({k: torch.zeros_like(v) for k, v in saved.items()}, sharded / "pytorch_model.bin")
    assert native_encoder(sharded) is None
    assert torch.equal(_hf(sharded).embeddings.word_embeddings.weight, saved["embeddings.word_embeddings.weight"])
    monkeypatch.setenv("ORCH_NATIVE_BERT", "0")
    assert native_encoder(tiny_bert) is None


def test_a_saved_native_encoder_is_what_transformers_saves(tiny_bert, tmp_path):
    """An export writes the encoder with ``save_pretrained``: transformers loads the native one's directory to the
    same weights, and its config.json says what transformers' own save says."""
    ours, theirs = native_encoder(tiny_bert), _hf(tiny_bert)
    ours.save_pretrained(tmp_path / "ours", state_dict=ours.state_dict(), safe_serialization=True)
    theirs.save_pretrained(str(tmp_path / "theirs"), state_dict=theirs.state_dict(), safe_serialization=True)
    mine, reference = (json.loads((tmp_path / d / "config.json").read_text()) for d in ("ours", "theirs"))
    assert mine == reference
    loaded = _hf(tmp_path / "ours")
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in theirs.state_dict().items())


def transformers_version() -> tuple[int, ...]:
    import transformers

    return tuple(int(x) for x in transformers.__version__.split(".")[:2])


def test_a_trial_without_transformers_model_code(tiny_bert, tmp_path):
    """The point of it: a fine-tuning trial in a fresh process imports no more of transformers' model code
    (modeling_utils: about 1.5 s a sweep worker) or of torch._dynamo and sympy (torch.optim's, 1.1 s) than its
    tokenizer does: with the lock's transformers, none of them; transformers 5.17's AutoTokenizer imports them all.
    Its record equals the same trial's with transformers' encoder (the switch), which imports modeling_utils."""
    tokenizer_only = subprocess.run(
        [sys.executable, "-c", "import sys, torch; from transformers import AutoTokenizer; AutoTokenizer; "
         "print([m for m in ('transformers.modeling_utils', 'torch._dynamo', 'sympy') if m in sys.modules])"],
        capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    script = f"""
import json, sys
from orchestrator.finetune.loop import run_trial
from orchestrator.finetune.spec import SAMPLE_DIR, load_task
from orchestrator.finetune.trial import TrialSpec
spec = TrialSpec(trial_id="t", model_name="m", model_dir={str(tiny_bert)!r}, task="biosses",
                 data_dir=str(SAMPLE_DIR / load_task("biosses").dir),
                 learning_rate=1e-3, seed=1, eval_epochs=(1, 2), batch_size=8, max_seq_length=32,
                 max_train_examples=24, max_eval_examples=16, num_threads=1)
rec = run_trial(spec)
print(json.dumps({{"modeling": "transformers.modeling_utils" in sys.modules,
                  "heavy": [m for m in ("transformers.modeling_utils", "torch._dynamo", "sympy") if m in sys.modules],
                  "epochs": [{{k: v for k, v in e.items() if "seconds" not in k}} for e in rec["epochs"]]}}))
"""
    runs = {}
    for switch in ("1", "0"):
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                             env={**__import__("os").environ, "ORCH_NATIVE_BERT": switch},
                             cwd=Path(__file__).resolve().parents[1])
        runs[switch] = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(runs["1"]["heavy"]) <= set(json.loads(tokenizer_only.replace("'", '"'))) and runs["0"]["modeling"]
    if transformers_version() >= (5, 23):  # the lock's: its tokenizer imports none of them
        assert runs["1"]["heavy"] == []
    assert runs["1"]["epochs"] == runs["0"]["epochs"] and len(runs["1"]["epochs"]) == 2
