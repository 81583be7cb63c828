"""Unit embeddings: the encoder's last-layer outputs averaged over a unit's sub-tokens (seed 002).

Each unit is tokenized alone, without special tokens, and cut into windows of ``max_seq_length - 2``
sub-tokens; each window is encoded as ``[CLS] window [SEP]``. The unit's vector is the mean of the
last hidden layer over all of its sub-tokens, in every window (``long_units="window"``), or in its
first window only (``"truncate"``). Padding never counts. [CLS] and [SEP] count only with
``special_tokens="include"``: seed 002 averages "over the encoder outputs for all subtokens in the
sentence", and the two markers are not sub-tokens of the sentence (with windows they would also
weigh more in a long unit than in a short one). Windows are batched by length, longest first.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from orchestrator.core.artifacts import usable_positions
from orchestrator.core.errors import InputError, OrchestratorError
from orchestrator.modeling.encoder import load_encoder

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class EmbedInfo:
    """What embedding one side did: units, windows, sub-tokens averaged, units cut or split."""

    units: int
    windows: int
    tokens: int
    max_seq_length: int
    truncated_units: int  # long_units=truncate: units whose later sub-tokens were dropped
    split_units: int  # long_units=window: units spread over more than one window
    seconds: float


def load_model(model_dir: str | Path):
    """(tokenizer, encoder in eval mode) of a Hugging Face BERT directory, or an InputError naming it."""
    from transformers import AutoTokenizer  # heavy: transformers
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one "Loading weights" bar per task would drown the job's progress
    model_dir = Path(model_dir)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        encoder = load_encoder(model_dir).eval()
    except Exception as exc:  # transformers raises OSError, ValueError, its own: all mean "not a usable model"
        raise InputError(model_dir, f"cannot load the model: {type(exc).__name__}: {exc}",
                         expected="a Hugging Face BERT directory (config.json, weights, tokenizer files)") from None
    if tokenizer.cls_token_id is None or tokenizer.sep_token_id is None or tokenizer.pad_token_id is None:
        raise InputError(model_dir, "its tokenizer has no [CLS], [SEP] or [PAD] token",
                         expected="a BERT tokenizer")
    return tokenizer, encoder


def windows_of(ids: Sequence[int], width: int, long_units: str) -> list[list[int]]:
    """A unit's sub-token ids cut into windows of at most ``width`` (the first only with 'truncate')."""
    if not ids:
        return [[]]
    cuts = [list(ids[i:i + width]) for i in range(0, len(ids), width)]
    return cuts[:1] if long_units == "truncate" else cuts


def embed_texts(model_dir: str | Path, texts: Sequence[str], *, max_seq_length: int = 128, batch_size: int = 32,
                special_tokens: str = "exclude", long_units: str = "window", device: str = "cpu", threads: int = 0,
                label: str = "") -> tuple[np.ndarray, EmbedInfo]:
    """(units x hidden float32 matrix, what was done): the mean of the last layer over each unit's sub-tokens.
    ``threads``: torch's CPU threads (0 = as set)."""
    start = time.perf_counter()
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise OrchestratorError(f"{label or model_dir}: use_gpu is set but this process sees no CUDA device")
    if threads > 0:
        torch.set_num_threads(threads)
    tokenizer, encoder = load_model(model_dir)
    encoder.to(device)
    length = min(max_seq_length, usable_positions(encoder.config.to_dict()) or max_seq_length)
    width = length - 2
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"]
    windows: list[tuple[int, list[int]]] = []
    truncated = split = 0
    for unit, unit_ids in enumerate(ids):
        cut = windows_of(unit_ids, width, long_units)
        truncated += long_units == "truncate" and len(unit_ids) > width
        split += len(cut) > 1
        windows.extend((unit, w) for w in cut)
    order = sorted(range(len(windows)), key=lambda i: -len(windows[i][1]))
    hidden = encoder.config.hidden_size
    sums = torch.zeros(len(texts), hidden, dtype=torch.float64)
    counts = torch.zeros(len(texts), dtype=torch.float64)
    cls, sep, pad = tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id
    batches = (len(order) + batch_size - 1) // batch_size
    report_every = max(1, batches // 10)
    with torch.inference_mode():
        for b in range(batches):
            chosen = [windows[i] for i in order[b * batch_size:(b + 1) * batch_size]]
            longest = max(len(w) for _, w in chosen) + 2
            input_ids = torch.full((len(chosen), longest), pad, dtype=torch.long)
            attention = torch.zeros((len(chosen), longest), dtype=torch.long)
            weight = torch.zeros((len(chosen), longest), dtype=torch.float64)
            for row, (_, w) in enumerate(chosen):
                input_ids[row, :len(w) + 2] = torch.tensor([cls, *w, sep])
                attention[row, :len(w) + 2] = 1
                if special_tokens == "include" or not w:  # a unit with no sub-token keeps its markers
                    weight[row, :len(w) + 2] = 1
                else:
                    weight[row, 1:len(w) + 1] = 1
            out = encoder(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                          token_type_ids=torch.zeros_like(input_ids).to(device)).last_hidden_state
            pooled = (out.double().cpu() * weight[:, :, None]).sum(dim=1)
            units = torch.tensor([u for u, _ in chosen])
            sums.index_add_(0, units, pooled)
            counts.index_add_(0, units, weight.sum(dim=1))
            if (b + 1) % report_every == 0 or b + 1 == batches:
                log.info("%sembedded %d/%d windows", f"{label}: " if label else "",
                         min((b + 1) * batch_size, len(order)), len(order))
    vectors = (sums / counts.clamp(min=1)[:, None]).float().numpy()
    info = EmbedInfo(units=len(texts), windows=len(windows), tokens=int(counts.sum()), max_seq_length=length,
                     truncated_units=int(truncated), split_units=int(split),
                     seconds=round(time.perf_counter() - start, 3))
    return vectors, info


__all__ = ["EmbedInfo", "embed_texts", "load_model", "windows_of"]
