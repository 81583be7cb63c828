"""One fine-tuning trial's settings: plain values, so a trial travels to a Ray worker as a dict
and the sweep can plan trials without importing torch."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class TrialSpec:
    """Everything one trial needs; plain values so it travels to a Ray worker as a dict."""

    trial_id: str
    model_name: str
    model_dir: str
    task: str
    data_dir: str  # the directory holding this task's split files
    learning_rate: float
    seed: int
    eval_epochs: tuple[int, ...]
    batch_size: int = 32
    max_seq_length: int = 128
    max_train_examples: int = 0
    max_eval_examples: int = 0
    weight_decay: float = 0.01
    optimizer: str = "adamw"  # adamw (weight_decay off biases and LayerNorm) | adam (no weight decay: seed 000)
    warmup_proportion: float = 0.1
    num_threads: int = 1
    device: str = "auto"
    fold: int = -1  # cross-validated tasks: the held-out fold of this trial (-1: fixed splits)
    cache_dir: str = ""  # where tokenised splits are kept between trials ("" = no disk cache)
    tune: str = "full"  # "full": every weight trains; "adapters": adapters and head only
    adapter_reduction_factor: int = 16  # tune="adapters" on a model without adapters: fresh ones of this size
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 with a dynamic loss scaler)
    # > 0: early stopping. Dev after every epoch up to max_epochs; stop after this many epochs without a
    # better dev score; test once, on the weights of the best dev epoch. 0: evaluate at eval_epochs.
    patience: int = 0

    @property
    def max_epochs(self) -> int:
        return max(self.eval_epochs)
