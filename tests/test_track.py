"""MLflow wiring: a local store keeps its artifacts in the run directory, and MLflow trouble never
stops or stalls training (issue 12)."""
from __future__ import annotations

import logging
import os
import re
import time

import mlflow
import pytest

from orchestrator.track.experiments import ensure_experiment


def test_local_store_artifacts_stay_in_run_dir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # where MLflow's default ./mlruns would otherwise go
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    uri = f"sqlite:///{run_dir / 'mlflow.db'}"
    exp_id = ensure_experiment(uri, "bioptorch", run_dir)
    assert ensure_experiment(uri, "bioptorch", run_dir) == exp_id  # idempotent
    client = mlflow.MlflowClient(uri)
    # the MLflow UI opens a model-training experiment on its runs, not on the GenAI traces overview
    assert client.get_experiment(exp_id).tags["mlflow.experimentKind"] == "custom_model_development"
    older = client.create_experiment("made-elsewhere")
    ensure_experiment(uri, "made-elsewhere", run_dir)
    assert client.get_experiment(older).tags["mlflow.experimentKind"] == "custom_model_development"
    run = client.create_run(exp_id)
    client.log_text(run.info.run_id, "hello", "note.txt")
    assert (run_dir / "mlartifacts" / run.info.run_id / "artifacts" / "note.txt").read_text() == "hello"
    assert not (tmp_path / "mlruns").exists()


# --------------------------------------------------------------------------- MLflow as a side channel
def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nobody listens once the socket is closed


@pytest.fixture
def fast_failing_mlflow(monkeypatch):
    """MLflow's HTTP client retries for minutes by default; the tests do not wait for that."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")


def test_an_unreachable_server_falls_back_to_the_run_directory_store_with_one_warning(tmp_path, caplog):
    from orchestrator.track import TrackingConfig, effective_uri, local_uri, probe

    url = f"http://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    assert "refused" in probe(url).lower()
    tracking = TrackingConfig(tracking_uri=url)
    with caplog.at_level(logging.WARNING, logger="orchestrator.track"):
        assert effective_uri(tracking, tmp_path) == local_uri(tmp_path)
        assert effective_uri(tracking, tmp_path) == local_uri(tmp_path)  # decided once per process
    assert time.monotonic() - start < 10
    warnings = [r for r in caplog.records if "does not answer" in r.getMessage()]
    assert len(warnings) == 1 and "mlflow ui --backend-store-uri" in warnings[0].getMessage()


@pytest.mark.parametrize("uri", ["file:///{tmp}/store", "{tmp}/mlruns"], ids=["file URI", "a bare path"])
def test_a_file_store_falls_back_to_the_run_directory_store_as_mlflow_3_refuses_it(uri, tmp_path, caplog,
                                                                                     monkeypatch):
    """A probe (session 49): tracking_uri=file:///... was taken; MLflow 3 refuses file stores, so the run logged
    nowhere, exited 0, and its summary named the empty store. It now falls back, as a server that does not answer."""
    from orchestrator.track import TrackingConfig, effective_uri, local_uri, probe

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    uri = uri.format(tmp=tmp_path)
    assert "MLFLOW_ALLOW_FILE_STORE=true" in probe(uri)
    with caplog.at_level(logging.WARNING, logger="orchestrator.track"):
        assert effective_uri(TrackingConfig(tracking_uri=uri), tmp_path / "run") == local_uri(tmp_path / "run")
    assert "file store" in caplog.text and "sqlite:///" in caplog.text
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    assert probe(uri) is None  # the user's choice, which MLflow then honours


def test_user_mlflow_tracking_uri_is_honoured(tmp_path):
    """$MLFLOW_TRACKING_URI set by the user (read once when the job starts) is the store when the
    config names none (issue 12: it was ignored)."""
    import subprocess
    import sys

    from conftest import ROOT

    store = f"sqlite:///{tmp_path / 'mine.db'}"
    env = {**os.environ, "MLFLOW_TRACKING_URI": store, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, str(ROOT / "jobs" / "blue_sweep.py"), "--dry-run",
                          f"runs_root={tmp_path / 'runs'}"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"tracking: {store} (experiment 'bioptorch') answers" in res.stdout


def test_a_tracking_uris_password_is_used_but_never_printed_logged_or_written(tmp_path, caplog):
    """A probe (session 45): MLFLOW_TRACKING_URI=http://alice:pw@host was printed by the dry run, the warning,
    the report's and the experiment page's "source", written to chain_config.json, manifests and MLflow
    params; and the server check sent "alice" as the host's name, so a server with a password was always
    "down" and the run logged elsewhere. The check now sends the user part as MLflow does (HTTP basic)."""
    import base64
    import http.server
    import subprocess
    import sys
    import threading
    from dataclasses import dataclass

    from conftest import ROOT
    from orchestrator.core.config import public, redacted
    from orchestrator.core.console import redact_log_records
    from orchestrator.core.manifest import read_manifest, write_manifest
    from orchestrator.track import TrackingConfig, probe

    wanted = "Basic " + base64.b64encode(b"alice:s3cr@t").decode()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the handler's name is http.server's
            self.send_response(200 if self.path == "/health" and self.headers.get("Authorization") == wanted else 401)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    uri = f"http://alice:s3cr%40t@127.0.0.1:{server.server_port}"
    try:
        assert probe(uri) is None  # the password reaches the server
        assert probe(f"http://127.0.0.1:{server.server_port}") is not None  # and the check needs it
        assert redacted(f"store {uri}/x and https://tok@h.org") == (f"store http://***@127.0.0.1:{server.server_port}/x"
                                                                     " and https://***@h.org")
        assert public({"a": [uri, 1], "b": "sqlite:////x/m@b.db"}) == {
            "a": [redacted(uri), 1], "b": "sqlite:////x/m@b.db"}  # a path's "@" is not a user part

        @dataclass
        class Job:
            tracking: TrackingConfig

        write_manifest(tmp_path / "out", stage="x", config=Job(TrackingConfig(tracking_uri=uri)))
        assert read_manifest(tmp_path / "out")["config"]["tracking"]["tracking_uri"] == redacted(uri)
        made = logging.getLogRecordFactory()
        try:
            redact_log_records()
            with caplog.at_level(logging.INFO):
                logging.getLogger("orchestrator.x").info("server %s", uri)
        finally:
            logging.setLogRecordFactory(made)
        assert caplog.records[-1].getMessage() == f"server {redacted(uri)}"

        env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONPATH": str(ROOT)}
        for extra in (["--dry-run"], ["--print-config", f"tracking.tracking_uri={uri}"]):
            res = subprocess.run([sys.executable, str(ROOT / "jobs" / "blue_sweep.py"), *extra,
                                  f"runs_root={tmp_path / 'runs'}"], env=env, capture_output=True, text=True,
                                 timeout=300)
            assert res.returncode == 0, res.stderr[-3000:]
            assert "s3cr" not in res.stdout + res.stderr and "***@127.0.0.1" in res.stdout
            assert extra != ["--dry-run"] or f"tracking: {redacted(uri)} (experiment 'bioptorch') answers" in res.stdout
    finally:
        server.shutdown()


def test_a_logger_whose_server_is_gone_warns_once_keeps_the_metrics_and_sends_them_later(
        tmp_path, caplog, fast_failing_mlflow):
    from orchestrator.track.runs import RankZeroLogger, replay_pending

    pending = tmp_path / "mlflow_pending.jsonl"
    down = RankZeroLogger({"uri": f"http://127.0.0.1:{_closed_port()}", "run_id": "r", "pending": str(pending)},
                          retry_s=0.0)
    with caplog.at_level(logging.WARNING, logger="orchestrator.track.runs"):
        for step in range(1, 4):
            down.log({"loss": 10.0 - step, "lr": 1e-3}, step)  # never raises
        down.close()
    assert len([r for r in caplog.records if "logging to run r failed" in r.getMessage()]) == 1
    assert len(pending.read_text().splitlines()) == 6
    # the store answers again: the kept metrics go to the run
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = mlflow.MlflowClient(uri).create_run(ensure_experiment(uri, "x", tmp_path))
    assert replay_pending({"uri": uri, "run_id": run.info.run_id, "pending": str(pending)}) == 6
    history = mlflow.MlflowClient(uri).get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 9.0), (2, 8.0), (3, 7.0)]
    assert not pending.exists()


# --------------------------------------------------------------------------- a crash while the sweep is logged
_LOG_SWEEP_UNTIL_KILLED = """
import json, sys, time
import mlflow
from orchestrator.track import TrackingConfig
from orchestrator.track import schema as S
from orchestrator.track.sweep import log_sweep

