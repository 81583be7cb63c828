"""Source scoring on real data: PubMed is closer to biomedical task text than WikiText and Shakespeare.

Runs the real job (jobs/score_sources.py in-process: real lmplz/build_binary, real kenlm,
one Ray task per source on an embedded 2-CPU Ray) on ../shared/data.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.core.manifest import read_manifest
from orchestrator.selection.measures import kenlm_binary

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TARGETS = [DATA / "ner" / "BC5CDR-chem-IOB" / "devel.tsv", DATA / "hoc" / "dev.tsv", DATA / "chemprot" / "dev.tsv"]
SOURCES = {"pubmed": DATA / "pubmed_sample" / "PubMedAbstract_1MB.txt",
           "wikitext": DATA / "general_en" / "wikitext2_tokenized",
           "shakespeare": DATA / "general_en" / "tinyshakespeare" / "input.txt"}


def _kenlm_built() -> bool:
    try:
        kenlm_binary("lmplz")
        kenlm_binary("build_binary")
    except Exception:
        return False
    return True


pytestmark = [
    pytest.mark.skipif(not all(p.exists() for p in [*TARGETS, *SOURCES.values()]), reason="../shared/data absent"),
    pytest.mark.skipif(not _kenlm_built(), reason="KenLM lmplz/build_binary not built: run scripts/setup.sh"),
]


def test_pubmed_scores_closest_on_ppl_jsd_tvc(tmp_path: Path, capsys):
    from jobs.score_sources import main

    out = tmp_path / "selection"
    argv = ["--target", *map(str, TARGETS)]
    for name, path in SOURCES.items():
        argv += ["--source", f"{name}={path}"]
    argv += ["sample_tokens=40000", "num_samples=5", "num_cpus=2", "lmplz_memory=100M", f"out_dir={out}",
             "gains={pubmed: [1.5, 1.1], wikitext: [0.2, -0.1], shakespeare: [-0.8, -1.2]}",
             "task_gains={hoc: {pubmed: [1.0], wikitext: [0.1], shakespeare: [-0.5]},"
             " chemprot: {pubmed: [2.0], wikitext: [0.3], shakespeare: [-1.0]}}"]
    assert main(argv) == 0
    scores = json.loads((out / "scores.json").read_text())
    assert set(scores) == set(SOURCES)
    for name in SOURCES:
        assert set(scores[name]) == {"ppl", "jsd", "tvc", "ttr"}
    pm, wiki, shk = scores["pubmed"], scores["wikitext"], scores["shakespeare"]
    assert pm["ppl"] < wiki["ppl"] and pm["ppl"] < shk["ppl"]
    assert pm["jsd"] < wiki["jsd"] and pm["jsd"] < shk["jsd"]
    assert pm["tvc"] > wiki["tvc"] and pm["tvc"] > shk["tvc"]
    assert all(0 < s["jsd"] < 1 and 0 < s["tvc"] < 1 and 0 < s["ttr"] < 1 for s in scores.values())

    samples = json.loads((out / "samples.json").read_text())
    assert all(len(samples[n]["samples"]) == 5 and samples[n]["sample_tokens"] == 40000 for n in SOURCES)
    manifest = read_manifest(out)
    assert manifest["stage"] == "selection" and manifest["counts"]["sources"] == 3
    corr = json.loads((out / "correlations.json").read_text())
    assert corr["jsd"]["n"] == 6 and corr["jsd"]["r"] < 0 < corr["tvc"]["r"]
    by_task = json.loads((out / "scores_by_task.json").read_text())
    assert set(by_task) == {"BC5CDR-chem-IOB", "hoc", "chemprot"}
    for task, per in by_task.items():
        assert per["pubmed"]["jsd"] < min(per["wikitext"]["jsd"], per["shakespeare"]["jsd"]), task
        assert per["pubmed"]["tvc"] > max(per["wikitext"]["tvc"], per["shakespeare"]["tvc"]), task
    task_corr = json.loads((out / "correlations_by_task.json").read_text())
    assert task_corr["jsd"]["n"] == 6 and task_corr["jsd"]["r"] < 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[1].split()[1] == "pubmed"     # ranked table, closest first


def test_the_parallel_scoring_shows_its_progress_and_scores_as_the_sequential_one(tmp_path: Path, monkeypatch,
                                                                                    caplog):
    """Scale probe S2: with parallel=true the per-sub-sample lines were logged inside the Ray tasks and never
    reached the terminal: nothing between the start and "finished in 143 s". Now the driver says the sub-samples
    measured of all (sources x num_samples) and elapsed as the tasks yield them (the time left once every source
    has one), and at least every ``HEARTBEAT_S`` (here 50 ms) while none comes; scores.json is the sequential
    scoring's, byte for byte."""
    import logging

    from orchestrator.selection.scoring import SelectionConfig
    from orchestrator.workflows import score_sources

    monkeypatch.setattr(score_sources._ScoringProgress, "HEARTBEAT_S", 0.05, raising=False)
    sources = {n: str(SOURCES[n]) for n in ("pubmed", "shakespeare")}
    outs = {}
    for parallel in (True, False):
        outs[parallel] = tmp_path / f"parallel-{parallel}"
        cfg = SelectionConfig(targets=[str(TARGETS[1])], sources=sources, sample_tokens=5000, num_samples=2,
                              num_cpus=2, lmplz_memory="50M", parallel=parallel, out_dir=str(outs[parallel]))
        with caplog.at_level(logging.INFO, logger="progress"):
            score_sources.run(cfg)
        if parallel:
            said = [r.getMessage() for r in caplog.records if r.name == "progress"]
    assert said[-1].startswith("score_sources: 4/4 sub-samples measured ("), said
    assert " elapsed" in said[-1] and "left" not in said[-1], said
    assert said[0].startswith("score_sources: 0/4 sub-samples measured, ") and " elapsed, no sub-sample yet from " \
        in said[0], said  # the heartbeat, before any sub-sample
    assert not [line for line in said if "left" in line and "no sub-sample yet" in line], said
    assert (outs[True] / "scores.json").read_bytes() == (outs[False] / "scores.json").read_bytes()


def test_bad_source_in_a_ray_task_is_reported_by_file_and_line(tmp_path: Path):
    from orchestrator.core.errors import InputError, OrchestratorError
    from orchestrator.selection.scoring import SelectionConfig
    from orchestrator.workflows import score_sources

    good = tmp_path / "good.txt"
    good.write_text("the liver tumor shows early enhancement .\n" * 50, encoding="utf-8")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine line\nna\xefve line\n")
    target = tmp_path / "target.txt"
    target.write_text("a liver tumor .\n", encoding="utf-8")
    cfg = SelectionConfig(targets=[str(target)], sources={"good": str(good), "bad": str(bad)}, sample_tokens=100,
                          short_source="whole", num_samples=1, num_cpus=2, lmplz_memory="50M",
                          out_dir=str(tmp_path / "out"))
    with pytest.raises(OrchestratorError, match=r"bad.txt:2: invalid UTF-8 byte 0xef"):
        score_sources.run(cfg)
    assert not (tmp_path / "out").exists()
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="empty.txt: is empty"):
        score_sources.run(SelectionConfig(targets=[str(target)], sources={"good": str(good), "e": str(empty)},
                                      out_dir=str(tmp_path / "out")))
