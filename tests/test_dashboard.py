"""The experiment comparison page (dashboards/experiment_page.py): built from MLflow alone, checked
against the store it was read from, and opened in headless Chromium (a screenshot, no console message)."""
from __future__ import annotations

import re
import subprocess
import sys
from html import escape, unescape
from pathlib import Path

import pytest
from mlflow.entities import Metric, RunTag
from mlflow.tracking import MlflowClient

from conftest import CHROMIUM, FLAGS, ROOT, needs_chromium
from conftest import EXPERIMENT_ARMS as ARMS
from dashboards.experiment_page import PAGE_PATH, build_page
from orchestrator.core.errors import OrchestratorError
from orchestrator.track import schema as S

TASKS = ("BIOSSES", "BC5CDR-chemical")
BASELINE = "conventional"
def open_in_chromium(page: Path, png: Path, profile: Path, size: tuple[int, int] = (1280, 1800)) -> list[str]:
    """Screenshot ``page`` into ``png``; returns the console messages the page produced (Chromium writes
    each as a line with ``:CONSOLE`` on stderr: console.log/error, uncaught exceptions, CSP violations)."""
    res = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                          f"--window-size={size[0]},{size[1]}", page.resolve().as_uri()],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return [line for line in res.stderr.splitlines() if ":CONSOLE" in line]


def section(page: str, start: str, end: str = "</svg>") -> str:
    """The page's text from ``start`` (a literal) to the next ``end``."""
    i = page.index(start)
    return page[i:page.index(end, i)]


