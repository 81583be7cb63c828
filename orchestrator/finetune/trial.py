"""One fine-tuning trial's settings: plain values, so a trial travels to a Ray worker as a dict
and the sweep can plan trials without importing torch. With them, what planning needs of a trial: which
trials train together as one bundle (``group_trials``: ``bundle_key``, ``model_family``; the training is
``orchestrator.finetune.bundle``) and whether a model directory is there to fine-tune (``model_dir_ok``)."""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.manifest import file_sha256
from orchestrator.core.reuse import TOKENIZER_FILES, content_key


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
    reinit_layers: int = 0  # > 0: the encoder's top layers start fresh (TaskModel.reinit_top_layers)

    @property
    def max_epochs(self) -> int:
        return max(self.eval_epochs)


BUNDLED_PRECISIONS = ("fp32", "bf16")  # fp16's dynamic loss scale is a per-trial state: those train alone
#: config.json keys that do not change what fine-tuning computes from a model directory: the class that saved
#: it, where it came from, the library's version, the dtype of its saved weights (they load as fp32 masters)
CONFIG_KEYS_IGNORED = ("architectures", "_name_or_path", "transformers_version", "torch_dtype", "dtype")
#: the files that make a directory's tokenizer (equal files: equal tokenised splits) and its adapters' shape
FAMILY_FILES = (*TOKENIZER_FILES, "adapter_config.json")


def model_family(model_dir: str) -> str | None:
    """What a model directory shares with the models whose trials it can be bundled with: its architecture
    (config.json but ``CONFIG_KEYS_IGNORED``) and its tokenizer's files, as one content key. None (bundled
    with no other model): no readable config.json."""
    path = Path(model_dir)
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    files = {name: file_sha256(path / name) for name in FAMILY_FILES if (path / name).is_file()}
    return content_key({k: v for k, v in config.items() if k not in CONFIG_KEYS_IGNORED}, files)


def bundle_key(trial: TrialSpec, family: str | None = None, seeds: bool = False) -> tuple | None:
    """What a trial shares with the trials it can be bundled with: every setting but its id and learning
    rate (``seeds``: and its seed); given its model's ``family`` (full fine-tuning only), that instead of its
    model. None: the trial trains alone."""
    if trial.precision not in BUNDLED_PRECISIONS:
        return None
    settings = dataclasses.asdict(trial)
    del settings["trial_id"], settings["learning_rate"]
    if seeds:
        del settings["seed"]
    if family is not None and trial.tune == "full":
        del settings["model_name"], settings["model_dir"]
        settings["model_family"] = family
    return tuple(sorted(settings.items()))


def group_trials(trials: Sequence[TrialSpec], bundle: bool, models: bool = False,
                 seeds: bool = False) -> list[list[TrialSpec]]:
    """``trials`` in groups that train together (in the order of their first trial); with ``bundle``
    False, or for a trial ``bundle_key`` keeps alone, groups of one. ``models``: the trials of models of
    one ``model_family`` group together too; ``seeds``: those of every seed too."""
    families = {d: model_family(d) for d in {t.model_dir for t in trials}} if bundle and models else {}
    groups: dict[Any, list[TrialSpec]] = {}
    for i, trial in enumerate(trials):
        key = bundle_key(trial, families.get(trial.model_dir), seeds) if bundle else None
        groups.setdefault(("alone", i) if key is None else key, []).append(trial)
    return list(groups.values())


def model_dir_ok(path: str | Path) -> bool:
    """A loadable HF BERT directory has a config.json and a tokenizer vocabulary."""
    p = Path(path)
    return (p / "config.json").is_file() and ((p / "vocab.txt").is_file() or (p / "tokenizer.json").is_file())


def mark_encoded(cache_dir: Path) -> float:
    """Start a run of the tokenised-split cache ``cache_dir``: the time, on its file system's clock, after
    which a split read or written counts as used by this run (``prune_encoded``)."""
    marker = Path(cache_dir) / ".run"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()  # made, or its time set to now
    return marker.stat().st_mtime


def prune_encoded(cache_dir: Path, since: float) -> tuple[int, int]:
    """Delete the tokenised splits of ``cache_dir`` (and its ``restricted/``) that no trial read or wrote since
    ``since`` (``mark_encoded``): those of other tokenizers, task files, lengths or caps, which grow with every
    model and data change (about 11x a task file each); and the driver's tokenizer copies (``tokenizers/``) no
    sweep run since wrote or used. Returns (files, bytes) deleted."""
    files = n_bytes = 0
    for path in [*Path(cache_dir).glob("*.json"), *Path(cache_dir).glob("restricted/*.json"),
                 *Path(cache_dir).glob("tokenizers/*.json")]:  # finetune.tokenizer's copies
        try:
            stat = path.stat()
            if stat.st_mtime < since:
                path.unlink()
                files, n_bytes = files + 1, n_bytes + stat.st_size
        except OSError:  # gone already, or a folder we may not write: kept
            continue
    return files, n_bytes
