"""Issue 15: the sweep's selected fine-tuned models as artifacts (``sweep.export_best``).

A real Ray Tune sweep of a tiny BERT on the shipped BC5CDR-chemical sample exports its selected
model; the export loads with transformers' AutoConfig and ``load_token_classifier``, and tags the
test sentences exactly as the sweep's trial did. MLflow is the run directory's SQLite store.
"""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.sweep.config import SweepConfig

ROOT = Path(__file__).resolve().parents[1]


def test_entity_spans_read_iob_tags():
    from orchestrator.finetune.export import entity_spans

    tagged = [[("a", "B-Chemical"), ("b", "I-Chemical"), ("c", "O"), ("d", "I-Chemical"), ("e", "B-Chemical"),
               ("f", "B-Disease"), ("g", "I-Chemical")], []]
    assert entity_spans(tagged) == [[("a b", "Chemical"), ("d", "Chemical"), ("e", "Chemical"), ("f", "Disease"),
                                     ("g", "Chemical")], []]


def test_export_best_names_tasks_by_stem_display_name_or_all_and_rejects_others():
    from orchestrator.core.errors import ConfigError
    from orchestrator.sweep.export import export_tasks
    from orchestrator.sweep.space import resolve_space, space_tasks

    specs = space_tasks(resolve_space(SweepConfig(search_space="tiny")))
    key = SweepConfig.KEY
    assert export_tasks(("bc5cdr_chemical", "ChemProt", "chemprot"), specs, key) == ["BC5CDR-chemical", "ChemProt"]
    assert export_tasks(("all",), specs, key) == [s.name for s in specs.values()]
    with pytest.raises(ConfigError, match=r"sweep\.export_best: 'bc5cdr_chemcial' .*did you mean 'bc5cdr_chemical'"):
        export_tasks(("bc5cdr_chemcial",), specs, key)


def test_stop_after_gives_the_model_of_that_epoch_of_a_longer_trial(tiny_bert):
    """The export of a shared-epoch trial's epoch E: the same schedule (spanning the largest epoch),
    stopped after E, scores as the full trial did at E."""
    from orchestrator.finetune.loop import run_trial
    from orchestrator.finetune.spec import SAMPLE_DIR
    from orchestrator.finetune.trial import TrialSpec

    trial = TrialSpec(trial_id="t", model_name="tiny", model_dir=str(tiny_bert), task="chemprot",
                      data_dir=str(SAMPLE_DIR / "ChemProt"), learning_rate=1e-3, seed=3, eval_epochs=(1, 3),
                      batch_size=16, max_seq_length=32)
    full, short = run_trial(trial), run_trial(trial, stop_after=1)
    assert [r["epoch"] for r in short["epochs"]] == [1]
    assert short["epochs"][0] == full["epochs"][0] and short["predictions"]["1"] == full["predictions"]["1"]


