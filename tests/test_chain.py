"""The main job end to end, as a user runs it: corpus -> vocab -> instances -> pretrain ->
BLUE sweep -> report, on an embedded Ray and a SQLite MLflow store."""
from __future__ import annotations

import json
import re
from pathlib import Path

import mlflow
import pandas as pd
import pytest
from mlflow.tracking import MlflowClient

from conftest import ROOT, SHARED_DATA, run_job

FAMILIES = {"BIOSSES", "BC5CDR-chemical", "ChemProt", "HoC", "MedNLI"}


def test_help_lists_dry_run_and_config_keys():
    res = run_job("blue_sweep.py", "--help")
    assert res.returncode == 0, res.stderr
    for text in ("--dry-run", "--config", "--preset", "pretrain.phase1.learning_rate", "sweep.search_space"):
        assert text in res.stdout


def test_dry_run_validates_and_trains_nothing(tmp_path):
    res = run_job("blue_sweep.py", "--dry-run", f"runs_root={tmp_path}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "nothing was trained" in res.stdout
    for task in FAMILIES:
        assert task in res.stdout
    # the default is an experiment: the pretrained model against its untrained floor, in one paired sweep
    assert "experiment: 2 arm(s), baseline floor" in res.stdout
    assert re.search(r"random-init\s+\w+\s+build\s+floor", res.stdout)
    assert re.search(r"vocab\s+\w+\s+build\s+pretrained, floor", res.stdout)  # the floor shares the vocabulary
    assert not (tmp_path / "default").exists()
    # arms={} runs the one model; the preset's baseline is then of no use and not an error
    res = run_job("blue_sweep.py", "--dry-run", f"runs_root={tmp_path}", "arms={}")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "experiment:" not in res.stdout and "nothing was trained" in res.stdout


def test_a_sweep_of_published_models_files_its_cost_under_the_sweep(tmp_path, tiny_bert):
    """README's "fine-tune published models only" (stages [sweep, report] over compare_models): a probe found
    its cost filed under model_name, a model the run never built."""
    res = run_job("blue_sweep.py", f"runs_root={tmp_path}", "arms={}", "stages=[sweep,report]",
                  f"compare_models.m={tiny_bert}", "sweep.search_space=tiny", "sweep.tasks=[biosses]",
                  "sweep.seeds=[1]", "sweep.learning_rates=[1e-3]", "sweep.epochs={biosses: [1]}", timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    cost = res.stdout[res.stdout.index("cost          :"):]
    assert re.match(r"cost +:.*\n  the sweep\n    sweep +[\d.]+s +[\d.]+ CPU-h\n", cost), cost
    assert "ours" not in cost
    assert json.loads((tmp_path / "default" / "sweep" / "results.json").read_text())["models"] == ["m"]


def test_bad_config_fails_with_suggestion_and_nonzero_exit(tmp_path):
    res = run_job("blue_sweep.py", "--dry-run", "pretrain.phase1.stepz=3")
    assert res.returncode == 2
    assert "did you mean 'steps'" in res.stderr
    missing = tmp_path / "nope.txt"
    res = run_job("blue_sweep.py", "--dry-run", f"corpus.sources=[{{name: x, paths: ['{missing}'], role: small}},"
                                                 f"{{name: y, paths: ['{missing}'], role: large}}]")
    assert res.returncode == 2
    assert str(missing) in res.stderr
    # a real run checks its inputs before it writes anything (issue 12: chain_config.json came first)
    res = run_job("blue_sweep.py", f"runs_root={tmp_path / 'runs'}",
                  f"corpus.sources=[{{name: x, paths: ['{missing}'], role: small}},"
                  f"{{name: y, paths: ['{missing}'], role: large}}]")
    assert res.returncode == 2 and str(missing) in res.stderr
    assert not (tmp_path / "runs").exists()


def _mlflow_runs(db: Path) -> pd.DataFrame:
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    client = MlflowClient()
    exps = client.search_experiments()
    return mlflow.search_runs(experiment_ids=[e.experiment_id for e in exps], output_format="pandas")


def _assert_chain_outcome(run_dir: Path, stdout: str, models: set[str], tasks: set[str]) -> None:
    # The job ends by saying where the report is and how to open MLflow on these runs.
    assert re.search(r"report \(html\): .*blue_table\.html", stdout)
    db = run_dir / "mlflow.db"
    assert f"mlflow ui --backend-store-uri sqlite:///{db}" in stdout
    # Pretraining loss fell (recorded by the pretrain stage).
    history = json.loads((run_dir / "pretrain" / "manifest.json").read_text())["counts"]
    assert history["last_loss"] < history["first_loss"]
    # MLflow: a sweep parent run, children per (model, task), nested trials with dev and test metrics.
    runs = _mlflow_runs(db)
    parent = runs[runs["tags.orchestrator.kind"] == "sweep"]
    assert len(parent) >= 1
    trials = runs[runs["tags.orchestrator.kind"] == "trial"]
    assert len(trials) >= len(models) * len(tasks)
    assert trials["tags.mlflow.parentRunId"].notna().all()
    children = runs[runs["run_id"].isin(set(trials["tags.mlflow.parentRunId"]))]
    assert set(children["tags.mlflow.parentRunId"]) <= set(parent["run_id"])
    metric_cols = [c for c in trials.columns if c.startswith("metrics.")]
    assert any(c.startswith("metrics.dev") for c in metric_cols)
    assert any(c.startswith("metrics.test") for c in metric_cols)
    assert trials[[c for c in metric_cols if c.startswith("metrics.test")]].notna().any(axis=1).all()
    # The report: a row per model, a column per task.
    results = json.loads((run_dir / "sweep" / "results.json").read_text())
    assert set(results["models"]) == models
    assert {t["name"] for t in results["tasks"]} == tasks
    md = (run_dir / "report" / "blue_table.md").read_text()
    header = next(line for line in md.splitlines() if line.startswith("| Model"))
    for task in tasks:
        assert f"| {task} " in header or f"| {task}|" in header
    rows = [line for line in md.split("## ")[1].splitlines()
            if line.startswith("| ") and not line.startswith("| Model")]
    assert {r.split("|")[1].strip() for r in rows} == models
    assert (run_dir / "report" / "blue_table.html").stat().st_size > 500


def _assert_every_stage_written_and_a_re_run_reuses_them(run_dir: Path, args: tuple[str, ...]) -> None:
    # Every stage left a complete output with a manifest.
    for stage in ("corpus", "vocab", "instances/len64", "instances/len128", "pretrain", "sweep"):
        assert (run_dir / stage / "manifest.json").is_file(), stage
    # Re-running the same command resumes: no stage and no trial is redone.
    again = run_job("blue_sweep.py", *args, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    log = again.stdout + again.stderr
    assert "pretrain: output complete for this config and inputs, reused" in log
    assert re.search(r"skipping (\d+) finished, running 0", log)


@pytest.mark.slow
@pytest.mark.skipif(SHARED_DATA.is_dir(), reason="with ../shared/data, test_chain_on_real_data runs this chain and "
                                                "its checks on real data (the suite's time: docs/CONTRIBUTING.md)")
def test_embedded_default_at_smoke_preset(tmp_path):
    """The README's smoke command, where the real data is not there to run the chain on."""
    args = ("--preset", "smoke", f"runs_root={tmp_path}")
    res = run_job("blue_sweep.py", *args, timeout=1200)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-5000:])
    run_dir = tmp_path / "smoke"
    _assert_chain_outcome(run_dir, res.stdout, {"smoke-simpt-ampv"}, FAMILIES)
    _assert_every_stage_written_and_a_re_run_reuses_them(run_dir, args)


@pytest.mark.slow
def test_chain_on_real_data(tmp_path, shared_data, tiny_bert):
    """PubMed sample (in-domain) + WikiText (general); BIOSSES, BC5CDR-chem, HoC and ChemProt;
    our model compared with a published-format BERT directory (conftest's tiny_bert: 2 layers, MiniLM's
    tokenizer). The real 6-layer MiniLM is fine-tuned on these four real tasks, with its scores checked
    against trivial baselines, in tests/test_finetune_real.py; here it only cost its trials' time."""
    # ChemProt's public file is its dev split only: the config re-splits it by abstract
    # (orchestrator/finetune/tasks/chemprot_resplit.yaml). compare_models.<name>=<dir>: the override without spaces.
    args = ("--config", str(ROOT / "configs" / "real_data.yaml"), f"runs_root={tmp_path}", "run_name=real",
            f"compare_models.tinybert={tiny_bert}", "pretrain.phase1.steps=20", "pretrain.phase2.steps=2",
            "corpus.mixer.units=2", "sweep.seeds=[1]", "sweep.max_train_examples=40", "sweep.max_eval_examples=30")
    res = run_job("blue_sweep.py", *args, timeout=1500)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-5000:])
    _assert_chain_outcome(tmp_path / "real", res.stdout, {"ours", "tinybert"},
                          {"BIOSSES", "BC5CDR-chemical", "HoC", "ChemProt-resplit"})
    # what test_embedded_default_at_smoke_preset checks where the real data is not there
    _assert_every_stage_written_and_a_re_run_reuses_them(tmp_path / "real", args)
