"""From scores to a corpus the chain runs: the weighting rules (known answers), the weighted mixer (each
source's planned bytes exact), the proposal job on the bundled sample with real KenLM (its corpus.yaml
loads and passes build_corpus --dry-run; scores reused), and an experiment arm that takes it in."""
from __future__ import annotations

import json
import math
import random
import re
import shlex
import shutil
from pathlib import Path

import pytest

from conftest import ROOT, run_job
from orchestrator.core.artifacts import ShardInfo
from orchestrator.core.cli import load_preset
from orchestrator.core.config import from_dict, load_config, merge
from orchestrator.core.errors import ConfigError, InputError
from orchestrator.corpus.mixing import MIXERS, MixerConfig, planned_bytes
from orchestrator.selection.proposal import WeightingConfig, propose_weights
from orchestrator.workflows.build_corpus import CorpusBuildConfig
from orchestrator.workflows.config import ExperimentConfig

SCORES = {"a": {"ppl": 100.0, "jsd": 0.5, "tvc": 0.3, "ttr": 0.1},
          "b": {"ppl": 200.0, "jsd": 0.6, "tvc": 0.2, "ttr": 0.2},
          "c": {"ppl": 400.0, "jsd": 0.7, "tvc": 0.1, "ttr": 0.3}}


def test_weighting_rules_known_answers():
    z = 1 + math.exp(-1) + math.exp(-2)
    # the default: softmax of -JSD / 0.1; JSD 0.1 apart -> e^-1 of the weight
    assert WeightingConfig().name == "softmax" and WeightingConfig().measure == "jsd"
    assert propose_weights(SCORES, WeightingConfig()) == pytest.approx(
        {"a": 1 / z, "b": math.exp(-1) / z, "c": math.exp(-2) / z})
    # on PPL with temperature 1 (nats): w proportional to 1 / PPL
    assert propose_weights(SCORES, WeightingConfig(measure="ppl", temperature=1.0)) == pytest.approx(
        {"a": 4 / 7, "b": 2 / 7, "c": 1 / 7})
    assert propose_weights(SCORES, WeightingConfig(name="top_k", k=2, measure="ppl")) == {"a": 0.5, "b": 0.5,
                                                                                           "c": 0.0}
    assert propose_weights(SCORES, WeightingConfig(name="top_k", measure="tvc")) == {"a": 1.0, "b": 0.0, "c": 0.0}
    assert propose_weights(SCORES, WeightingConfig(name="uniform")) == pytest.approx({s: 1 / 3 for s in "abc"})
    # min_weight drops c (0.090) and renormalises the rest
    kept = propose_weights(SCORES, WeightingConfig(min_weight=0.1))
    assert kept == pytest.approx({"a": 1 / (1 + math.exp(-1)), "b": math.exp(-1) / (1 + math.exp(-1)), "c": 0.0})
    # a cold softmax is top-1, a hot one uniform
    assert propose_weights(SCORES, WeightingConfig(temperature=1e-4))["a"] == pytest.approx(1.0)
    assert propose_weights(SCORES, WeightingConfig(temperature=1e4)) == pytest.approx({s: 1 / 3 for s in "abc"},
                                                                                      abs=1e-4)


@pytest.mark.parametrize("kwargs, message", [
    ({"measure": "ttr"}, "TTR measures diversity"),
    ({"name": "softmx"}, "did you mean 'softmax'"),
    ({"temperature": 0.0}, "temperature must be > 0"),
    ({"k": 0}, "k must be >= 1"),
])
def test_bad_weighting_settings_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        WeightingConfig(**kwargs)