def test_a_sweep_exports_its_selected_ner_model_and_the_export_tags_as_the_trial_did(tiny_bert, ray_local,
                                                                                     tmp_path):
    import mlflow
    from transformers import AutoConfig

    from orchestrator.finetune.export import entity_spans, load_token_classifier
    from orchestrator.finetune.loop import score
    from orchestrator.finetune.readers import read_split
    from orchestrator.finetune.spec import SAMPLE_DIR, load_task
    from orchestrator.sweep.runner import run_sweep
    from orchestrator.track import TrackingConfig

    cfg = SweepConfig(search_space="tiny", tasks=("bc5cdr_chemical",), learning_rates=(3e-3,), seeds=(1, 2),
                      epochs={"bc5cdr_chemical": (1, 2)}, export_best=("bc5cdr_chemical",))
    out = tmp_path / "sweep"
    tracking = TrackingConfig(experiment="test-export")
    result = run_sweep(cfg, {"tiny": tiny_bert}, out, tracking, tmp_path)
    assert (result.ran, result.exported) == (2, 1)
    assert list(result.exports) == ["tiny"] and list(result.exports["tiny"]) == ["BC5CDR-chemical"]
    entry = result.exports["tiny"]["BC5CDR-chemical"]
    assert json.loads((out / "exports.json").read_text()) == result.exports

    # the run exported: the selected setting, the seed with the best dev score there
    cell = result.results["cells"]["tiny"]["BC5CDR-chemical"]
    records = {p.stem: json.loads(p.read_text()) for p in (out / "trials").glob("tiny__bc5cdr_chemical__*.json")}
    epoch = cell["selected"]["epochs"]
    dev_at = {rec["trial"]["seed"]: next(r["dev"] for r in rec["epochs"] if r["epoch"] == epoch)
              for rec in records.values()}
    best_seed = min(dev_at, key=lambda s: (-dev_at[s], s))
    rec = next(r for r in records.values() if r["trial"]["seed"] == best_seed)
    export = Path(entry["dir"])
    assert export.parent == out / "exports" and export.name.startswith(rec["trial_id"] + "-")
    assert (entry["trial_id"], entry["seed"], entry["epoch"], entry["learning_rate"]) == (rec["trial_id"], best_seed,
                                                                                         epoch, 3e-3)

    # a Hugging Face directory: safetensors only, the label map, the tokenizer, the head, the manifest
    names = {p.name for p in export.iterdir()}
    assert {"config.json", "model.safetensors", "head.safetensors", "task.json", "manifest.json"} <= names
    assert {"tokenizer_config.json", "vocab.txt"} & names and not [n for n in names if n.endswith((".bin", ".pt",
                                                                                                   ".pkl"))]
    config = AutoConfig.from_pretrained(export)
    labels = load_task("bc5cdr_chemical").labels
    assert config.id2label == dict(enumerate(labels)) and config.label2id == {x: i for i, x in enumerate(labels)}
    manifest = json.loads((export / "manifest.json").read_text())
    test_at = {s: next(r["test"] for r in rec["epochs"] if r["epoch"] == epoch) for s, rec in
               ((r["trial"]["seed"], r) for r in records.values())}
    assert (manifest["task"], manifest["model"], manifest["seed"], manifest["epoch"]) == ("BC5CDR-chemical", "tiny",
                                                                                         best_seed, epoch)
    assert manifest["trial_fingerprint"] == rec["fingerprint"] and manifest["reproduced"] is True
    assert manifest["test"] == test_at[best_seed] == cell["test_scores"][cell["seeds"].index(best_seed)]

    # the loader tags the test sentences as the trial did (its recorded predictions), to the same score
    tagger = load_token_classifier(export)
    assert tagger.id2label == config.id2label
    test = read_split(tagger.spec, SAMPLE_DIR / "BC5CDR-chem", "test")
    tagged = tagger.tag([ex.text_a for ex in test])
    preds = [[tag for _, tag in sentence] for sentence in tagged]
    assert preds == rec["predictions"][str(epoch)]["test"]
    assert score(tagger.spec, test, preds) == manifest["test"] > 0
    assert [w for w, _ in tagged[0]] == list(test[0].text_a)
    assert tagger.tag([" ".join(test[0].text_a)]) == tagged[:1]  # a string is split on whitespace
    assert any(entity_spans(tagged)), "the exported model finds no entity at all"

    # MLflow: the (model, task) run says where its fine-tuned model is
    mlflow.set_tracking_uri(tracking.resolve_uri(tmp_path))
    runs = mlflow.search_runs(experiment_names=["test-export"], output_format="list")
    cells = {r.data.tags["task"]: r for r in runs if r.data.tags.get("orchestrator.kind") == "model_task"}
    assert cells["BC5CDR-chemical"].data.tags["orchestrator.export_dir"] == str(export)
    assert cells["BC5CDR-chemical"].data.tags["orchestrator.export_trial"] == rec["trial_id"]
    mtime = (export / "manifest.json").stat().st_mtime_ns

    # the same sweep again: no trial and no export is trained; without export_best it is the same sweep
    again = run_sweep(cfg, {"tiny": tiny_bert}, out, tracking, tmp_path)
    assert (again.ran, again.exported, again.exports) == (0, 0, result.exports)
    assert (export / "manifest.json").stat().st_mtime_ns == mtime
    plain = run_sweep(dataclasses.replace(cfg, export_best=()), {"tiny": tiny_bert}, out, tracking,
                      tmp_path)
    assert (plain.ran, plain.skipped, plain.parent_run_id) == (0, 2, result.parent_run_id)  # same trial keys


