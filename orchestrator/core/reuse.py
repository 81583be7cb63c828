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

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from orchestrator.core.config import to_dict
from orchestrator.core.cost import COST_FIELD, StageCost, cluster_units, device_text, duration, measured
from orchestrator.core.errors import InputError, OrchestratorError
from orchestrator.core.locks import hold
from orchestrator.core.manifest import (
    MANIFEST,
    HashCache,
    atomic_dir,
    atomic_write_json,
    file_sha256,
    library_versions,
    read_manifest,
)

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
    except (FileNotFoundError, InputError):  # none, or not readable: as if none
        return False


def stamp(stage_dir: str | Path, key: str, cost: StageCost | None = None) -> None:
    """Record ``key`` (and what making it cost) in the manifest a stage wrote into ``stage_dir``."""
    path = Path(stage_dir) / MANIFEST
    if not path.is_file():
        raise OrchestratorError(f"stage output {stage_dir} has no {MANIFEST}: the stage did not finish")
    extra = {COST_FIELD: cost.record()} if cost is not None else {}
    atomic_write_json(path, {**read_manifest(stage_dir), KEY_FIELD: key, **extra})


_LOCKS: dict[str, threading.RLock] = {}
_LOCKS_GUARD = threading.Lock()


@contextlib.contextmanager
def output_lock(out_dir: str | Path) -> Iterator[None]:
    """Serialise whoever would build the same output: the threads of this process (an experiment's
    arms built at once share stages) and other processes (two jobs on one directory: a lock file
    beside the output, ``orchestrator.core.locks``). The second waits, then finds the output finished
    and reuses it. Re-entrant: a stage may lock the output its caller holds."""
    name = str(Path(out_dir).resolve())
    with _LOCKS_GUARD:
        lock = _LOCKS.setdefault(name, threading.RLock())
    with lock, hold(name):
        yield


def run_stage(stage: str, out_dir: str | Path, key: str, build: Callable[[Path], Any], label: str = "",
              units: tuple[float, float] | None = None) -> Path:
    """Reuse ``out_dir`` if it was made with ``key``; otherwise ``build(tmp)`` and rename it into place.

    ``stage`` is what the stage's manifest calls it; ``label`` names this output in the log. The build's
    wall time and device time (``units``: the (CPUs, GPUs) it held; default the Ray cluster's) go into
    its manifest (``orchestrator.core.cost``)."""
    out_dir = Path(out_dir)
    name = label or stage
    with output_lock(out_dir):
        if reusable(out_dir, key):
            log.info("%s: output complete for this config and inputs, reused (%s)%s", name, out_dir,
                     made_under(read_manifest(out_dir)))
            return out_dir
        log.info("%s: started", name)
        started = time.monotonic()
        with atomic_dir(out_dir, stage) as tmp:
            build(tmp)
            cost = measured(stage, time.monotonic() - started, *(units or cluster_units()))
            stamp(tmp, key, cost)
        log.info("%s: done in %s (%s)", name, duration(cost.wall_s), device_text(cost))
    return out_dir


def relocated_key(stage: str, key: str, out_dir: str | Path, key_at: Callable[[dict], str | None], *,
                  beside: bool = True, record: Callable[[Path], dict] = read_manifest,
                  said: str = "was made from inputs of the same contents at other paths: it is reused, with the "
                              "outputs made from it") -> str:
    """``key``, or the key of a finished ``stage`` output (or what ``record`` reads) at ``out_dir`` or beside it that
    this very config made from inputs of the same contents at other paths: a checkout cloned elsewhere, a model
    installed in another environment, data copied to another disk. ``key_at(record)`` is this config's key with its
    input paths as that output's record holds them and their contents read where they are now (None: not comparable);
    the output answers when that is the key it records. No output's key changes: one whose paths hold is ``key``.
    ``beside=False``: ``out_dir`` alone (a stage given its output directory); ``record(path)``: what an output
    records, as a manifest does (stage, key, config; default its manifest; FileNotFoundError: none there):
    pretraining's finished output (``final/`` written) or its run in progress (its checkpoints' run record);
    ``said``: the rest of the line that says an output answers."""
    out_dir = Path(out_dir)
    if reusable(out_dir, key):
        return key
    for path, made in earlier_outputs(stage, out_dir, beside, record):
        recorded = made[KEY_FIELD]
        if recorded == key and path == out_dir:  # this very output (a record other than its manifest says so)
            return key
        if recorded == key or key_at(made) != recorded:
            continue
        said_once(path, key, log, f"%s: %s {said}", stage, path)
        return str(recorded)
    return key


def earlier_outputs(stage: str, out_dir: Path, beside: bool = True,
                    record: Callable[[Path], dict] = read_manifest) -> Iterator[tuple[Path, dict]]:
    """(path, manifest) of each finished ``stage`` output (its manifest records a key) at ``out_dir``, then, with
    ``beside``, in the folders next to it (an experiment's ``stages/<stage>/<key>``; a chain's run directory): the
    outputs an earlier run of other inputs' paths or times may have left. ``record``: what is read of each
    (``relocated_key``)."""
    siblings = sorted(out_dir.parent.iterdir()) if beside and out_dir.parent.is_dir() else []
    for path in dict.fromkeys([out_dir, *siblings]):
        try:
            made = record(path)
        except (FileNotFoundError, NotADirectoryError, InputError):  # not a stage output
            continue
        if made.get("stage") == stage and made.get(KEY_FIELD):
            yield path, made


