"""Bottleneck adapters after each feed-forward block, base model frozen (seed 002, Appendix D).

    Adapter_l(h_l, r_l) = U_l(ReLU(D_l(h_l))) + r_l

with r_l the feed-forward output and h_l the output of the layer norm that follows it; the
result goes through that same layer norm with the attention output again (Pfeiffer et al.
2020's placement, AdapterHub's "pfeiffer" config). Own module because the ``adapters``
library (1.3.0) requires transformers ~= 4.57 and this project pins 5.23.

U starts at zero, so a freshly adapted model computes exactly what the base model did.
Adapter weights are saved beside the HF weights (``adapters.safetensors`` + ``adapter_config.json``):
the HF directory stays loadable as a plain BERT, and ``load_adapters`` puts them back.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from orchestrator.core.errors import ConfigError, InputError

ADAPTER_WEIGHTS = "adapters.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


class BottleneckAdapter(nn.Module):
    def __init__(self, hidden: int, bottleneck: int):
        super().__init__()
        self.down = nn.Linear(hidden, bottleneck)
        self.up = nn.Linear(bottleneck, hidden)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """A fresh adapter: the identity (``up`` zero), ``down`` normal."""
        nn.init.normal_(self.down.weight, std=0.02)
        nn.init.zeros_(self.down.bias)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)

    def forward(self, h: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.up(torch.relu(self.down(h))) + residual


class AdaptedBertOutput(nn.Module):
    """Drop-in for transformers' BertOutput (same parameter names plus ``adapter``)."""

    def __init__(self, base: nn.Module, bottleneck: int):
        super().__init__()
        self.dense, self.dropout, self.LayerNorm = base.dense, base.dropout, base.LayerNorm
        self.adapter = BottleneckAdapter(base.dense.out_features, bottleneck)

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        r = self.dropout(self.dense(hidden_states))
        h = self.LayerNorm(r + input_tensor)
        return self.LayerNorm(self.adapter(h, r) + input_tensor)


def add_adapters(model: nn.Module, reduction_factor: int, train_heads: bool = True) -> dict[str, int]:
    """Insert an adapter into every layer, freeze everything else (the pretraining heads optionally
    trainable). ``model`` is a BERT with heads (``model.bert``) or the bare encoder (``BertModel``).

    Returns {"trainable": n, "total": n} parameter counts.
    """
    hidden = model.config.hidden_size
    bottleneck = max(1, hidden // reduction_factor)
    layers = adapter_layers(model)
    if layers is None:
        raise ConfigError(f"adapters need a BERT-style encoder.layer (each layer's output: dense, dropout, LayerNorm); "
                          f"{type(model).__name__} has none")
    for p in model.parameters():
        p.requires_grad_(False)
    for layer in layers:
        layer.output = AdaptedBertOutput(layer.output, bottleneck)
    if train_heads and hasattr(model, "cls"):
        for name, p in model.named_parameters():
            if name.startswith("cls.") and "word_embeddings" not in name:
                p.requires_grad_(True)
        # The MLM decoder is tied to the (frozen) word embeddings; only its bias and transform train.
        model.cls.predictions.decoder.weight.requires_grad_(False)
    model.config.adapter_reduction_factor = reduction_factor
    return parameter_counts(model)


def adapter_layers(model: nn.Module) -> list[nn.Module] | None:
    """The layers an adapter goes into: a BERT-style ``encoder.layer`` (of ``model.bert`` where it has heads),
    each layer's ``output`` a BertOutput's dense, dropout and LayerNorm (BERT, RoBERTa, ELECTRA); None for a
    model without them (DistilBERT's ``transformer.layer``, ALBERT's shared layer groups)."""
    layers = getattr(getattr(getattr(model, "bert", model), "encoder", None), "layer", None)
    if not isinstance(layers, nn.ModuleList) or not all(
            all(hasattr(getattr(layer, "output", None), part) for part in ("dense", "dropout", "LayerNorm"))
            for layer in layers):
        return None
    return list(layers)


def check_adaptable(name: str, model_dir: str | Path) -> None:
    """InputError naming the model's config.json unless adapters go into it (``adapter_layers``): the model is
    built from its config on the meta device, no weights read. A config transformers cannot build from is left
    to the trial's load, whose message names it."""
    from transformers import AutoConfig, AutoModel  # heavy: transformers

    try:
        config = AutoConfig.from_pretrained(str(model_dir))
        with torch.device("meta"):
            model = AutoModel.from_config(config)
    except Exception:
        return
    if adapter_layers(model) is None:
        raise InputError(Path(model_dir) / "config.json",
                         f"model {name}: model_type {config.model_type!r} ({type(model).__name__}) has no BERT-style "
                         "encoder.layer for the search space's tune: adapters",
                         expected="a BERT-style encoder (BERT, RoBERTa, ELECTRA), or tune: full")


def parameter_counts(model: nn.Module) -> dict[str, int]:
    return {"trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "total": sum(p.numel() for p in model.parameters())}


def has_adapters(model: nn.Module) -> bool:
    return any(isinstance(m, AdaptedBertOutput) for m in model.modules())


def adapter_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if ".adapter." in k}


def save_adapters(model: nn.Module, out_dir: Path) -> None:
    """Write the adapter weights and their config next to an HF model directory."""
    out_dir = Path(out_dir)
    save_file(adapter_state(model), str(out_dir / ADAPTER_WEIGHTS))
    (out_dir / ADAPTER_CONFIG).write_text(json.dumps(
        {"reduction_factor": model.config.adapter_reduction_factor, "placement": "pfeiffer"}, indent=2))


def saved_adapters(model_dir: str | Path) -> bool:
    """Whether a model directory carries adapters (``save_adapters``' two files)."""
    return (Path(model_dir) / ADAPTER_CONFIG).is_file() and (Path(model_dir) / ADAPTER_WEIGHTS).is_file()


def load_adapters(model: nn.Module, model_dir: Path) -> nn.Module:
    """Re-insert adapters saved by ``save_adapters`` into a model loaded from ``model_dir``: the
    model with heads they were trained in, or its bare encoder (``AutoModel``, for fine-tuning).
    The weights were saved from a model with heads (``bert.encoder...``); a bare encoder's names
    lack that prefix, so it is matched on the names as saved or with ``bert.`` removed."""
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / ADAPTER_CONFIG).read_text())
    if not has_adapters(model):
        add_adapters(model, cfg["reduction_factor"])
    saved = load_file(str(model_dir / ADAPTER_WEIGHTS))
    wanted = set(adapter_state(model))
    if not wanted & set(saved):
        saved = {k.removeprefix("bert."): v for k, v in saved.items()}
    missing = wanted - set(saved)
    if missing:
        raise ValueError(f"{model_dir / ADAPTER_WEIGHTS} lacks {sorted(missing)[:3]}")
    model.load_state_dict({k: v for k, v in saved.items() if k in wanted}, strict=False)
    return model