def text_of(cell_html: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", cell_html)).strip()


@pytest.fixture(scope="module")
def store(experiment_run):
    run = experiment_run
    assert run.first.returncode == 0, (run.first.stdout[-3000:], run.first.stderr[-5000:])
    return f"sqlite:///{run.run_dir / 'mlflow.db'}"


@pytest.fixture(scope="module")
def page_file(store, tmp_path_factory) -> Path:
    return build_page(store, tmp_path_factory.mktemp("page") / "sub" / "experiment.html")


@pytest.mark.slow
def test_the_page_shows_what_mlflow_holds(store, page_file):
    page = page_file.read_text(encoding="utf-8")
    client = MlflowClient(store)
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()], max_results=5000)
    by_kind: dict[str, list] = {}
    for r in runs:
        by_kind.setdefault(r.data.tags.get(S.KIND), []).append(r)
    parent, = by_kind[S.KIND_EXPERIMENT]
    assert "<h1>Experiment exp</h1>" in page and parent.info.run_id in page
    assert not list(page_file.parent.glob(".*tmp*"))  # written via a temp file and a rename
    # Arms: one row each, in config order, with status and kind from the parent's tags.
    arms = re.findall(r'<tr data-arm="([^"]+)" data-status="([^"]+)" data-kind="([^"]*)"', section(page, 'id="arms"',
                                                                                                 "</table>"))
    assert arms == [("conventional", "ok", "pretrain"), ("simpt", "ok", "pretrain"), ("floor", "ok", "random")]
    assert parent.data.tags[S.ARMS] == ",".join(ARMS)
    # Cost: each arm's stages (then the whole sweep's), as the parent's cost tags hold them
    costs = S.read_cost_tags(parent.data.tags)
    assert list(costs)[:3] == list(ARMS) and "random-init" in [r["stage"] for r in costs["floor"]]
    cost = section(page, 'id="cost"', "</table>")
    for owner, rows in costs.items():
        shown = re.findall(rf'<tr data-owner="{re.escape(escape(owner))}" data-stage="([^"]+)"', cost)
        assert shown == [escape(r["stage"]) for r in rows], owner
    # The seed 000 table: a row per arm; each task cell is the (model, task) run's test_mean in points.
    table = section(page, 'id="blue-table"', "</table>")
    assert re.findall(r'<tr data-model="([^"]+)"', table) == list(ARMS)
    cells = {(r.data.tags[S.ARM], r.data.tags[S.TASK]): r.data.metrics for r in by_kind[S.KIND_MODEL_TASK]}
    assert set(cells) == {(a, t) for a in ARMS for t in TASKS}
    for (arm, task), metrics in cells.items():
        cell = re.search(rf'data-model="{arm}" data-column="{task}"[^>]*>(.*?)</td>', table).group(1)
        assert text_of(cell).startswith(f"{metrics[S.TEST_MEAN] * 100:.1f}"), (arm, task, cell)
    # Differences: a row per non-baseline arm and task; every seed pairs, so the mean difference is the
    # difference of the cells' means.
    diffs = section(page, 'id="differences"', "</table>")
    for arm in ARMS:
        for task in TASKS:
            row = re.search(rf'<tr data-arm="{arm}" data-column="{task}" data-significant="(true|false)"[^>]*>'
                            r"(.*?)</tr>", diffs)
            if arm == BASELINE:
                assert row is None
                continue
            assert row, (arm, task)
            tds = [text_of(td) for td in re.findall(r"<td[^>]*>(.*?)</td>", row.group(2))]
            assert tds[0] == arm and tds[1] == task and tds[3] == "2"  # two seeds pair
            expected = (cells[(arm, task)][S.TEST_MEAN] - cells[(BASELINE, task)][S.TEST_MEAN]) * 100
            assert abs(float(tds[4].replace("\u2212", "-")) - expected) < 0.051, (tds, expected)
            assert re.fullmatch(r"\[[-+\u2212]?[\d.]+, [-+\u2212]?[\d.]+\]", tds[5]), tds  # the 95 % interval
            assert (tds[7] == "*") == (row.group(1) == "true")
    plots = re.findall(r'<svg class="interval-plot" data-column="([^"]+)"', page)
    assert set(TASKS) <= set(plots) and "total" in plots
    # Seed 004: each scored arm other than the baseline, its measures as its selection run logged them.
    scores = section(page, 'id="source-scores"', "</table>")
    simpt, = [r for r in by_kind[S.KIND_SELECTION] if r.data.tags[S.ARM] == "simpt"]
    row = re.search(r"<tr><td>simpt</td>(.*?)</tr>", scores).group(1)
    values = [text_of(td) for td in re.findall(r"<td>(.*?)</td>", row)]
    measures = S.read_source_metrics(simpt.data.metrics)["measures"]
    assert values[:4] == [f"{measures[m]:.4g}" for m in ("ppl", "jsd", "tvc", "ttr")]
    assert 'id="source-correlations"' in page and "fewer than 3 arms" in page  # one arm: no r
    # Seed 002's retrieval table, from a retrieval run's artifact: each cell is what that arm's run logged.
    table = section(page, 'class="retrieval" data-k="1"', "</table>")
    for arm, run in {r.data.tags[S.ARM]: r for r in by_kind[S.KIND_RETRIEVAL]}.items():
        logged = S.read_retrieval_metrics(run.data.metrics)["p_at_1"]
        for direction, value in logged.items():
            where = f'data-model="{arm}" data-direction="{escape(direction)}">'
            cell = re.search(re.escape(where) + "(.*?)</td>", table)
            assert text_of(cell.group(1)) == f"{100 * value:.1f}", (arm, direction)
    # Pretraining loss: one series per arm with a pretraining run, every logged step on it.
    loss = section(page, 'id="pretraining-loss"')
    series = dict(re.findall(r'<g class="series" data-series="([^"]+)" data-points="(\d+)"', loss))
    pretrains = {r.data.tags[S.ARM]: r for r in by_kind[S.KIND_PRETRAIN]}
    assert set(series) == set(pretrains) == {"conventional", "simpt"}
    for arm, run in pretrains.items():
        assert int(series[arm]) == len(client.get_metric_history(run.info.run_id, S.PRETRAIN_LOSS)) == 10
    assert "no pretraining loss logged under this experiment): floor." in page
    # Fine-tuning curves: per task, a dev and a test series for every arm.
    for task in TASKS:
        curves = section(page, f'id="curves-{task}"')
        got = sorted(re.findall(r'<g class="series" data-series="([^"]+)" data-split="([^"]+)"', curves))
        assert got == sorted((a, s) for a in ARMS for s in ("dev", "test")), task