args = json.loads(open(sys.argv[1]).read())
real_start_run, trials_started = mlflow.start_run, []

def start_run(*a, **kw):  # the 4th trial run has started: say so, and wait for the SIGKILL
    run = real_start_run(*a, **kw)
    if (kw.get("tags") or {}).get(S.KIND) == S.KIND_TRIAL:
        trials_started.append(run)
        if len(trials_started) == 4:
            print("logging trial 4", flush=True)
            time.sleep(600)
    return run

mlflow.start_run = start_run
log_sweep(TrackingConfig(), args.pop("run_dir"), **args)
"""


def _sweep_to_log(run_dir) -> dict:
    """log_sweep's arguments for a tiny finished sweep: one model, one task, six trials."""
    task = {"name": "BIOSSES", "group": "biomedical", "metric": "pearson", "higher_is_better": True}
    records = [{"trial": {"model_name": "floor", "learning_rate": lr, "seed": seed}, "task": "BIOSSES",
                "trial_id": f"floor-BIOSSES-lr{lr}-s{seed}", "fingerprint": f"fp-{lr}-{seed}", "seconds": 1.5,
                "epochs": [{"epoch": e, "train_loss": 1.0 / e, "dev": 0.5 + e / 10, "test": 0.4 + e / 10}
                           for e in (1, 2)]}
               for lr in (1e-5, 3e-5) for seed in (1, 2, 3)]
    cell = {"selected": {"learning_rate": 3e-5}, "mean": 0.6, "sd": 0.01, "dev_mean": 0.7, "n": 3,
            "curve": [{"epoch": 1, "dev": 0.6, "test": 0.5}, {"epoch": 2, "dev": 0.7, "test": 0.6}]}
    results = {"tasks": [task], "models": ["floor"], "cells": {"floor": {"BIOSSES": cell}},
               "summary": {"floor": {"total": 0.6}}}
    return {"run_dir": str(run_dir), "name": "demo", "config": {"sweep": {"seeds": [1, 2, 3]}},
            "results": results, "records": records, "model_tags": {}, "artifacts": []}


