"""Load a BERT encoder from a Hugging Face directory, the one way every stage that reads a model does.

    encoder = load_encoder(model_dir)            # BertModel (no heads), fp32, adapters in place

A directory the pretrain stage wrote (``BertForPreTraining`` / ``BertForMaskedLM`` weights), an
exported fine-tuned model or a published BERT (MiniLM) all load: ``AutoModel`` keeps the encoder
and drops the heads. A directory that carries adapters (``orchestrator.modeling.adapters.save_adapters``,
written by a pretraining run with ``pretrain.adapters``) gets them re-inserted, so the encoder computes
what was trained. Fine-tuning (``orchestrator.finetune.model.TaskModel``) and the retrieval evaluation
(``orchestrator.retrieval``) both load through here.
"""
from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModel, PreTrainedModel

from orchestrator.modeling.adapters import load_adapters, saved_adapters


def load_encoder(model_dir: str | Path, use_safetensors: bool | None = None) -> PreTrainedModel:
    """The bare encoder of ``model_dir`` in fp32 (the masters pretraining keeps), with its saved adapters.

    ``use_safetensors=True`` refuses pickled weights (an exported model); ``None`` takes either
    (transformers reads a ``.bin`` with ``weights_only=True``)."""
    encoder = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32, use_safetensors=use_safetensors)
    if saved_adapters(model_dir):
        load_adapters(encoder, Path(model_dir))
    return encoder


__all__ = ["load_encoder"]
