"""BERT models for pretraining: from a size preset, or continued from a Hugging Face directory.

``PretrainingModule`` is what DDP wraps: it runs the encoder once and applies the MLM decoder only
to the masked positions (NVIDIA's trick; the vocabulary projection of every position is most of
the head's cost), returning the MLM and NSP losses separately plus MLM accuracy counts. It is a
forward path over the standard ``BertForPreTraining`` modules: the weights, and so the checkpoints
``from_pretrained`` loads, are the model's own.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForMaskedLM, BertForPreTraining, PreTrainedModel

from orchestrator.core.errors import ConfigError, InputError
from orchestrator.modeling.encoder import from_pretrained
from orchestrator.pretrain.config import SIZE_PRESETS, ModelConfig, SpeedConfig, read_hf_config
from orchestrator.pretrain.data import IGNORE_INDEX
from orchestrator.pretrain.float8 import use_float8
from orchestrator.pretrain.unpad import compile_unpadded, encode, unpad_refusal

log = logging.getLogger(__name__)

ARCH_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "vocab_size", "max_position_embeddings", "type_vocab_size")


def bert_config(cfg: ModelConfig, vocab_size: int, pad_token_id: int) -> BertConfig:
    hidden, layers, heads, inter = SIZE_PRESETS[cfg.size]
    return BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, intermediate_size=inter,
                      max_position_embeddings=cfg.max_position_embeddings, hidden_dropout_prob=cfg.dropout,
                      attention_probs_dropout_prob=cfg.dropout, pad_token_id=pad_token_id)


def model_class(objective: str) -> type[PreTrainedModel]:
    return BertForPreTraining if objective == "mlm_nsp" else BertForMaskedLM


def build_model(cfg: ModelConfig, vocab_size: int, pad_token_id: int, attention: str = "sdpa",
                fp8: bool = False) -> PreTrainedModel:
    """A fresh model from the size preset, or ``cfg.init_from`` with any missing head added.

    Continuing from a directory whose vocabulary size differs from the tokenizer's is refused
    unless ``allow_vocab_resize`` (resized embeddings for new ids start untrained). ``attention``:
    the kernel the self-attention runs (``set_attention``); ``fp8`` (``speed.fp8``): the encoder
    layers' linear layers multiply in FP8 (``float8.use_float8``; the caller checks the device with
    ``float8.fp8_refusal``).
    """
    model = _built(cfg, vocab_size, pad_token_id)
    set_attention(model, attention)
    if fp8:
        use_float8(model.bert)
    return model


def _built(cfg: ModelConfig, vocab_size: int, pad_token_id: int) -> PreTrainedModel:
    cls = model_class(cfg.objective)
    if not cfg.init_from:
        return cls(bert_config(cfg, vocab_size, pad_token_id))
    source = Path(cfg.init_from)
    hf = read_hf_config(source)
    if hf.get("model_type") != "bert":
        raise InputError(source / "config.json", f"model_type is {hf.get('model_type')!r}; only BERT models "
                                                 "can be continued", expected="model_type 'bert'")
    if hf["vocab_size"] != vocab_size and not cfg.allow_vocab_resize:
        raise ConfigError(f"model.init_from {source} has vocab_size {hf['vocab_size']} but the tokenizer has "
                          f"{vocab_size}; use that model's own tokenizer, or set model.allow_vocab_resize=true "
                          "to resize the embeddings")
    # float32 masters whatever the file holds: transformers 5 loads with dtype="auto", so fp16/bf16
    # weights would train in half precision (fp16's unscale_ refuses them; bf16 loses small updates)
    model = from_pretrained(cls, source, dtype=torch.float32)
    if model.config.vocab_size != vocab_size:
        log.warning("resizing embeddings of %s from %d to %d", source, model.config.vocab_size, vocab_size)
        model.resize_token_embeddings(vocab_size)
    return model


def set_attention(model: PreTrainedModel, attention: str) -> PreTrainedModel:
    """Run the self-attention through ``attention``: "sdpa" (torch's ``scaled_dot_product_attention``,
    FlashAttention or memory-efficient kernels on CUDA) or "eager" (transformers' matmul, softmax,
    matmul). transformers reads ``config._attn_implementation`` at every forward; it is not saved in
    config.json, so a checkpoint loads with the loader's own choice."""
    if attention not in ("sdpa", "eager"):
        raise ConfigError(f"attention must be sdpa or eager, got {attention!r}")
    model.set_attn_implementation(attention)
    if model.config._attn_implementation != attention:  # transformers refused it without saying so
        raise ConfigError(f"{type(model).__name__} runs {model.config._attn_implementation!r} attention, "
                          f"not the {attention!r} asked for")
    return model


