"""A BERT encoder (any Hugging Face BERT directory) with one small head per task family.

A directory that carries adapters (``orchestrator.modeling.adapters.save_adapters``, written by a
pretraining run with ``pretrain.adapters``) is loaded with them in place.

One module instead of an AutoModelFor* per family: the HoC multilabel head and the sentence-pair
regression head share the [CLS] featuriser, and the pretrain stage's BertForPreTraining
checkpoints load through AutoModel (the MLM/NSP heads are simply not used).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from orchestrator.core.errors import ConfigError
from orchestrator.finetune.spec import TaskSpec


def num_outputs(spec: TaskSpec) -> int:
    return 1 if spec.family == "sts" else len(spec.labels)


def prior_log_odds(targets: Sequence[Sequence[float]]) -> torch.Tensor:
    """Log-odds of each label's frequency in 0/1 training targets (examples x labels), with half a
    count added to both outcomes so a label never (or always) seen keeps a finite bias."""
    t = torch.as_tensor(targets, dtype=torch.float64)
    p = (t.sum(0) + 0.5) / (t.shape[0] + 1.0)
    return torch.log(p / (1 - p)).float()


class TaskModel(nn.Module):
    """Encoder + dropout + linear; token-level logits for NER, [CLS] logits otherwise."""

    def __init__(self, model_dir: str | Path, spec: TaskSpec, use_safetensors: bool | None = None,
                 encoder: nn.Module | None = None):
        super().__init__()
        from orchestrator.modeling.adapters import saved_adapters  # heavy: safetensors
        from orchestrator.modeling.encoder import load_encoder

        self.family = spec.family
        # fp32 masters, as pretraining; use_safetensors=True refuses pickled weights (an exported model).
        # ``encoder``: model_dir's encoder as load_encoder gives it, already loaded (a per-process copy)
        self.encoder = encoder if encoder is not None else load_encoder(model_dir, use_safetensors=use_safetensors)
        if saved_adapters(model_dir):  # a model pretrained with adapters is fine-tuned with them in place
            self.encoder.requires_grad_(True)  # full fine-tuning: the base and its adapters
        hidden = self.encoder.config.hidden_size
        self.dropout = nn.Dropout(getattr(self.encoder.config, "hidden_dropout_prob", 0.1))
        self.head = nn.Linear(hidden, num_outputs(spec))
        nn.init.normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def tune_adapters_only(self, reduction_factor: int) -> None:
        """Adapter fine-tuning (seed 002): freeze the encoder but its adapters, fresh ones of hidden /
        ``reduction_factor`` when it has none; the task head trains."""
        from orchestrator.modeling.adapters import add_adapters, has_adapters  # heavy: safetensors

        if not has_adapters(self.encoder):
            add_adapters(self.encoder, reduction_factor)
        for name, p in self.encoder.named_parameters():
            p.requires_grad_(".adapter." in name)

    def reinit_top_layers(self, count: int) -> None:
        """Re-initialise the encoder's top ``count`` layers as a fresh BERT's are (Zhang et al. 2021, "Revisiting
        Few-sample BERT Fine-tuning"): Linear weights normal with the config's ``initializer_range``, biases 0,
        LayerNorm 1 and 0, an adapter in them as ``add_adapters`` starts one. The layers below keep their
        pretrained weights; the pooler is not re-initialised, as the heads do not read it."""
        from orchestrator.modeling.adapters import BottleneckAdapter, adapter_layers  # heavy: safetensors

        layers = adapter_layers(self.encoder)
        if layers is None or not 1 <= count <= len(layers):
            raise ConfigError(f"reinit_layers {count}: the encoder ({type(self.encoder).__name__}) has "
                              f"{len(layers or [])} BERT-style layers; give 0 (none) up to that many")
        std = getattr(self.encoder.config, "initializer_range", 0.02)
        with torch.no_grad():
            for layer in layers[-count:]:
                for name, module in layer.named_modules():
                    if isinstance(module, BottleneckAdapter):
                        module.reset_parameters()
                    elif ".adapter." in f".{name}.":  # an adapter's own layers: reset with it
                        continue
                    elif isinstance(module, nn.Linear):
                        module.weight.normal_(0.0, std)
                        module.bias.zero_()
                    elif isinstance(module, nn.LayerNorm):
                        module.weight.fill_(1.0)
                        module.bias.zero_()

    def init_bias_to_prior(self, targets: Sequence[Sequence[float]] | Sequence[float]) -> None:
        """Multilabel: start each sigmoid output at its label's training frequency instead of 0.5.
        With the zero bias of BERT's heads, Adam moves the bias only ~lr per step, so on a short run
        the encoder itself is pushed to emit the label prior and every output stays below 0.5.
        Sts: the regression output starts at the mean training score (the same reasoning: from 0, a
        short run spends its first epochs moving the output to the mean)."""
        if self.family not in ("multilabel", "sts"):
            raise ValueError(f"a prior bias is defined for sigmoid (multilabel) and sts heads, not {self.family}")
        with torch.no_grad():
            if self.family == "sts":
                self.head.bias.fill_(float(torch.as_tensor(targets, dtype=torch.float64).mean()))
            else:
                self.head.bias.copy_(prior_log_odds(targets))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
        states = out.last_hidden_state
        if self.family == "ner":
            return self.head(self.dropout(states))
        logits = self.head(self.dropout(states[:, 0]))
        return logits.squeeze(-1) if self.family == "sts" else logits

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if self.family == "sts":
            return nn.functional.mse_loss(logits, labels.float())
        if self.family == "multilabel":
            return nn.functional.binary_cross_entropy_with_logits(logits, labels.float())
        if self.family == "ner":
            return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1),
                                               ignore_index=-100)
        return nn.functional.cross_entropy(logits, labels)
