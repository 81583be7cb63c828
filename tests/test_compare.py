"""Paired comparison of models against a baseline: known per-seed scores in, hand-computed statistics out;
the report's section and comparison.json; the report job's check of the baseline."""
from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from conftest import ROOT
from orchestrator.core.errors import InputError
from orchestrator.core.manifest import read_manifest
from orchestrator.core.results import summarize
from orchestrator.report.blue_table import write_report
from orchestrator.report.compare import comparison_document, ner_before_after, paired_differences
from orchestrator.report.pages import render_markdown
from orchestrator.report.replicates import across_seeds, replicate_differences
from orchestrator.report.table import build_table

SEEDS = [1, 2, 3, 4]
#: model -> task -> per-seed test scores (seeds 1..4)
SCORES = {
    "base": {"BIOSSES": [0.80, 0.82, 0.78, 0.81], "ERR": [0.30, 0.32, 0.31, 0.29], "NER": [0.60, 0.62, 0.61, 0.63]},
    "ampv": {"BIOSSES": [0.85, 0.86, 0.84, 0.88], "ERR": [0.25, 0.28, 0.26, 0.27], "NER": [0.70, 0.71, 0.69, 0.74]},
}
PER_TAG = {
    "base": {"Chemical": {"precision": 0.7, "recall": 0.6, "f1": 0.646, "support": 30},
             "Disease": {"precision": 0.5, "recall": 0.4, "f1": 0.444, "support": 10}},
    "ampv": {"Chemical": {"precision": 0.8, "recall": 0.7, "f1": 0.747, "support": 30},
             "Disease": {"precision": 0.6, "recall": 0.6, "f1": 0.6, "support": 10}},
}


def cell(scores: list[float], seeds: list | None = None, **extra) -> dict:
    seeds = SEEDS[:len(scores)] if seeds is None else seeds
    sd = statistics.stdev(scores) if len(scores) > 1 else 0.0
    return {"mean": statistics.fmean(scores), "sd": sd, "n": len(scores), "test_scores": list(scores),
            "seeds": list(seeds), **extra}


def make_results() -> dict:
    """Two models; BIOSSES (biomedical), ERR (clinical, lower is better), NER (biomedical, per-tag)."""
    tasks = [{"name": "BIOSSES", "metric": "pearson", "higher_is_better": True, "group": "biomedical"},
             {"name": "ERR", "metric": "mae", "higher_is_better": False, "group": "clinical"},
             {"name": "NER", "metric": "ner_f1", "higher_is_better": True, "group": "biomedical"}]
    cells = {model: {task: cell(values, per_tag=PER_TAG[model]) if task == "NER" else cell(values)
                     for task, values in row.items()} for model, row in SCORES.items()}
    return {"tasks": tasks, "models": list(SCORES), "cells": cells, "summary": summarize(tasks, cells)}


def diffs(model: str, task: str) -> list[float]:
    return [m - b for m, b in zip(SCORES[model][task], SCORES["base"][task])]


# ---------------------------------------------------------------------------------------------
def test_difference_t_and_p_match_a_hand_computation():
    entry = paired_differences(make_results(), "base", n_boot=2000)["rows"]["ampv"]["BIOSSES"]
    d = diffs("ampv", "BIOSSES")  # 0.05, 0.04, 0.06, 0.07
    mean = sum(d) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 3)
    t = mean / (sd / math.sqrt(4))
    p = 2 * stats.t.sf(abs(t), df=3)
    assert entry["n"] == 4 and entry["paired"] == SEEDS and entry["pairs_by"] == "seed"
    assert entry["mean_diff"] == pytest.approx(0.055) and entry["mean_diff"] == pytest.approx(mean)
    assert entry["sd_diff"] == pytest.approx(sd)
    assert entry["t"] == pytest.approx(t) and entry["p"] == pytest.approx(p)
    ref = stats.ttest_rel(SCORES["ampv"]["BIOSSES"], SCORES["base"]["BIOSSES"])
    assert entry["p"] == pytest.approx(ref.pvalue) and entry["t"] == pytest.approx(ref.statistic)
    assert p < 0.05 and entry["significant"] is True
    assert entry["better"] is True and entry["note"] is None
    assert entry["baseline_mean"] == pytest.approx(0.8025) and entry["model_mean"] == pytest.approx(0.8575)


