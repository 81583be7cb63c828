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
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import shutil
import socket
import subprocess
import tempfile
import textwrap
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.core.config import public, to_dict
from orchestrator.core.errors import InputError, OrchestratorError
from orchestrator.core.locks import hidden_sibling, pid_alive, sibling_stem

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_TRACKED_LIBS = ("torch", "ray", "transformers", "tokenizers", "mlflow", "kenlm", "fasttext",
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


def nearest_existing(path: str | Path) -> Path:
    """``path``, or its nearest ancestor that exists (where a directory to be made would be made)."""
    node = Path(path).absolute()
    while not node.exists() and node != node.parent:
        node = node.parent
    return node


def check_writable_dir(path: str | Path, what: str) -> None:
    """Raise unless ``path`` is a directory this process may write in, or can be made one: its nearest
    existing ancestor is a directory with write permission. A job checks its output directories so
    (and its dry run does), before Ray starts: a file or a read-only folder in the way is bad input,
    not a crash halfway through."""
    path = Path(path).absolute()
    node = nearest_existing(path)
    if not node.is_dir():
        where = "is a file" if node == path else f"is under {node}, which is a file"
        raise OrchestratorError(f"{what}: {path} {where}; give a directory")
    if not os.access(node, os.W_OK | os.X_OK):
        where = "" if node == path else f" (it would be made in {node})"
        raise OrchestratorError(f"{what}: {path} is not writable by this user{where}; give a directory you "
                                "can write in")


@contextlib.contextmanager
def atomic_dir(final: str | Path, stage: str) -> Iterator[Path]:
    """Yield a sibling temp directory; rename it onto ``final`` only if the block succeeds.

    ``final`` must be replaceable by ``stage`` (``check_replaceable``), checked before the block
    runs and again before the rename; an earlier output of the same stage is replaced."""
    final = Path(final)
    check_replaceable(final, stage)
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(final)
    tmp = _own_temp(final, "tmp")
    tmp.mkdir()
    trash = None
    try:
        yield tmp
        check_replaceable(final, stage)
        if final.exists():
            trash = _own_temp(final, "old")
            final.rename(trash)
        tmp.rename(final)
    except BaseException:
        if trash is not None and trash.exists() and not final.exists():
            trash.rename(final)  # the replace failed half-way: the earlier output back in place
        shutil.rmtree(tmp, ignore_errors=True)  # no finished-looking temporary left behind
        raise
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)


_HOST = re.sub(r"[^A-Za-z0-9.-]", "_", socket.gethostname())


