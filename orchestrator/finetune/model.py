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
