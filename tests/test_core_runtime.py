"""The runtime module: embedded Ray on loopback, cluster detection, seeding."""
from __future__ import annotations

import copy
import os
import random
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
import ray
import torch
import yaml
from ray.autoscaler._private.util import prepare_config

from orchestrator.core import runtime
from orchestrator.core.errors import ConfigError

CLUSTER_YAML = Path(__file__).resolve().parents[1] / "cluster.yaml"


def test_node_type_gpus_counts_what_the_autoscaler_can_start():
    """cluster.yaml as ``ray up`` leaves it on the head (Ray's prepare_config): a CPU head and a GPU
    worker type at 0..8 nodes can give 8 GPUs, though none runs at the start."""
    cluster = prepare_config(copy.deepcopy(yaml.safe_load(CLUSTER_YAML.read_text())))
    assert cluster["available_node_types"]["gpu_worker"]["min_workers"] == 0
    assert runtime.node_type_gpus(cluster) == 8
    cluster["max_workers"] = 3  # the cluster's cap bounds every worker type
    cluster["available_node_types"]["head"]["resources"]["GPU"] = 1  # a GPU head counts once
    assert runtime.node_type_gpus(cluster) == 4
    del cluster["available_node_types"]["gpu_worker"]
    assert runtime.node_type_gpus(cluster) == 1 and runtime.node_type_gpus({}) == 0


def test_cluster_address_resolution(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runtime, "_CLUSTER_MARKER", tmp_path / "absent")
    assert runtime.cluster_address() is None
    assert runtime.cluster_address("10.0.0.1:6379") == "10.0.0.1:6379"
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:7777")
    assert runtime.cluster_address() == "127.0.0.1:7777"
    assert runtime.cluster_address("local") is None
    monkeypatch.delenv("RAY_ADDRESS")
    marker = tmp_path / "ray_current_cluster"
    marker.write_text("127.0.0.1:6379")
    monkeypatch.setattr(runtime, "_CLUSTER_MARKER", marker)
    assert runtime.cluster_address() == "auto"


def test_embedded_ray_binds_loopback(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runtime, "_CLUSTER_MARKER", tmp_path / "absent")
    if ray.is_initialized():  # left over by another test module's session fixture
        ray.shutdown()
    with runtime.ray_session(num_cpus=1) as info:
        assert info["mode"] == "local"
        assert info["resources"]["CPU"] == 1
        nodes = ray.nodes()
        assert {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}

        @ray.remote(num_cpus=0)
        def where():
            import orchestrator

            return orchestrator.__file__

        assert ray.get(where.remote()).endswith("orchestrator/__init__.py")

        # A request no node of this fixed Ray can meet would be queued for good: refused, naming the setting
        runtime.check_fits({"CPU": 1, "GPU": 0}, "x")
        with pytest.raises(ConfigError, match=r"^x: each task asks for CPU 2, but .* has at most CPU 1"):
            runtime.check_fits({"CPU": 2}, "x")
        with pytest.raises(ConfigError, match=r"asks for CPU 1, GPU 0.5, but .* at most CPU 1, GPU 0,"):
            runtime.check_fits({"CPU": 1, "GPU": 0.5}, "x")

        # Automatic GPUs: this embedded Ray has none, and a stray autoscaler file does not count for it ...
        from orchestrator.sweep.config import SweepConfig
        from orchestrator.sweep.runner import _resources

        monkeypatch.delenv(runtime.CLUSTER_GPUS_ENV, raising=False)
        bootstrap = tmp_path / "ray_bootstrap_config.yaml"
        bootstrap.write_text(yaml.safe_dump(prepare_config(yaml.safe_load(CLUSTER_YAML.read_text()))))
        monkeypatch.setattr(runtime, "_BOOTSTRAP_CONFIG", bootstrap)
        assert runtime.possible_gpus() == 0 and _resources(SweepConfig())["gpu"] == 0
        # ... but attached to cluster.yaml's head at zero GPU workers, a trial asks for a GPU (so the
        # autoscaler starts a GPU node), unless the user set a number
        monkeypatch.setattr(runtime, "_CLUSTER_MARKER", bootstrap)
        assert runtime.possible_gpus() == 8 and _resources(SweepConfig())["gpu"] == 1
        assert _resources(SweepConfig(gpus_per_trial=0.25))["gpu"] == 0.25
        monkeypatch.setenv(runtime.CLUSTER_GPUS_ENV, "0")  # the explicit setting wins
        assert _resources(SweepConfig())["gpu"] == 0
        monkeypatch.setenv(runtime.CLUSTER_GPUS_ENV, "two")
        with pytest.raises(ConfigError, match="ORCH_CLUSTER_GPUS"):
            runtime.possible_gpus()
    assert not ray.is_initialized()


