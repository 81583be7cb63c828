"""Load a BERT encoder from a Hugging Face directory, the one way every stage that reads a model does.

    encoder = load_encoder(model_dir)            # BertModel (no heads), fp32, adapters in place

A directory the pretrain stage wrote (``BertForPreTraining`` / ``BertForMaskedLM`` weights), an
exported fine-tuned model or a published BERT (MiniLM) all load: the encoder is kept and the heads
dropped. A plain BERT loads as ``orchestrator.modeling.bert.NativeBertModel`` (transformers' ``BertModel``
computation bit for bit, without importing transformers' model code: 1.5 s a sweep worker); any other
model through ``AutoModel``. A directory that carries adapters (``orchestrator.modeling.adapters.save_adapters``,
written by a pretraining run with ``pretrain.adapters``) gets them re-inserted, so the encoder computes
what was trained. Fine-tuning (``orchestrator.finetune.model.TaskModel``) and the retrieval evaluation
(``orchestrator.retrieval``) both load through here.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from orchestrator.core.errors import InputError
from orchestrator.modeling.adapters import load_adapters, saved_adapters
from orchestrator.modeling.bert import native_encoder

#: What is said of a weights file torch's ``weights_only`` load refuses
PICKLED = ("its weights file holds objects other than tensors (a pickle, which could run code when loaded): "
           "refused")
SAFE_WEIGHTS = "model.safetensors, or a pytorch_model.bin of tensors only"


def from_pretrained(cls: Any, model_dir: str | Path, **kwargs: Any) -> Any:
    """``cls.from_pretrained(model_dir, **kwargs)``, a weights file that is more than tensors being bad input
    naming the directory (it was an UnpicklingError called a bug, advising ``weights_only=False``)."""
    try:
        return cls.from_pretrained(str(model_dir), **kwargs)
    except pickle.UnpicklingError:
        raise InputError(Path(model_dir), PICKLED, expected=SAFE_WEIGHTS) from None


def load_encoder(model_dir: str | Path, use_safetensors: bool | None = None) -> nn.Module:
    """The bare encoder of ``model_dir`` in fp32 (the masters pretraining keeps), with its saved adapters:
    ``NativeBertModel`` where it computes what transformers' would, else transformers' ``AutoModel``.

    ``use_safetensors=True`` refuses pickled weights (an exported model); ``None`` takes either
    (a ``.bin`` is read with ``weights_only=True``)."""
    encoder = native_encoder(model_dir, use_safetensors=use_safetensors)
    if encoder is None:
        from transformers import AutoModel  # heavy: transformers (its model code)

        encoder = from_pretrained(AutoModel, model_dir, dtype=torch.float32, use_safetensors=use_safetensors)
    if saved_adapters(model_dir):
        load_adapters(encoder, Path(model_dir))
    return encoder


__all__ = ["from_pretrained", "load_encoder"]