def test_a_sweep_whose_logging_process_is_killed_is_completed_by_a_re_run(tmp_path):
    """kill -9 while a sweep is logged to MLflow (3 of a cell's 6 trial runs done, the 4th started),
    then the same logging again: every trial run of the cell is FINISHED with its metrics, and no
    half-logged run is left live beside them (issue 34 item 1: the cell was taken as finished)."""
    import json
    import signal
    import subprocess
    import sys

    from conftest import ROOT
    from orchestrator.track import TrackingConfig, local_uri
    from orchestrator.track import schema as S
    from orchestrator.track.sweep import log_sweep

    args = _sweep_to_log(tmp_path)
    (tmp_path / "args.json").write_text(json.dumps(args))
    (tmp_path / "log_sweep.py").write_text(_LOG_SWEEP_UNTIL_KILLED)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "log_sweep.py"), str(tmp_path / "args.json")],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "logging trial 4\n"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    client = mlflow.MlflowClient(local_uri(tmp_path))
    exp = client.get_experiment_by_name("bioptorch").experiment_id
    assert any(r.info.status == "RUNNING" for r in client.search_runs([exp]))  # the crash left runs half-logged

    parent = log_sweep(TrackingConfig(), tmp_path, **{k: v for k, v in args.items() if k != "run_dir"})
    live = client.search_runs([exp])  # deleted runs are not listed
    assert {r.info.status for r in live} == {"FINISHED"}
    assert [r.info.run_id for r in live if r.data.tags.get(S.KIND) == S.KIND_SWEEP] == [parent]
    cells = [r for r in live if r.data.tags.get(S.KIND) == S.KIND_MODEL_TASK]
    assert len(cells) == 1 and cells[0].data.tags[S.PARENT] == parent and S.CELL_DIGEST in cells[0].data.tags
    trials = [r for r in live if r.data.tags.get(S.KIND) == S.KIND_TRIAL]
    assert sorted(r.info.run_name for r in trials) == sorted(rec["trial_id"] for rec in args["records"])
    assert all(r.data.tags[S.PARENT] == cells[0].info.run_id for r in trials)
    assert all({"train_loss", "dev", "test", "seconds"} <= set(r.data.metrics) for r in trials)
    gone = client.search_runs([exp], run_view_type=mlflow.entities.ViewType.DELETED_ONLY)
    assert gone and all(r.info.status != "RUNNING" for r in gone)
    # logged completely, the cell is kept as it is by the next re-run
    assert log_sweep(TrackingConfig(), tmp_path, **{k: v for k, v in args.items() if k != "run_dir"}) == parent
    assert sorted(r.info.run_id for r in client.search_runs([exp])) == sorted(r.info.run_id for r in live)


def test_a_stage_result_left_unfinished_is_logged_anew_not_kept_beside(tmp_path):
    """A stage result's run (a retrieval, a source scoring) whose process stopped between creating and
    ending it is RUNNING for good; the re-run deletes it and logs the result finished, and the run after
    that finds the finished one and logs nothing."""
    from orchestrator.track import TrackingConfig, local_uri
    from orchestrator.track import schema as S
    from orchestrator.track.runs import log_stage_result

    client = mlflow.MlflowClient(local_uri(tmp_path))
    exp = ensure_experiment(local_uri(tmp_path), "bioptorch", tmp_path)
    tags = {S.MODEL: "simpt", S.OUTPUT_KEY: "k1"}
    (tmp_path / "results.json").write_text("{}")
    half = client.create_run(exp, run_name="retrieval", tags={**tags, S.KIND: S.KIND_RETRIEVAL})  # what a kill leaves

    def log() -> str | None:
        return log_stage_result(TrackingConfig(), tmp_path, stage=S.KIND_RETRIEVAL, params={"k": 1},
                                metrics={"p_at_1.de__en": 12.5}, tags=tags, artifacts=[tmp_path / "results.json"])

    first = log()
    assert first and first != half.info.run_id
    live = client.search_runs([exp])
    assert [(r.info.run_id, r.info.status) for r in live] == [(first, "FINISHED")]
    assert live[0].data.metrics == {"p_at_1.de__en": 12.5}
    assert [a.path for a in client.list_artifacts(first)] == ["results.json"]
    assert client.get_run(half.info.run_id).info.lifecycle_stage == "deleted"
    assert log() == first and len(client.search_runs([exp])) == 1


def _store_contents(db_file) -> tuple:
    """What an empty store holds that matters: its schema, its migration head, its experiments (times aside)."""
    import sqlite3

    with sqlite3.connect(db_file) as db:
        # a table's clauses sorted: MLflow itself writes a table's constraints in no fixed order
        schema = sorted((kind, name, sorted((sql or "").replace(", \n", "\n").splitlines()))
                        for kind, name, sql in db.execute("SELECT type, name, sql FROM sqlite_master"))
        head = db.execute("SELECT version_num FROM alembic_version").fetchall()
        experiments = db.execute("SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments"
                                 ).fetchall()
    return schema, head, experiments