def test_an_export_killed_midway_leaves_no_complete_looking_directory(tiny_bert, tmp_path):
    """SIGKILL while the selected run is re-trained: only a hidden temp directory is left, which the
    loader refuses; exporting again completes it."""
    from orchestrator.finetune.export import load_finetuned
    from orchestrator.sweep.export import export_run, finished, plan_exports

    data_dir = ROOT / "orchestrator" / "sample_data" / "blue" / "ChemProt"
    record = {"trial_id": "tiny__chemprot__lr0.001__s3", "task": "ChemProt", "fingerprint": "f" * 16,
              "trial": {"trial_id": "tiny__chemprot__lr0.001__s3", "model_name": "tiny", "model_dir": str(tiny_bert),
                        "task": "chemprot", "data_dir": str(data_dir),
                        "learning_rate": 1e-3, "seed": 3, "eval_epochs": [2], "batch_size": 16,
                        "max_seq_length": 32},
              "epochs": [{"epoch": 2, "dev": -1.0, "test": -1.0}]}  # not its scores
    results = {"tasks": [{"name": "ChemProt", "higher_is_better": True}],
               "cells": {"tiny": {"ChemProt": {"selected": {"learning_rate": 1e-3, "epochs": 2}}}}}
    (tmp_path / "in.json").write_text(json.dumps({"results": results, "record": record}))
    script = ("import json, pathlib, sys\nfrom orchestrator.sweep.export import export_run, plan_exports\n"
              "d = json.loads(pathlib.Path(sys.argv[1]).read_text())\n"
              "export_run(plan_exports(d['results'], [d['record']], ['ChemProt'], pathlib.Path(sys.argv[2]), "
              "'best_dev')[0])\n")
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-c", script, str(tmp_path / "in.json"), str(out)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None and not list(out.glob("exports/.*.tmp-*")):
            time.sleep(0.05)
        assert proc.poll() is None, "the export ended before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    (plan,) = plan_exports(results, [record], ["ChemProt"], out, "best_dev")
    left = list((out / "exports").iterdir())
    assert left and all(p.name.startswith(".") and ".tmp-" in p.name for p in left)
    assert not plan.dst.exists() and finished(plan) is None
    with pytest.raises(FileNotFoundError, match="not a finished model export"):
        load_finetuned(left[0])
    manifest = export_run(plan)  # exporting again (here in this process) completes it
    assert finished(plan) == manifest and manifest["epoch"] == 2 and manifest["reproduced"] is False
    assert load_finetuned(plan.dst).spec.name == "ChemProt"
    # the trial re-run on a task file edited in place has the same fingerprint, so the same export directory:
    # an export is taken only for the task files its record names (one made before they were named, for any)
    (plan,) = plan_exports(results, [{**record, "task_data": {"train.tsv": "a"}}], ["ChemProt"], out, "best_dev")
    assert finished(plan) == manifest
    assert export_run(plan)["task_data"] == {"train.tsv": "a"}
    (edited,) = plan_exports(results, [{**record, "task_data": {"train.tsv": "b"}}], ["ChemProt"], out, "best_dev")
    assert edited.dst == plan.dst and finished(edited) is None and finished(plan)["task_data"] == {"train.tsv": "a"}


def test_a_reused_export_names_the_library_releases_it_was_made_under(tmp_path, capsys):
    """Session 55: an export made under another release is reused (no key holds a version), as the sweep's trials
    are; their reuse line named the releases (``made_under_each``), the exports' said nothing of it."""
    import contextlib

    from orchestrator.core.manifest import library_versions, write_manifest
    from orchestrator.sweep.export import EXPORT_STAGE, plan_exports
    from orchestrator.sweep.runner import _export_best

    results = {"tasks": [{"name": "ChemProt", "higher_is_better": True}],
               "cells": {m: {"ChemProt": {"selected": {"learning_rate": 1e-3, "epochs": 2}}} for m in ("a", "b")}}
    records = [{"trial_id": f"{m}__chemprot__lr0.001__s3", "task": "ChemProt", "fingerprint": m * 16,
                "trial": {"trial_id": f"{m}__chemprot__lr0.001__s3", "model_name": m, "model_dir": str(tmp_path),
                          "task": "chemprot", "data_dir": str(tmp_path), "learning_rate": 1e-3, "seed": 3,
                          "eval_epochs": [2]},
                "epochs": [{"epoch": 2, "dev": 0.5, "test": 0.4}]} for m in ("a", "b")]
    out, now = tmp_path / "sweep", library_versions()
    plans = plan_exports(results, records, ["ChemProt"], out, "best_dev")
    for plan, torch in zip(plans, ("1.13.1", now["torch"])):  # as export_run leaves them, one of another torch
        write_manifest(plan.dst, stage=EXPORT_STAGE, config=plan.trial, seed=3,
                       extra={"learning_rate": 1e-3, "dev": 0.5, "test": 0.4, "reproduced": True,
                              "versions": {**now, "torch": torch}})
    exports, trained = _export_best(SweepConfig(), results, records, ["ChemProt"], out, contextlib.ExitStack())
    assert trained == 0 and {m: e["ChemProt"]["dir"] for m, e in exports.items()} == {
        p.model: str(p.dst) for p in plans}  # reused, as before: no Ray, nothing trained
    assert (f"sweep: 2 selected model(s) to export; reusing 2, training 0; made under torch 1.13.1 (1 of 2), "
            f"now {now['torch']}\n") in capsys.readouterr().out


