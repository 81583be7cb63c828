"""Atomic stage outputs, manifests and the registry."""
from __future__ import annotations

import calendar
import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError, InputError, OrchestratorError
from orchestrator.core.manifest import (
    atomic_dir,
    atomic_write_json,
    atomic_write_json_list,
    is_complete,
    iter_json_list,
    read_manifest,
    write_manifest,
)
from orchestrator.core.registry import Registry


def test_atomic_dir_leaves_nothing_on_failure(tmp_path):
    out = tmp_path / "stage"
    with pytest.raises(RuntimeError):
        with atomic_dir(out, "demo") as tmp:
            (tmp / "part-0.parquet").write_text("half")
            raise RuntimeError("boom")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_previous_output(tmp_path):
    out = tmp_path / "stage"
    for n in (1, 2):
        with atomic_dir(out, "demo") as tmp:
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


@pytest.mark.parametrize("items", [[], [{"b": 1, "a": [1, 2, "x\ny"], "c": {"z": [], "y": {}}}],
                                   [{"pages": ("s:0:1", "s:0:2"), "n": 1.5}, {"u": "é"}, [1, None]]])
def test_a_list_written_an_item_at_a_time_is_the_same_file(tmp_path, items):
    """A corpus's shards.json (every document's page, sentences and bytes) was one json.dumps string: about
    0.5 KB of the driver's peak a document. Written an item at a time, its bytes do not change."""
    atomic_write_json_list(tmp_path / "b.json", iter(items))
    assert (tmp_path / "b.json").read_bytes() == atomic_write_json(tmp_path / "a.json", items).read_bytes()

    def failing():
        yield {"a": 1}
        raise RuntimeError("stopped")

    with pytest.raises(RuntimeError):
        atomic_write_json_list(tmp_path / "b.json", failing())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json"]  # no temporary file left
    assert json.loads((tmp_path / "b.json").read_text()) == json.loads(json.dumps(items))  # the old file kept


@pytest.mark.parametrize("block", [1, 3, 64, 1 << 20])
def test_a_json_list_is_read_an_item_at_a_time_whatever_the_window(tmp_path, block):
    """The instance and vocabulary stages read shards.json (every document of the corpus) whole: about 250 B of
    the driver a document (``benchmarks/plan_load_memory.py``). It is read an item at a time, through a
    window as small as a byte: numbers cut at the window's end ("1" of "1.5e3") are read whole."""
    items = [{"a": [1, 2.5, -3e-7, "x\ny"], "b": None}, 1.5e3, -12, "s", [], {}, [[1], [2, [3]]], True, 10 ** 30]
    for text in (json.dumps(items), json.dumps(items, indent=2), json.dumps(items, separators=(",", ":"))):
        (tmp_path / "l.json").write_text(text, encoding="utf-8")
        assert list(iter_json_list(tmp_path / "l.json", block=block)) == items
    atomic_write_json_list(tmp_path / "w.json", items)
    assert list(iter_json_list(tmp_path / "w.json", block=block)) == items
    (tmp_path / "e.json").write_text(" [ ] \n", encoding="utf-8")
    assert list(iter_json_list(tmp_path / "e.json", block=block)) == []
    for text, line, said in [("", 1, "it ends early"), ('{"a": 1}', 1, "found '{'"), ("[1,\n2\n3]", 3, "found '3'"),
                             ('[1,\n{"a":\n}]', 3, "not valid JSON"), ("[1] x", 1, "the end of the file"),
                             ("[1,\n", 2, "not valid JSON")]:
        (tmp_path / "bad.json").write_text(text, encoding="utf-8")
        with pytest.raises(InputError, match=said) as caught:
            list(iter_json_list(tmp_path / "bad.json", block=block))
        assert caught.value.line == line and caught.value.path == str(tmp_path / "bad.json")