def twelve_seeds() -> tuple[dict, np.ndarray]:
    """BIOSSES over 12 seeds with distinct differences (few pairs make a coarse, discrete bootstrap)."""
    results = make_results()
    base = [0.80 + 0.01 * (i % 5) for i in range(12)]
    d = np.array([0.031, 0.052, -0.012, 0.044, 0.018, 0.067, 0.009, 0.025, 0.073, -0.004, 0.038, 0.057])
    seeds = list(range(100, 112))
    results["cells"]["base"]["BIOSSES"] = cell(base, seeds=seeds)
    results["cells"]["ampv"]["BIOSSES"] = cell(list(np.array(base) + d), seeds=seeds)
    return results, d


def test_bootstrap_interval_contains_the_mean_and_is_seeded():
    results, d = twelve_seeds()
    first = paired_differences(results, "base", seed=7)["rows"]["ampv"]["BIOSSES"]
    again = paired_differences(results, "base", seed=7)["rows"]["ampv"]["BIOSSES"]
    other = paired_differences(results, "base", seed=8)["rows"]["ampv"]["BIOSSES"]
    lo, hi = first["ci"]
    assert first["mean_diff"] == pytest.approx(d.mean())
    assert lo < first["mean_diff"] < hi
    assert d.min() < lo < hi < d.max()  # means of resamples stay well inside the range of the differences
    assert again["ci"] == first["ci"]
    assert other["ci"] != first["ci"] and other["ci"] == pytest.approx(first["ci"], abs=0.005)
    # a 50 % interval (same draws) is nested in the 95 % one; alpha sets the interval and the test's threshold
    narrow = paired_differences(results, "base", seed=7, alpha=0.5)
    assert narrow["ci_level"] == 0.5
    n_lo, n_hi = narrow["rows"]["ampv"]["BIOSSES"]["ci"]
    assert lo < n_lo < n_hi < hi
    # an interval does not depend on which other models are compared
    results["models"].append("simpt")
    results["cells"]["simpt"] = {"BIOSSES": cell([0.9] * 12, seeds=list(range(100, 112)))}
    assert paired_differences(results, "base", seed=7)["rows"]["ampv"]["BIOSSES"]["ci"] == first["ci"]