@pytest.mark.parametrize("task", ["bc5cdr_chemical", "chemprot", "hoc", "biosses"])
def test_an_export_loads_in_plain_transformers_as_it_predicts_or_says_how(tiny_bert, task, tmp_path):
    """An outputs probe (session 48): every export's config said BertModel, its head in head.safetensors, so
    AutoModelFor{Token,Sequence}Classification loaded it with a random classifier (BIOSSES Pearson -0.39 where the
    sweep recorded 0.51), HoC without multi_label_classification, BIOSSES with 2 labels; its tokenizer had no
    length limit (truncation=True cut nothing, a long text failed in the model) and no vocab.txt. An NER export is
    now a BertForTokenClassification, equal to the sweep's model; the others say what they are and how to load
    them (README.md)."""
    import torch
    from transformers import AutoModelForTokenClassification, AutoTokenizer, BertConfig

    from orchestrator.core.manifest import write_manifest
    from orchestrator.finetune.export import load_finetuned, save_finetuned
    from orchestrator.finetune.model import TaskModel
    from orchestrator.finetune.spec import load_task

    spec = dataclasses.replace(load_task(task), dir="")
    tok = AutoTokenizer.from_pretrained(str(tiny_bert))
    torch.manual_seed(0)
    model = TaskModel(tiny_bert, spec).eval()
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)
    out = tmp_path / "export"
    save_finetuned(model, spec, tok, out, max_seq_length=32)
    write_manifest(out, stage="finetune_export", config={"test": True})
    config = json.loads((out / "config.json").read_text())
    positions = BertConfig.from_pretrained(str(tiny_bert)).max_position_embeddings
    assert AutoTokenizer.from_pretrained(str(out)).model_max_length == positions
    assert (out / "vocab.txt").is_file() and "is_local" not in (out / "tokenizer_config.json").read_text()
    batch = tok(["Naloxone reverses the effect of clonidine .", "Aspirin"], padding=True, return_tensors="pt")
    with torch.no_grad():
        ours = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        loaded = load_finetuned(out).model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    assert torch.allclose(loaded, ours, atol=1e-6)  # the project's loader, as before
    card = (out / "README.md").read_text()
    if spec.family == "ner":
        assert config["architectures"] == ["BertForTokenClassification"]
        plain, info = AutoModelForTokenClassification.from_pretrained(str(out), output_loading_info=True)
        assert not info["missing_keys"] and plain.config.id2label[1] == spec.labels[1]
        with torch.no_grad():
            assert torch.allclose(plain.eval()(**batch).logits, ours, atol=1e-6)
        assert "loads it whole" in card
    else:
        assert config["problem_type"] == {"sts": "regression", "multilabel": "multi_label_classification"}.get(
            spec.family, "single_label_classification")
        assert config.get("num_labels", len(config.get("id2label", {}))) == (1 if spec.family == "sts"
                                                                              else len(spec.labels))
        assert "do not use them" in card and "[:, 0]" in card


def test_a_reinit_axis_is_selected_on_dev_logged_to_mlflow_and_its_selected_trial_exported(tiny_bert, ray_local,
                                                                                           tmp_path):
    """``sweep.reinit_layers=[0,1]`` through a real sweep: one trial per value, the cell's selection names the
    value with the better dev score, MLflow's (model, task) run and a report rebuilt from it say it, and the export
    is that value's trial's model."""
    from mlflow import MlflowClient

    from orchestrator.report.mlflow_results import load_results, results_from_children
    from orchestrator.sweep.runner import run_sweep
    from orchestrator.track import TrackingConfig, local_uri

    cfg = SweepConfig(search_space="tiny", tasks=("biosses",), learning_rates=(1e-3,), seeds=(1,),
                      epochs={"biosses": (1,)}, reinit_layers=(0, 1), export_best=("biosses",))
    out = tmp_path / "sweep"
    result = run_sweep(cfg, {"tiny": tiny_bert}, out, TrackingConfig(experiment="test-reinit"), tmp_path)
    records = {rec["trial"]["reinit_layers"]: rec for rec in
               (json.loads(p.read_text()) for p in (out / "trials").glob("tiny__biosses__*.json"))}
    assert sorted(records) == [0, 1] and records[1]["trial_id"] == "tiny__biosses__lr0.001__r1__s1"
    dev = {n: rec["epochs"][-1]["dev"] for n, rec in records.items()}
    assert dev[0] != dev[1]  # the fresh top layer trains to another model
    best = max(dev, key=lambda n: (dev[n], -n))
    cell = result.results["cells"]["tiny"]["BIOSSES"]
    assert cell["selected"] == {"learning_rate": 1e-3, "reinit_layers": best, "epochs": 1}
    assert result.exports["tiny"]["BIOSSES"]["trial_id"] == records[best]["trial_id"]

    uri = local_uri(tmp_path)
    client = MlflowClient(uri)
    rebuilt = results_from_children(client, client.get_run(load_results(uri, "test-reinit").run_id))
    assert rebuilt["cells"]["tiny"]["BIOSSES"]["selected"] == cell["selected"]