def test_git_state_says_when_the_checkout_has_changes_and_hashes_them(tmp_path):
    """A probe (session 43): runs made with uncommitted changes recorded the bare commit, as if clean."""
    import subprocess

    from orchestrator.core.manifest import git_state

    assert git_state(tmp_path) == {"git_commit": None, "git_dirty": None}  # not a checkout
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "code.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "c"], check=True)
    clean = git_state(tmp_path)
    assert clean["git_dirty"] is False and len(clean["git_commit"]) == 40 and "git_diff_sha256" not in clean
    (tmp_path / "code.py").write_text("x = 2\n")
    edited = git_state(tmp_path)
    assert edited["git_commit"] == clean["git_commit"] and edited["git_dirty"] is True
    (tmp_path / "new.py").write_text("y = 1\n")  # a file git does not track yet is part of the code too
    added = git_state(tmp_path)
    assert added["git_dirty"] is True and added["git_diff_sha256"] != edited["git_diff_sha256"]
    (tmp_path / "new.py").write_text("y = 2\n")
    assert git_state(tmp_path)["git_diff_sha256"] not in (added["git_diff_sha256"], edited["git_diff_sha256"])
    manifest = read_manifest(write_manifest(tmp_path / "out", stage="s", config={}).parent)
    assert {"git_commit", "git_dirty"} <= set(manifest)  # this checkout's, whatever its state


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


@pytest.mark.parametrize("text, said", [("{", r"manifest.json:2: invalid JSON: Expecting property name"),
                                        ("[1]", "manifest.json: holds a JSON list"),
                                        ('{"counts": {"max_seq_length": "abc", "masking": "static", "vocab_size": 5, '
                                         '"vocab_sha256": "x"}}', "manifest.json: a value of the wrong type"),
                                        ('{"counts": [1]}', "manifest.json: counts is a JSON list")])
def test_a_corrupt_manifest_is_bad_input_naming_the_file(tmp_path, text, said):
    from orchestrator.core.artifacts import read_instance_info
    from orchestrator.core.reuse import reusable

    (tmp_path / "manifest.json").write_text(text + "\n", encoding="utf-8")
    (tmp_path / "part-00000.parquet").write_bytes(b"")
    with pytest.raises(InputError, match=said):
        read_instance_info(tmp_path)
    if "value of the wrong type" not in said and "counts" not in said:
        with pytest.raises(InputError, match=said):
            read_manifest(tmp_path)
        assert not reusable(tmp_path, "any key")  # an unreadable output is made again, not an error


def test_input_error_survives_pickling():
    import pickle

    err = pickle.loads(pickle.dumps(InputError("a.tsv", "empty sentence", line=3, expected="text")))
    assert isinstance(err, InputError) and (err.path, err.line, err.expected) == ("a.tsv", 3, "text")
    assert str(err) == "a.tsv:3: empty sentence (expected text)"


def test_atomic_dir_never_replaces_what_the_project_did_not_write(tmp_path):
    """Issue 12: an output directory pointed at a user's folder deleted that folder."""
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    entered = []
    with pytest.raises(OrchestratorError, match="not an output of this project"):
        with atomic_dir(foreign, "report"):
            entered.append(True)
    assert not entered and (foreign / "notes.txt").read_text() == "keep me"  # refused before any work
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]
    other = tmp_path / "sweep"
    with atomic_dir(other, "sweep") as tmp:
        write_manifest(tmp, stage="sweep", config={})
    with pytest.raises(OrchestratorError, match="output of stage 'sweep'"):
        with atomic_dir(other, "report"):
            pass
    (tmp_path / "empty").mkdir()
    with atomic_dir(tmp_path / "empty", "report") as tmp:
        write_manifest(tmp, stage="report", config={})
    assert is_complete(tmp_path / "empty")


def test_model_identity_is_the_content_not_the_shape(tmp_path, monkeypatch):
    """Issue 12: two models of one shape with other weights had one identity, so a sweep answered a
    re-pretrained model with the old model's trials."""
    import shutil

    import torch
    from transformers import BertConfig, BertModel

    from orchestrator.core.reuse import model_file_record, model_identity

    monkeypatch.setenv("ORCH_CACHE_DIR", str(tmp_path / "cache"))
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32)
    ids = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        BertModel(config).save_pretrained(str(tmp_path / f"m{seed}"))
        for path in (tmp_path / f"m{seed}").iterdir():
            _age(path)  # not written this moment: kept in the cache
        ids.append(model_identity(tmp_path / f"m{seed}"))
    assert ids[0] != ids[1]
    sizes = {(tmp_path / m / "model.safetensors").stat().st_size for m in ("m1", "m2")}
    assert len(sizes) == 1  # the same shape
    shutil.copytree(tmp_path / "m1", tmp_path / "copy")
    assert model_identity(tmp_path / "copy") == ids[0]  # a copy is the same model
    cached = json.loads((tmp_path / "cache" / "file_sha256.json").read_text())
    assert any(key.startswith(str((tmp_path / "m1" / "model.safetensors").resolve())) for key in cached)
    # a directory the project wrote carries the hashes in its manifest: the same identity, no hashing
    write_manifest(tmp_path / "m2", stage="model", config={}, extra={"model_files": model_file_record(tmp_path / "m2")})
    (tmp_path / "cache" / "file_sha256.json").unlink()
    assert model_identity(tmp_path / "m2") == ids[1]
    assert not (tmp_path / "cache" / "file_sha256.json").exists()
    # re-trained in place (same names, same sizes): the recorded hashes no longer apply
    torch.manual_seed(3)
    BertModel(config).save_pretrained(str(tmp_path / "m2"))
    assert model_identity(tmp_path / "m2") not in ids


