"""Shared test helpers: where the real data lives, how to run a job as a user would."""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


@pytest.fixture(autouse=True)
def _no_inherited_ray_address_or_mlflow_store(monkeypatch):
    """Each test starts without RAY_ADDRESS, so an embedded Ray never tries to reach a cluster
    that an earlier test (or the developer's shell) pointed at and that is gone; and without
    MLFLOW_TRACKING_URI, which mlflow.set_tracking_uri() exports: the jobs honour a user's
    MLFLOW_TRACKING_URI, and one left by an earlier test would send a job to that test's store."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield
    os.environ.pop("MLFLOW_TRACKING_URI", None)


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


@pytest.fixture(scope="module")
def ray_local():
    """An embedded 2-CPU Ray on 127.0.0.1 for one test module (shut down after it if it started it)."""
    from orchestrator.core.runtime import ray_session

    with ray_session(num_cpus=2, log_to_driver=False):
        yield


#: Two pretrained arms that differ in mixing, and the untrained floor, which shares the first arm's
#: corpus and vocabulary (the base config mixes conventionally).
EXPERIMENT_ARMS = {"conventional": {}, "simpt": {"corpus.mixer.name": "simpt"}, "floor": {"init": "random"}}
EXPERIMENT_ARGS = ["--preset", "smoke", "run_name=exp", "corpus.mixer.name=conventional",
                   "arms.conventional={}", "arms.simpt.corpus.mixer.name=simpt", "arms.floor.init=random",
                   "sweep.tasks=[biosses,bc5cdr_chemical]", "sweep.seeds=[1,2]", "instances.max_seq_lengths=[64]",
                   "pretrain.phase1.steps=10", "pretrain.phase2.steps=0"]


@dataclass
class ExperimentRun:
    run_dir: Path
    first: subprocess.CompletedProcess  # the run that built everything
    again: subprocess.CompletedProcess  # the same command once more: reuses everything


@pytest.fixture(scope="session")
def experiment_run(tmp_path_factory) -> ExperimentRun:
    """The 3-arm smoke experiment (EXPERIMENT_ARMS), run to the end, then run again; shared by the
    experiment, MLflow and dashboard tests (about two minutes on 2 cores)."""
    root = tmp_path_factory.mktemp("experiment")
    args = [*EXPERIMENT_ARGS, f"runs_root={root}"]
    first = run_job("blue_sweep.py", *args, timeout=1500)
    again = run_job("blue_sweep.py", *args, timeout=900) if first.returncode == 0 else first
    return ExperimentRun(root / "exp", first, again)