def checkpoint_activations(model: PreTrainedModel) -> PreTrainedModel:
    """Recompute each layer's activations in the backward pass (``pretrain.gradient_checkpointing``), with
    PyTorch's non-reentrant checkpoint. transformers 5.23 names it ``activation_checkpointing_enable``
    (``gradient_checkpointing_enable`` a deprecated alias); earlier 5.x, such as the 5.17 a GPU host may
    bring, have only ``gradient_checkpointing_enable``."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def check_same_architecture(expected: BertConfig | dict, checkpoint_dir: Path) -> None:
    """Refuse to resume from a checkpoint of another architecture (a changed config, a reused out_dir)."""
    want = expected.to_dict() if isinstance(expected, BertConfig) else expected
    have = read_hf_config(checkpoint_dir)
    diff = {k: (have.get(k), want.get(k)) for k in ARCH_KEYS if have.get(k) != want.get(k)}
    if diff:
        detail = ", ".join(f"{k}: checkpoint {a!r} vs config {b!r}" for k, (a, b) in diff.items())
        raise InputError(checkpoint_dir / "config.json", f"checkpoint is from another architecture ({detail})",
                         expected="the architecture this config builds; use a fresh out_dir or matching config")


class PretrainingModule(torch.nn.Module):
    """Wraps BertForPreTraining / BertForMaskedLM; forward returns losses and accuracy counts.

    ``masked_only=True`` gathers the encoder's output at the masked positions (labels != -100)
    before the MLM decoder (transform, LayerNorm, vocabulary projection); ``False`` decodes every
    position and then keeps the masked ones (what ``BertForPreTraining.forward`` computes): the
    same logits at those positions, so the same loss, accuracy and gradients. ``unpad=True`` runs the
    encoder on the real tokens only (``pretrain/unpad.py``): the same outputs at every real position."""

    def __init__(self, model: PreTrainedModel, masked_only: bool = True, unpad: bool = False):
        super().__init__()
        self.model = model
        self.nsp = isinstance(model, BertForPreTraining)
        self.masked_only = masked_only
        self.unpad = unpad
        if unpad and (reason := unpad_refusal(model.bert)):
            raise ConfigError(f"pretrain.speed.unpad: this model cannot run unpadded ({reason}); set it to false")

    def forward(self, input_ids, token_type_ids, attention_mask, labels, next_sentence_label=None,
                real_index=None, masked_index=None):
        """``real_index`` / ``masked_index``: the flat positions of the real and the masked tokens
        (``collate(..., indices=True)``, found on the data thread); without them they are found here,
        which on CUDA waits for the GPU."""
        if masked_index is None:
            masked_index = (labels != IGNORE_INDEX).reshape(-1).nonzero().squeeze(1)
        heads = self.model.cls
        # unpad: the encoder on the real tokens only, when the batch has padding (pretrain/unpad.py)
        hidden, pooled = encode(self.model.bert, input_ids, token_type_ids, attention_mask, self.unpad, real_index)
        how = getattr(heads, COMPILED_HEAD, None)
        losses = head_losses if how is None else _compiled_head_losses(*how)
        return losses(heads, hidden, pooled, labels, masked_index, next_sentence_label, self.masked_only, self.nsp)


def head_losses(heads: torch.nn.Module, hidden: torch.Tensor, pooled: torch.Tensor | None, labels: torch.Tensor,
                masked_index: torch.Tensor, next_sentence_label: torch.Tensor | None, masked_only: bool,
                nsp: bool) -> dict[str, torch.Tensor]:
    """The pretraining heads (``model.cls``) and their losses on the encoder's output: ``PretrainingModule``'s
    result. ``masked_only``: the MLM decoder at the ``masked_index`` positions only, else at every position
    and then those kept; ``nsp``: the next-sentence head too (``BertForPreTraining``). A function of its
    inputs alone, so ``speed.compile_head`` can compile it (``compile_encoder``)."""
    targets = labels.reshape(-1).index_select(0, masked_index)
    flat = hidden.reshape(-1, hidden.shape[-1])
    logits = (heads.predictions(flat.index_select(0, masked_index)) if masked_only
              else heads.predictions(flat).index_select(0, masked_index))
    # The mean over the masked positions. Filler positions (speed.cuda_graphs' static shapes) have the
    # target IGNORE_INDEX, which the sum skips; a micro-batch with nothing masked contributes zero loss.
    count = (targets != IGNORE_INDEX).sum()
    mlm_loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX, reduction="sum") \
        / count.clamp(min=1)
    result = {"mlm_loss": mlm_loss, "mlm_correct": (logits.argmax(-1) == targets).sum(), "mlm_count": count}
    loss = mlm_loss
    if nsp:
        nsp_loss = F.cross_entropy(heads.seq_relationship(pooled).float(), next_sentence_label)
        result["nsp_loss"] = nsp_loss
        loss = loss + nsp_loss
    result["loss"] = loss
    return result


#: the attribute of a model's heads (``model.cls``) that names the torch.compile (backend, mode) of ``head_losses``
COMPILED_HEAD = "_head_compile"
_compiled_heads: dict[tuple[str, str | None], object] = {}  # (backend, mode) -> head_losses compiled so (per process)


def _compiled_head_losses(backend: str, mode: str | None):
    if (backend, mode) not in _compiled_heads:
        # dynamic: the number of masked positions changes with every batch (a compile per count would never end)
        _compiled_heads[backend, mode] = torch.compile(head_losses, backend=backend, dynamic=True, mode=mode)
    return _compiled_heads[backend, mode]


def training_module(model: PreTrainedModel, speed: SpeedConfig,
                    wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> torch.nn.Module:
    """The module a pretraining step runs, as ``speed`` says: ``PretrainingModule`` with its decoder and
    encoder choices (``masked_only_head``, ``unpad``), wrapped by ``wrap`` (Ray Train's ``prepare_model``:
    DDP in a world of more than one), then, with ``compile``, the encoder and heads compiled in place
    (``compile_encoder``), so the parameters, their names and DDP's hooks stay the model's own. The loop
    and the GPU benchmark build it here, so a benchmark row runs what a run with its switches runs."""
    module = PretrainingModule(model, masked_only=speed.masked_only_head, unpad=speed.unpad)
    if wrap is not None:
        module = wrap(module)
    if speed.compile:
        compile_encoder(model, unpad=speed.unpad, cuda_graphs=speed.cuda_graphs, head=speed.compile_head)
    return module


def compile_encoder(model: PreTrainedModel, backend: str = "inductor", unpad: bool = False,
                    cuda_graphs: bool = False, head: bool = False) -> PreTrainedModel:
    """``torch.compile`` the encoder in place (``Module.compile``): its parameters and their names, so
    the state dict, the checkpoints and DDP's gradient hooks, stay the model's own. The first forward
    of each new input shape compiles (the loop logs the first step's time apart); ``dynamic=None`` lets
    torch make a dimension dynamic once it has seen it change. With ``unpad`` (``speed.unpad``) the
    unpadded encoder is compiled too, with dynamic shapes (``pretrain/unpad.py``): batches with padding
    run it, batches without run the compiled ``BertModel``. ``cuda_graphs`` (``speed.cuda_graphs``,
    inductor only): mode ``reduce-overhead``, each shape's kernels recorded once as a CUDA graph and
    replayed as one launch (on CPU inductor leaves the graphs out). ``head`` (``speed.compile_head``): the
    MLM decoder, the NSP head and their losses (``head_losses``) compiled as one function too, with
    dynamic shapes (the masked positions' count changes with every batch), in the same mode; without it
    they run eager. Like the unpadded encoder's, the choice is an attribute (``COMPILED_HEAD``): the
    heads' modules and state dict are unchanged."""
    mode = "reduce-overhead" if cuda_graphs else None
    model.bert.compile(backend=backend, dynamic=None, mode=mode)
    if unpad:
        compile_unpadded(model.bert, backend, mode)
    if head:
        setattr(model.cls, COMPILED_HEAD, (backend, mode))
    return model
