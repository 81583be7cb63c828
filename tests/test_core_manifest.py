"""Atomic stage outputs, manifests and the registry."""
from __future__ import annotations

import json

import pytest

from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.manifest import atomic_dir, atomic_write_json, is_complete, read_manifest, write_manifest
from orchestrator.core.registry import Registry


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "stage"
    with pytest.raises(RuntimeError):
        with atomic_dir(out) as tmp:
            (tmp / "part-0.parquet").write_text("half")
            raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_previous_output(tmp_path):
    out = tmp_path / "stage"
    for n in (1, 2):
        with atomic_dir(out) as tmp:
            (tmp / "v.txt").write_text(str(n))
            write_manifest(tmp, stage="demo", config={"n": n}, inputs=[tmp / "v.txt"], counts={"rows": n}, seed=n)
    assert (out / "v.txt").read_text() == "2"
    man = read_manifest(out)
    assert man["stage"] == "demo" and man["counts"] == {"rows": 2} and man["seed"] == 2
    assert len(next(iter(man["inputs"].values()))) == 64
    assert "torch" in man["versions"] and "python" in man["versions"]
    assert is_complete(out) and not is_complete(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stage"]


def test_atomic_write_json_roundtrip(tmp_path):
    path = atomic_write_json(tmp_path / "a" / "x.json", {"b": 1})
    assert json.loads(path.read_text()) == {"b": 1}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]


def test_registry_duplicates_and_suggestions():
    reg: Registry[int] = Registry("mixer")
    reg.add("simpt", 1)
    reg.register("conventional")(2)
    with pytest.raises(ConfigError, match="already registered"):
        reg.add("simpt", 3)
    with pytest.raises(ConfigError, match="did you mean 'simpt'"):
        reg.get("simtp")
    assert reg.names() == ["conventional", "simpt"] and "simpt" in reg


def test_input_error_names_file_line_expected(tmp_path):
    err = InputError(tmp_path / "train.tsv", "wrong column count", line=7, expected="4 tab-separated columns")
    assert str(err) == f"{tmp_path / 'train.tsv'}:7: wrong column count (expected 4 tab-separated columns)"


def test_input_error_survives_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(InputError("a.tsv", "empty sentence", line=3, expected="text")))
    assert isinstance(err, InputError) and (err.path, err.line, err.expected) == ("a.tsv", 3, "text")
    assert str(err) == "a.tsv:3: empty sentence (expected text)"