def said_once(path: Path, key: str, logger: logging.Logger, message: str, *args: Any) -> None:
    """Log ``message`` (that the output at ``path`` answers ``key``) on ``logger``, once a process (each arm of an
    experiment asks)."""
    if _SAID.get(str(path)) != key:
        _SAID[str(path)] = key
        logger.info(message, *args)


_SAID: dict[str, str] = {}  # outputs an earlier run made that a key was found to answer -> that key


def made_under(manifest: dict) -> str:
    """The libraries whose release (major.minor) the output's manifest records other than this process has, in
    words ("; made under tokenizers 0.22.1, now 0.23.3"; "" when none differ or none are recorded). An output is
    not rebuilt for an upgrade (a stage's key holds no library version: a patch release would rebuild hours of
    work), but a reuse says it: the rerun's numbers may differ from a fresh build's (probe, session 54)."""
    now = library_versions()
    differ = [f"{lib} {made}, now {now[lib]}" for lib, made in sorted(_other_releases(manifest).items())]
    return f"; made under {'; '.join(differ)}" if differ else ""


def made_under_at(stage_dir: str | Path) -> str:
    """``made_under`` of the finished output at ``stage_dir`` ("" where it has no readable manifest): what a dry
    run's "reused" line adds, from the small manifest its reuse check (``reusable``) has just read."""
    try:
        return made_under(read_manifest(stage_dir))
    except (FileNotFoundError, InputError):
        return ""


def made_under_each(records: Sequence[dict]) -> str:
    """``made_under`` of many outputs reused at once (a sweep's trial records), said once: each library whose
    release differs in any of them, with each release it was made under and how many of ``records`` were ("; made
    under transformers 4.46.0 (3 of 4), now 4.57.1"). A record that records no ``versions`` (kept before trial
    records did, session 55) is of an unknown release: in ``records``' count, in no release's."""
    now = library_versions()
    made: dict[str, dict[str, int]] = {}
    for record in records:
        for lib, version in _other_releases(record).items():
            made.setdefault(lib, {}).setdefault(version, 0)
            made[lib][version] += 1
    differ = [f"{lib} " + ", ".join(f"{v} ({n} of {len(records)})" for v, n in sorted(made[lib].items()))
              + f", now {now[lib]}" for lib in sorted(made)]
    return f"; made under {'; '.join(differ)}" if differ else ""


def _other_releases(manifest: dict) -> dict[str, str]:
    """{library: the version ``manifest`` records} of the libraries whose major.minor differs from this process's."""
    made = manifest.get("versions")
    if not isinstance(made, dict):
        return {}
    now = library_versions()

    def release(version: str) -> list[str]:
        return version.split("+")[0].split(".")[:2]

    return {lib: made[lib] for lib in made
            if isinstance(made[lib], str) and lib in now and release(made[lib]) != release(now[lib])}


#: The files of a Hugging Face tokenizer directory that decide how it tokenizes.
TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: Files of a Hugging Face model directory that decide what it computes (weights, config, tokenizer).
MODEL_FILE_PATTERNS = ("config.json", "*.safetensors", "*.bin", "adapter_config.json", *TOKENIZER_FILES)
MODEL_FILES_FIELD = "model_files"


def model_files(model_dir: str | Path) -> list[Path]:
    model_dir = Path(model_dir)
    return sorted({p for pattern in MODEL_FILE_PATTERNS for p in model_dir.glob(pattern) if p.is_file()})


def model_file_record(model_dir: str | Path) -> dict[str, dict]:
    """{file name: {sha256, size, mtime_ns}} of a model directory: what its manifest records."""
    return {p.name: {"sha256": file_sha256(p), "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
            for p in model_files(model_dir)}


def model_identity(model_dir: str | Path) -> str:
    """The content identity of a model directory: a hash of its weight, config and tokenizer files'
    contents. Two models with the same architecture but other weights differ; a copy is the same.

    A file's sha256 comes from the directory's manifest when the project wrote it (and the file's
    size and modification time are still those recorded), else from a per-user cache keyed by
    path, size and modification time, else it is computed (once: a 400 MB model is hashed once)."""
    model_dir = Path(model_dir)
    files = model_files(model_dir)
    if not files:  # not built yet (a dry run plans trials of a model a stage will write): no content
        return content_key({"no model files in": str(model_dir.resolve())})
    recorded: dict = {}
    try:
        recorded = read_manifest(model_dir).get(MODEL_FILES_FIELD) or {}
    except (FileNotFoundError, InputError):  # none, or not readable: as if none
        pass
    cache = HashCache()
    digests = {}
    for path in files:
        stat = path.stat()
        entry = recorded.get(path.name) or {}
        if entry.get("size") == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns:
            digests[path.name] = entry["sha256"]
        else:
            digests[path.name] = cache.sha256(path)
    cache.save()
    return content_key(digests)