def test_a_write_that_fails_leaves_no_temporary_file(tmp_path):
    """A probe (session 44): a full disk left 0-byte `.<name>.tmp-...` files beside run files and trial records,
    never removed. A failed write (here text that cannot be encoded) now removes its temporary file."""
    from orchestrator.core.manifest import atomic_write_text

    atomic_write_json(tmp_path / "x.json", {"kept": True})
    with pytest.raises(UnicodeEncodeError):
        atomic_write_text(tmp_path / "x.json", "half \ud800")
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"] and json.loads((tmp_path / "x.json").read_text())


def _age(path, seconds=3600):
    """``path``'s modification time an hour back: the hash cache keeps no file written in the last 2 s."""
    then = time.time_ns() - seconds * 10**9
    os.utime(path, ns=(then, then))


def test_input_hashes_are_kept_a_user_but_a_file_rewritten_within_its_timestamp_is_read_again(tmp_path, monkeypatch):
    """Stage keys and manifests hash their inputs (a vocabulary's target texts, a proxy search's sources, a corpus's
    sources) through the per-user cache: a dry run, the next arm and the next run do not read gigabytes again. A
    file is looked up by path, size and modification time; one modified in the last 2 s is read every time, since a
    rewrite of the same size within the file system's clock tick keeps its time (a stale hash would reuse an output
    built from other text)."""
    import hashlib

    from orchestrator.core.manifest import hash_inputs

    monkeypatch.setenv("ORCH_CACHE_DIR", str(tmp_path / "cache"))
    old = tmp_path / "target.txt"
    old.write_text("abc\n")
    _age(old)
    assert hash_inputs([old]) == {str(old): hashlib.sha256(b"abc\n").hexdigest()}
    kept = json.loads((tmp_path / "cache" / "file_sha256.json").read_text())
    assert list(kept.values()) == [hashlib.sha256(b"abc\n").hexdigest()] and str(old.resolve()) in next(iter(kept))

    fresh = tmp_path / "fresh.txt"
    fresh.write_text("abc\n")
    first = fresh.stat().st_mtime_ns
    assert hash_inputs([fresh]) == {str(fresh): hashlib.sha256(b"abc\n").hexdigest()}
    fresh.write_text("xyz\n")  # the same size, and the same timestamp (as within one clock tick)
    os.utime(fresh, ns=(first, first))
    assert hash_inputs([fresh]) == {str(fresh): hashlib.sha256(b"xyz\n").hexdigest()}
    assert len(json.loads((tmp_path / "cache" / "file_sha256.json").read_text())) == 1  # the fresh file not kept


