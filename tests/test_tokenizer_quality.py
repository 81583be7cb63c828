"""jobs/tokenizer_quality.py on text it cannot measure on: refused by name, before anything is written
(the job's table and known answers are in test_vocab.py)."""
from __future__ import annotations

import importlib.util

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
