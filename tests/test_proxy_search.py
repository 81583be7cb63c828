"""RegMix-style proposal from proxy runs: the regression and simplex search on a known answer (pure numpy),
the pools' packing and sharing-out, a real proxy search (Ray Tune trials, real training, MLflow SQLite)
whose corpus.yaml loads and whose re-run reuses it, bad configs, and the shipped proposal."""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from conftest import ROOT, run_job
from orchestrator.core.cli import load_preset
from orchestrator.core.config import load_config
from orchestrator.core.errors import ConfigError
from orchestrator.instances.config import Specials
from orchestrator.pretrain.proxy import draw_rows, pack, share_out
from orchestrator.selection.regmix import (
    RegressionConfig,
    cross_validate,
    dirichlet_mixtures,
    fit_regression,
    search_simplex,
    spearman,
)
from orchestrator.workflows.build_corpus import CorpusBuildConfig

BEST = np.array([0.6, 0.3, 0.1])


def known_loss(W: np.ndarray) -> np.ndarray:
    """A loss with its minimum at BEST inside the simplex: 2 + 3 * ||w - BEST||^2 (a Scheffe quadratic)."""
    return 2.0 + 3.0 * ((W - BEST) ** 2).sum(axis=1)


def test_the_search_recovers_a_known_best_mixture_and_the_regression_ranks_held_out_mixtures():
    W = dirichlet_mixtures({"a": 0.3, "b": 0.5, "c": 0.2}, k=16, concentration=1.0, seed=0)
    assert W.shape == (16, 3) and np.allclose(W.sum(axis=1), 1.0)
    y = known_loss(W) + np.random.default_rng(1).normal(0, 0.002, len(W))  # a little measurement noise
    cfg = RegressionConfig(features="quadratic", samples=50_000, top_k=50)
    cv = cross_validate(W, y, cfg)
    assert cv["folds"] == 16 and cv["spearman"] > 0.95 and cv["mae"] < 0.01
    best, predicted = search_simplex(fit_regression(W, y, cfg), 3, cfg)
    assert np.abs(best - BEST).max() < 0.05 and predicted == pytest.approx(2.0, abs=0.01)
    # a linear model cannot have an interior minimum: it ranks worse and proposes a vertex's neighbourhood
    linear = RegressionConfig(features="linear", samples=50_000, top_k=50)
    assert cross_validate(W, y, linear)["spearman"] < cv["spearman"]
    # k-fold, and the Dirichlet's mean is the natural mixture
    assert cross_validate(W, y, RegressionConfig(folds=4))["folds"] == 4
    many = dirichlet_mixtures({"a": 3, "b": 5, "c": 2}, k=4000, concentration=1.0, seed=0)
    assert many.mean(axis=0) == pytest.approx([0.3, 0.5, 0.2], abs=0.02)