def test_a_new_run_directory_store_is_the_store_mlflow_would_have_made(tmp_path, monkeypatch):
    """A new SQLite store starts as a copy of the empty one kept in the cache (made once by MLflow):
    the same tables, migration head and Default experiment, whose artifact location still follows the
    working directory, as MLflow's own does."""
    from orchestrator.track import TrackingConfig, effective_uri
    from orchestrator.track.local_store import cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    made_by_mlflow = tmp_path / "plain" / "mlflow.db"
    made_by_mlflow.parent.mkdir()
    mlflow.MlflowClient(f"sqlite:///{made_by_mlflow}").search_experiments()
    first, second = tmp_path / "run1", tmp_path / "run2"
    first.mkdir(), second.mkdir()
    effective_uri(TrackingConfig(), first)  # makes the kept empty store, then copies it
    templates = list(cache_dir().glob("mlflow-*-empty.db"))
    assert [p.name for p in templates] == [f"mlflow-{mlflow.__version__}-empty.db"]
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    effective_uri(TrackingConfig(), second)  # a copy, made from another working directory
    assert _store_contents(first / "mlflow.db") == _store_contents(made_by_mlflow)
    schema, head, experiments = _store_contents(second / "mlflow.db")
    assert (schema, head) == _store_contents(made_by_mlflow)[:2]
    assert experiments == [(0, "Default", str(tmp_path / "elsewhere" / "mlruns" / "0"), "active")]
    # the copy is a working store: an experiment and a run go in and come back
    client = mlflow.MlflowClient(f"sqlite:///{second / 'mlflow.db'}")
    run = client.create_run(ensure_experiment(f"sqlite:///{second / 'mlflow.db'}", "exp", second))
    client.log_metric(run.info.run_id, "f1", 0.5)
    assert client.get_run(run.info.run_id).data.metrics == {"f1": 0.5}
    # an existing store is never replaced
    before = (second / "mlflow.db").stat().st_mtime_ns
    effective_uri(TrackingConfig(), second)
    assert (second / "mlflow.db").stat().st_mtime_ns == before


def test_a_run_directory_of_any_name_or_place_keeps_its_mlflow_store_and_artifacts(tmp_path):
    """A portability probe (session 45): a run directory named with "?" put its store in a file beside it
    (SQLAlchemy read a query), "%41" in another ("A"), and one whose path SQLite cannot open retried for about
    100 s a stage and logged nowhere: now refused up front, saying why. A run directory moved elsewhere wrote
    its new runs' artifacts to the old place (recreated), its report found no results artifact, and a reused
    pretraining made an empty store at the old place: now its store follows it (a report reads a copy)."""
    import json
    import shutil

    from orchestrator.core.errors import ConfigError
    from orchestrator.track import TrackingConfig, effective_uri, local_uri
    from orchestrator.track.local_store import readable_store
    from orchestrator.track.runs import RUN_MARKER, recorded_run_unfinished

    odd = tmp_path / "a b é"  # a space and a letter beyond ASCII are fine
    odd.mkdir()
    uri = effective_uri(TrackingConfig(), odd)
    client = mlflow.MlflowClient(uri)
    run = client.create_run(ensure_experiment(uri, "x", odd))
    client.log_text(run.info.run_id, "hello", "note.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd.name]  # nothing beside it
    assert (odd / "mlflow.db").is_file() and len(list((odd / "mlartifacts").rglob("note.txt"))) == 1
    for name, said in [("q?x", "'?'"), ("p%41", "'%'"), ("h #1", "'#'")]:
        with pytest.raises(ConfigError, match=f"holds {said}"):
            effective_uri(TrackingConfig(), tmp_path / name)
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd.name]

    deep = tmp_path / ("d" * 200) / ("e" * 200) / ("f" * 100)
    with pytest.raises(ConfigError, match="SQLite opens at most 511"):
        effective_uri(TrackingConfig(), deep)

    old, new = tmp_path / "r1", tmp_path / "r2"
    old.mkdir()
    uri = effective_uri(TrackingConfig(), old)
    client = mlflow.MlflowClient(uri)
    run = client.create_run(ensure_experiment(uri, "x", old))
    client.log_text(run.info.run_id, "hello", "note.txt")
    (old / "pretrain").mkdir()
    (old / "pretrain" / RUN_MARKER).write_text(json.dumps({"run_id": run.info.run_id, "uri": uri}))
    shutil.move(old, new)
    before = (new / "mlflow.db").read_bytes()
    with readable_store(local_uri(new)) as readable:  # the report's view: the artifacts where they are now
        assert mlflow.MlflowClient(readable).download_artifacts(run.info.run_id, "note.txt", str(tmp_path))
    assert (new / "mlflow.db").read_bytes() == before and not old.exists()  # the store read, not written
    assert not recorded_run_unfinished(new / "pretrain") and not old.exists()  # no empty store at the old place
    uri = effective_uri(TrackingConfig(), new)  # a job logging to it again: the store follows its folder
    client = mlflow.MlflowClient(uri)
    client.log_text(client.create_run(ensure_experiment(uri, "x", new)).info.run_id, "again", "b.txt")
    assert not old.exists() and len(list((new / "mlartifacts").rglob("*.txt"))) == 2
    assert client.get_run(run.info.run_id).info.artifact_uri.startswith((new / "mlartifacts").as_uri())