def test_seed_everything_is_repeatable():
    runtime.seed_everything(123)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    runtime.seed_everything(123)
    assert a == (random.random(), np.random.rand(), torch.rand(1).item())
    assert runtime.choose_device("auto").type in ("cpu", "cuda")


def test_embedded_ray_can_restart_in_one_process(monkeypatch, tmp_path):
    """A second embedded Ray after a shutdown must not try to reach the first (dead) one."""
    import os

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runtime, "_CLUSTER_MARKER", tmp_path / "absent")
    if ray.is_initialized():
        ray.shutdown()
    for _ in range(2):
        runtime.init_ray(num_cpus=1)
        assert ray.is_initialized() and "RAY_ADDRESS" not in os.environ
        ray.shutdown()



def test_a_ray_session_gives_the_caller_back_its_sigterm_handler_environment_and_generators(monkeypatch, tmp_path):
    """An environment probe (session 46), the tool called from a notebook: after a workflow's run, the caller's
    SIGTERM handler was the tool's (a later SIGTERM raised its Terminated), TUNE_DISABLE_SIGINT_HANDLER and
    RAY_USAGE_STATS_ENABLED stayed set for the caller's own Tune runs, and the caller's random, NumPy and torch
    generators had been reseeded with the run's seed. A job's driver still runs seeded, and its SIGTERM raises."""
    import signal

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(runtime, "_CLUSTER_MARKER", tmp_path / "absent")
    for key in runtime.RAY_ENV_SET:
        monkeypatch.delenv(key, raising=False)
    if ray.is_initialized():
        ray.shutdown()

    def mine(signum, frame):  # the caller's
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    before = dict(os.environ)
    try:
        with runtime.ray_session(num_cpus=1):
            assert os.environ["TUNE_DISABLE_SIGINT_HANDLER"] == "1"
            assert signal.getsignal(signal.SIGTERM) is not mine  # the tool's, while it works
        assert signal.getsignal(signal.SIGTERM) is mine
        assert [k for k in runtime.RAY_ENV_SET if k in os.environ] == []
        # and all that ray.init exports (probe L7: PYTHONBREAKPOINT sent the caller's breakpoint() to Ray's debugger)
        assert dict(os.environ) == before

        # Ctrl-C while Ray starts, its first processes up (probe L3: they stayed, with Ray's SIGTERM handler)
        real_init = ray.init

        def interrupted(*args, **kwargs):
            real_init(*args, **kwargs)
            raise KeyboardInterrupt

        monkeypatch.setattr(ray, "init", interrupted)
        with pytest.raises(KeyboardInterrupt), runtime.ray_session(num_cpus=1):
            pass
        assert not ray.is_initialized() and signal.getsignal(signal.SIGTERM) is mine and dict(os.environ) == before
        deadline = time.monotonic() + 30
        while any("gcs_server" in p.name() for p in psutil.Process().children(recursive=True)):
            assert time.monotonic() < deadline, "Ray's processes outlived the interrupted start"
            time.sleep(0.5)
    finally:
        signal.signal(signal.SIGTERM, previous)

    def draws() -> tuple:
        return random.random(), float(np.random.rand()), torch.rand(1).item()

    runtime.seed_everything(7)
    expected = draws()
    runtime.seed_everything(7)
    with runtime.seeded(123):
        inside = draws()
    assert draws() == expected  # the caller's next draws, as if the call had not happened
    runtime.seed_everything(123)
    assert draws() == inside  # and the block ran seeded