@pytest.mark.parametrize("damaged", ["[]", "null", '{"a": 1}', "{"])
def test_a_damaged_file_hash_cache_is_started_afresh(tmp_path, monkeypatch, caplog, damaged):
    """A probe (session 44): a cache file holding `[]` (or `null`) failed every sweep with "unexpected TypeError:
    list indices must be integers" and no word of the file. It is started afresh, with a warning naming it; the
    cache is where $XDG_CACHE_HOME says when $ORCH_CACHE_DIR is not set, as MLflow's kept empty store is."""
    import hashlib

    from orchestrator.core.manifest import file_digests, user_cache_dir

    monkeypatch.delenv("ORCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache_dir() == tmp_path / "xdg" / "bioptorch-orchestrator"
    cache = user_cache_dir() / "file_sha256.json"
    cache.parent.mkdir(parents=True)
    cache.write_text(damaged)
    data = tmp_path / "train.tsv"
    data.write_text("a\tb\n")
    _age(data)
    assert file_digests([data]) == {"train.tsv": hashlib.sha256(b"a\tb\n").hexdigest()}
    assert isinstance(json.loads(cache.read_text()), dict)  # rewritten as a cache
    assert damaged == "{" or any(str(cache) in r.getMessage() for r in caplog.records)


def test_a_hash_cache_that_cannot_be_written_is_said_once(tmp_path, monkeypatch, caplog):
    """A portability probe (session 45): with XDG_CACHE_HOME read-only, a 5-trial sweep warned 10 times that it
    could not keep the file hashes (once a trial record checked or written). Once a process now."""
    import logging

    from orchestrator.core.manifest import file_digests

    monkeypatch.delenv("ORCH_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    (tmp_path / "xdg" / "bioptorch-orchestrator").mkdir(parents=True)
    (tmp_path / "xdg" / "bioptorch-orchestrator" / "file_sha256.json").mkdir()  # unwritable as a file, even by root
    data = tmp_path / "train.tsv"
    data.write_text("a\tb\n")
    _age(data)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            file_digests([data])
    assert len([r for r in caplog.records if "could not keep file hashes" in r.getMessage()]) == 1


# --------------------------------------------------------------------------- two jobs on one output
_BUILD_STAGE = """
import logging, sys, time
from pathlib import Path
from orchestrator.core.manifest import write_manifest
from orchestrator.core.reuse import run_stage

logging.basicConfig(level=logging.INFO, format="%(message)s")
out, who, hold_s = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])

def build(tmp):
    print("building", flush=True)
    (tmp / "built_by").write_text(who)
    time.sleep(hold_s)
    write_manifest(tmp, stage="demo", config={}, counts={})

run_stage("demo", out, "key-1", build)
"""


def test_a_second_process_on_the_same_output_waits_then_reuses_or_refuses(tmp_path):
    """Two processes building one stage output: the second waits, saying for whom, and reuses what the
    first built; with a shorter wait it stops naming the holder; a holder killed (kill -9) blocks no one,
    and its lock is taken over (issue 34 item 5: both built everything)."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT
    from orchestrator.core.locks import WAIT_ENV, lock_path

    script, out = tmp_path / "build.py", tmp_path / "runs" / "stage"
    script.write_text(_BUILD_STAGE)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def start(who: str, hold_s: float, wait_s: str = "60") -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), str(out), who, str(hold_s)], text=True,
                                env={**env, WAIT_ENV: wait_s}, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    first = start("first", 4)
    assert first.stdout.readline() == "building\n"  # it holds the lock now
    second = start("second", 0)
    second_out, second_err = second.communicate(timeout=120)
    first.communicate(timeout=60)
    assert (first.returncode, second.returncode) == (0, 0), second_err
    assert f"waiting: {out} is being built by pid {first.pid}" in second_err
    assert "reused" in second_err and "building" not in second_out
    assert (out / "built_by").read_text() == "first" and not lock_path(out).exists()

    script.write_text(_BUILD_STAGE.replace("key-1", "key-2"))  # another config: built again
    holder = start("holder", 60)
    assert holder.stdout.readline() == "building\n"
    refused = start("refused", 0, wait_s="1")
    _, refused_err = refused.communicate(timeout=120)
    assert refused.returncode == 1 and "OutputBusy" in refused_err
    assert f"{out} is being built by pid {holder.pid} on " in refused_err and WAIT_ENV in refused_err

    os.kill(holder.pid, signal.SIGKILL)  # dies holding the lock: its lock file stays behind
    holder.wait(timeout=30)
    assert lock_path(out).exists()
    after = start("after", 0)
    after_out, after_err = after.communicate(timeout=120)
    assert after.returncode == 0 and after_out == "building\n", after_err
    assert "waiting" not in after_err and "which is gone" in after_err
    assert f"taking over the lock left by pid {holder.pid} on " in after_err
    assert (out / "built_by").read_text() == "after" and not lock_path(out).exists()

    from orchestrator.core.reuse import output_lock

    with output_lock(out), output_lock(out):  # re-entrant: a stage locks what its caller holds
        assert lock_path(out).exists()
    assert not lock_path(out).exists()


@pytest.mark.parametrize("name", ["stage", "s" * 250])  # a name of 250 bytes: its siblings within 255 (session 45)
def test_a_killed_runs_temporary_directory_is_removed_by_the_next_run_and_no_one_elses(tmp_path, name):
    """kill -9 inside ``atomic_dir`` leaves its ``.<name>.tmp-*`` directory; the next ``atomic_dir`` of
    that output removes it, but not the temporary directory of a live process or another host's
    (issue 34 item 6: they stayed for good)."""
    import os
    import signal
    import subprocess
    import sys

    from conftest import ROOT
    from orchestrator.core.locks import hidden_sibling, lock_path
    from orchestrator.core.reuse import output_lock

    out = tmp_path / name
    stem = hidden_sibling(out, "").name  # ".<name>", or its start and a hash
    code = ("import sys, time\nfrom orchestrator.core.manifest import atomic_dir\n"
            f"with atomic_dir({str(out)!r}, 'demo') as tmp:\n"
            "    (tmp / 'half.txt').write_text('half')\n    print(tmp, flush=True)\n    time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.PIPE, text=True)
    killed = Path(proc.stdout.readline().strip())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert (killed / "half.txt").is_file()
    host = killed.name.removeprefix(f"{stem}.tmp-").rsplit("-", 2)[0]  # .<name>.tmp-<host>-<pid>-<id>
    live = tmp_path / f"{stem}.tmp-{host}-{os.getppid()}-0123abcd"  # a live process's (this one's parent)
    elsewhere = tmp_path / f"{stem}.tmp-another-host-{proc.pid}-4567abcd"  # the dead pid, on another host
    for kept in (live, elsewhere):
        kept.mkdir()
    # a replaced output whose deletion was cut off (probe C: `.stage.old-<id>` was never removed by anyone)
    old = tmp_path / f"{stem}.old-{host}-{proc.pid}-89abcdef"
    old.mkdir()
    with atomic_dir(out, "demo") as tmp:
        write_manifest(tmp, stage="demo", config={}, counts={})
    assert not killed.exists() and not old.exists() and live.is_dir() and elsewhere.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([elsewhere.name, live.name, name])
    with output_lock(out):  # its lock beside it, within the name limit too
        assert lock_path(out).is_file() and len(lock_path(out).name) <= 255




def test_a_stage_records_what_it_cost_and_a_later_run_reports_it_reused(tmp_path, caplog):
    """run_stage times the build into the manifest (wall x the CPUs it held); a re-run that reuses the
    output reports that cost, marked reused; GPUs, when held, make it GPU-hours."""
    import time

    from orchestrator.core.cost import StageCost, cost_lines, measured, read_cost, read_record
    from orchestrator.core.reuse import run_stage

    def build(tmp):
        time.sleep(0.05)
        write_manifest(tmp, stage="demo", config={})

    start = time.time()
    out = run_stage("demo", tmp_path / "demo", "k1", build, units=(4.0, 0.0))
    made = read_cost(out, "demo", since=start)
    assert made.wall_s >= 0.05 and (made.device, made.units, made.reused) == ("CPU", 4.0, False)
    assert made.device_h == pytest.approx(made.wall_s * 4 / 3600, abs=1e-6)
    assert run_stage("demo", tmp_path / "demo", "k1", lambda tmp: pytest.fail("rebuilt")) == out
    # made under another tokenizers release (an upgrade probe, session 54): reused, and the reuse says so
    manifest = json.loads((out / "manifest.json").read_text())
    now = manifest["versions"]["tokenizers"]
    manifest["versions"].update(tokenizers="0.1.0", numpy=manifest["versions"]["numpy"] + "+local")
    (out / "manifest.json").write_text(json.dumps(manifest))
    with caplog.at_level("INFO", logger="orchestrator.core.reuse"):
        assert run_stage("demo", tmp_path / "demo", "k1", lambda tmp: pytest.fail("rebuilt")) == out
    assert caplog.messages[-1].endswith(f"reused ({out}); made under tokenizers 0.1.0, now {now}")  # numpy alike
    # many outputs reused at once (a sweep's trial records, session 55): said once, each release with how many of them
    # were made under it; a record of no versions (kept before records kept them) is in the count, in no release's
    from orchestrator.core.reuse import made_under_each

    versions = manifest["versions"]
    records = [{"versions": {**versions, "tokenizers": v}} for v in ("0.1.0", "0.2.1", "0.1.0")] + [{}]
    assert made_under_each(records) == f"; made under tokenizers 0.1.0 (2 of 4), 0.2.1 (1 of 4), now {now}"
    assert made_under_each([{"versions": {**versions, "tokenizers": now + "+local"}}, {}]) == made_under_each([]) == ""
    later = read_cost(out, "demo", since=time.time() + 2)  # a run that started after it was made
    assert later.reused and later.wall_s == made.wall_s
    gpu = measured("pretrain", 1800.0, cpus=8, gpus=2)
    assert (gpu.device, gpu.units, gpu.device_h) == ("GPU", 2, 1.0)
    lines = cost_lines({"a": [later, StageCost("sweep (its trials)", -1.0, device_h=0.25, shared="b")], "b": []})
    assert lines[1] == "  a" and "(reused)" in lines[2] and "(shared with b)" in lines[3]
    assert lines[3].split()[3] == "-" and lines[4].split()[-2:] == [f"{0.25 + later.device_h:.3f}", "CPU-h"]
    assert not any(line.strip() == "b" for line in lines)  # an arm without costs is not listed
    # a sweep re-run with more trials: its cost is the whole sweep's, and the summary says how much was this run's
    # (probe D item 6: 34.6 s inside "this run took 30.3s", with no word that most of it was an earlier run's)
    from orchestrator.core.cost import from_record
    partly = from_record("sweep", {"wall_s": 34.6, "device": "CPU", "units": 2.0, "device_h": 0.019,
                                   "made": "2026-12-05T09:00:00Z", "earlier_wall_s": 20.8, "earlier_device_h": 0.011},
                         since=calendar.timegm((2026, 12, 5, 8, 59, 0, 0, 0, 0)))
    assert not partly.reused and partly.earlier_wall_s == 20.8
    # a concurrency probe (session 46): a job that waited for another's builds of shared stages and reused them
    # listed every one without "reused", as its own CPU-hours: made after its start, but by another process
    from orchestrator.core.cost import this_process
    record = {"wall_s": 4.5, "device": "CPU", "units": 2.0, "device_h": 0.0025, "made": "2026-12-05T09:00:00Z"}
    since = calendar.timegm((2026, 12, 5, 8, 59, 0, 0, 0, 0))
    assert from_record("corpus", {**record, "by": "host:1:2"}, since=since).reused
    assert not from_record("corpus", {**record, "by": this_process()}, since=since).reused
    assert not from_record("corpus", record, since=since).reused  # a record of older code, made since: its own
    assert read_record(out)["by"] == this_process()
    assert cost_lines({"m": [partly]})[2].endswith("(13.8s this run, the rest an earlier run's)")


_HOLD = """
import sys
from orchestrator.core.reuse import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_second_job_on_a_run_directory_of_outputs_placed_by_name_waits_for_the_whole_first(tmp_path):
    """A concurrency probe (session 46): two chains on one run directory with other configs (a vocabulary of 1,500
    and of 1,200) each locked one stage output at a time, so the second rebuilt vocab/ and instances/ between the
    first one's stages: the first trained a model with 1,500 embeddings and the other's 1,200-token vocab.txt,
    exited 0, and was reused ever after. A chain (and jobs/build_corpus.py) now holds its run directory for its
    whole run: here a holder makes each job stop (the wait set to 1 s) before it writes anything there."""
    import os
    import subprocess
    import sys

    from conftest import ROOT
    from orchestrator.core.locks import WAIT_ENV

    runs = tmp_path / "runs"
    jobs = {runs / "smoke": ["blue_sweep.py", "--preset", "smoke", f"runs_root={runs}"],
            tmp_path / "corpus": ["build_corpus.py", "--preset", "tiny", f"out_dir={tmp_path / 'corpus'}"]}
    env = {**os.environ, "PYTHONPATH": str(ROOT), WAIT_ENV: "1"}
    for run_dir, (job, *args) in jobs.items():
        run_dir.mkdir(parents=True)
        holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(run_dir)], env=env, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert holder.stdout.readline() == "held\n"
            res = subprocess.run([sys.executable, str(ROOT / "jobs" / job), *args], env=env, capture_output=True,
                                 text=True, timeout=300)
        finally:
            holder.communicate("\n", timeout=60)
        assert res.returncode != 0 and f"{run_dir} is being built by pid {holder.pid}" in res.stderr, res.stderr
        assert sorted(p.name for p in run_dir.iterdir()) == [], job  # no chain_config.json, corpus/, logs/
