"""Checkpoints: a loadable Hugging Face directory plus the training state needed to resume exactly.

    ckpt-<step>/
      config.json, model.safetensors          BertForPreTraining / BertForMaskedLM (save_pretrained)
      vocab.txt, tokenizer.json, ...          the tokenizer, so every checkpoint is usable on its own
      adapters.safetensors, adapter_config.json   (adapter training only)
      training_state.pt                       optimizer, scheduler, scaler, step, phase (torch.save), and
                                              ``resume``: every worker's random generators (torch, CUDA,
                                              numpy, Python) and data position (epoch, batches read, the
                                              mask generator's state), so a resume goes on where it stopped
      trainer_state.json                      step / phase / metrics, human-readable
      checkpoint.json                         every file above with its size: a copy that was cut off
                                              (a node lost while Ray persisted it) is never taken

Loading uses safetensors and ``torch.load(weights_only=True)`` only: a checkpoint is data, never code.
Finding, naming and checking checkpoints imports neither torch nor transformers (a dry run does them).
"""
from __future__ import annotations

import json
import pickle
import shutil
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.core.artifacts import limit_tokenizer, usable_positions
from orchestrator.core.config import flatten
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import read_json_object
from orchestrator.core.reuse import KEY_FIELD, TOKENIZER_FILES

if TYPE_CHECKING:
    from transformers import PreTrainedModel

CHECKPOINTS = "checkpoints"  # in a pretraining output: Ray Train's persisted checkpoints (the default place)
STORAGE_RECORD = "storage.json"  # in a pretraining output, with pretrain.storage_path: where its checkpoints are
STATE_FILE = "training_state.pt"
RUN_RECORD = "run.json"  # in out_dir/checkpoints: the key and settings of the run the checkpoints belong to
TRAINER_STATE = "trainer_state.json"
COMPLETE = "checkpoint.json"
#: Without these a checkpoint's (and final/'s) tokenizer does not load as the one trained with.
REQUIRED_TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json")
HF_FILES = ("config.json", "model.safetensors", "generation_config.json", "adapters.safetensors",
            "adapter_config.json") + TOKENIZER_FILES


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:07d}"


def save_hf(model: PreTrainedModel, tokenizer_dir: Path, out_dir: Path) -> None:
    """Model weights (safetensors) + config + tokenizer files into ``out_dir``."""
    from orchestrator.modeling.adapters import has_adapters, save_adapters  # heavy: torch

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if has_adapters(model):
        base_state = {k: v for k, v in model.state_dict().items() if ".adapter." not in k}
        model.save_pretrained(str(out_dir), state_dict=base_state)
        save_adapters(model, out_dir)
    else:
        model.save_pretrained(str(out_dir))
    check_tokenizer_files(tokenizer_dir)
    for name in TOKENIZER_FILES:
        src = Path(tokenizer_dir) / name
        if src.is_file():
            shutil.copy2(src, out_dir / name)
    limit_tokenizer(out_dir, usable_positions(model.config.to_dict()) or model.config.max_position_embeddings)


def check_tokenizer_files(tokenizer_dir: Path) -> None:
    """Raise, naming the file, when ``tokenizer_dir`` lacks a file the saved model needs (on another
    node than the driver's, a tokenizer directory that is not on shared storage is missing)."""
    for name in REQUIRED_TOKENIZER_FILES:
        if not (Path(tokenizer_dir) / name).is_file():
            raise InputError(Path(tokenizer_dir) / name, f"tokenizer file not found on {socket.gethostname()}",
                             expected="the tokenizer directory, readable wherever checkpoints are written "
                                      "(several nodes: on shared storage, pretrain.shared_storage=true)")


def save_checkpoint(out_dir: Path, model: PreTrainedModel, tokenizer_dir: Path, *, optimizer, scheduler, scaler,
                    state: dict[str, Any], resume: dict[str, Any] | None = None) -> Path:
    """Write a complete checkpoint into ``out_dir`` (a fresh directory Ray then persists).
    ``resume``: {"world", "rng" (per rank), "data": {"phase", "positions" (per rank)}}, see the loop."""
    import torch  # heavy: torch

    save_hf(model, tokenizer_dir, out_dir)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "scaler": scaler.state_dict() if scaler is not None else None, "state": state, "resume": resume},
               Path(out_dir) / STATE_FILE)
    (Path(out_dir) / TRAINER_STATE).write_text(json.dumps(state, indent=2, sort_keys=True, default=float))
    sizes = {p.name: p.stat().st_size for p in sorted(Path(out_dir).iterdir()) if p.is_file()}
    (Path(out_dir) / COMPLETE).write_text(json.dumps({"files": sizes}, indent=2))
    return Path(out_dir)