def test_unreachable_cluster_fails_fast_with_a_clear_error(monkeypatch):
    import socket

    import pytest

    from orchestrator.core.errors import OrchestratorError

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    with pytest.raises(OrchestratorError, match="not reachable.*unset RAY_ADDRESS"):
        runtime.init_ray()


def test_a_run_log_takes_the_process_output_and_the_terminal_keeps_the_concise_lines(tmp_path, capfd):
    """fd 1 and 2 (Ray's C++ core, Tune's tables, forwarded worker output) go to the log file; the terminal
    gets the project's records, the lines workers marked, and progress; --verbose changes nothing."""
    import logging
    import os

    from orchestrator.core import console

    path = tmp_path / "logs" / "job.log"
    project, library = logging.getLogger("orchestrator.test"), logging.getLogger("ray.tune.test")
    project.setLevel(logging.INFO)
    library.setLevel(logging.INFO)
    with runtime.run_log(path) as written:
        assert written == path and console.capturing() and not console.updating()  # a pipe, not a TTY
        os.write(1, b"Trial status: 60 TERMINATED\n")
        os.write(2, b"tensorboardX notice\n")
        project.info("corpus: started")
        library.handle(logging.LogRecord("ray.tune.test", logging.INFO, "/site-packages/ray/tune/x.py", 1,
                                         "a library's info", None, None))
        console._forward({"lines": ["worker noise", "[progress] phase1: step 1/2", "(w) [console] phase1: 2 steps",
                                    "(w) [console] phase1: 2 steps"]})  # a line delivered twice is shown once
        console._forward({"lines": ["[progress] phase2: step 6/12", "[console] phase2 stopped by plateau",
                                    "[progress] phase2: step 6/12", "[console] phase2 stopped by plateau"]})  # a pair
        console.progress("sweep: 1/2 trials")
        # Ray's own lines saying the job waits for a node (a cluster probe, session 45: the terminal went silent for
        # good): shown, each kind at most every WAIT_EVERY_S
        wait = ":event_summary:Error: No available node types can fulfill resource request {'GPU': 1.0}. Add..."
        console._forward({"pid": "autoscaler", "lines": [wait, wait]})
    out, err = capfd.readouterr()
    terminal = (out + err).splitlines()
    assert [line.split(" ", 1)[1] for line in terminal] == [
        "corpus: started", "phase1: step 1/2", "phase1: 2 steps", "phase2: step 6/12", "phase2 stopped by plateau",
        "sweep: 1/2 trials", f"waiting (Ray): {wait}"], terminal
    kept = path.read_text(encoding="utf-8")
    assert "Trial status: 60 TERMINATED" in kept and "tensorboardX notice" in kept
    with runtime.run_log(path):  # a second run in this process (a library call twice; a probe, session 46: not shown)
        console._forward({"lines": ["(w) [console] phase1: 2 steps"]})
    out, err = capfd.readouterr()
    assert [line.split(" ", 1)[1] for line in (out + err).splitlines()] == ["phase1: 2 steps"]
    console.set_verbose(True)  # --verbose: everything stays on the terminal
    try:
        with runtime.run_log(path) as written:
            assert written is None and not console.capturing()
    finally:
        console.set_verbose(False)


_LIMITED_RAY = """
import ray
from orchestrator.core.runtime import ray_session

@ray.remote
def square(x):
    return x * x

with ray_session(num_cpus=1):
    print("STORE", ray.cluster_resources()["object_store_memory"], "ANSWER", ray.get(square.remote(7)))
"""