def test_a_library_call_leaves_the_callers_mlflow_session_as_it_was(tmp_path, monkeypatch):
    """An environment probe (session 46), the tool called from a notebook: a workflow's run left MLflow pointed at
    the tool's store, so the user's next log_metric and end_run failed on their own active run ("not found"), the
    tool's stage run was made a child of that run of another store, and an experiment's parent run could not start
    beside it ("already active"). Which store the tool used also hung on the order of the imports. Now every
    workflow's run keeps the caller's session (``track.caller.mlflow_state_kept``): inside, none of the caller's runs
    is active and their $MLFLOW_TRACKING_URI as the call began is the default store; after it, all is as it was."""
    import mlflow

    from orchestrator.track import TrackingConfig
    from orchestrator.track import schema as S
    from orchestrator.track.caller import mlflow_state_kept, user_tracking_uri
    from orchestrator.track.runs import parent_run, start_stage_run
    from orchestrator.workflows import blue_sweep, pretrain, report

    user_uri = f"sqlite:///{tmp_path / 'user.db'}"
    mlflow.set_tracking_uri(user_uri)  # exports $MLFLOW_TRACKING_URI: the tool's default store is the user's
    mine = mlflow.start_run(experiment_id=mlflow.create_experiment("mine"))
    try:
        tool = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'tool.db'}")
        with mlflow_state_kept():
            assert mlflow.active_run() is None and user_tracking_uri() == user_uri
            assert TrackingConfig().resolve_uri(tmp_path / "run") == user_uri
            with parent_run(tool, tmp_path, kind="experiment", key="k1", name="exp") as parent:
                assert parent is not None  # it was "Run ... is already active": no parent, and no nesting
                info = start_stage_run(tool, tmp_path, stage="pretrain", params={"a": 1}, out_dir=tmp_path / "pt")
            assert mlflow.get_tracking_uri() == tool.tracking_uri  # the tool's, inside
        stage = mlflow.MlflowClient(tool.tracking_uri).get_run(info["run_id"])
        assert stage.data.tags[S.PARENT] == parent  # the tool's parent, not the user's run of another store
        assert mlflow.get_tracking_uri() == user_uri and os.environ["MLFLOW_TRACKING_URI"] == user_uri
        assert mlflow.active_run().info.run_id == mine.info.run_id
        mlflow.log_metric("after", 1.0)  # was: Run with id=... not found
    finally:
        mlflow.end_run()
    assert mlflow.MlflowClient(user_uri).get_run(mine.info.run_id).data.metrics == {"after": 1.0}
    for workflow in (blue_sweep, pretrain, report):  # every workflow's run is wrapped (the jobs call them)
        assert hasattr(workflow.run, "__wrapped__"), workflow.__name__
    mlflow.set_tracking_uri(None)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_a_store_runs_share_keeps_the_artifacts_beside_it_not_in_the_first_jobs_run_directory(tmp_path):
    """A concurrency probe (session 46): two jobs logging to one SQLite store put every run's artifacts (results.json,
    exports) in the run directory of whichever job created the experiment first: deleting that run took the other's
    results with it (its report then lost the paired differences). A SQLite store's artifacts are now beside its
    file: a run directory's own store is unchanged (<run_dir>/mlartifacts)."""
    import mlflow

    from orchestrator.track import local_uri
    from orchestrator.track.experiments import ensure_experiment

    shared = f"sqlite:///{tmp_path / 'store' / 'shared.db'}"
    (tmp_path / "store").mkdir()
    first = ensure_experiment(shared, "bioptorch", tmp_path / "runs" / "y")
    assert mlflow.MlflowClient(shared).get_experiment(first).artifact_location == \
        (tmp_path / "store" / "mlartifacts").as_uri()
    run_dir = tmp_path / "runs" / "x"
    run_dir.mkdir(parents=True)
    own = ensure_experiment(local_uri(run_dir), "bioptorch", run_dir)
    assert mlflow.MlflowClient(local_uri(run_dir)).get_experiment(own).artifact_location == \
        (run_dir / "mlartifacts").as_uri()


def test_a_stage_run_started_in_another_thread_is_a_child_of_the_open_parent(tmp_path):
    """An experiments probe (session 46): with arm_concurrency 2 each arm is built in its own thread, where MLflow has
    no active run (it is per thread), so the arms' pretraining runs had no parent: the page said "no run under this
    experiment" for arms it had pretrained, and drew no loss curve."""
    import threading

    import mlflow

    from orchestrator.track import TrackingConfig
    from orchestrator.track import schema as S
    from orchestrator.track.runs import parent_run, start_stage_run

    tool = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'tool.db'}")
    started: dict = {}
    with parent_run(tool, tmp_path, kind="experiment", key="k", name="exp") as parent:
        arm = threading.Thread(target=lambda: started.update(start_stage_run(
            tool, tmp_path, stage="pretrain", params={}, out_dir=tmp_path / "pt")))
        arm.start()
        arm.join()
    run = mlflow.MlflowClient(tool.tracking_uri).get_run(started["run_id"])
    assert run.data.tags[S.PARENT] == parent
    mlflow.set_tracking_uri(None)


