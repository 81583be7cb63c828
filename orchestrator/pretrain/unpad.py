"""BERT's encoder without work on padding (issue 30, ``pretrain.speed.unpad``).

Real instances are a quarter padding (benchmarks/RESULTS.md: 25-26 % of the positions of two
length-128 instance sets, batches padded to their longest row). Every part of a BERT layer but the
attention's two matmuls works on each position alone (the Q, K, V and output projections, the
feed-forward block, LayerNorm, dropout): those run here on the real tokens only, packed as one
``[tokens, hidden]`` matrix, as NVIDIA's and MLPerf's unpadded BERTs do. The attention itself scatters
Q, K and V back to ``[batch, heads, length, head size]`` and runs ``scaled_dot_product_attention``
with the padding masked, as the padded path does: at length 128 it is about 3 % of a layer's FLOPs,
and a varlen kernel (FlashAttention's) would need a package the project does not require.

The same arithmetic as ``BertModel`` with SDPA attention (the padded positions' outputs aside, which
no loss reads): tests/test_pretrain_speed.py checks the loss and every gradient, with NSP, MLM only
and adapters. The modules are the model's own, so checkpoints, DDP and adapters are unchanged; with
``pretrain.gradient_checkpointing`` each layer is recomputed in the backward pass, as transformers does.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint


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


def _layer(layer, hidden: torch.Tensor, index: torch.Tensor, shape: tuple[int, int],
           key_mask: torch.Tensor | None) -> torch.Tensor:
    """One ``BertLayer`` on the packed tokens ``hidden`` ([tokens, hidden])."""
    attention = layer.attention.self
    batch, length = shape
    heads, size = attention.num_attention_heads, attention.attention_head_size

    def spread(x: torch.Tensor) -> torch.Tensor:  # [tokens, heads * size] -> [batch, heads, length, size]
        padded = x.new_zeros(batch * length, x.shape[-1]).index_copy(0, index, x)
        return padded.view(batch, length, heads, size).transpose(1, 2)

    q, k, v = (spread(projection(hidden)) for projection in (attention.query, attention.key, attention.value))
    dropout = attention.dropout.p if attention.training else 0.0
    context = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, dropout_p=dropout)
    context = context.transpose(1, 2).reshape(batch * length, heads * size).index_select(0, index)
    attended = layer.attention.output(context, hidden)
    return layer.output(layer.intermediate(attended), attended)


def encode(bert, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor,
           unpad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``bert``'s (last hidden state, pooler output): unpadded when ``unpad`` and the batch has padding,
    else ``bert``'s own forward (a batch of full rows gains nothing from packing: measured 0.96x on CPU)."""
    if unpad:
        index = real_tokens(attention_mask)
        if index.numel() < attention_mask.numel():
            hidden = unpadded_sequence_output(bert, input_ids, token_type_ids, attention_mask, index)
            return hidden, (bert.pooler(hidden) if bert.pooler is not None else None)
    out = bert(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
    return out.last_hidden_state, out.pooler_output


def real_tokens(attention_mask: torch.Tensor) -> torch.Tensor:
    """The flat positions of the real tokens, row after row (one host sync on CUDA)."""
    return attention_mask.reshape(-1).nonzero().squeeze(1)


def unpadded_sequence_output(bert, input_ids: torch.Tensor, token_type_ids: torch.Tensor,
                             attention_mask: torch.Tensor, index: torch.Tensor | None = None) -> torch.Tensor:
    """``bert(...).last_hidden_state`` ([batch, length, hidden]) computed on the real tokens only; the
    padded positions hold zeros. ``bert`` is a ``BertModel`` (``model.bert``) with absolute positions;
    ``index``: ``real_tokens(attention_mask)``, when the caller has it."""
    batch, length = input_ids.shape
    index = real_tokens(attention_mask) if index is None else index
    embedded = bert.embeddings(input_ids=input_ids, token_type_ids=token_type_ids)
    hidden = embedded.reshape(batch * length, -1).index_select(0, index)
    key_mask = attention_mask.bool()[:, None, None, :]  # every query sees its row's real tokens
    for layer in bert.encoder.layer:
        if getattr(layer, "gradient_checkpointing", False) and layer.training and torch.is_grad_enabled():
            # pretrain.gradient_checkpointing (transformers marks each layer): recompute it in the backward
            hidden = torch.utils.checkpoint.checkpoint(_layer, layer, hidden, index, (batch, length), key_mask,
                                                       use_reentrant=False)
        else:
            hidden = _layer(layer, hidden, index, (batch, length), key_mask)
    return hidden.new_zeros(batch * length, hidden.shape[-1]).index_copy(0, index, hidden).view(batch, length, -1)
