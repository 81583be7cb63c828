"""BERT's encoder in plain PyTorch for fine-tuning: transformers' ``BertModel`` computation, to the bit, without
transformers' model stack.

    encoder = native_encoder(model_dir)        # None where transformers' own must load it (``load_encoder``)

Why: a sweep's worker imported transformers' model code (``modeling_utils``, and through it
``torch.distributed.tensor``, ``torch._dynamo`` and scipy's optimizers for other models' losses) for about
1.5 s before its first trial could train: about 2 points of the laptop sweep's overhead, which issue 31 holds
to 10 % (``benchmarks/sweep_overhead.py``). Nor does it import transformers to read the config (``BertSettings``:
config.json with ``BertConfig``'s defaults; 0.8 s a worker with the tokenizer's, ``finetune.tokenizer``);
transformers writes what an export saves (``BertSettings.save_pretrained``) and loads every other model.

The same parameter and buffer names as ``BertModel`` (a state dict loads into either), the same operations in
the same order, dropout drawn from the same generator in the same order, and the padding mask given to
``scaled_dot_product_attention`` as transformers gives it (none without padding, else a boolean 4-D mask): the
outputs, gradients and so every trial's numbers equal transformers' bit for bit (``tests/test_native_bert.py``).
The pooler's weights are kept (an export writes them) but not run: fine-tuning's heads read [CLS]'s state.

Used only where ``BertModel`` computes exactly this (``supported``): absolute positions, GELU, an encoder (not
a decoder), no feed-forward chunking, one weights file holding every weight ``BertModel`` has. A checkpoint
that lacks some (no pooler) gets random ones from transformers, which draws from the generator the trial's
dropout then draws from, so that one loads there. ``ORCH_NATIVE_BERT=0`` in the environment always gives
transformers' own.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: The environment switch: "0" loads every encoder with transformers
SWITCH = "ORCH_NATIVE_BERT"


@dataclass
class EncoderOutput:
    """What fine-tuning reads of ``BertModel``'s output."""
    last_hidden_state: torch.Tensor


#: ``BertConfig``'s defaults for what ``NativeBertModel`` and ``supported`` read (checked against transformers' in
#: ``tests/test_finetune_tokenizer.py``)
BERT_DEFAULTS = {"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                 "intermediate_size": 3072, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                 "attention_probs_dropout_prob": 0.1, "max_position_embeddings": 512, "type_vocab_size": 2,
                 "layer_norm_eps": 1e-12, "pad_token_id": 0, "is_decoder": False, "add_cross_attention": False,
                 "chunk_size_feed_forward": 0}
_INTS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
         "max_position_embeddings", "type_vocab_size", "chunk_size_feed_forward")
_FLOATS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "layer_norm_eps")


