"""Seed 004's analysis from a results document: gains per task and seed over the baseline arm, Pearson
and Spearman of each measure with them, the matrix between the measures (Figure 3), the figures, the
report section, MLflow, and reading scores that score_sources wrote. Known answers: measures built to
correlate +1 / -1 (or only monotonically) with gains built into the per-seed scores."""
from __future__ import annotations

import json
import math
import statistics

import numpy as np
import pytest

from orchestrator.core.errors import InputError
from orchestrator.core.results import summarize
from orchestrator.report.blue_table import write_report
from orchestrator.report.compare import paired_differences
from orchestrator.report.sources import POOLED, read_source_scores, source_correlations, source_metrics

SEEDS = [1, 2, 3]
FLOOR = {"BIOSSES": [0.375, 0.4375, 0.3125], "ERR": [0.30, 0.32, 0.31]}
#: BIOSSES: each arm a constant shift of the floor, so its gain is the same on every seed (binary
#: fractions: the differences are exact, so the seeds of one arm tie exactly, as Spearman needs).
SHIFT = {"a": 0.125, "b": 0.25, "c": 0.375, "d": 0.5}
#: ERR (mean absolute error: lower is better): per-seed changes, so the gains vary by seed.
ERR_CHANGE = {"a": [-0.05, -0.02, 0.01], "b": [0.03, 0.00, -0.01], "c": [-0.08, -0.06, -0.07],
              "d": [0.02, 0.04, -0.03]}
ERR_PPL = {"a": 250.0, "b": 150.0, "c": 350.0, "d": 50.0}


def cell(scores: list[float]) -> dict:
    return {"mean": statistics.fmean(scores), "sd": statistics.stdev(scores), "n": len(scores),
            "test_scores": list(scores), "seeds": list(SEEDS)}


def results_doc() -> dict:
    tasks = [{"name": "BIOSSES", "metric": "pearson", "higher_is_better": True, "group": "biomedical"},
             {"name": "ERR", "metric": "mae", "higher_is_better": False, "group": "clinical"}]
    scores = {"floor": FLOOR}
    for arm in SHIFT:
        scores[arm] = {"BIOSSES": [v + SHIFT[arm] for v in FLOOR["BIOSSES"]],
                       "ERR": [v + e for v, e in zip(FLOOR["ERR"], ERR_CHANGE[arm])]}
    cells = {m: {t: cell(v) for t, v in row.items()} for m, row in scores.items()}
    return {"tasks": tasks, "models": list(scores), "cells": cells, "summary": summarize(tasks, cells)}


def measures(ppl: float, jsd: float) -> dict:
    # TVC = 0.6 - PPL/1000 everywhere: the matrix's PPL~TVC is -1 exactly; TTR is the same for every arm
    return {"ppl": ppl, "jsd": jsd, "tvc": 0.6 - ppl / 1000, "ttr": 0.05}


#: BIOSSES: PPL falls linearly as the gain grows (r = -1), TVC rises (r = +1), JSD falls but not
#: linearly (rho = -1, |r| < 1). ERR: arbitrary measures. Total: measures against both tasks' text.
SCORES = {arm: {"measures": measures(300.0 + 10 * i, 0.5 + 0.1 * i),
                "by_task": {"BIOSSES": measures(500.0 - 1000 * s, math.exp(-10 * s)),
                            "ERR": measures(ERR_PPL[arm], 0.9 - 0.1 * i)}}
          for i, (arm, s) in enumerate(SHIFT.items())}


@pytest.fixture(scope="module")
def doc() -> dict:
    return source_correlations(paired_differences(results_doc(), "floor", n_boot=50), SCORES)