def test_a_deleted_mlflow_experiment_is_said_before_any_work_with_how_to_restore_it(tmp_path):
    """A probe (session 49): with the experiment deleted in the store, the job warned twice, logged nothing,
    exited 0 and its summary linked the deleted experiment. The run's parent refuses it first, saying the fix."""
    import mlflow

    from orchestrator.core.errors import ConfigError
    from orchestrator.track import TrackingConfig, local_uri
    from orchestrator.track.experiments import ensure_experiment
    from orchestrator.track.runs import parent_run

    uri = local_uri(tmp_path)
    experiment_id = ensure_experiment(uri, "bioptorch", tmp_path)
    mlflow.MlflowClient(uri).delete_experiment(experiment_id)
    with pytest.raises(ConfigError, match=rf"MLflow experiment 'bioptorch' at {re.escape(uri)} is deleted: restore it "
                                          rf"\(mlflow experiments restore --experiment-id {experiment_id}"):
        with parent_run(TrackingConfig(), tmp_path, kind="experiment", key="k", name="x"):
            pass
    mlflow.MlflowClient(uri).restore_experiment(experiment_id)
    with parent_run(TrackingConfig(), tmp_path, kind="experiment", key="k", name="x") as run_id:
        assert run_id is not None


def test_a_trial_run_is_logged_in_one_batch_with_every_epoch_at_its_step(tmp_path, monkeypatch):
    """Probe M12: a trial's metrics went to MLflow one call per epoch (37 s for a 70-run sweep); now each trial run
    gets its params and every metric in one ``log_batch``, with the same names, steps and values as before."""
    from mlflow.tracking import MlflowClient

    from orchestrator.track import TrackingConfig
    from orchestrator.track import schema as S
    from orchestrator.track.sweep import log_sweep

    calls: dict[str, int] = {}
    real = MlflowClient.log_batch

    def counting(self, run_id, *a, **kw):
        calls[run_id] = calls.get(run_id, 0) + 1
        return real(self, run_id, *a, **kw)

    monkeypatch.setattr(MlflowClient, "log_batch", counting)
    args = _sweep_to_log(tmp_path)
    for rec in args["records"]:
        rec["epochs"] = [{"epoch": e, "train_loss": 1.0 / e, **({"dev": e / 10, "test": e / 20} if e % 5 == 0 else {})}
                         for e in range(1, 21)]
    log_sweep(TrackingConfig(), **args)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    trials = client.search_runs([client.get_experiment_by_name("bioptorch").experiment_id],
                                filter_string=f"tags.`{S.KIND}` = '{S.KIND_TRIAL}'")
    assert len(trials) == 6 and all(calls[r.info.run_id] == 1 for r in trials)
    for run in trials:
        rec = next(r for r in args["records"] if r["trial_id"] == run.info.run_name)
        assert run.data.params == {**{k: str(v) for k, v in rec["trial"].items()}, "model": "floor", "task": "BIOSSES"}
        for key in ("train_loss", "dev", "test"):
            assert [(m.step, m.value) for m in sorted(client.get_metric_history(run.info.run_id, key),
                                                      key=lambda m: m.step)] == \
                [(row["epoch"], row[key]) for row in rec["epochs"] if key in row]
        assert run.data.metrics["seconds"] == 1.5
    mlflow.set_tracking_uri(None)


def test_an_interrupt_ends_runs_killed_an_error_failed_and_a_reopened_run_is_running(tmp_path, monkeypatch):
    """Probe M4: Ctrl-C, SIGTERM (``Terminated``) and Ray's ``SystemExit`` ended the experiment, stage and sweep
    runs FAILED, like a real error, and a resumed stage run stayed FAILED while it trained again."""
    from orchestrator.core.errors import Terminated
    from orchestrator.track import TrackingConfig
    from orchestrator.track import schema as S
    from orchestrator.track.runs import end_stage_run, ended_status, parent_run, start_stage_run
    from orchestrator.track.sweep import log_sweep

    tool = TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / 'tool.db'}")
    client = mlflow.MlflowClient(tool.tracking_uri)
    ended, stage_runs = {}, {}
    for name, exc in [("ctrl_c", KeyboardInterrupt()), ("sigterm", Terminated()), ("ray", SystemExit(15)),
                      ("bug", RuntimeError("a bug"))]:
        with pytest.raises(type(exc)), parent_run(tool, tmp_path, kind="experiment", key=name, name=name) as run_id:
            info = start_stage_run(tool, tmp_path, stage="pretrain", params={}, out_dir=tmp_path / name)
            try:
                raise exc
            except BaseException as stopped:
                end_stage_run(info, ended_status(stopped))
                raise
        ended[name] = (client.get_run(run_id).info.status, client.get_run(info["run_id"]).info.status)
        stage_runs[name] = info["run_id"]
    assert ended == {"ctrl_c": ("KILLED", "KILLED"), "sigterm": ("KILLED", "KILLED"), "ray": ("KILLED", "KILLED"),
                     "bug": ("FAILED", "FAILED")}
    # the stage trains again: its run is reopened RUNNING
    again = start_stage_run(tool, tmp_path, stage="pretrain", params={}, out_dir=tmp_path / "ctrl_c")
    assert again["run_id"] == stage_runs["ctrl_c"] and client.get_run(again["run_id"]).info.status == "RUNNING"

    # a Ctrl-C while the sweep is logged: its runs end KILLED
    def stop(*a, **kw):
        raise KeyboardInterrupt

    monkeypatch.setattr("orchestrator.track.sweep._log_trial", stop)
    with pytest.raises(KeyboardInterrupt):
        log_sweep(tool, **_sweep_to_log(tmp_path))
    runs = client.search_runs([client.get_experiment_by_name("bioptorch").experiment_id],
                              filter_string=f"tags.`{S.KIND}` != 'pretrain' and tags.`{S.KIND}` != 'experiment'")
    assert sorted((r.data.tags[S.KIND], r.info.status) for r in runs) == [("model_task", "KILLED"),
                                                                          ("sweep", "KILLED")]
    mlflow.set_tracking_uri(None)