@pytest.mark.parametrize("limit, said", [
    ("ulimit -v 8000000", None),  # 8 GB of address space: a store of a quarter of it
    ("ulimit -f 120", "this shell limits the file size to 0.1 MiB (ulimit -f); Ray's object store needs at least "
                      "75 MiB there"),
    ("ulimit -n 64", "this shell allows 64 open files (ulimit -n, hard limit 64); Ray needs at least 256"),
])
def test_an_embedded_ray_under_a_shells_limits_runs_or_says_which_limit(tmp_path, limit, said):
    """A probe (session 44): under `ulimit -v 8000000` a job hung with no word after Ray's start (Ray's default
    store, 30 % of the machine's memory, is mapped by every worker); under `ulimit -f` it failed after 30 s
    blaming Ray's start; under `ulimit -n 64` Ray ended the job with 220 lines of C++ stacks and no message."""
    import subprocess
    import sys

    from conftest import ROOT

    res = subprocess.run(["bash", "-c", f"{limit}; trap '' XFSZ; exec {sys.executable} -c '{_LIMITED_RAY}'"],
                         capture_output=True, text=True, timeout=240, cwd=ROOT, env={**os.environ,
                                                                                      "PYTHONPATH": str(ROOT)})
    if said is None:
        assert res.returncode == 0 and "ANSWER 49" in res.stdout, res.stderr[-3000:]
        assert float(res.stdout.split("STORE ")[1].split()[0]) <= 8000000 * 1024 / 4
    else:
        assert res.returncode != 0 and said in res.stderr and "ANSWER" not in res.stdout, res.stderr[-3000:]


def test_only_this_users_cluster_marker_attaches_and_a_planted_log_link_is_refused(monkeypatch, tmp_path, caplog):
    """A security probe (session 45): /tmp/ray is writable by anyone, and a job attached to whatever cluster
    /tmp/ray/ray_current_cluster named, so another user could send it, with its code and data, to theirs;
    and a job's logs/job.log beside its output (in a shared folder) was appended to through a link someone
    planted there. Another user's marker (or a link) is ignored, saying so; a log link or a log folder that
    is a link or another user's is refused."""
    import logging

    from orchestrator.core import console

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("ORCH_IGNORE_LOCAL_CLUSTER", raising=False)
    marker = tmp_path / "ray_current_cluster"
    assert runtime.cluster_address(marker=marker) is None  # no cluster on this host
    marker.write_text("127.0.0.1:6379")
    assert runtime.cluster_address(marker=marker) == "auto"  # this user's: the head node's job attaches
    assert runtime.cluster_address("local", marker=marker) is None
    link = tmp_path / "link"
    link.symlink_to(marker)
    with caplog.at_level(logging.WARNING):
        assert runtime.cluster_address(marker=link) is None
    assert "not a file" in caplog.text
    if os.getuid() == 0:  # root can give the file to another user
        os.chown(marker, 65534, 65534)
        assert runtime.cluster_address(marker=marker) is None and "another user's, uid 65534" in caplog.text

    victim = tmp_path / "bashrc"
    victim.write_text("mine\n")
    (tmp_path / "out" / "logs").mkdir(parents=True)
    (tmp_path / "out" / "logs" / "job.log").symlink_to(victim)
    monkeypatch.setattr(console, "_verbose", False)
    with pytest.raises(ConfigError, match="the job's log file is a link"):
        with console.run_log(tmp_path / "out" / "logs" / "job.log"):
            pass
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "logs").symlink_to(tmp_path / "out" / "logs")
    with pytest.raises(ConfigError, match="log folder is a link"):
        with console.run_log(tmp_path / "shared" / "logs" / "job.log"):
            pass
    assert victim.read_text() == "mine\n"
    with console.run_log(tmp_path / "mine" / "logs" / "job.log") as written:  # a folder of one's own: written
        os.write(1, b"a line\n")
    assert written.read_text() == "a line\n"