def test_bootstrap_matches_a_direct_resampling():
    """The interval is the percentile interval of resampled means: checked against independent draws."""
    results, d = twelve_seeds()
    entry = paired_differences(results, "base", n_boot=20000, seed=3)["rows"]["ampv"]["BIOSSES"]
    rng = np.random.default_rng(123)
    means = d[rng.integers(0, len(d), size=(200_000, len(d)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    # two independent bootstraps of the same 12 pairs: the same interval up to Monte Carlo error
    assert entry["ci"][0] == pytest.approx(lo, abs=1e-3) and entry["ci"][1] == pytest.approx(hi, abs=1e-3)
    # its width is of the t interval's order (a percentile interval runs ~15 % narrower at n = 12)
    half = stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    assert entry["ci"][1] - entry["ci"][0] == pytest.approx(2 * half, rel=0.25)


def test_unpaired_seeds_are_dropped_and_seed_order_does_not_matter():
    results = make_results()
    # ampv ran seeds 5, 3, 2, 1 (listed in another order); base ran 1..4: seeds 1, 2, 3 pair
    results["cells"]["ampv"]["BIOSSES"] = cell([0.99, 0.84, 0.86, 0.85], seeds=[5, 3, 2, 1])
    entry = paired_differences(results, "base")["rows"]["ampv"]["BIOSSES"]
    assert entry["n"] == 3 and sorted(entry["paired"]) == [1, 2, 3]
    assert entry["dropped"] == {"baseline": [4], "model": [5]}
    want = [0.85 - 0.80, 0.86 - 0.82, 0.84 - 0.78]
    assert entry["mean_diff"] == pytest.approx(sum(want) / 3)
    assert entry["p"] == pytest.approx(stats.ttest_rel([0.85, 0.86, 0.84], [0.80, 0.82, 0.78]).pvalue)


def test_one_pair_or_equal_differences_give_no_p_and_say_why():
    results = make_results()
    results["cells"]["ampv"]["BIOSSES"] = cell([0.9, 0.95], seeds=[1, 9])  # one seed in common
    results["cells"]["ampv"]["ERR"] = cell([v - 0.05 for v in SCORES["base"]["ERR"]])  # every seed -0.05
    row = paired_differences(results, "base")["rows"]["ampv"]
    one = row["BIOSSES"]
    assert one["n"] == 1 and one["p"] is None and one["t"] is None and one["ci"] is None
    assert one["significant"] is False and "one pair" in one["note"]
    assert one["mean_diff"] == pytest.approx(0.10)
    same = row["ERR"]
    assert same["n"] == 4 and same["p"] is None and same["significant"] is False
    assert "differences are equal" in same["note"] and same["sd_diff"] == pytest.approx(0.0, abs=1e-12)
    assert same["ci"] == [pytest.approx(-0.05), pytest.approx(-0.05)]
    results["cells"]["ampv"]["BIOSSES"] = cell([0.9], seeds=[9])  # no seed in common
    none = paired_differences(results, "base")["rows"]["ampv"]["BIOSSES"]
    assert none["n"] == 0 and none["mean_diff"] is None and "no pairs" in none["note"]


def test_lower_is_better_keeps_the_raw_difference_and_flags_better_by_direction():
    doc = paired_differences(make_results(), "base")
    err = doc["rows"]["ampv"]["ERR"]
    assert err["higher_is_better"] is False
    assert err["mean_diff"] == pytest.approx(sum(diffs("ampv", "ERR")) / 4) and err["mean_diff"] < 0
    assert err["better"] is True  # a lower error is an improvement
    worse = make_results()
    worse["cells"]["ampv"]["ERR"] = cell([v + 0.1 for v in SCORES["base"]["ERR"]])
    assert paired_differences(worse, "base")["rows"]["ampv"]["ERR"]["better"] is False
    assert {c["key"]: c["higher_is_better"] for c in doc["columns"]}["ERR"] is False


def test_summary_columns_are_per_seed_macro_averages_over_the_same_tasks():
    results = make_results()
    row = paired_differences(results, "base")["rows"]["ampv"]
    # ERR, clinical's only task, is lower-is-better: in no average, so there is no clinical column
    assert [c["key"] for c in paired_differences(results, "base")["columns"]][:2] == ["total", "biomedical"]
    assert "clinical" not in row
    per_seed = {m: [statistics.fmean(SCORES[m][t][i] for t in ("BIOSSES", "NER")) for i in range(4)]
                for m in SCORES}
    bio = row["biomedical"]
    assert bio["partial"] is False and bio["tasks"] == ["BIOSSES", "NER"] and bio["n"] == 4
    assert bio["baseline_mean"] == pytest.approx(statistics.fmean(per_seed["base"]))
    assert bio["p"] == pytest.approx(stats.ttest_rel(per_seed["ampv"], per_seed["base"]).pvalue)
    assert row["total"]["tasks"] == ["BIOSSES", "NER"] and row["total"]["partial"] is False

    # ampv has no NER cell: its biomedical column averages BIOSSES only, for both models, marked partial
    del results["cells"]["ampv"]["NER"]
    row = paired_differences(results, "base")["rows"]["ampv"]
    bio = row["biomedical"]
    assert bio["partial"] is True and bio["tasks"] == ["BIOSSES"] and bio["missing"] == ["NER"]
    assert bio["baseline_mean"] == pytest.approx(statistics.fmean(SCORES["base"]["BIOSSES"]))  # not the full average
    assert bio["mean_diff"] == pytest.approx(row["BIOSSES"]["mean_diff"])
    assert "NER" not in row  # a task only one model has gets no entry


def test_cross_validated_tasks_pair_by_fold_and_leave_the_summary_partial():
    results = make_results()
    results["cells"]["base"]["ERR"] = cell([0.30, 0.31, 0.35], seeds=[1, 2], folds=3)
    results["cells"]["ampv"]["ERR"] = cell([0.28, 0.30, 0.30], seeds=[1, 2], folds=3)
    row = paired_differences(results, "base")["rows"]["ampv"]
    err = row["ERR"]
    assert err["pairs_by"] == "fold" and err["paired"] == [0, 1, 2] and err["n"] == 3
    assert err["mean_diff"] == pytest.approx((-0.02 - 0.01 - 0.05) / 3)
    assert err["p"] == pytest.approx(stats.ttest_rel([0.28, 0.30, 0.30], [0.30, 0.31, 0.35]).pvalue)
    assert row["total"]["partial"] is False and "ERR" not in row["total"]["tasks"]  # lower is better: in no average
    results["cells"]["base"]["BIOSSES"] = cell([0.80, 0.82, 0.78], seeds=[1, 2], folds=3)
    results["cells"]["ampv"]["BIOSSES"] = cell([0.85, 0.86, 0.84], seeds=[1, 2], folds=3)
    row = paired_differences(results, "base")["rows"]["ampv"]
    assert row["BIOSSES"]["pairs_by"] == "fold"
    assert row["total"]["partial"] is True and "BIOSSES" in row["total"]["missing"]
    results["cells"]["ampv"]["ERR"] = cell([0.28, 0.30, 0.30, 0.3, 0.3], seeds=[1, 2], folds=5)
    five = paired_differences(results, "base")["rows"]["ampv"]["ERR"]
    assert five["n"] == 0 and "different fold counts" in five["note"]


def test_unknown_baseline_or_model_is_refused_by_name():
    with pytest.raises(InputError, match=r"runs/x/results.json: baseline 'nope' is not a model.*'base', 'ampv'"):
        paired_differences(make_results(), "nope", source="runs/x/results.json")
    with pytest.raises(InputError, match="'ghost'"):
        paired_differences(make_results(), "base", ["ghost"])


def test_cells_without_per_seed_scores_give_no_pairs():
    """Results rebuilt from MLflow metrics carry means only: nothing is invented."""
    results = make_results()
    for row in results["cells"].values():
        for c in row.values():
            del c["test_scores"], c["seeds"]
    row = paired_differences(results, "base")["rows"]["ampv"]
    assert row["BIOSSES"]["n"] == 0 and "no per-seed test scores" in row["BIOSSES"]["note"]
    assert row["total"]["n"] == 0 and row["total"]["tasks"] == [] and row["total"]["note"]


def test_ner_before_after_is_seed_001_layout():
    tables = ner_before_after(make_results(), "base", "ampv")
    assert list(tables) == ["NER"]  # only the task with per-tag rows
    ner = tables["NER"]
    assert list(ner["tags"]) == ["Chemical", "Disease"]
    assert ner["tags"]["Disease"]["before"] == {"precision": 0.5, "recall": 0.4, "f1": 0.444, "support": 10}
    assert ner["tags"]["Chemical"]["after"]["recall"] == 0.7
    before, after = ner["overall"]["before"], ner["overall"]["after"]
    assert before["support"] == 40 and after["support"] == 40
    assert before["recall"] == pytest.approx((0.6 * 30 + 0.4 * 10) / 40)  # support-weighted = micro recall
    assert after["precision"] == pytest.approx((0.8 * 30 + 0.6 * 10) / 40)
    assert before["f1"] == pytest.approx(statistics.fmean(SCORES["base"]["NER"]))  # the task's micro F1
    assert "not micro precision" in ner["overall_method"]["precision"]
    assert "micro F1" in ner["overall_method"]["f1"]
    results = make_results()  # trials since issue 33 record entity counts: the sweep writes a micro avg row
    results["cells"]["base"]["NER"]["per_tag"]["micro avg"] = {"precision": 0.61, "recall": 0.55, "f1": 0.58,
                                                               "support": 40}
    ner = ner_before_after(results, "base", "ampv")["NER"]
    assert ner["overall"]["before"] == {"precision": 0.61, "recall": 0.55, "f1": 0.58, "support": 40}
    assert ner["overall_method"]["precision"].startswith("micro average from the recorded entity counts")
    assert list(ner["tags"]) == ["Chemical", "Disease"]  # the average is no tag


# ---------------------------------------------------------------------------------------------
def test_report_with_a_baseline_has_the_section_and_comparison_json(tmp_path):
    results = make_results()
    paths = write_report(results, tmp_path / "report", baseline="base")
    md = paths["md"].read_text(encoding="utf-8")
    assert "## Paired differences vs base" in md and "### p-values" in md
    # what the seeds are, and what the interval does not hold (session 56: another pretraining seed alone moved an
    # arm's Total by 11 points)
    assert "The seeds are fine-tuning seeds: each model is one pretraining, whose own variation the interval does " \
        "not hold" in md
    doc = json.loads(paths["comparison"].read_text())
    assert doc == json.loads(json.dumps(comparison_document(results, "base")))
    bio = doc["rows"]["ampv"]["BIOSSES"]
    lo, hi = (f"{abs(v) * 100:.1f}" for v in bio["ci"])
    ampv_row = next(line for line in md.split("## Paired differences")[1].splitlines() if line.startswith("| ampv"))
    assert f"+5.5 [+{lo}, +{hi}]*" in ampv_row  # BIOSSES: +0.055 in points, significant
    assert "\u22124.0 [" in ampv_row  # ERR: lower is better, the raw (negative) difference
    assert "### NER NER: base (before) vs ampv (after)" in md
    assert "| Chemical | 70.0 | 80.0 | 60.0 | 70.0 | 64.6 | 74.7 | 30 |" in md
    html_text = paths["html"].read_text(encoding="utf-8")
    assert 'id="paired-differences"' in html_text
    assert 'data-model="ampv" data-column="BIOSSES" data-significant="true" title="p = ' in html_text
    assert 'class="blue ner-tags" data-model="ampv" data-task="NER"' in html_text
    manifest = read_manifest(tmp_path / "report")
    assert "comparison.json" in manifest["files"] and manifest["config"]["baseline"] == "base"


def test_report_without_a_baseline_is_the_table_alone(tmp_path):
    results = make_results()
    paths = write_report(results, tmp_path / "report")
    assert "comparison" not in paths and not (tmp_path / "report" / "comparison.json").exists()
    md = paths["md"].read_text(encoding="utf-8")
    assert md == render_markdown(build_table(results), curves=None)
    assert "Paired differences" not in md and "paired-differences" not in paths["html"].read_text()
    assert "comparison.json" not in read_manifest(tmp_path / "report")["files"]
    one = make_results()  # one model: nothing to compare, but the baseline must still be one of the models
    one["models"] = ["base"]
    del one["cells"]["ampv"], one["summary"]["ampv"]
    solo = write_report(one, tmp_path / "solo", baseline="base")
    assert "comparison" not in solo and "Paired differences" not in solo["md"].read_text()
    with pytest.raises(InputError, match="baseline 'ampv'"):
        write_report(one, tmp_path / "solo2", baseline="ampv")


def report_job(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "jobs" / "report.py"), *args], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_report_job_checks_the_baseline(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(make_results()))
    out = tmp_path / "report"
    bad = report_job(f"results_json={path}", f"out_dir={out}", "baseline=nope", "--dry-run")
    assert bad.returncode == 2
    assert f"{path}: baseline 'nope' is not a model" in bad.stderr and "'base', 'ampv'" in bad.stderr
    assert not out.exists()
    good = report_job(f"results_json={path}", f"out_dir={out}", "--baseline", "base", "--dry-run")
    assert good.returncode == 0, good.stderr[-2000:]
    assert "comparison.json: paired differences vs base" in good.stdout and not out.exists()
    ran = report_job(f"results_json={path}", f"out_dir={out}", "baseline=base")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads((out / "comparison.json").read_text())["baseline"] == "base"


_HOLD_REPORT = """
import sys
from orchestrator.core.reuse import output_lock
with output_lock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_two_writers_of_one_report_take_turns_and_a_failed_replace_leaves_the_earlier_report(tmp_path, monkeypatch):
    """A concurrency probe (session 46): two jobs on one run directory (or one and jobs/report.py) wrote its report
    at once, and about one writer in twenty failed as "unexpected FileNotFoundError ... (a bug)" or "Directory not
    empty", leaving a complete-looking .report.tmp-* folder. The report is now written under its output's lock, and
    a replace that fails half-way puts the earlier report back and removes the temporary folder."""
    import os
    from pathlib import Path

    from orchestrator.core.locks import WAIT_ENV, OutputBusy

    out = tmp_path / "report"
    write_report(make_results(), out)
    before = (out / "blue_table.md").read_text(encoding="utf-8")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_REPORT, str(out)], text=True, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline() == "held\n"
        monkeypatch.setenv(WAIT_ENV, "1")
        with pytest.raises(OutputBusy, match=f"{out} is being built by pid {holder.pid}"):
            write_report(make_results(), out, title="the second writer")
    finally:
        holder.communicate("\n", timeout=60)
    rename = Path.rename

    def fail_into_place(self, target):  # the other writer's report appeared at out between the two renames
        if Path(target) == out and ".tmp-" in self.name:
            raise OSError(39, "Directory not empty", str(target))
        return rename(self, target)

    monkeypatch.setattr(Path, "rename", fail_into_place)
    with pytest.raises(OSError, match="Directory not empty"):
        write_report(make_results(), out, title="a third")
    assert (out / "blue_table.md").read_text(encoding="utf-8") == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "report") == []  # no temporary left


def test_arms_replicated_at_another_pretraining_seed_are_compared_at_each_seed_and_what_recurs_is_marked(tmp_path):
    """Session 56: another pretrain.seed alone moved an arm's Total by 11 points, so a difference at one pretraining
    seed is no evidence. ``<arm>_s<seed>`` is ``<arm>``'s replicate: each arm is compared with the baseline at its
    own seed and, at each replicate seed, its replicate with the baseline's replicate; what has p < alpha with
    the same sign at every seed is bold (it recurs)."""
    results = make_results()
    # at seed 7, ampv's BIOSSES gain recurs (+0.05 each seed, p < 0.05) and its NER gain turns into a loss
    shifted = {"BIOSSES": [0.70, 0.71, 0.69, 0.72], "ERR": [0.30, 0.31, 0.32, 0.29], "NER": [0.66, 0.65, 0.67, 0.66]}
    gained = {"BIOSSES": [0.75, 0.77, 0.74, 0.76], "ERR": [0.31, 0.29, 0.30, 0.33], "NER": [0.60, 0.61, 0.59, 0.60]}
    for model, row in (("base_s7", shifted), ("ampv_s7", gained)):
        results["cells"][model] = {task: cell(values, per_tag=PER_TAG["base"]) if task == "NER" else cell(values)
                                   for task, values in row.items()}
        results["models"].append(model)
    results["summary"] = summarize(results["tasks"], results["cells"])
    doc = replicate_differences(results, paired_differences(results, "base", n_boot=2000))
    assert doc["seeds"] == ["own", "s7"] and list(doc["rows"]) == ["ampv"]  # a replicate is no row of its own
    bio, ner = doc["rows"]["ampv"]["BIOSSES"], doc["rows"]["ampv"]["NER"]
    own = paired_differences(results, "base", n_boot=2000)["rows"]["ampv"]["BIOSSES"]
    at7 = paired_differences(results, "base_s7", n_boot=2000)["rows"]["ampv_s7"]["BIOSSES"]
    assert bio["entries"] == [own, at7] and bio["recurs"] is True
    assert ner["entries"][0]["mean_diff"] > 0 > ner["entries"][1]["mean_diff"] and ner["recurs"] is False
    # across the two pretraining seeds, the seed as the unit: scipy's one-sample t-test on the per-seed differences
    from scipy.stats import t, ttest_1samp

    for entry, significant in ((bio, True), (ner, False)):
        diffs = [e["mean_diff"] for e in entry["entries"]]
        across, mean = entry["across"], sum(diffs) / 2
        assert across["n"] == 2 and across["mean_diff"] == pytest.approx(mean)
        assert across["p"] == pytest.approx(ttest_1samp(diffs, 0).pvalue) and across["significant"] is significant
        half = t.ppf(0.975, 1) * abs(diffs[0] - diffs[1]) / 2  # sd / sqrt(2) of two values: half their distance
        assert (across["low"], across["high"]) == pytest.approx((mean - half, mean + half))
    assert doc["rows"]["ampv"]["total"]["across"]["n"] == 2
    assert across_seeds([{"mean_diff": 0.1, "partial": True}, {"mean_diff": 0.2}], 0.05) is None  # other tasks
    assert across_seeds([{"mean_diff": 0.1}, None], 0.05) is None  # no replicate at a seed
    same = across_seeds([{"mean_diff": 0.1}, {"mean_diff": 0.1}], 0.05)
    assert same["mean_diff"] == 0.1 and same["p"] is None and same["significant"] is False  # no spread: no test
    paths = write_report(results, tmp_path / "report", baseline="base")
    md = paths["md"].read_text(encoding="utf-8")
    section = md.split("## Paired differences at each pretraining seed (own / s7)", 1)[1].split("\n## ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith("| ampv"))
    assert "**+5.5\\* / +5.0\\***" in row and "+9.5\\* / \u22126.0\\*" in row, row
    assert "<arm>" not in section and "&lt;arm&gt;_s&lt;seed&gt;" in section  # escaped for Markdown viewers
    across = section.split("### Across pretraining seeds", 1)[1]
    row = next(line for line in across.splitlines() if line.startswith("| ampv"))
    assert "+5.3 [+2.1, +8.4]\\* (p 0.030)" in row and "1 degree of freedom" in across, row
    page = paths["html"].read_text(encoding="utf-8")
    assert 'id="replicates"' in page and 'data-column="BIOSSES" data-recurs="true"><strong>+5.5* / +5.0*' in page
    assert 'id="replicates-across"' in page and "+5.3 [+2.1, +8.4]* (p 0.030)</td>" in page
    assert "data-recurs" not in page.split('id="replicates-across"', 1)[1]  # the per-seed table's mark only
    assert json.loads(paths["comparison"].read_text())["replicates"]["rows"]["ampv"]["BIOSSES"]["recurs"] is True
    # without a replicate of the baseline there is nothing to pair at that seed: no section
    del results["cells"]["base_s7"]
    results["models"].remove("base_s7")
    assert replicate_differences(results, paired_differences(results, "base", n_boot=2000)) is None
    assert "at each pretraining seed" not in write_report(results, tmp_path / "r2", baseline="base")["md"].read_text()