class BertSettings:
    """A BERT directory's config.json as ``BertConfig.from_pretrained`` reads it, for ``NativeBertModel``, without
    importing transformers: an attribute is the value set on it, else config.json's, else ``BERT_DEFAULTS``'. What
    needs transformers' config (``to_dict``, ``save_pretrained``: an export) reads it from the directory then, with
    the attributes set since. ``read`` gives None where a value is not what ``BertConfig`` would plainly take."""

    def __init__(self, source: Path, values: dict[str, Any]):
        self.__dict__["_source"], self.__dict__["_values"], self.__dict__["_set"] = source, values, {}

    @classmethod
    def read(cls, model_dir: Path, values: Any = None) -> BertSettings | None:
        """``model_dir``'s settings, from its config.json or from ``values`` (that file as read already)."""
        if values is None:
            values = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        if not isinstance(values, dict) or {"attn_implementation", "_attn_implementation"} & set(values):
            return None
        settings = cls(model_dir, values)
        if not all(type(getattr(settings, k)) is int for k in _INTS) or \
                not all(type(getattr(settings, k)) in (int, float) for k in _FLOATS):
            return None  # BertConfig's load says what is wrong, or takes what this one would read otherwise
        return settings

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # copy's and pickle's probes: what a plain object has
            raise AttributeError(name)
        for values in (self.__dict__.get("_set", {}), self.__dict__.get("_values", {}), BERT_DEFAULTS):
            if name in values:
                return values[name]
        if name == "_attn_implementation":
            return None  # as BertConfig's when config.json names none
        raise AttributeError(f"BertSettings has no {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        self._set[name] = value

    def transformers_config(self) -> Any:
        """transformers' ``BertConfig`` of the directory, with the attributes set here since."""
        from transformers import BertConfig  # heavy: transformers (its config only)

        config = BertConfig.from_pretrained(str(self._source))
        for name, value in self._set.items():
            setattr(config, name, value)
        return config

    def to_dict(self) -> dict[str, Any]:
        return self.transformers_config().to_dict()

    def save_pretrained(self, out_dir: str) -> None:
        self.transformers_config().save_pretrained(out_dir)


class _Embeddings(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        # given their (uninitialised) weights, the tables draw none: on the meta device a draw runs through
        # torch's Python reference kernels, whose first call imports torch._dynamo (1.1 s)
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id,
                                            _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size,
                                                _weight=torch.empty(config.max_position_embeddings, config.hidden_size))
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size,
                                                  _weight=torch.empty(config.type_vocab_size, config.hidden_size))
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        # made on the CPU whatever the default device (``native_encoder`` builds on the meta device, where arange
        # runs through torch's Python reference kernels, whose first call imports sympy: 0.4 s)
        positions = torch.arange(config.max_position_embeddings, device="cpu")
        self.register_buffer("position_ids", positions.expand((1, -1)), persistent=False)
        self.register_buffer("token_type_ids", torch.zeros(self.position_ids.size(), dtype=torch.long, device="cpu"),
                             persistent=False)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None) -> torch.Tensor:
        batch_size, seq_length = input_ids.size()
        position_ids = self.position_ids[:, :seq_length]
        if token_type_ids is None:  # the buffer's zeros, as transformers takes them
            buffered = torch.gather(self.token_type_ids.expand(position_ids.shape[0], -1), dim=1, index=position_ids)
            token_type_ids = buffered.expand(batch_size, seq_length)
        embeddings = self.word_embeddings(input_ids) + self.token_type_embeddings(token_type_ids)
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class _SelfAttention(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.scaling = self.attention_head_size ** -0.5
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        input_shape = hidden_states.shape[:-1]
        shape = (*input_shape, -1, self.attention_head_size)
        q = self.query(hidden_states).view(*shape).transpose(1, 2)
        k = self.key(hidden_states).view(*shape).transpose(1, 2)
        v = self.value(hidden_states).view(*shape).transpose(1, 2)
        dropout = self.dropout.p if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, scale=self.scaling,
                                             is_causal=False)
        out = out.reshape(out.shape[0], -1, q.shape[2], v.shape[-1]).transpose(1, 2).contiguous()
        return out.reshape(*input_shape, -1).contiguous()


class _Output(nn.Module):
    """dense, dropout, LayerNorm of the sum with the input: the attention's output and the feed-forward's (named
    as transformers names them: ``AdaptedBertOutput`` wraps the latter as it wraps transformers')."""

    def __init__(self, config: Any, inputs: int):
        super().__init__()
        self.dense = nn.Linear(inputs, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + input_tensor)