def test_a_temp_directory_ray_cannot_start_with_is_said_as_such(tmp_path):
    """A portability probe (session 45): TMPDIR with a letter beyond ASCII failed inside Ray's start with a
    UnicodeEncodeError, which the job called a bug. It is a one-line config error naming TMPDIR."""
    import subprocess
    import sys

    from conftest import ROOT

    temp = tmp_path / "tmp é"
    temp.mkdir()
    code = "from orchestrator.core.runtime import ray_session\nwith ray_session(num_cpus=1):\n    pass\n"
    res = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "ConfigError: the temp directory" in res.stderr and "(TMPDIR)" in res.stderr
    assert "UnicodeEncodeError" not in res.stderr


def test_a_stage_called_with_no_ray_running_runs_the_projects_own_for_the_call(tmp_path):
    """Probe L2: ``corpus_stages`` called from a notebook as the docs show it, no Ray running: Ray Data started Ray's
    default (every interface, the dashboard, none of the project's worker settings) and left it up. Now the call
    runs the project's embedded Ray, on 127.0.0.1, and stops it after."""
    from orchestrator.core.cli import load_preset
    from orchestrator.core.config import load_config
    from orchestrator.workflows.build_corpus import CorpusBuildConfig
    from orchestrator.workflows.runner import corpus_stages

    if ray.is_initialized():
        ray.shutdown()
    cfg = load_config(CorpusBuildConfig, base=load_preset("build_corpus", "tiny"))
    built = corpus_stages(cfg.corpus, cfg.vocab, cfg.instances, tmp_path, stages=("corpus",))
    assert list((built.corpus_dir / "shards").glob("*/*.parquet")) and not ray.is_initialized()


def test_the_corpus_job_logs_rays_output_and_starts_no_ray_when_every_stage_is_reused(tmp_path):
    """Probe G8: ``jobs/build_corpus.py`` printed Ray's output (Ray Data's progress tables: 294 of its 364 terminal
    lines at 300 MB), where the other jobs keep it in ``logs/job.log``. Probe G7: a re-run whose every stage is
    reused started Ray all the same (18-22 s for nothing)."""
    import subprocess
    import sys

    from conftest import ROOT

    out = tmp_path / "corpus"
    args = [sys.executable, "jobs/build_corpus.py", f"out_dir={out}", "vocab.report=false", "vocab.vocab_size=500",
            "instances.max_seq_lengths=[64]"]
    first = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    shown = first.stdout + first.stderr
    logged = (out / "logs" / "job.log").read_text(encoding="utf-8")
    assert "ray local" in shown and "Ray's and the workers' own output" in shown
    assert "Dataset" in logged and "Dataset" not in shown  # Ray Data's own lines: in the log, not on the terminal
    again = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "reused" in again.stderr and "ray local" not in again.stdout + again.stderr


def test_a_ctrl_c_that_ray_trains_handler_ends_with_sys_exit_reaches_the_caller_as_an_interrupt():
    """Probe L6: Ray Train's SIGINT handler ends a Ctrl-C'd ``fit`` with ``sys.exit``; called from Python,
    ``pretrain`` raised ``SystemExit(1)``, which ended ``python -i`` and which ``except KeyboardInterrupt`` missed.
    Ray's SIGTERM handler's ``sys.exit(15)`` stays a termination; the caller's SIGINT handler is back either way."""
    import signal

    from orchestrator.core.errors import keep_sigint_handler

    before = signal.getsignal(signal.SIGINT)
    for code, seen in [(0, KeyboardInterrupt), (1, KeyboardInterrupt), (15, SystemExit)]:
        with pytest.raises(seen), keep_sigint_handler():
            signal.signal(signal.SIGINT, lambda *a: None)  # as fit() installs its own
            raise SystemExit(code)
        assert signal.getsignal(signal.SIGINT) is before
