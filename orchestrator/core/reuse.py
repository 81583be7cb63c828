"""One reuse rule for every stage: an output is reused only when it records the key of what made it.

    key = content_key("vocab", cfg.vocab, output_key(corpus_dir))
    vocab_dir = run_stage("vocab", run_dir / "vocab", key, lambda tmp: build_vocab(cfg.vocab, corpus_dir, tmp))

A stage's key is the hash of its own resolved config and of the keys (or content hashes) of its
inputs; ``run_stage`` builds into a temporary sibling directory, stamps the key into the
manifest the stage wrote, and renames it into place. A later call with the same key returns the
finished directory untouched; any change to the config or to anything upstream changes the key,
and the stage runs again. The same ``content_key`` names a sweep trial, an MLflow sweep and a
tokenised split, so there is one definition of "the same".
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.core.config import to_dict
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.manifest import MANIFEST, atomic_dir, atomic_write_json, manifest_hash, read_manifest

log = logging.getLogger(__name__)

KEY_FIELD = "stage_key"


def content_key(*parts: Any, length: int = 16) -> str:
    """sha256 of the canonical JSON of ``parts`` (configs as plain dicts, keys sorted), hex-truncated."""
    text = json.dumps([to_dict(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def output_key(stage_dir: str | Path) -> str:
    """The key recorded by a finished stage output (its manifest's hash when it records none)."""
    manifest = read_manifest(stage_dir)
    if manifest.get(KEY_FIELD):
        return str(manifest[KEY_FIELD])
    return content_key(manifest)


def reusable(stage_dir: str | Path, key: str) -> bool:
    """True when ``stage_dir`` is a finished output made with ``key``."""
    try:
        return read_manifest(stage_dir).get(KEY_FIELD) == key
    except (FileNotFoundError, json.JSONDecodeError):
        return False


def stamp(stage_dir: str | Path, key: str) -> None:
    """Record ``key`` in the manifest a stage wrote into ``stage_dir``."""
    path = Path(stage_dir) / MANIFEST
    if not path.is_file():
        raise OrchestratorError(f"stage output {stage_dir} has no {MANIFEST}: the stage did not finish")
    atomic_write_json(path, {**read_manifest(stage_dir), KEY_FIELD: key})


def run_stage(name: str, out_dir: str | Path, key: str, build: Callable[[Path], Any]) -> Path:
    """Reuse ``out_dir`` if it was made with ``key``; otherwise ``build(tmp)`` and rename it into place."""
    out_dir = Path(out_dir)
    if reusable(out_dir, key):
        log.info("%s: output complete for this config and inputs, reused (%s)", name, out_dir)
        return out_dir
    with atomic_dir(out_dir) as tmp:
        build(tmp)
        stamp(tmp, key)
    return out_dir


def model_identity(model_dir: str | Path) -> str:
    """The model's manifest hash when it is a stage output of this project; otherwise a hash of its
    config.json and the names and sizes of its weight files (cheap, and changes when it is re-saved)."""
    path = Path(model_dir)
    found = manifest_hash(path)
    if found:
        return found
    digest = hashlib.sha256()
    config = path / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for weights in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")):
        digest.update(f"{weights.name}:{weights.stat().st_size}".encode())
    return digest.hexdigest()[:16]
