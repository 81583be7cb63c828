"""Stage outputs: written atomically (temp path, then rename) with a manifest.json beside them.

    with atomic_dir(out) as tmp:
        ... write files into tmp ...
        write_manifest(tmp, stage="corpus", config=cfg, inputs=[...], counts={...}, seed=1)
    # out now exists, complete, or not at all

A directory without a manifest.json is never taken as a finished stage output, and never replaced:
``atomic_dir`` renames its result onto ``final`` only when ``final`` does not exist, is empty, or
is an earlier output of the same stage (its manifest says so). A folder holding anything else is
the user's, and writing there stops with an error before any work is done.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.core.config import to_dict
from orchestrator.core.errors import OrchestratorError

MANIFEST = "manifest.json"
_TRACKED_LIBS = ("torch", "ray", "transformers", "tokenizers", "mlflow", "kenlm", "fasttext-numpy2-wheel",
                 "numpy", "pandas", "pyarrow", "scikit-learn", "scipy", "seqeval")


def check_replaceable(final: str | Path, stage: str) -> None:
    """Raise unless ``final`` may be (re)written by ``stage``: absent, an empty directory, or a
    directory whose manifest.json is ``stage``'s. Nothing the project did not write is replaced."""
    final = Path(final)
    if not final.exists():
        return
    if final.is_dir() and not any(final.iterdir()):
        return
    found = None
    if final.is_dir() and (final / MANIFEST).is_file():
        try:
            found = json.loads((final / MANIFEST).read_text(encoding="utf-8")).get("stage")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            found = None
    if found == stage:
        return
    what = "a file" if final.is_file() else (f"the output of stage {found!r}" if found else
                                              "a folder that is not an output of this project (no manifest.json)")
    raise OrchestratorError(f"{final} exists and is {what}: the {stage} stage will not replace it; "
                            "choose another output directory, or move that one away")


@contextlib.contextmanager
def atomic_dir(final: str | Path, stage: str) -> Iterator[Path]:
    """Yield a sibling temp directory; rename it onto ``final`` only if the block succeeds.

    ``final`` must be replaceable by ``stage`` (``check_replaceable``), checked before the block
    runs and again before the rename; an earlier output of the same stage is replaced."""
    final = Path(final)
    check_replaceable(final, stage)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
        check_replaceable(final, stage)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():
        trash = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        final.rename(trash)
        tmp.rename(final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        tmp.rename(final)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write a file via a temp sibling and rename, so a reader never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
    return path


def atomic_write_json(path: str | Path, data: Any) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def hash_inputs(paths: Iterable[str | Path]) -> dict[str, str]:
    """{path: sha256} for files; directories hash their manifest if they have one, else every file."""
    out: dict[str, str] = {}
    for p in paths:
        p = Path(p)
        if p.is_file():
            out[str(p)] = file_sha256(p)
        elif (p / MANIFEST).is_file():
            out[str(p)] = "manifest:" + file_sha256(p / MANIFEST)
        elif p.is_dir():
            h = hashlib.sha256()
            for f in sorted(q for q in p.rglob("*") if q.is_file()):
                h.update(str(f.relative_to(p)).encode())
                h.update(file_sha256(f).encode())
            out[str(p)] = "tree:" + h.hexdigest()
    return out


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _TRACKED_LIBS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def git_commit(repo: str | Path | None = None) -> str | None:
    repo = Path(repo) if repo else Path(__file__).resolve().parents[2]
    try:
        res = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() or None if res.returncode == 0 else None


def write_manifest(out_dir: str | Path, *, stage: str, config: Any, inputs: Iterable[str | Path] = (),
                   counts: dict | None = None, seed: int | None = None, extra: dict | None = None) -> Path:
    manifest = {
        "stage": stage,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": to_dict(config),
        "inputs": hash_inputs(inputs),
        "counts": counts or {},
        "seed": seed,
        "versions": library_versions(),
        "git_commit": git_commit(),
    }
    if extra:
        manifest.update(extra)
    return atomic_write_json(Path(out_dir) / MANIFEST, manifest)


def read_manifest(stage_dir: str | Path) -> dict:
    path = Path(stage_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{stage_dir} has no {MANIFEST}: not a finished stage output")
    return json.loads(path.read_text(encoding="utf-8"))


def is_complete(stage_dir: str | Path) -> bool:
    return (Path(stage_dir) / MANIFEST).is_file()