def _own_temp(final: Path, kind: str) -> Path:
    """``.<name>.<kind>-<host>-<pid>-<id>`` beside ``final``: this process's temporary (``tmp``) or set-aside
    (``old``) directory, the name ``clean_stale_temps`` reads back."""
    return hidden_sibling(final, f".{kind}-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


@contextlib.contextmanager
def scratch_dir(name: str, parent: str | Path | None = None) -> Iterator[Path]:
    """An owner-only working directory ``.<name>.tmp-<host>-<pid>-<id>`` in ``parent`` (empty or None: the
    system temp directory), removed when the block ends. Named as ``atomic_dir``'s temporary directories,
    so one left by a process killed without a clean-up (a Ray worker ended on SIGTERM) is removed by the
    next ``scratch_dir`` of the same name (``clean_stale_temps``)."""
    root = Path(parent or tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(root / name)
    tmp = _own_temp(root / name, "tmp")
    tmp.mkdir(mode=0o700)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def clean_stale_temps(final: str | Path) -> list[Path]:
    """Remove the temporary directories of ``final`` that a killed run of this user on this host
    left (``atomic_dir``'s ``.<name>.tmp-<host>-<pid>-<id>``, and ``.<name>.old-...``, a replaced output
    not yet deleted; its pid gone); never another host's,
    another user's, or a live process's. Returns what was removed."""
    final = Path(final)
    stem = re.escape(sibling_stem(final.name))
    pattern = re.compile(rf"\.{stem}\.(?:tmp|old)-(?P<host>.+)-(?P<pid>\d+)-[0-9a-f]{{8}}")
    removed = []
    for entry in final.parent.iterdir() if final.parent.is_dir() else []:
        match = pattern.fullmatch(entry.name)
        if (match is None or match["host"] != _HOST or int(match["pid"]) == os.getpid()
                or pid_alive(int(match["pid"])) or not entry.is_dir() or entry.is_symlink()
                or entry.stat().st_uid != os.getuid()):
            continue
        shutil.rmtree(entry, ignore_errors=True)
        log.info("removed %s, left by an interrupted run (pid %s, gone)", entry, match["pid"])
        removed.append(entry)
    return removed


def private_dir(path: str | Path) -> Path:
    """Create ``path`` (or narrow it) so only its owner can enter it (0700): where files derived
    from a task released under a data-use agreement are kept."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def make_private(path: str | Path) -> Path:
    """Narrow a file, or a folder and everything in it, to its owner: folders 0700, files 0600."""
    path = Path(path)
    os.chmod(path, 0o700 if path.is_dir() else 0o600)
    if path.is_dir():
        for root, dirs, files in os.walk(path):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o700)
            for name in files:
                os.chmod(os.path.join(root, name), 0o600)
    return path


def atomic_write_text(path: str | Path, text: str, *, private: bool = False) -> Path:
    """Write a file via a temp sibling and rename, so a reader never sees half of it. ``private``:
    the folder is made owner-only and the file is created 0600, readable by no one else at any time."""
    path = Path(path)
    if private:
        private_dir(path.parent)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    with _temp_sibling(path, private) as f:
        f.write(text)
    return path


@contextlib.contextmanager
def _temp_sibling(path: Path, private: bool = False) -> Iterator[Any]:
    """A text file opened as a new temp sibling of ``path`` (0600 when ``private``), renamed onto ``path`` when
    the block ends; removed when it fails (a full disk, a stop): no half-written temporary file is left."""
    tmp = hidden_sibling(path, f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600 if private else 0o666)
    try:
        with open(fd, "w", encoding="utf-8") as f:
            yield f
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, data: Any, *, private: bool = False) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", private=private)


def atomic_write_json_list(path: str | Path, items: Iterable[Any]) -> Path:
    """``atomic_write_json(path, list(items))``, the same bytes, written an item at a time: a list of
    millions of entries (a corpus's shards with their documents) is never held as one string."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with _temp_sibling(path) as f:
        first = True
        for item in items:
            f.write("[\n" if first else ",\n")
            f.write(textwrap.indent(json.dumps(item, indent=2, sort_keys=True, default=str), "  "))
            first = False
        f.write("[]\n" if first else "\n]\n")
    return path


def iter_json_list(path: str | Path, block: int = 1 << 20) -> Iterator[Any]:
    """The items of the JSON list in ``path``, one at a time (as ``atomic_write_json_list`` writes them):
    neither the file nor all its items are held at once. Not a JSON list: ``InputError`` naming the
    line and what was expected."""
    stream = _JsonStream(Path(path), block)
    with stream:
        stream.expect("[")
        if stream.peek() == "]":
            stream.expect("]")
        else:
            while True:
                yield stream.value()
                if stream.expect(",]") == "]":
                    break
        stream.expect("")


#: What may follow the part of a JSON number the window holds
NUMBER_CHARS = "0123456789.eE+-"


class _JsonStream:
    """``iter_json_list``'s reader: a window of the file, refilled as it is consumed."""

    def __init__(self, path: Path, block: int):
        self.path, self.block = path, block
        self.buf, self.pos, self.lines_before, self.eof = "", 0, 0, False
        self.decoder = json.JSONDecoder()

    def __enter__(self):
        self.file = open(self.path, encoding="utf-8")
        return self

    def __exit__(self, *exc):
        self.file.close()

    def _more(self) -> bool:
        """Drops what is consumed and reads on (as much as the window holds, at least a block)."""
        if self.eof:
            return False
        self.lines_before += self.buf.count("\n", 0, self.pos)
        more = self.file.read(max(self.block, len(self.buf)))
        self.buf, self.pos, self.eof = self.buf[self.pos:] + more, 0, not more
        return bool(more)

    def _error(self, message: str, expected: str, at: int | None = None) -> InputError:
        line = self.lines_before + self.buf.count("\n", 0, self.pos if at is None else at) + 1
        return InputError(self.path, message, line, expected=expected)

    def peek(self) -> str:
        """The next character that is not whitespace; "" at the end of the file."""
        while True:
            rest = self.buf[self.pos:]
            self.pos += len(rest) - len(rest.lstrip())
            if self.pos < len(self.buf) or not self._more():
                return self.buf[self.pos:self.pos + 1]

    def expect(self, chars: str) -> str:
        """Consumes the next character, one of ``chars`` ("": the end of the file)."""
        found = self.peek()
        if found not in chars or bool(found) != bool(chars):
            said = " or ".join(repr(c) for c in chars) if chars else "the end of the file"
            raise self._error(f"not a JSON list: found {found!r}" if found else "not a JSON list: it ends early",
                              expected=said)
        self.pos += len(found)
        return found

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                item, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self._more():
                    continue
                raise self._error(f"not valid JSON ({exc.msg})", "a JSON list", at=exc.pos) from None
            if self.eof or self.buf[end:].strip(NUMBER_CHARS) or not self._more():  # "1" of "1.5", "1e3": read on
                self.pos = end
                return item


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def hash_inputs(paths: Iterable[str | Path]) -> dict[str, str]:
    """{path: sha256} for files; directories hash their manifest if they have one, else every file. A file is
    read once a user while its size and modification time hold (``HashCache``): a stage's key and its manifest
    hash the same sources, and a config's next arm or next run (a dry run included) hashes them again."""
    out: dict[str, str] = {}
    cache = HashCache()
    for p in paths:
        p = Path(p)
        if p.is_file():
            out[str(p)] = cache.sha256(p)
        elif (p / MANIFEST).is_file():
            out[str(p)] = "manifest:" + file_sha256(p / MANIFEST)
        elif p.is_dir():
            h = hashlib.sha256()
            for f in sorted(q for q in p.rglob("*") if q.is_file()):
                h.update(str(f.relative_to(p)).encode())
                h.update(cache.sha256(f).encode())
            out[str(p)] = "tree:" + h.hexdigest()
    cache.save()
    return out


def file_digests(paths: Iterable[Path], by_path: bool = False) -> dict[str, str]:
    """{file name (``by_path``: the path as given): sha256} of ``paths``, each hashed once a user while its
    size and modification time hold (the per-user cache ``model_identity`` uses): a sweep's task files, read for
    every trial; a corpus's sources, when their modification times changed (``corpus.stage.earlier_corpus_key``)."""
    cache = HashCache()
    digests = {(str(p) if by_path else Path(p).name): cache.sha256(Path(p)) for p in paths}
    cache.save()
    return digests


def user_cache_dir() -> Path:
    """The per-user cache: ``$ORCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/bioptorch-orchestrator``, else
    ``~/.cache/bioptorch-orchestrator`` (file hashes here, MLflow's empty store in ``track.local_store``)."""
    if os.environ.get("ORCH_CACHE_DIR"):
        return Path(os.environ["ORCH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bioptorch-orchestrator"


_UNSAVED_CACHES: set[str] = set()  # the hash caches this process could not write, and said so


#: sha256 by (cache file, "path:size:mtime_ns") that this process read from or wrote to that cache: a sweep asks for
#: its model's and task files' hashes for every trial's record, and parsing the per-user cache (which only grows)
#: each time cost more than the rest of the record
_KNOWN_DIGESTS: dict[tuple[str, str], str] = {}


#: a file modified less than this long ago is hashed, not looked up or kept: a file system's timestamps are coarse
#: (a clock tick, or seconds), so a rewrite of the same size within one tick keeps its modification time (git's
#: "racily clean" files)
RACY_NS = 2_000_000_000


class HashCache:
    """sha256 of files by (absolute path, size, mtime_ns), kept in ``user_cache_dir()`` so that external models
    are hashed once, not per run. A file that is not such a mapping (damaged, edited) is started afresh. It is
    read on the first file this process has not looked up in it before."""

    def __init__(self):
        self.path = user_cache_dir() / "file_sha256.json"
        self._entries: dict[str, str] | None = None
        self.changed = False

    @property
    def entries(self) -> dict[str, str]:
        if self._entries is None:
            try:
                self._entries = json.loads(self.path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError, UnicodeDecodeError):
                self._entries = {}
            if not isinstance(self._entries, dict) or not all(isinstance(v, str) for v in self._entries.values()):
                log.warning("%s is not a file-hash cache: starting it afresh", self.path)
                self._entries = {}
        return self._entries

    def sha256(self, path: Path) -> str:
        stat = path.stat()
        if time.time_ns() - stat.st_mtime_ns < RACY_NS:  # may be written again within the same timestamp: read it
            return file_sha256(path)
        key = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
        known = _KNOWN_DIGESTS.get((str(self.path), key))
        if known is not None:
            return known
        if key not in self.entries:
            self.entries[key] = file_sha256(path)
            self.changed = True
        _KNOWN_DIGESTS[(str(self.path), key)] = self.entries[key]
        return self.entries[key]

    def save(self) -> None:
        if self.changed:
            try:
                atomic_write_json(self.path, self.entries)
            except OSError as exc:  # a read-only home: hash again next time (said once: a sweep asks per trial)
                said = str(self.path) in _UNSAVED_CACHES
                _UNSAVED_CACHES.add(str(self.path))
                log.log(logging.DEBUG if said else logging.WARNING, "could not keep file hashes in %s: %s",
                        self.path, exc)


def library_versions() -> dict[str, str]:
    """The versions of Python and the tracked libraries this process runs (read once a process: every manifest
    records them, and a reuse compares them, ``core.reuse.made_under``)."""
    return dict(_library_versions())


@functools.cache
def _library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _TRACKED_LIBS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def _git(repo: Path, *args: str) -> bytes | None:
    """A git command's output in ``repo``; None when git or the repository is not there."""
    try:
        res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout if res.returncode == 0 else None


def git_commit(repo: str | Path | None = None) -> str | None:
    out = _git(Path(repo) if repo else Path(__file__).resolve().parents[2], "rev-parse", "HEAD")
    return out.decode().strip() or None if out is not None else None


def git_state(repo: str | Path | None = None) -> dict[str, Any]:
    """The code a run ran: ``git_commit``, ``git_dirty`` (changes to tracked files, or files git does not
    ignore and does not track) and, when dirty, ``git_diff_sha256``: the sha256 of ``git diff HEAD`` and of
    the untracked files' names and contents (a file over 1 MiB by its size and modification time: data a
    user keeps in the checkout is not read at every stage), so two runs of one commit with other edits
    differ. None values outside a git checkout (an installed package)."""
    repo = Path(repo) if repo else Path(__file__).resolve().parents[2]
    commit = git_commit(repo)
    status = _git(repo, "status", "--porcelain") if commit else None
    if status is None:
        return {"git_commit": commit, "git_dirty": None}
    if not status.strip():
        return {"git_commit": commit, "git_dirty": False}
    h = hashlib.sha256(_git(repo, "diff", "HEAD", "--binary") or b"")
    for name in sorted((_git(repo, "ls-files", "--others", "--exclude-standard", "-z") or b"").split(b"\0")):
        if name:
            h.update(name)
            path = repo / os.fsdecode(name)
            stat = path.stat() if path.is_file() else None
            h.update(b"-" if stat is None else file_sha256(path).encode() if stat.st_size <= 1 << 20
                     else f"{stat.st_size}:{stat.st_mtime_ns}".encode())
    return {"git_commit": commit, "git_dirty": True, "git_diff_sha256": h.hexdigest()}


def write_manifest(out_dir: str | Path, *, stage: str, config: Any, inputs: Iterable[str | Path] = (),
                   counts: dict | None = None, seed: int | None = None, extra: dict | None = None) -> Path:
    manifest = {
        "stage": stage,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "config": public(to_dict(config)),
        "inputs": hash_inputs(inputs),
        "counts": counts or {},
        "seed": seed,
        "versions": library_versions(),
        **git_state(),
    }
    if extra:
        manifest.update(extra)
    return atomic_write_json(Path(out_dir) / MANIFEST, manifest)


def read_manifest(stage_dir: str | Path) -> dict:
    path = Path(stage_dir) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{stage_dir} has no {MANIFEST}: not a finished stage output")
    return read_json_object(path, "a stage's manifest, a JSON object")


def read_json_object(path: str | Path, expected: str) -> dict:
    """A JSON file that must hold an object (a manifest, a model's config.json, a shard index): InputError
    naming the file, and the line where the JSON breaks, when it does not. ``expected``: what it should be."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(path, f"invalid JSON: {exc.msg} at column {exc.colno}", line=exc.lineno,
                         expected=expected) from None
    except UnicodeDecodeError as exc:
        raise InputError(path, f"invalid UTF-8 byte at offset {exc.start}", expected=expected) from None
    if not isinstance(data, dict):
        raise InputError(path, f"holds a JSON {type(data).__name__}", expected=expected)
    return data


def is_complete(stage_dir: str | Path) -> bool:
    return (Path(stage_dir) / MANIFEST).is_file()