def _shards(source: str, n: int, docs: int = 4, size: int = 1000) -> list[ShardInfo]:
    return [ShardInfo(path=f"{source}/shard-{i}.parquet", source=source, role="large", language="en", n_bytes=size,
                      pages=tuple(f"{source}{i}.{j}" for j in range(docs)), doc_sentences=(5,) * docs,
                      doc_bytes=(size // docs,) * docs) for i in range(n)]


def test_the_weighted_mixer_feeds_each_source_its_share():
    shards = _shards("a", 2) + _shards("b", 4)  # 2000 and 4000 bytes, documents of 250
    cfg = MixerConfig(name="weighted", weights={"a": 3, "b": 1}, total_bytes=6000)
    plan = MIXERS.get("weighted")(shards, cfg, random.Random(0))
    # a: 4500 bytes = 2 full passes (each shard, dupe factor 2) + 2 random documents; b: 1500 = 6 documents
    assert planned_bytes(plan, shards) == {"a": 4500, "b": 1500}
    full = [u for u in plan.units if u.dupe_factor == 2]
    assert sorted(u.members[0].path for u in full) == ["a/shard-0.parquet", "a/shard-1.parquet"]
    # every unit its own id, so its own part file: a source's full passes had one id between them, and the
    # instances stage wrote them all to one part, keeping the last (choose_data's arms lost 54-69 % of their
    # instances; session 52)
    assert [u.unit_id for u in plan.units] == list(range(len(plan.units)))
    assert all(u.members[0].rows is None for u in full)
    assert plan.notes["passes"] == {"a": 2.25, "b": 0.375} and plan.notes["weights"] == {"a": 0.75, "b": 0.25}
    # default budget: the sources' size x dupe_factor; a weight of 0 feeds nothing
    default = MIXERS.get("weighted")(shards, MixerConfig(name="weighted", weights={"a": 1, "b": 0}, dupe_factor=2),
                                     random.Random(0))
    assert planned_bytes(default, shards) == {"a": 12000}
    assert [u.unit_id for u in default.units] == [0, 1]
    with pytest.raises(ConfigError, match="no weight for source 'b'"):
        MIXERS.get("weighted")(shards, MixerConfig(name="weighted", weights={"a": 1}), random.Random(0))
    with pytest.raises(ConfigError, match="mixer.weights.a: -1"):
        MixerConfig(name="weighted", weights={"a": -1})


def test_a_plan_whose_unit_ids_repeat_is_refused_where_it_is_made_and_where_it_is_read(tmp_path):
    """A corpus the weighted mixer built before its fix holds units with one id: reading its plan says so and
    how to rebuild, where the instances stage wrote a part over another's and the pretraining read found parts
    missing (choose_data, session 52)."""
    import json

    from orchestrator.core.artifacts import Member, MixPlan, Unit, load_plan
    from orchestrator.core.errors import InputError

    units = (Unit(0, (Member("a/shard-0.parquet"),), 2), Unit(0, (Member("a/shard-1.parquet"),), 2),
             Unit(2, (Member("b/shard-0.parquet", (1,)),), 1))
    with pytest.raises(ValueError, match=r"unit ids repeat: unit id 0 x 2"):
        MixPlan(units, {})
    (tmp_path / "shards.json").write_text("[]")
    (tmp_path / "plan.json").write_text(json.dumps({"notes": {}, "units": [
        {"unit_id": u.unit_id, "dupe_factor": u.dupe_factor,
         "members": [{"path": m.path, "rows": list(m.rows) if m.rows else None} for m in u.members]} for u in units]}))
    with pytest.raises(InputError, match=r"plan.json: units with the same id \(unit id 0 x 2\).*remove this corpus "
                                         r"stage's folder and the instances built from it"):
        load_plan(tmp_path)


@pytest.fixture(scope="module")
def proposal(tmp_path_factory):
    """The job's tiny preset (the bundled corpora against the bundled BC5CDR-chem and HoC text), run."""
    from orchestrator.selection.measures import kenlm_binary
    from orchestrator.workflows.propose_mix import ProposalConfig, run

    try:
        kenlm_binary("lmplz"), kenlm_binary("build_binary")
    except Exception:
        pytest.skip("KenLM lmplz/build_binary not built: run scripts/setup.sh")
    out = tmp_path_factory.mktemp("proposal") / "out"
    cfg = load_config(ProposalConfig, overrides=[f"out_dir={out}"], base=load_preset("propose_mix", "tiny"))
    return cfg, run(cfg)


def test_the_proposal_is_a_corpus_config_that_dry_runs(proposal):
    cfg, result = proposal
    assert sum(result.weights.values()) == pytest.approx(1.0)
    # the in-domain sample is the closer one to biomedical task text, so it leads
    assert result.scores["in_domain"]["jsd"] < result.scores["general"]["jsd"]
    assert result.weights["in_domain"] > 0.5 > result.weights["general"] > 0
    built = load_config(CorpusBuildConfig, result.corpus_file)
    assert built.corpus.mixer.name == "weighted"
    assert built.corpus.mixer.weights == pytest.approx(result.weights, abs=1e-6)
    assert [s.name for s in built.corpus.sources] == ["in_domain", "general"]
    assert built.corpus.mixer.shard_bytes == cfg.corpus.mixer.shard_bytes == 20000
    record = json.loads((result.out_dir / "proposal.json").read_text())
    assert record["method"] == "scores" and record["rule"]["name"] == "softmax" and record["corpus"] == "corpus.yaml"
    assert set(json.loads((result.out_dir / "scores_by_task.json").read_text())) == {"BC5CDR-chem", "HoC"}
    # the summary's own build command, as printed: it builds into a run directory of its own
    res = run_job("build_corpus.py", *build_command(result.summary())[2:], "--dry-run", timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert re.search(r"weighted: ~\d+ bytes to instance creation \(file sizes\): in_domain 6\d\.\d%", res.stdout)
    assert f"run directory: {result.out_dir.parent / 'out_corpus'}\n" in res.stdout


def build_command(summary: str) -> list[str]:
    """The command a proposer's summary prints after 'build it:'."""
    return shlex.split(next(line for line in summary.splitlines() if "build it:" in line).split("build it:")[1])


def test_the_printed_build_command_names_a_fresh_run_directory():
    """The 'build it' line gave no out_dir, so jobs/build_corpus.py's tiny preset built the proposal into
    runs/corpus_tiny, replacing the corpus a pretraining there was trained on (docs probe D12)."""
    from orchestrator.workflows.propose_mix import ProposalResult
    from orchestrator.workflows.proxy_search import ProxySearchResult

    scores = {"a": {"ppl": 9.0, "jsd": 0.1, "tvc": 0.5, "ttr": 0.2}}
    proposal = ProposalResult(out_dir=Path("runs/proposal_tiny"), weights={"a": 1.0}, scores=scores, rule="softmax")
    proxy = ProxySearchResult(out_dir=Path("runs/proxy tiny"), weights={"a": 1.0}, predicted_loss=1.0, proxies=[],
                              cv={"spearman": 1.0, "folds": 3, "pearson": 1.0, "mae": 0.0})
    assert build_command(proposal.summary()) == ["python", "jobs/build_corpus.py", "--config",
                                                 "runs/proposal_tiny/corpus.yaml", "out_dir=runs/proposal_tiny_corpus"]
    assert build_command(proxy.summary()) == ["python", "jobs/build_corpus.py", "--config",
                                              "runs/proxy tiny/corpus.yaml", "out_dir=runs/proxy tiny_corpus"]


def test_a_new_rule_reuses_the_scores_and_a_score_sources_output_serves_too(proposal, tmp_path, caplog):
    from orchestrator.core.config import replace
    from orchestrator.selection.proposal import WeightingConfig as W
    from orchestrator.workflows.propose_mix import run

    cfg, first = proposal
    shutil.copytree(first.out_dir, tmp_path / "copy")  # an earlier output, kept for the other tests
    with caplog.at_level("INFO"):
        top = run(replace(cfg, out_dir=str(tmp_path / "copy"), weighting=W(name="top_k")))
    assert "scores reused" in caplog.text and "scoring candidate" not in caplog.text
    assert top.weights == {"in_domain": 1.0, "general": 0.0} and top.scores == first.scores
    built = load_config(CorpusBuildConfig, top.corpus_file)
    assert [s.name for s in built.corpus.sources] == ["in_domain"]  # weight 0: left out of the corpus
    # but its share moves to the source kept: the proposal feeds the candidates' size x dupe factor, as the
    # softmax proposal does (probe D item 3: top_k fed a quarter of it, the kept source's size alone)
    from orchestrator.corpus.stage import source_sizes
    assert built.corpus.mixer.total_bytes == sum(source_sizes(cfg.corpus).values()) * cfg.corpus.mixer.dupe_factor
    assert load_config(CorpusBuildConfig, first.corpus_file).corpus.mixer.total_bytes == 0  # none left out
    # the scores of a score_sources run (its layout: scores.json, scores_by_task.json), per target task
    again = run(replace(cfg, out_dir=str(tmp_path / "again"), scores=str(top.out_dir), target_task="HoC"))
    hoc = json.loads((top.out_dir / "scores_by_task.json").read_text())["HoC"]
    assert again.weights == pytest.approx(propose_weights(hoc, W()))
    with pytest.raises(InputError, match="has no scores for candidate 'general'"):
        (tmp_path / "partial").mkdir()
        (tmp_path / "partial" / "scores.json").write_text(json.dumps({"in_domain": first.scores["in_domain"]}))
        run(replace(cfg, out_dir=str(tmp_path / "x"), scores=str(tmp_path / "partial")))


def test_an_experiment_arm_takes_the_proposal_as_its_corpus(proposal, tmp_path):
    from orchestrator.workflows.runner import arm_plans

    _, result = proposal
    base = merge(load_preset("blue_sweep", "smoke"), {"runs_root": str(tmp_path), "run_name": "exp"})
    arms = {"proposal": {"corpus_from": str(result.corpus_file), "corpus.mixer.dupe_factor": 3},
            "base": {}, "floor": {"init": "random"}}
    cfg = from_dict(ExperimentConfig, merge(base, {"arms": arms}))
    arm = cfg.arm("proposal")
    assert arm.corpus.mixer.name == "weighted" and arm.corpus.mixer.weights == pytest.approx(result.weights)
    assert arm.corpus.mixer.dupe_factor == 3  # the arm's own overrides apply on top of the file's corpus
    assert cfg.arm("base").corpus == cfg.corpus and cfg.arm_kind("proposal") == "pretrain"
    plans = arm_plans(cfg)
    assert plans["proposal"].outputs[0].key != plans["base"].outputs[0].key  # its own corpus output
    with pytest.raises(ConfigError, match=r"arms.bad.corpus_from: config file not found"):
        from_dict(ExperimentConfig, merge(base, {"arms": {"bad": {"corpus_from": str(tmp_path / "none.yaml")}}}))
    (tmp_path / "no_corpus.yaml").write_text("vocab: {vocab_size: 100}\n")
    with pytest.raises(ConfigError, match="has no corpus: section"):
        from_dict(ExperimentConfig, merge(base, {"arms": {"bad": {"corpus_from": str(tmp_path / "no_corpus.yaml")}}}))


def test_the_shipped_proposal_loads():
    """configs/proposals/biomed_jsd (written by configs/propose_biomed.yaml on the shared data) is a
    corpus config whose weights favour PubMed for the biomedical targets."""
    built = load_config(CorpusBuildConfig, ROOT / "configs/proposals/biomed_jsd/corpus.yaml")
    weights = built.corpus.mixer.weights
    assert built.corpus.mixer.name == "weighted" and max(weights, key=weights.get) == "pubmed"
    record = json.loads((ROOT / "configs/proposals/biomed_jsd/proposal.json").read_text())
    assert record["weights"] == pytest.approx(weights, abs=1e-6)


def test_a_target_task_the_targets_do_not_make_is_refused_by_the_dry_run_before_any_scoring(tmp_path):
    res = run_job("propose_mix.py", "--preset", "tiny", "--dry-run", "target_task=Hoc", timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert res.stderr.strip() == "error: target_task 'Hoc' is not a task of the targets (did you mean 'HoC'?)"
    res = run_job("propose_mix.py", "--preset", "tiny", "target_task=nope", f"out_dir={tmp_path / 'p'}", timeout=300)
    assert res.returncode == 2 and "target_task 'nope' is not a task of the targets" in res.stderr
    assert not (tmp_path / "p").exists()