def test_the_gains_are_per_task_and_seed_in_the_better_direction(doc):
    by = {(p["column"], p["arm"], p["pair"]): p["gain"] for p in doc["points"]}
    for arm, s in SHIFT.items():
        for i, seed in enumerate(SEEDS):
            assert by[("BIOSSES", arm, seed)] == pytest.approx(s)
            assert by[("ERR", arm, seed)] == pytest.approx(-ERR_CHANGE[arm][i])  # a lower error is a gain
            # Total: BIOSSES's difference alone (ERR, lower is better, is in no summary average; it was the
            # macro average of the raw differences, an error's rise counted as a gain)
            assert by[("total", arm, seed)] == pytest.approx(s)
    assert doc["gains"]["ERR"]["c"] == pytest.approx(0.07) and doc["gains"]["BIOSSES"]["d"] == pytest.approx(0.5)
    assert set(doc["scores"]) == set(SHIFT) and doc["unscored"] == [] and doc["unmatched"] == []
    assert len(doc["points"]) == 4 * 3 * 3  # arms x (total + 2 tasks) x seeds


def test_known_correlations_per_task(doc):
    bio = doc["correlations"]["BIOSSES"]
    assert bio["ppl"]["r"] == pytest.approx(-1.0) and bio["ppl"]["rho"] == pytest.approx(-1.0)
    assert bio["tvc"]["r"] == pytest.approx(1.0) and bio["tvc"]["rho"] == pytest.approx(1.0)
    # JSD = exp(-10 gain): every rank agrees (rho = -1), the relation is not linear (r between -1 and 0)
    expected = np.corrcoef([math.exp(-10 * s) for s in SHIFT.values()], list(SHIFT.values()))[0, 1]
    assert bio["jsd"]["rho"] == pytest.approx(-1.0) and bio["jsd"]["r"] == pytest.approx(expected)
    assert -1.0 < bio["jsd"]["r"] < -0.9
    assert bio["ttr"]["r"] is None and bio["ttr"]["why"] == "constant series"
    assert bio["ppl"]["n"] == 12 and bio["ppl"]["arms"] == 4 and bio["ppl"]["units"] == 4
    # ERR: gains vary by seed; r and rho over the 12 (arm, seed) points, computed here from the raw scores
    x = [ERR_PPL[a] for a in SHIFT for _ in SEEDS]
    y = [-e for a in SHIFT for e in ERR_CHANGE[a]]
    err = doc["correlations"]["ERR"]["ppl"]
    assert err["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    rx = [sorted(x).index(v) + (x.count(v) - 1) / 2 for v in x]  # x ties within an arm: average ranks
    ry = np.argsort(np.argsort(y))  # y has no ties
    assert err["rho"] == pytest.approx(np.corrcoef(rx, ry)[0, 1])
    assert 0 < err["p"] < 1 and 0 < err["rho_p"] < 1


def test_pooled_points_and_the_matrix(doc):
    pooled = doc["correlations"][POOLED]["ppl"]
    assert pooled["n"] == 24 and pooled["units"] == 8 and pooled["arms"] == 4
    x = [SCORES[a]["by_task"][t]["ppl"] for t in ("BIOSSES", "ERR") for a in SHIFT for _ in SEEDS]
    y = [p["gain"] for t in ("BIOSSES", "ERR") for a in SHIFT for p in doc["points"]
         if p["column"] == t and p["arm"] == a]
    assert pooled["r"] == pytest.approx(np.corrcoef(x, y)[0, 1])
    m = doc["matrix"]
    assert m["variables"] == ["ppl", "jsd", "tvc", "ttr", "gain"] and m["n"] == 24 and m["units"] == 8
    r = np.array([[np.nan if v is None else v for v in row] for row in m["pearson"]], dtype=float)
    assert r[0, 2] == pytest.approx(-1.0) and r[2, 0] == pytest.approx(-1.0)  # TVC = 0.6 - PPL/1000
    assert r[0, 0] == pytest.approx(1.0) and np.allclose(r[:3, :3], r[:3, :3].T)
    assert np.isnan(r[3]).all() and np.isnan(r[:, 3]).all()  # TTR constant: undefined, not 0
    assert r[0, 4] == pytest.approx(pooled["r"]) and m["spearman"][0][4] == pytest.approx(pooled["rho"])
    metrics = source_metrics(doc)
    assert metrics["source_gain.BIOSSES.ppl.r"] == pytest.approx(-1.0)
    assert metrics["source_gain.matrix.ppl-tvc.r"] == pytest.approx(-1.0)
    assert metrics["source_gain.tasks pooled.ppl.n"] == 24
    assert not any(k.startswith("source_gain.BIOSSES.ttr.r") for k in metrics)  # undefined: left out


def test_fewer_than_three_arms_is_undefined_and_said_so():
    comparison = paired_differences(results_doc(), "floor", n_boot=50)
    two = source_correlations(comparison, {a: SCORES[a] for a in "ab"})
    bio = two["correlations"]["BIOSSES"]["ppl"]
    assert bio["r"] is None and bio["rho"] is None and bio["why"] == "fewer than 3 arms" and bio["n"] == 6
    # pooled over two tasks: 4 distinct (arm, task) values, enough for a number (with the caveat in the note)
    assert two["correlations"][POOLED]["ppl"]["units"] == 4 and two["correlations"][POOLED]["ppl"]["r"] is not None
    one = source_correlations(comparison, {"a": SCORES["a"]})
    assert one["correlations"][POOLED]["ppl"]["why"] == "fewer than 3 (arm, task) measure values"
    assert "nothing can be concluded" in two["note"] and "optimistic" in two["note"]


def test_the_report_carries_tables_figures_and_mlflow_gets_the_numbers(tmp_path):
    from mlflow.tracking import MlflowClient

    from orchestrator.report.sources import log_source_gains
    from orchestrator.track import TrackingConfig

    paths = write_report(results_doc(), tmp_path / "report", baseline="floor", source_scores=SCORES)
    for kind in ("sources_scatter", "sources_matrix"):
        assert paths[kind].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sources = json.loads(paths["comparison"].read_text())["sources"]
    assert sources["correlations"]["BIOSSES"]["tvc"]["r"] == pytest.approx(1.0)
    md = paths["md"].read_text()
    assert "## Source similarity vs gain (seed 004)" in md and "| Column | n (arms) | r(PPL) | \u03c1(PPL) |" in md
    assert "| BIOSSES | 12 (4) | -1.000 (p=" in md and "\u2013 (constant series)" in md
    assert "![each measure against the gain](sources_scatter.png)" in md
    html = paths["html"].read_text()
    assert 'id="source-matrix"' in html and '<img id="source-scatter"' in html
    tracking = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", experiment="gains")
    files = [paths[k] for k in ("sources_scatter", "sources_matrix", "comparison")]
    run_id = log_source_gains(tracking, tmp_path, sources, files)
    client = MlflowClient(tracking.tracking_uri)
    run = client.get_run(run_id)
    assert run.data.metrics["source_gain.BIOSSES.ppl.rho"] == pytest.approx(-1.0)
    assert run.data.tags["orchestrator.kind"] == "source_gains" and run.data.params["baseline"] == "floor"
    assert {a.path for a in client.list_artifacts(run_id)} == {"sources_scatter.png", "sources_matrix.png",
                                                                "comparison.json"}
    assert log_source_gains(tracking, tmp_path, sources, files) == run_id  # the same numbers: logged once


def test_scores_are_read_from_a_score_sources_output_or_a_comparison(tmp_path):
    out = tmp_path / "selection"
    out.mkdir()
    (out / "scores.json").write_text(json.dumps({a: s["measures"] for a, s in SCORES.items()}))
    (out / "scores_by_task.json").write_text(json.dumps(
        {t: {a: s["by_task"][t] for a, s in SCORES.items()} for t in ("BIOSSES", "ERR")}))
    assert read_source_scores(out) == SCORES
    comparison = tmp_path / "comparison.json"
    comparison.write_text(json.dumps({"rows": {}, "sources": {"scores": SCORES}}))
    assert read_source_scores(comparison) == SCORES
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"a": {"measures": {"ppl": 1.0}}}))
    with pytest.raises(InputError, match=r"bad.json: source 'a' has no jsd score"):
        read_source_scores(bad)
    with pytest.raises(InputError, match="file not found"):
        read_source_scores(tmp_path / "nowhere")