class _Attention(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.self = _SelfAttention(config)
        self.output = _Output(config, config.hidden_size)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        return self.output(self.self(hidden_states, mask), hidden_states)


class _Intermediate(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(hidden_states))  # transformers' "gelu": the exact (erf) GELU


class _Layer(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.attention = _Attention(config)
        self.intermediate = _Intermediate(config)
        self.output = _Output(config, config.intermediate_size)

    def forward(self, hidden_states: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        attention = self.attention(hidden_states, mask)
        return self.output(self.intermediate(attention), attention)


class _Encoder(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.layer = nn.ModuleList([_Layer(config) for _ in range(config.num_hidden_layers)])


class _Pooler(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()


class NativeBertModel(nn.Module):
    """``BertModel``'s parameters and its encoder's computation (see the module's docstring). Its embedding
    tables are not initialised: ``native_encoder`` loads every weight."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)
        self.pooler = _Pooler(config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> EncoderOutput:
        hidden = self.embeddings(input_ids, token_type_ids)
        mask = sdpa_padding_mask(attention_mask, hidden.shape[1])
        for layer in self.encoder.layer:
            hidden = layer(hidden, mask)
        return EncoderOutput(last_hidden_state=hidden)

    def save_pretrained(self, out_dir: str | Path, state_dict: dict[str, torch.Tensor] | None = None,
                        safe_serialization: bool = True) -> None:
        """``config.json`` and ``model.safetensors`` as transformers' ``BertModel.save_pretrained`` writes them:
        a directory transformers (and ``load_encoder``) loads as a ``BertModel``."""
        from safetensors.torch import save_file  # heavy: safetensors

        if not safe_serialization:
            raise ValueError("NativeBertModel writes safetensors only")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        self.config.architectures = ["BertModel"]
        self.config.dtype = "float32"
        self.config.save_pretrained(str(out_dir))
        state = state_dict if state_dict is not None else self.state_dict()
        save_file({k: v.detach().cpu().contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"),
                  metadata={"format": "pt"})


#: devices where a mask's values are read here for free; elsewhere reading them waits for the device (a host sync)
MASK_READ_DEVICES = frozenset({"cpu"})


def sdpa_padding_mask(attention_mask: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """The mask transformers gives ``scaled_dot_product_attention`` for a 2-D padding mask: none when nothing
    is padded (its kernels without a mask), else a boolean [batch, 1, length, length] (True: attend). A 4-D
    mask is taken as it is (a bundle's rows).

    Whether anything is padded is read from the mask on the CPU only (``MASK_READ_DEVICES``). On a GPU that read
    would wait for the device at every forward, so there a mask given is used, and a caller whose batch has no
    padding gives none (fine-tuning's batches, which know their lengths on the host: ``finetune.loop._groups``);
    an all-ones mask given on a GPU computes the same attention with a masked kernel."""
    if attention_mask is None or attention_mask.dim() == 4:
        return attention_mask
    keep = attention_mask.bool()
    if keep.device.type in MASK_READ_DEVICES and keep.all():
        return None
    every_query = torch.arange(length, device=keep.device)[None, None, :, None] >= 0
    return every_query & keep[:, None, None, :]


def supported(config: Any) -> bool:
    """Whether ``BertModel`` computes for ``config`` exactly what ``NativeBertModel`` does."""
    return (getattr(config, "model_type", None) == "bert" and config.hidden_act == "gelu"
            and getattr(config, "_attn_implementation", None) in (None, "sdpa")  # a config asking for eager: its own
            and getattr(config, "position_embedding_type", "absolute") == "absolute"
            and not config.is_decoder and not getattr(config, "add_cross_attention", False)
            and not config.chunk_size_feed_forward and config.hidden_size % config.num_attention_heads == 0)


def _weights(model_dir: Path, use_safetensors: bool | None) -> dict[str, torch.Tensor] | None:
    """The one weights file's tensors; None where there is none, several (shards: also when a single pickle lies
    beside a safetensors index, which transformers prefers), or only a pickle where ``use_safetensors`` asks for
    safetensors (transformers then says what is wrong)."""
    safe, pickled = model_dir / "model.safetensors", model_dir / "pytorch_model.bin"
    if (model_dir / "model.safetensors.index.json").is_file():
        return None
    if safe.is_file():
        from safetensors.torch import load_file  # heavy: safetensors

        return load_file(str(safe))
    if pickled.is_file() and use_safetensors is not True:
        return torch.load(pickled, map_location="cpu", weights_only=True)  # a pickle of other objects: refused
    return None


def native_encoder(model_dir: str | Path, use_safetensors: bool | None = None) -> NativeBertModel | None:
    """``model_dir``'s encoder as ``NativeBertModel`` in fp32, or None where transformers must load it (the
    module's docstring): building it draws no random numbers, as transformers' load draws none."""
    model_dir = Path(model_dir)
    if os.environ.get(SWITCH, "1") == "0" or not (model_dir / "config.json").is_file():
        return None
    try:
        values = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        if values.get("model_type") != "bert":
            return None
        config = BertSettings.read(model_dir, values)
        if config is None:
            from transformers import BertConfig  # heavy: transformers (its config only)

            config = BertConfig.from_pretrained(str(model_dir))
        if not supported(config):
            return None
        saved = _weights(model_dir, use_safetensors)
    except Exception:  # a damaged or refused file: transformers' load names it as it always has
        return None
    if saved is None:
        return None
    if any(k.startswith("bert.") for k in saved):  # a model with heads (pretraining's): its encoder's weights
        saved = {k.removeprefix("bert."): v for k, v in saved.items() if k.startswith("bert.")}
    with torch.device("meta"):  # no initial weights drawn: every one is loaded
        model = NativeBertModel(config)
    wanted = model.state_dict()
    if set(wanted) - set(saved):
        return None
    model.load_state_dict({k: saved[k].to(torch.float32) for k in wanted}, assign=True)
    config._attn_implementation = "sdpa"
    return model.eval()  # as transformers' from_pretrained gives it


__all__ = ["BERT_DEFAULTS", "BertSettings", "EncoderOutput", "MASK_READ_DEVICES", "NativeBertModel", "SWITCH",
           "native_encoder", "sdpa_padding_mask", "supported"]
