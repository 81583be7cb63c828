"""BERT's encoder without work on padding (issue 30, ``pretrain.speed.unpad``).

Real instances are a quarter padding (benchmarks/RESULTS.md: 25-26 % of the positions of two
length-128 instance sets, batches padded to their longest row). Every part of a BERT layer but the
attention's two matmuls works on each position alone (the Q, K, V and output projections, the
feed-forward block, LayerNorm, dropout): those run here on the real tokens only, packed as one
``[tokens, hidden]`` matrix, as NVIDIA's and MLPerf's unpadded BERTs do (Q, K and V as one matmul, as
theirs). The attention itself scatters Q, K and V back to ``[batch, heads, length, head size]`` and
runs ``scaled_dot_product_attention`` (or, with ``speed.attention: eager``, transformers'
matmul-softmax-matmul) with the padding masked, as the padded path does: at length 128 it is about
3 % of a layer's FLOPs. A varlen kernel would skip the scatter: FlashAttention's needs a package the
project does not require, and torch's own (``torch.nn.attention.varlen``, 2.10 and later) has no
attention dropout, which BERT's recipe uses.

The same arithmetic as ``BertModel`` with its attention (the padded positions' outputs aside, which
no loss reads): tests/test_pretrain_speed.py checks the loss and every gradient, with NSP, MLM only
and adapters. The modules are the model's own, so checkpoints, DDP and adapters are unchanged; with
``pretrain.gradient_checkpointing`` each layer is recomputed in the backward pass, as transformers does.

With ``pretrain.speed.compile`` too, ``compile_unpadded`` has the packed encoder compiled as one
function with dynamic shapes (``torch.compile(dynamic=True)``): the number of real tokens changes with
every batch, and a compile per count would never end. The positions of the real tokens come from the
data thread (``collate(..., indices=True)``) or, without them, from a ``nonzero`` before the compiled
region (its size is known only from the data).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

#: the attribute of a ``BertModel`` that names the torch.compile (backend, mode) of its unpadded encoder
COMPILED = "_unpadded_compile"
_compiled: dict[tuple[str, str | None], object] = {}  # (backend, mode) -> packed_encoder compiled so (per process)


def unpad_refusal(bert) -> str | None:
    """Why ``bert`` cannot run unpadded, or None: the path covers the BERT the engine builds."""
    config = bert.config
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return f"position_embedding_type {config.position_embedding_type} (unpadded: absolute only)"
    if config.is_decoder or config.add_cross_attention:
        return "a decoder / cross-attention BERT"
    if config.chunk_size_feed_forward:
        return f"chunk_size_feed_forward {config.chunk_size_feed_forward}"
    return None


def _projections(attention, hidden: torch.Tensor) -> torch.Tensor:
    """The attention's queries, keys and values of the packed tokens, side by side ([tokens, 3 x hidden]).
    When the three are plain linear layers (not ``speed.fp8``'s), as one matmul with their weights
    stacked (as NVIDIA's and MLPerf's BERTs fuse them): one GEMM and one cast where there were three,
    each output column the same dot product. The weights stay the model's three modules: checkpoints
    are unchanged, and the gradients reach each through the concatenation."""
    linears = (attention.query, attention.key, attention.value)
    if all(type(m) is torch.nn.Linear and m.bias is not None for m in linears):  # BERT's: with biases
        return F.linear(hidden, torch.cat([m.weight for m in linears]), torch.cat([m.bias for m in linears]))
    return torch.cat([m(hidden) for m in linears], dim=-1)


def _layer(layer, hidden: torch.Tensor, index: torch.Tensor, shape: tuple[int, int], key_mask: torch.Tensor,
           eager: bool) -> torch.Tensor:
    """One ``BertLayer`` on the packed tokens ``hidden`` ([tokens, hidden]); ``eager``: the attention as
    transformers' eager implementation computes it, else with ``scaled_dot_product_attention``."""
    attention = layer.attention.self
    batch, length = shape
    heads, size = attention.num_attention_heads, attention.attention_head_size

    # Q, K and V side by side ([tokens, 3 x heads x size]), scattered to the padded layout in one pass:
    # [batch, length, 3, heads, size] -> three [batch, heads, length, size] views
    qkv = _projections(attention, hidden)
    padded = qkv.new_zeros(batch * length, qkv.shape[-1]).index_copy(0, index, qkv)
    q, k, v = padded.view(batch, length, 3, heads, size).permute(2, 0, 3, 1, 4).unbind(0)
    dropout = attention.dropout.p if attention.training else 0.0
    if eager:  # speed.attention: eager, transformers' matmul-softmax-matmul (eager_attention_forward)
        scores = (q @ k.transpose(2, 3)) * size ** -0.5
        scores = scores.masked_fill(~key_mask, torch.finfo(scores.dtype).min)
        context = F.dropout(scores.softmax(-1), p=dropout, training=dropout > 0) @ v
    else:
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout)
    context = context.transpose(1, 2).reshape(batch * length, heads * size).index_select(0, index)
    attended = layer.attention.output(context, hidden)
    return layer.output(layer.intermediate(attended), attended)