@pytest.mark.slow
def test_the_job_writes_the_page_and_names_it(experiment_run):
    page = experiment_run.run_dir / PAGE_PATH
    assert page.is_file() and (page.parent / "blue_table.html").is_file()
    for res in (experiment_run.first, experiment_run.again):  # the re-run writes it again
        assert f"report (page): {page}" in res.stdout, res.stdout[-2000:]
    assert 'id="pretraining-loss"' in page.read_text(encoding="utf-8")


def test_the_page_shows_the_sweep_its_experiments_last_run_logged(experiment_run, store, tmp_path):
    """An experiments probe (session 46): a re-run whose sweep matched an earlier one reopened that sweep run (an
    older start, perhaps under an older experiment run), and the page showed the newest sweep child instead: another
    sweep's table and differences than blue_table.md, written by the same job; with a failed arm removed (a new
    experiment run), "no sweep under this experiment yet". The experiment run now names its sweep (S.SWEEP_RUN)."""
    import shutil

    client = MlflowClient(store)
    parent = client.search_runs([e.experiment_id for e in client.search_experiments()],
                                filter_string=f"tags.`{S.KIND}` = '{S.KIND_EXPERIMENT}'")[0]
    logged = parent.data.tags[S.SWEEP_RUN]
    assert client.get_run(logged).data.tags[S.KIND] == S.KIND_SWEEP
    shutil.copy(experiment_run.run_dir / "mlflow.db", tmp_path / "mlflow.db")  # the shared store stays as it is
    copy = f"sqlite:///{tmp_path / 'mlflow.db'}"
    newer = MlflowClient(copy).create_run(parent.info.experiment_id, run_name="sweep:other", tags={
        S.KIND: S.KIND_SWEEP, S.PARENT: parent.info.run_id}).info.run_id  # started after it, as a newer sweep
    page = build_page(copy, tmp_path / "page.html").read_text(encoding="utf-8")
    assert f"the one its last run logged, run {logged[:8]}, is shown" in page and newer[:8] not in page
    assert 'id="blue-table"' in page


@pytest.mark.slow
@needs_chromium
def test_chromium_renders_the_page_without_a_console_message(page_file, tmp_path):
    from PIL import Image

    png = tmp_path / "page.png"
    messages = open_in_chromium(page_file, png, tmp_path / "profile", size=(1280, 1800))
    assert messages == []
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as img:
        assert img.size == (1280, 1800)
        rgb = img.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20)
        ink = sum(n for n, c in colours if sum(c) < 600) / (img.size[0] * img.size[1])
    assert len(colours) > 50 and ink > 0.01, (len(colours), ink)  # text, tables and coloured plot lines


@needs_chromium
def test_the_console_check_sees_errors_and_blocked_loads(tmp_path):
    """The check above would fail on a page that logs an error, throws, or loads anything from outside."""
    from dashboards.experiment_page import CSP

    bad = tmp_path / "bad.html"
    bad.write_text(f'<!DOCTYPE html><html><head><meta http-equiv="Content-Security-Policy" content="{CSP}">'
                   '</head><body><p>x</p><img src="http://example.invalid/a.png"></body></html>')
    messages = open_in_chromium(bad, tmp_path / "bad.png", tmp_path / "p1", size=(400, 300))
    assert any("violates the following Content Security Policy" in m for m in messages), messages
    js = tmp_path / "js.html"
    js.write_text('<!DOCTYPE html><html><body><script>console.error("deliberate"); notAFunction();</script>'
                  "</body></html>")
    messages = open_in_chromium(js, tmp_path / "js.png", tmp_path / "p2", size=(400, 300))
    assert any("deliberate" in m for m in messages) and any("Uncaught ReferenceError" in m for m in messages)