def test_one_filter_finds_a_model_task_run_and_its_trial_runs(tmp_path):
    """Probe M8: a (model, task) run had params model and task (the display name, HoC) and its trials model_name
    and task (the file stem, hoc_prior), so no one filter found both; now a trial has model and task as its cell
    has them, and its file stem as task_stem."""
    from orchestrator.track import TrackingConfig, local_uri
    from orchestrator.track import schema as S
    from orchestrator.track.sweep import log_sweep

    args = _sweep_to_log(tmp_path)
    for rec in args["records"]:
        rec["trial"]["task"] = "biosses"
    log_sweep(TrackingConfig(), **args)
    client = mlflow.MlflowClient(local_uri(tmp_path))
    exp = client.get_experiment_by_name("bioptorch").experiment_id
    found = client.search_runs([exp], filter_string="params.task = 'BIOSSES' and params.model = 'floor'")
    assert sorted(r.data.tags[S.KIND] for r in found) == ["model_task"] + ["trial"] * 6
    assert {r.data.params[S.TASK_STEM] for r in found if r.data.tags[S.KIND] == S.KIND_TRIAL} == {"biosses"}
    mlflow.set_tracking_uri(None)


def test_a_reused_output_is_logged_into_a_store_that_has_no_run_of_it(tmp_path):
    """Probe M3: an output trained with store A, then reused by a job logging to store B (or after the user deleted
    its run in A), was never logged there: the experiment showed no pretraining and no loss curve. Now the store
    gets a run from what the output recorded, with the loss at its steps, tagged reused; once only."""
    from orchestrator.track import TrackingConfig
    from orchestrator.track import schema as S
    from orchestrator.track.runs import RankZeroLogger, end_stage_run, log_recorded_run, start_stage_run

    store_a, store_b = (TrackingConfig(tracking_uri=f"sqlite:///{tmp_path / name}") for name in ("a.db", "b.db"))
    out = tmp_path / "pretrain"
    history = [{"step": step, "loss": 9.0 - step, "phase": 1, "mfu": None} for step in (1, 2, 3)]
    info = start_stage_run(store_a, tmp_path, stage="pretrain", params={"steps": 3}, out_dir=out)
    logger = RankZeroLogger(info)
    for row in history:
        logger.log({k: v for k, v in row.items() if k != "step"}, row["step"])
    logger.close()
    end_stage_run(info)

    def reuse(store: TrackingConfig) -> str | None:
        return log_recorded_run(store, tmp_path, stage="pretrain", out_dir=out, params={"steps": 3},
                                history=history, tags={S.ARM: "pretrained", S.OUTPUT_KEY: "k1"})

    assert reuse(store_a) is None  # its own run is there
    logged = reuse(store_b)
    client = mlflow.MlflowClient(store_b.tracking_uri)
    [run] = client.search_runs([client.get_experiment_by_name("bioptorch").experiment_id])
    assert run.info.run_id == logged and run.info.status == "FINISHED" and run.data.params == {"steps": "3"}
    assert run.data.tags[S.KIND] == "pretrain" and run.data.tags[S.REUSED] == "true" and run.data.tags[S.ARM] == \
        "pretrained"
    assert [(m.step, m.value) for m in client.get_metric_history(logged, S.PRETRAIN_LOSS)] == [(1, 8.0), (2, 7.0),
                                                                                               (3, 6.0)]
    assert reuse(store_b) == logged and len(client.search_runs([run.info.experiment_id])) == 1  # once only
    # the user deleted the run in store A: the next reuse logs it there again
    mlflow.MlflowClient(store_a.tracking_uri).delete_run(info["run_id"])
    again = reuse(store_a)
    assert again not in (None, info["run_id"])
    assert len(mlflow.MlflowClient(store_a.tracking_uri).get_metric_history(again, S.PRETRAIN_LOSS)) == 3
    mlflow.set_tracking_uri(None)