def encode(bert, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
           unpad: bool, index: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``bert``'s (last hidden state, pooler output): unpadded when ``unpad`` and the batch has padding,
    else ``bert``'s own forward (a batch of full rows gains nothing from packing: measured 0.96x on CPU).
    ``index``: ``real_tokens(attention_mask)`` when the caller has it (found on the data thread)."""
    if unpad:
        index = real_tokens(attention_mask) if index is None else index
        if index.numel() < attention_mask.numel():
            hidden = unpadded_sequence_output(bert, input_ids, token_type_ids, attention_mask, index)
            return hidden, (bert.pooler(hidden) if bert.pooler is not None else None)
    out = bert(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    return out.last_hidden_state, out.pooler_output


def real_tokens(attention_mask: torch.Tensor) -> torch.Tensor:
    """The flat positions of the real tokens, row after row (one host sync on CUDA)."""
    return attention_mask.reshape(-1).nonzero().squeeze(1)


def compile_unpadded(bert, backend: str = "inductor", mode: str | None = None) -> None:
    """Run ``bert``'s unpadded encoder compiled with ``backend`` (and torch.compile's ``mode``) from now on
    (``speed.compile`` with ``speed.unpad``): an attribute names them, so the module, its state dict and
    copies of it are unchanged."""
    setattr(bert, COMPILED, (backend, mode))


def unpadded_sequence_output(bert, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                             attention_mask: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """``bert(...).last_hidden_state`` ([batch, length, hidden]) computed on the real tokens only; the
    padded positions hold zeros (or, for filler positions in ``index``, what the layers made of them).
    ``bert`` is a ``BertModel`` (``model.bert``) with absolute positions; ``index``:
    ``real_tokens(attention_mask)``, when the caller has it."""
    index = real_tokens(attention_mask) if index is None else index
    how = getattr(bert, COMPILED, None)
    if how is None:
        return packed_encoder(bert, input_ids, token_type_ids, attention_mask, index)
    if how not in _compiled:
        backend, mode = how
        _compiled[how] = torch.compile(packed_encoder, backend=backend, dynamic=True, mode=mode)
    return _compiled[how](bert, input_ids, token_type_ids, attention_mask, index)


def packed_encoder(bert, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
                   index: torch.Tensor) -> torch.Tensor:
    """The embeddings and every layer on the real tokens at ``index``, scattered back to [batch, length,
    hidden] with zeros at the padding: what ``unpadded_sequence_output`` runs, eager or compiled. ``index``
    may end with padding positions (``collate``'s static shapes): they are computed as tokens of their
    row, attended by no real token (their keys are masked), and written back to their own padding."""
    batch, length = input_ids.shape
    embedded = bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
    hidden = embedded.reshape(batch * length, -1).index_select(0, index)
    key_mask = attention_mask.bool()[:, None, None, :]  # every query sees its row's real tokens
    eager = bert.config._attn_implementation == "eager"  # speed.attention, as the padded path reads it
    for layer in bert.encoder.layer:
        if getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled():
            # pretrain.gradient_checkpointing (transformers marks each layer): recompute it in the backward
            hidden = torch.utils.checkpoint.checkpoint(_layer, layer, hidden, index, (batch, length), key_mask,
                                                       eager, use_reentrant=False)
        else:
            hidden = _layer(layer, hidden, index, (batch, length), key_mask, eager)
    return hidden.new_zeros(batch * length, hidden.shape[-1]).index_copy(0, index, hidden).view(batch, length, -1)