def load_weights(model: PreTrainedModel, ckpt_dir: Path) -> None:
    """Load the weights of a checkpoint into an already built model of the same architecture."""
    from safetensors.torch import load_file  # heavy: safetensors

    from orchestrator.modeling.adapters import load_adapters  # heavy: torch

    ckpt_dir = Path(ckpt_dir)
    state = load_file(str(ckpt_dir / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied tensors (decoder weight/bias) are stored once; adapters live in their own file.
    current = model.state_dict()
    loaded = {current[k].data_ptr() for k in state if k in current}
    missing = [k for k in missing if ".adapter." not in k and current[k].data_ptr() not in loaded]
    if missing or unexpected:
        raise ValueError(f"{ckpt_dir}: checkpoint weights do not fit the model "
                         f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    if (ckpt_dir / "adapters.safetensors").is_file():
        load_adapters(model, ckpt_dir)
    if hasattr(model, "tie_weights"):
        model.tie_weights()


def load_training_state(ckpt_dir: Path) -> dict[str, Any]:
    import torch  # heavy: torch

    from orchestrator.modeling.encoder import PICKLED  # heavy: transformers

    try:
        return torch.load(Path(ckpt_dir) / STATE_FILE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:
        raise InputError(Path(ckpt_dir) / STATE_FILE, PICKLED.replace("its weights file holds", "it holds"),
                         expected="a checkpoint this project wrote (tensors and plain values)") from None


def is_checkpoint(path: Path) -> bool:
    """A complete checkpoint: its ``checkpoint.json`` lists the training state and the config, and
    every listed file is there with the size it was written with."""
    path = Path(path)
    try:
        files = json.loads((path / COMPLETE).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if STATE_FILE not in files or "config.json" not in files:
        return False
    return all((path / name).is_file() and (path / name).stat().st_size == size for name, size in files.items())


def latest_checkpoint(root: Path) -> Path | None:
    """The complete ``ckpt-*`` under ``root`` with the highest step, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    found = sorted(p for p in root.glob("ckpt-*") if p.is_dir() and is_checkpoint(p))
    return found[-1] if found else None


def other_run(ckpt_dir: Path, key: str, fields: dict, same: tuple[str, ...] = ()) -> str | None:
    """What makes the checkpoints in ``ckpt_dir`` another run's than the one keyed ``key`` (whose settings are
    ``fields``; ``same``: other keys of this very run); None when there are none, or they are this run's."""
    record = Path(ckpt_dir) / RUN_RECORD
    old = json.loads(record.read_text()) if record.is_file() else None
    if latest_checkpoint(ckpt_dir) is None or (old is not None and old.get("key") in (key, *same)):
        return None
    if old is None:
        return "they carry no run record (an older version of this project)"
    a, b = flatten(old["config"]), flatten(fields)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    changes = [f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:6]] + (["..."] if len(keys) > 6 else [])
    return ", ".join(changes) if changes else "the instances or the vocabulary it was trained on"


def checkpoints_dir(out_dir: Path) -> Path:
    """Where the pretraining output at ``out_dir`` keeps its checkpoints: ``out_dir/checkpoints``, or with
    ``pretrain.storage_path`` the run's folder there that its storage record names."""
    record = Path(out_dir) / STORAGE_RECORD
    if not record.is_file():
        return Path(out_dir) / CHECKPOINTS
    storage = read_json_object(record, "a pretraining output's storage record, a JSON object")
    return Path(str(storage.get("storage_path"))) / str(storage.get("name"))


def run_in_progress(out_dir: Path) -> dict:
    """The run whose checkpoints the pretraining output at ``out_dir`` holds, recorded as a finished output's
    manifest records itself (``stage``, its key, ``config``: the run record's training settings), for
    ``core.reuse.relocated_key``: a run stopped before its ``final/`` that its resume check takes for the run it
    records. Its checkpoints are in ``out_dir/checkpoints``, or with ``pretrain.storage_path`` where its storage
    record says (an object store: none to read). FileNotFoundError: no complete checkpoint with a run record."""
    ckpt_dir = checkpoints_dir(out_dir)
    run = read_json_object(ckpt_dir / RUN_RECORD, "a pretraining run record, a JSON object")
    if latest_checkpoint(ckpt_dir) is None:
        raise FileNotFoundError(f"{ckpt_dir} holds no complete checkpoint")
    return {"stage": "pretrain", KEY_FIELD: run.get("key"), "config": run.get("config")}


def other_run_error(ckpt_dir: Path, what: str) -> ConfigError:
    return ConfigError(f"pretrain: {ckpt_dir} holds checkpoints of another run ({what}); resuming them would "
                       "continue that run. Use a fresh output directory, or set pretrain.on_mismatch=restart to "
                       "discard them and train from scratch")