def test_missing_pieces_are_said_not_failed(tmp_path):
    """A store with an experiment whose second arm failed, whose third is a published model and
    which has no sweep yet: the page names the failure and the missing sections."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    exp_id = client.create_experiment("bioptorch")
    parent = client.create_run(exp_id, run_name=f"{S.KIND_EXPERIMENT}:demo", tags={
        S.KIND: S.KIND_EXPERIMENT, S.ARMS: "a,broken,pub", S.BASELINE_TAG: "a",
        S.arm_tag("a", "status"): "ok", S.arm_tag("a", "kind"): "pretrain",
        S.arm_tag("broken", "status"): "failed", S.arm_tag("broken", "kind"): "pretrain",
        S.arm_tag("broken", "stage"): "corpus", S.arm_tag("broken", "error"): "InputError: bad.txt <not UTF-8>",
        S.arm_tag("pub", "status"): "ok", S.arm_tag("pub", "kind"): "model"}).info.run_id
    pre = client.create_run(exp_id, run_name="pretrain", tags={S.KIND: S.KIND_PRETRAIN, S.ARM: "a",
                                                               S.PARENT: parent}).info.run_id
    client.log_batch(pre, metrics=[Metric(S.PRETRAIN_LOSS, 8.0 - 0.1 * s, 0, s) for s in range(1, 6)])
    client.set_terminated(pre)
    client.set_terminated(parent)
    out = build_page(uri, tmp_path / "page.html")
    page = out.read_text(encoding="utf-8")
    assert re.findall(r'<tr data-arm="([^"]+)" data-status="([^"]+)"', page) == [
        ("a", "ok"), ("broken", "failed"), ("pub", "ok")]
    assert "failed in corpus" in page and "InputError: bad.txt &lt;not UTF-8&gt;" in page
    assert "none: a published model" in page and "no sweep under this experiment yet" in page
    assert re.findall(r'<g class="series" data-series="([^"]+)" data-points="(\d+)"', page) == [("a", "5")]
    assert 'id="blue-table"' not in page and 'id="differences"' not in page
    # A run that is not an experiment's is refused by id; so is a store without an experiment run.
    with pytest.raises(OrchestratorError, match="is not an experiment's parent run"):
        build_page(uri, tmp_path / "x.html", experiment_run_id=pre)
    client.log_batch(parent, tags=[RunTag(S.KIND, S.KIND_SWEEP)])
    with pytest.raises(OrchestratorError, match="no experiment run at"):
        build_page(uri, tmp_path / "x.html")
    assert not (tmp_path / "x.html").exists()


def test_the_command_has_help_and_says_what_is_missing(tmp_path):
    script = str(ROOT / "dashboards" / "experiment_page.py")
    res = subprocess.run([sys.executable, script, "--help"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "--tracking-uri" in res.stdout and "--out" in res.stdout
    # argparse formats a description only when it holds %(prog): a doubled %% was shown as written (docs probe D10)
    assert "(95 % bootstrap intervals" in res.stdout and "%%" not in res.stdout
    res = subprocess.run([sys.executable, script, "--tracking-uri", f"sqlite:///{tmp_path / 'none.db'}", "--out",
                          str(tmp_path / "p.html")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "error: no MLflow store at" in res.stderr, res.stderr
    assert not (tmp_path / "none.db").exists() and not (tmp_path / "p.html").exists()


def test_the_newest_sweep_and_experiment_are_the_last_logged_and_the_run_directorys(tmp_path):
    """A job that reuses a sweep reopens its MLflow run, which keeps its start: `jobs/report.py --run-dir`
    showed the sweep that started last (another config's, of an earlier job) and the page the experiment that
    started last. The run that ended last is the newest; in a store run directories share, the page takes the
    experiment of the run directory it is given (it took the store's newest, another run directory's)."""
    import time

    import mlflow
    import pytest

    from dashboards.experiment_data import find_experiment_run
    from orchestrator.core.errors import OrchestratorError
    from orchestrator.report.mlflow_results import find_sweep_run
    from orchestrator.track import schema as S

    uri = f"sqlite:///{tmp_path / 'shared.db'}"
    mlflow.set_tracking_uri(uri)
    exp = mlflow.set_experiment("e").experiment_id
    client = MlflowClient(uri)

    def run(kind: str, run_dir: Path, run_id: str | None = None) -> str:
        with mlflow.start_run(run_id=run_id, experiment_id=exp,
                              tags={S.KIND: kind, S.RUN_DIR: str(run_dir.resolve())}) as r:
            time.sleep(0.02)
            return r.info.run_id

    a, b = tmp_path / "a", tmp_path / "b"
    first = run(S.KIND_SWEEP, a)  # three seeds
    second = run(S.KIND_SWEEP, a)  # two seeds, a later job
    assert find_sweep_run(client, "e").info.run_id == second
    run(S.KIND_SWEEP, a, first)  # the three seeds again: the same sweep, reopened and logged again
    assert find_sweep_run(client, "e").info.run_id == first
    assert find_sweep_run(client, "e", run_dir=a).info.run_id == first

    ours = run(S.KIND_EXPERIMENT, a)
    theirs = run(S.KIND_EXPERIMENT, b)
    assert find_experiment_run(client).info.run_id == theirs  # the store's newest
    assert find_experiment_run(client, run_dir=a).info.run_id == ours
    with pytest.raises(OrchestratorError, match="no experiment run of the run directory"):
        find_experiment_run(client, run_dir=tmp_path / "c")
    mlflow.set_tracking_uri(None)

    # an experiment's parent run names every run directory that logged it (two with one config share it)
    from orchestrator.track import TrackingConfig
    from orchestrator.track.runs import parent_run

    tracking = TrackingConfig(experiment="e", tracking_uri=uri)
    for run_dir in (a, b):
        with parent_run(tracking, run_dir, kind=S.KIND_EXPERIMENT, key="k", name="experiment:x") as pid:
            pass
    assert client.get_run(pid).data.tags[S.RUN_DIR].split("\n") == sorted([str(a.resolve()), str(b.resolve())])
    assert find_experiment_run(client, run_dir=b).info.run_id == pid
    mlflow.set_tracking_uri(None)


def test_a_partial_difference_is_marked_on_the_page_and_p_keeps_its_side_of_alpha():
    """The report marks a summary difference over fewer tasks (an augmented arm's NER tasks only) with a dagger;
    the page showed it as a Total like the others. A p of 0.0496 was printed "0.050" beside its star. A tick at
    0 read "-0"."""
    from dashboards.experiment_data import Experiment
    from dashboards.experiment_page import _differences_section
    from dashboards.svg import nice_ticks
    from orchestrator.report.compare import p_text

    entry = {"mean_diff": 0.2, "ci": [0.2, 0.2], "p": 0.0496, "significant": True, "better": True, "n": 3,
             "note": None}
    comparison = {"baseline": "base", "alpha": 0.05, "ci_level": 0.95, "n_boot": 100,
                  "columns": [{"key": "total", "label": "Total", "kind": "summary", "metric": "macro",
                               "higher_is_better": True}],
                  "rows": {"aug": {"total": {**entry, "partial": True, "tasks": ["BC5CDR-chemical"]}},
                           "full": {"total": {**entry, "p": 0.0504, "significant": False}}}}
    exp = Experiment(tracking_uri="", run_id="r", name="x", status="FINISHED", started=None, baseline="base",
                     arms={}, comparison=comparison)
    page = _differences_section(exp)
    aug, full = (line for line in page.splitlines() if line.startswith("<tr data-arm="))
    assert "+20.0\u2020" in aug and "partial: averages BC5CDR-chemical only" in aug and "\u2020" not in full
    assert "averages only the tasks both have" in page
    assert "<td>0.0496</td>" in aug and "<td>0.050</td>" in full
    assert (p_text(0.0496), p_text(0.0504), p_text(0.2), p_text(0.0004)) == ("0.0496", "0.050", "0.200", "<0.001")
    assert "-0.0" not in map(str, nice_ticks(-0.775, 0.116, 6))  # -0.8 + 4 x 0.2 is -5.6e-17


def test_an_interval_panel_makes_room_for_its_arms_names():
    """The panels' left margin was a fixed 90 px: an arm name longer than about 12 characters ran off the
    panel's left edge (session 47's display probe). The margin now follows the longest name, up to 40
    characters; a longer one is cut with an ellipsis and its whole text is the label's tooltip."""
    from dashboards.svg import LABEL_CHARS, interval_panel

    entry = {"mean_diff": 0.01, "ci": [-0.01, 0.03], "p": 0.2, "significant": False, "better": True, "n": 3}
    column = {"key": "total", "label": "Total", "higher_is_better": True}

    def labels(names: list[str]) -> tuple[float, list[tuple[str, str]]]:
        svg = interval_panel(column, [(n, entry) for n in names], 100.0)
        found = re.findall(r'<text x="([\d.]+)" y="[\d.]+" text-anchor="end" font-size="11">(.*?)</text>', svg)
        return float(found[0][0]), [(tip, unescape(re.sub(r"<title>.*?</title>", "", t))) for tip, t in found]

    x, shown = labels(["conventional", "ampv"])
    assert x == 84 and [s for _, s in shown] == ["conventional", "ampv"]  # short names: the margin it had
    name = "simpt-ampv-pubmed-abstracts-x2"  # 30 characters
    x, shown = labels(["conventional", name])
    assert x >= 6.5 * len(name) and shown[1][1] == name  # the whole name fits left of the plot
    long = "mdapt-" + "pubmed-" * 10
    svg = interval_panel(column, [("a", entry), (long, entry)], 100.0)
    cut = long[:LABEL_CHARS - 1] + "\u2026"
    assert f"<title>{long}</title>{cut}</text>" in svg
    x, _ = labels(["a", long])
    assert x >= 6.5 * LABEL_CHARS


def test_arms_replicated_at_another_pretraining_seed_get_the_reports_section_on_the_page():
    """Session 56: the report pairs arms replicated at other pretraining seeds (``<arm>_s<seed>``); the page, read
    from MLflow, shows the same section beside its paired differences."""
    from dashboards.experiment_data import Experiment
    from dashboards.experiment_page import render_page
    from orchestrator.core.results import summarize
    from orchestrator.report.compare import paired_differences
    from orchestrator.report.replicates import replicate_differences

    tasks = [{"name": "BIOSSES", "metric": "pearson", "higher_is_better": True, "group": "biomedical"}]
    scores = {"base": [0.80, 0.82, 0.78], "mlm": [0.85, 0.88, 0.84], "base_s7": [0.70, 0.71, 0.69],
              "mlm_s7": [0.75, 0.77, 0.74]}
    cells = {m: {"BIOSSES": {"metric": "pearson", "test_scores": v, "seeds": [1, 2, 3], "selected": {}}}
             for m, v in scores.items()}
    results = {"tasks": tasks, "models": list(scores), "cells": cells, "summary": summarize(tasks, cells)}
    comparison = paired_differences(results, "base", n_boot=200)
    comparison["replicates"] = replicate_differences(results, comparison)
    exp = Experiment(tracking_uri="", run_id="r", name="x", status="FINISHED", started=None, baseline="base",
                     arms={}, results=results, comparison=comparison)
    page = render_page(exp)
    assert "Paired differences at each pretraining seed (own / s7)" in page
    row = page.split('id="replicates"', 1)[1].split('<tr data-model="mlm">', 1)[1].split("</tr>", 1)[0]
    assert 'data-column="BIOSSES" data-recurs="true"><strong>+5.7* / +5.3*</strong>' in row, row