def test_trial_runs_behind_the_selection_carry_the_scores_it_used_and_a_re_run_logs_nothing_twice(tmp_path):
    """Probe M9: a trial run's dev and test are its last epoch's (MLflow's latest step), so ranking trials by
    ``metrics.dev`` was not the sweep's selection; the runs behind the selected setting are now tagged and carry
    the epoch, dev and test the selection used. Probe M13: a re-run of the same sweep appended another point to
    the parent's summary metrics."""
    from orchestrator.sweep.selection import selected_answers
    from orchestrator.track import TrackingConfig, local_uri
    from orchestrator.track import schema as S
    from orchestrator.track.sweep import log_sweep

    args = _sweep_to_log(tmp_path)
    args["results"]["cells"]["floor"]["BIOSSES"]["selected"] = {"learning_rate": 3e-5, "epochs": 1}
    args["selected"] = selected_answers(args["results"], args["records"])
    first = args["records"][0]
    first.update(predictions={"1": {"test": [0.1, 0.2]}, "2": {"test": [0.3, 0.4]}}, test_ids=["a", "b"])
    parent = log_sweep(TrackingConfig(), **args)
    client = mlflow.MlflowClient(local_uri(tmp_path))
    exp = client.get_experiment_by_name("bioptorch").experiment_id
    trials = client.search_runs([exp], filter_string=f"tags.`{S.KIND}` = 'trial'")
    chosen = client.search_runs([exp], filter_string=f"tags.`{S.SELECTED_TRIAL}` = 'true'")
    assert sorted(r.info.run_name for r in chosen) == [f"floor-BIOSSES-lr3e-05-s{s}" for s in (1, 2, 3)]
    for run in trials:
        picked = run.info.run_id in {r.info.run_id for r in chosen}
        assert run.data.tags[S.SELECTED_TRIAL] == S.bool_tag(picked)
        assert run.data.metrics["dev"] == pytest.approx(0.7)  # the last epoch's
        assert (run.data.metrics.get(S.SELECTED_EPOCH), run.data.metrics.get(S.SELECTED_DEV),
                run.data.metrics.get(S.SELECTED_TEST)) == ((1, pytest.approx(0.6), pytest.approx(0.5)) if picked
                                                           else (None, None, None))
    [run] = [r for r in trials if r.info.run_name == first["trial_id"]]  # its predictions say what they are of
    assert mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/predictions.json") == {
        "test_ids": ["a", "b"], "by_epoch": first["predictions"]}
    assert log_sweep(TrackingConfig(), **args) == parent
    assert [m.value for m in client.get_metric_history(parent, S.summary_metric("floor", "total"))] == [0.6]
    mlflow.set_tracking_uri(None)


def test_runs_under_a_deleted_experiment_run_move_to_the_new_one_and_a_resume_logs_each_step_once(tmp_path):
    """Probe M10: the user deleted an experiment's run; the re-run made a new one, but the reused sweep and
    pretraining runs stayed children of the deleted run, so the new one showed none. Probe M13/S6: a resumed
    pretraining logged the steps between its checkpoint and the interrupt twice. And each pretraining run is named
    after its arm (they were all "pretrain")."""
    from orchestrator.track import TrackingConfig, local_uri
    from orchestrator.track import schema as S
    from orchestrator.track.runs import RankZeroLogger, end_stage_run, log_recorded_run, parent_run, start_stage_run
    from orchestrator.track.sweep import log_sweep

    tool, client = TrackingConfig(), mlflow.MlflowClient(local_uri(tmp_path))
    args, tags = _sweep_to_log(tmp_path), {S.ARM: "pretrained", S.OUTPUT_KEY: "k1"}
    history = [{"step": step, "loss": 9.0 - step} for step in range(1, 6)]

    def experiment(steps: range) -> tuple[str, str, str]:
        with parent_run(tool, tmp_path, kind=S.KIND_EXPERIMENT, key="k", name="experiment:x") as run_id:
            info = start_stage_run(tool, tmp_path, stage="pretrain", params={}, out_dir=tmp_path / "pt", tags=tags)
            logger = RankZeroLogger(info)
            for row in history[steps.start - 1:steps.stop - 1]:
                logger.log({"loss": row["loss"]}, row["step"])
            logger.close()
            end_stage_run(info)
            log_recorded_run(tool, tmp_path, stage="pretrain", out_dir=tmp_path / "pt", params={}, history=history,
                             tags=tags)
            return run_id, info["run_id"], log_sweep(tool, **args)

    first, pretrain, sweep = experiment(range(1, 4))  # steps 1-3, then "interrupted"
    assert client.get_run(pretrain).info.run_name == "pretrain:pretrained"
    client.delete_run(first)
    second, pretrain_again, sweep_again = experiment(range(2, 6))  # resumed from the checkpoint at step 1
    assert second != first and (pretrain_again, sweep_again) == (pretrain, sweep)
    assert {client.get_run(r).data.tags[S.PARENT] for r in (pretrain, sweep)} == {second}
    assert [m.step for m in client.get_metric_history(pretrain, "loss")] == [1, 2, 3, 4, 5]
    mlflow.set_tracking_uri(None)
