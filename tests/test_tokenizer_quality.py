"""jobs/tokenizer_quality.py on text it cannot measure on: refused by name, before anything is written
(the job's table and known answers are in test_vocab.py)."""
from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import ROOT


def _job():
    spec = importlib.util.spec_from_file_location("tq_job", ROOT / "jobs" / "tokenizer_quality.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    return job


@pytest.mark.parametrize("content, message", [
    ("\n\n   \n\n", "holds no text"),  # probe: wrote a table of 0 words and null measures, rc 0
    ("\u200b\n\u200b\n", "holds no words in the 2 unit(s) read"),  # units, but not one word in them
])
def test_a_text_without_words_is_refused_before_anything_is_written(tmp_path, capsys, content, message):
    text = tmp_path / "en.txt"
    text.write_text(content, encoding="utf-8")
    out = tmp_path / "tq"
    for dry in (["--dry-run"], []):  # the tiny preset's tokenizer, MiniLM's
        assert _job().main([*dry, "--text", f"en={text}", f"out_dir={out}"]) == 2
        assert f"{text}: {message}" in capsys.readouterr().err
    assert not out.exists()


def test_a_directory_given_as_text_is_said_to_be_one(tmp_path, capsys):
    """Probe: `--text en=<a directory>` said "file not found"."""
    folder = tmp_path / "texts"
    folder.mkdir()
    assert _job().main(["--dry-run", "--text", f"en={folder}"]) == 2
    err = capsys.readouterr().err
    assert f"{folder}: is a directory, not a file (expected a text file for en:" in err and "not found" not in err


def _tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("manifest, said", [
    (None, "a folder that is not an output of this project (no manifest.json)"),  # probe A 3: the user's notes
    ('{"stage": "vocab"}', "the output of stage 'vocab'"),  # probe A 3: another stage's finished output
])
def test_an_output_folder_it_did_not_write_is_refused_before_any_work(tmp_path, capsys, dry, manifest, said):
    """Probe A item 3: out_dir=<any folder> replaced the user's tokenizer_quality.md (or added files into
    the vocab stage's output), exit 0, no manifest; the dry run said valid."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "tokenizer_quality.md").write_text("my precious notes\n", encoding="utf-8")
    if manifest:
        (mine / "manifest.json").write_text(manifest, encoding="utf-8")
    before = _tree(tmp_path)
    assert _job().main([*(["--dry-run"] if dry else []), f"out_dir={mine}"]) == 2
    assert capsys.readouterr().err == (f"error: {mine} exists and is {said}: the tokenizer_quality stage will not "
                                       "replace it; choose another output directory, or move that one away\n")
    assert _tree(tmp_path) == before  # nothing overwritten, nothing added, not even beside it


def test_a_rerun_replaces_its_own_output_which_has_a_manifest(tmp_path, capsys):
    out = tmp_path / "tq"
    for _ in range(2):  # the tiny preset: MiniLM on the shipped sample text
        assert _job().main([f"out_dir={out}"]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "tokenizer_quality.json",
                                                     "tokenizer_quality.md"]
    assert json.loads((out / "manifest.json").read_text())["stage"] == "tokenizer_quality"
    assert [p.name for p in tmp_path.iterdir()] == ["tq"]  # no temp folder left beside it


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_max_lines_below_one_is_refused_under_the_jobs_own_key(tmp_path, capsys, dry):
    """Probe A item 12: the message named quality.corpus_lines and quality.max_lines, keys this job does not have."""
    out = tmp_path / "tq"
    assert _job().main([*(["--dry-run"] if dry else []), "max_lines=0", f"out_dir={out}"]) == 2
    assert capsys.readouterr().err == "error: max_lines must be >= 1, got 0\n"
    assert not out.exists()


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_two_texts_of_one_language_and_kind_are_refused(tmp_path, capsys, dry):
    """`--text en=a --text en:text=b` made two text sets both (en, text): the printed JSON kept b's numbers
    alone under "en:text", and the difference column measured a's rows against b's first tokenizer (MiniLM
    against itself showed +3.8 points)."""
    for name, content in (("a", "The protein binds the receptor.\n"), ("b", "The river runs to the sea.\n")):
        (tmp_path / f"{name}.txt").write_text(content, encoding="utf-8")
    out = tmp_path / "tq"
    assert _job().main([*(["--dry-run"] if dry else []), "--text", f"en={tmp_path / 'a.txt'}", "--text",
                        f"en:text={tmp_path / 'b.txt'}", f"out_dir={out}"]) == 2
    assert capsys.readouterr().err == ("error: texts: 'en' and 'en:text' are both en:text; give each file its own "
                                       "kind (e.g. de:general, de:specific)\n")
    assert not out.exists()
    assert _job().main(["--dry-run", "--text", f"en={tmp_path / 'a.txt'}", "--text",
                        f"en:general={tmp_path / 'b.txt'}"]) == 0  # two kinds: two text sets