def test_spearman_and_the_pools_sharing_known_answers():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9486833, abs=1e-6)  # scipy's value, ties
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert share_out({"a": 0.5, "b": 0.3, "c": 0.2}, 7) == {"a": 4, "b": 2, "c": 1}
    assert sum(share_out({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 10).values()) == 10
    sp = Specials(cls=2, sep=3, mask=4, vocab_size=20, continuation=frozenset())
    rows = pack(np.arange(10, 21), sp, 6)  # 11 tokens -> 2 sequences of [CLS] 4 tokens [SEP], tail dropped
    assert rows.tolist() == [[2, 10, 11, 12, 13, 3], [2, 14, 15, 16, 17, 3]]
    pools = {"a": np.full((3, 4), 1), "b": np.full((50, 4), 2)}
    drawn, counts = draw_rows(pools, {"a": 0.8, "b": 0.2}, 10, np.random.default_rng(0))
    assert counts == {"a": 8, "b": 2} and (drawn[:, 0] == 1).sum() == 8 and len(drawn) == 10


@pytest.fixture(scope="module")
def search(tmp_path_factory, ray_local):
    """The job's tiny preset with 3 proxies of 20 steps, run for real: Tune trials, training, MLflow."""
    from orchestrator.workflows.proxy_search import ProxySearchConfig, run

    out = tmp_path_factory.mktemp("proxy") / "out"
    cfg = load_config(ProxySearchConfig, overrides=[f"out_dir={out}", "proxies=3", "proxy.train_tokens=10000",
                                                    "regression.samples=2000", "regression.top_k=10"],
                      base=load_preset("proxy_search", "tiny"))
    return cfg, run(cfg)


def test_a_real_proxy_search_writes_a_corpus_config_and_logs_a_run_per_proxy(search):
    import mlflow

    cfg, result = search
    assert sum(result.weights.values()) == pytest.approx(1.0) and len(result.proxies) == 3
    built = load_config(CorpusBuildConfig, result.corpus_file)
    assert built.corpus.mixer.name == "weighted"
    assert built.corpus.mixer.weights == pytest.approx({k: v for k, v in result.weights.items() if v > 0}, abs=1e-6)
    record = json.loads((result.out_dir / "proposal.json").read_text())
    assert record["method"] == "proxy" and record["corpus"] == "corpus.yaml"
    assert [p["index"] for p in record["proxies"]] == [0, 1, 2]
    for p in record["proxies"]:
        # every proxy trained its budget (20 steps of 16 x 32) and learned something: below the uniform guess
        assert p["steps"] == 20 and p["train_tokens"] == 10240
        assert 0 < p["target_mlm_loss"] < math.log(1000)
        assert sum(p["sequences"].values()) == 20 * 16
    assert len({round(p["target_mlm_loss"], 6) for p in record["proxies"]}) == 3  # mixtures differ, losses too
    assert -1 <= record["regression"]["cv_spearman"] <= 1 and record["regression"]["cv_folds"] == 3
    manifest = json.loads((result.out_dir / "manifest.json").read_text())
    assert manifest["stage"] == "proxy_search" and manifest["counts"]["proxies"] == 3
    kept = [json.loads(p.read_text()) for p in (cfg.work / "proxies").glob("*.json")]
    assert len(kept) == 3 and all(r["versions"] == manifest["versions"] for r in kept)  # what each trained under
    pools = next((cfg.work / "pools").iterdir())
    assert json.loads((pools / "manifest.json").read_text())["counts"]["target"]["sequences"] <= 64
    client = mlflow.MlflowClient(f"sqlite:///{cfg.work / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    parent = [r for r in runs if r.data.tags.get("orchestrator.kind") == "proxy_search"]
    children = [r for r in runs if r.data.tags.get("orchestrator.kind") == "proxy"]
    assert len(parent) == 1 and len(children) == 3
    assert "cv_spearman" in parent[0].data.metrics
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent[0].info.run_id}
    assert sorted(c.data.metrics["target_mlm_loss"] for c in children) == pytest.approx(
        sorted(p["target_mlm_loss"] for p in record["proxies"]))


def test_a_rerun_reuses_the_output_and_a_changed_search_reuses_the_trained_proxies(search, caplog):
    from orchestrator.core.config import replace
    from orchestrator.selection.regmix import RegressionConfig as R
    from orchestrator.workflows.proxy_search import run

    cfg, first = search
    again = run(cfg)
    assert again.reused and again.weights == first.weights
    with caplog.at_level("INFO"):
        other = run(replace(cfg, regression=R(features="quadratic", samples=2000, top_k=10)))
    assert "3 of 3 already trained" in caplog.text and not other.reused
    assert [p["target_mlm_loss"] for p in other.proxies] == [p["target_mlm_loss"] for p in first.proxies]


def test_a_reused_search_and_reused_proxies_name_the_library_releases_they_were_made_under(tmp_path, caplog):
    """Session 55: proxies and a search output made under another release are reused (no key holds a version);
    the reuse lines, and the dry run's "would be reused", now say which libraries differ. A proxy record keeps the
    versions it trained under; one kept before is of an unknown release (counted, in no release). No Ray starts."""
    from orchestrator.core.manifest import library_versions
    from orchestrator.workflows.proxy_search import (
        ProxySearchConfig,
        plan,
        planned_proxies,
        regress,
        run,
        run_proxies,
        search_key,
        write_output,
    )

    cfg = load_config(ProxySearchConfig, overrides=[f"out_dir={tmp_path / 'out'}", "proxies=3"],
                      base=load_preset("proxy_search", "tiny"))
    now = library_versions()
    (cfg.work / "proxies").mkdir(parents=True)
    for p, torch in zip(planned_proxies(cfg, "pools-key"), ("1.13.1", "1.13.1", None)):  # as a proxy trial records
        record = {**p, "target_mlm_loss": 6.0 + p["weights"]["general"], "target_mlm_accuracy": 0.1, "train_loss": 6.5,
                  "steps": 40, "train_tokens": 20480, "sequences": {"in_domain": 320, "general": 320}, "seconds": 1.0,
                  **({"versions": {**now, "torch": torch}} if torch else {})}  # the last: kept before versions were
        (cfg.work / "proxies" / f"{p['key']}.json").write_text(json.dumps(record))
    with caplog.at_level("INFO", logger="proxy_search"):
        proxies = run_proxies(cfg, tmp_path / "pools", "pools-key")
    assert [p["index"] for p in proxies] == [0, 1, 2]  # all reused: nothing to train
    assert caplog.messages[-1] == ("proxies: 3 of 3 already trained (same pools, settings and mixture), reused; made "
                                   f"under torch 1.13.1 (2 of 3), now {now['torch']}")
    write_output(cfg, search_key(cfg), proxies, regress(cfg, proxies))  # as the search leaves its output
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["versions"] == now
    made = {**now, "transformers": "4.2.0", "numpy": now["numpy"] + "+local"}  # numpy: the same release
    (tmp_path / "out" / "manifest.json").write_text(json.dumps({**manifest, "versions": made}))
    caplog.clear()
    with caplog.at_level("INFO", logger="proxy_search"):
        assert run(cfg).reused
    said = f"; made under transformers 4.2.0, now {now['transformers']}"
    assert caplog.messages[-1] == ("proxy search: output complete for this config and inputs, reused "
                                   f"({cfg.out_dir}){said}")
    assert f"{cfg.out_dir}: complete for this config and inputs, would be reused{said}\n" in plan(cfg) + "\n"


@pytest.mark.parametrize("overrides, message", [
    (["proxies=2"], "proxies must be >= 3"),
    (["targets=[]"], "no targets"),
    (["proxy.size=huge"], "proxy.size 'huge'"),
    (["regression.top_k=0"], "top_k <= samples"),
    (["regression.featurs=linear"], "featurs"),
    (["pools.max_seq_length=4"], "max_seq_length must be >= 8"),
    (["out_dir=runs/p", "work_dir=runs/p/"], "work_dir runs/p is out_dir (runs/p)"),
    (["out_dir=runs/p", "work_dir=runs/p/work"], "work_dir runs/p/work is inside out_dir (runs/p)"),
    (["out_dir=runs/w/proxies/p", "work_dir=runs/w"], "out_dir runs/w/proxies/p is in work_dir's proxies"),
])
def test_bad_configs_are_refused(overrides, message):
    from orchestrator.workflows.proxy_search import ProxySearchConfig

    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(ProxySearchConfig, overrides=overrides, base=load_preset("proxy_search", "tiny"))


def test_the_output_may_lie_in_the_work_directory_beside_what_the_search_keeps_there():
    from orchestrator.workflows.proxy_search import ProxySearchConfig

    cfg = load_config(ProxySearchConfig, overrides=["out_dir=runs/w/proposal", "work_dir=runs/w"],
                      base=load_preset("proxy_search", "tiny"))
    assert str(cfg.work) == "runs/w"


def test_the_job_dry_runs_and_a_missing_target_fails_naming_it(tmp_path):
    res = run_job("proxy_search.py", "--dry-run", f"out_dir={tmp_path / 'out'}", timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "4 proxies (tiny, 40 steps x 16 x 32" in res.stdout and "dry run: config and inputs are valid" in res.stdout
    assert not (tmp_path / "out").exists()
    res = run_job("proxy_search.py", "--dry-run", "--target", str(tmp_path / "none.tsv"), timeout=120)
    assert res.returncode != 0 and "none.tsv" in res.stderr



def test_the_shipped_proxy_proposal_loads():
    """configs/proposals/biomed_proxy (written by configs/proxy_biomed.yaml on the shared data)."""
    built = load_config(CorpusBuildConfig, ROOT / "configs/proposals/biomed_proxy/corpus.yaml")
    record = json.loads((ROOT / "configs/proposals/biomed_proxy/proposal.json").read_text())
    assert built.corpus.mixer.name == "weighted" and record["method"] == "proxy"
    assert {k: v for k, v in record["weights"].items() if v > 0} == pytest.approx(built.corpus.mixer.weights, abs=1e-6)
    assert len(record["proxies"]) >= 12
