"""Ray's cluster paths for real, on 127.0.0.1: `ray up/submit/down` over SSH, and `ray job submit`.

Both tests start their own Ray head with a private --temp-dir and free ports, and stop only that
head (scripts/cluster_local/stop_ray_head.py): `ray stop` would kill every Ray on the machine,
other tests' included. The launcher test runs a private sshd (key-only root login on a random
port, HOME redirected to a temp dir, so the real home is never touched).
"""
from __future__ import annotations

import errno
import getpass
import hashlib
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
HELPERS = ROOT / "scripts" / "cluster_local"
VENV_BIN = Path(sys.executable).parent
RAY = VENV_BIN / "ray"
SMOKE_PRESET = ROOT / "orchestrator" / "presets" / "blue_sweep" / "smoke.yaml"

pytestmark = pytest.mark.cluster


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


def private_temp_dir() -> Path:
    # Short on purpose: Ray's unix socket paths live under it and must stay below ~107 bytes.
    return Path(tempfile.mkdtemp(prefix="orh", dir="/tmp"))


def head_command(temp_dir: Path, gcs: int, dashboard: int, num_cpus: int = 2) -> list[str]:
    """`ray start --head` on loopback with every port chosen, so it cannot collide with other Rays."""
    names = ("dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port",
             "metrics-export-port", "ray-client-server-port", "node-manager-port", "object-manager-port")
    taken = {gcs, dashboard}
    ports = {}
    for name in names:  # distinct from each other and from the given ones
        port = free_port()
        while port in taken:
            port = free_port()
        taken.add(port)
        ports[f"--{name}"] = str(port)
    low = free_port()
    while any(low <= port <= low + 50 for port in taken):  # Ray refuses a worker range holding a chosen port
        low = free_port()
    return [str(RAY), "start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", f"--temp-dir={temp_dir}",
            f"--num-cpus={num_cpus}", "--disable-usage-stats", f"--min-worker-port={low}",
            f"--max-worker-port={low + 50}", *[f"{k}={v}" for k, v in ports.items()]]


def ray_env(home: Path) -> dict[str, str]:
    """Auth mode identical on both sides; everything on loopback; no writes to the real home."""
    env = dict(os.environ)
    env.update(HOME=str(home), RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0",
               RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PATH=f"{VENV_BIN}:{env.get('PATH', '')}")
    env.pop("RAY_ADDRESS", None)
    return env


def processes_of(temp_dir: Path) -> list[int]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if any(str(temp_dir) in arg for arg in proc.info.get("cmdline") or []):
            found.append(proc.info["pid"])
    return found


def stop_head(temp_dir: Path) -> None:
    subprocess.run([sys.executable, str(HELPERS / "stop_ray_head.py"), str(temp_dir), "--grace", "5"],
                   capture_output=True, text=True, timeout=60)


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in output:\n{text[-3000:]}")


def loopback_only(port: int) -> bool:
    """Something listens on ``port`` and only on loopback (127.0.0.1, or its IPv4-mapped IPv6 form)."""
    addrs = {c.laddr.ip.removeprefix("::ffff:") for c in psutil.net_connections("inet")
             if c.status == "LISTEN" and c.laddr.port == port}
    return bool(addrs) and all(ipaddress.ip_address(a).is_loopback for a in addrs)


# ---------------------------------------------------------------------------------------------
def test_ray_job_submit_to_local_head(tmp_path):
    temp_dir, gcs, dashboard = private_temp_dir(), free_port(), free_port()
    env = ray_env(tmp_path / "home")
    (tmp_path / "home").mkdir()
    try:
        start = subprocess.run(head_command(temp_dir, gcs, dashboard), env=env, capture_output=True, text=True,
                               timeout=120)
        assert start.returncode == 0, start.stderr[-3000:]
        wait_port(dashboard, timeout=60)
        assert loopback_only(gcs)  # the GCS is not exposed beyond loopback

        submit = subprocess.run(
            [str(RAY), "job", "submit", "--address", f"http://127.0.0.1:{dashboard}",
             "--working-dir", str(HELPERS), "--", sys.executable, "tiny_job.py", "--tasks", "3"],
            env=env, capture_output=True, text=True, timeout=120)
        assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
        out = last_json(submit.stdout)
        assert out["squares"] == [0, 1, 4] and out["mode"] == "cluster"
        assert out["gcs"] == f"127.0.0.1:{gcs}"  # ran on this head, not on an embedded Ray
        job_id = next(w.strip("'") for line in submit.stdout.splitlines() if "succeeded" in line
                      for w in line.split() if w.strip("'").startswith("raysubmit_"))
        status = subprocess.run([str(RAY), "job", "status", "--log-style=record", "--address",
                                 f"http://127.0.0.1:{dashboard}", job_id],
                                env=env, capture_output=True, text=True, timeout=60)
        assert f"Job '{job_id}' succeeded" in status.stdout + status.stderr
        logs = subprocess.run([str(RAY), "job", "logs", "--address", f"http://127.0.0.1:{dashboard}", job_id],
                              env=env, capture_output=True, text=True, timeout=60)
        assert last_json(logs.stdout) == out  # the job's own output, kept by the head
    finally:
        stop_head(temp_dir)
        assert processes_of(temp_dir) == []
        shutil.rmtree(temp_dir, ignore_errors=True)


# ---------------------------------------------------------------------------------------------
SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
needs_ssh = pytest.mark.skipif(
    not (Path(SSHD).exists() and shutil.which("rsync") and shutil.which("nc") and shutil.which("ssh-keygen")
         and os.geteuid() == 0),
    reason="needs root and openssh-server, rsync, netcat-openbsd (scripts/setup.sh --test installs them)")


@pytest.fixture()
def sshd(tmp_path):
    """A private sshd on 127.0.0.1:<random port>: fresh host key, key-only root login, HOME=<tmp>."""
    d = tmp_path / "sshd"
    home = tmp_path / "remote_home"
    d.mkdir()
    home.mkdir()
    for name in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / name)], check=True)
    shutil.copy(d / "client_key.pub", d / "authorized_keys")
    port = free_port()
    config = d / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {d / 'host_key'}", f"PidFile {d / 'sshd.pid'}",
        f"AuthorizedKeysFile {d / 'authorized_keys'}", "PermitRootLogin prohibit-password",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PubkeyAuthentication yes",
        "StrictModes no", "UsePAM no", f"SetEnv HOME={home}", "Subsystem sftp internal-sftp", ""]))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    with open(d / "sshd.log", "w") as log:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=log)
        try:
            wait_port(port, timeout=15)
            yield {"port": port, "key": d / "client_key", "home": home, "log": d / "sshd.log"}
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def write_local_cluster(tmp_path: Path, sshd: dict, temp_dir: Path, gcs: int, dashboard: int) -> Path:
    """A local-provider cluster yaml whose remote shell uses this venv and stops only this head."""
    env_dir = tmp_path / "remote_env"
    env_dir.mkdir()
    (env_dir / "bashrc").write_text("\n".join([
        f"export PATH=$HOME/bin:{VENV_BIN}:$PATH", f"export VIRTUAL_ENV={VENV_BIN.parent}",
        "export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0",
        f"export RAY_ADDRESS=127.0.0.1:{gcs}",
        f"export ORCH_RAY_BIN={RAY} ORCH_PYTHON={sys.executable}",
        f"export ORCH_STOP_HELPER={HELPERS / 'stop_ray_head.py'} ORCH_RAY_TEMP_DIR={temp_dir}",
        f"cd {ROOT}", ""]))  # as cluster.yaml does: relative config paths mean the same as on a laptop
    shutil.copy(HELPERS / "ray_wrapper.sh", env_dir / "ray")
    start = " ".join(head_command(temp_dir, gcs, dashboard))
    cluster = {
        "cluster_name": f"orchtest{gcs}",
        "provider": {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []},
        "auth": {"ssh_user": "root", "ssh_private_key": str(sshd["key"]),
                 "ssh_proxy_command": f"nc %h {sshd['port']}"},
        "file_mounts": {"~/orch_env": str(env_dir)},
        "setup_commands": ["cp ~/orch_env/bashrc ~/.bashrc && mkdir -p ~/bin && cp ~/orch_env/ray ~/bin/ray "
                           "&& chmod +x ~/bin/ray"],
        # Idempotent: a second `ray up` (or `ray submit --start`) finds the head running.
        "head_start_ray_commands": [f"nc -z 127.0.0.1 {gcs} || {start}"],
        "worker_start_ray_commands": [],
    }
    path = tmp_path / "local_cluster.yaml"
    path.write_text(yaml.safe_dump(cluster, sort_keys=False))
    return path


@needs_ssh
@pytest.mark.slow  # with the main job's smoke preset inside: ~4 min on an idle 2-core machine
def test_ray_up_submit_down_over_ssh(tmp_path, sshd):
    temp_dir, gcs, dashboard = private_temp_dir(), free_port(), free_port()
    local_home = tmp_path / "local_home"
    local_home.mkdir()
    env = ray_env(local_home)
    yaml_path = write_local_cluster(tmp_path, sshd, temp_dir, gcs, dashboard)
    state_file = Path("/tmp/ray") / f"cluster-orchtest{gcs}.state"

    def ray_cli(*args: str, timeout: int = 240) -> subprocess.CompletedProcess:
        return subprocess.run([str(RAY), *args], env=env, capture_output=True, text=True, timeout=timeout,
                              cwd=ROOT)

    try:
        up = ray_cli("up", "-y", "--no-config-cache", "--log-style=record", str(yaml_path))
        assert up.returncode == 0, up.stdout[-4000:] + up.stderr[-4000:] + sshd["log"].read_text()[-2000:]
        assert (sshd["home"] / ".bashrc").is_file()  # setup ran in the redirected remote home
        assert not (Path.home() / "orch_env").exists()
        assert loopback_only(gcs)

        # the main job at its smallest preset, on this cluster
        assert SMOKE_PRESET.is_file(), SMOKE_PRESET  # a stale path here once made this test run a toy job
        runs = tmp_path / "runs"
        # A dotted key into a mapping field (no spaces, so it survives ray submit's unquoted join);
        # the directory is the one the smoke preset reads anyway, so the run costs nothing more.
        # One task, one instance length, 10 steps of one phase: every stage still runs on the cluster; the
        # other four tasks' trials, the second phase and its instances only cost time (test_chain runs them).
        biosses = ROOT / "orchestrator" / "sample_data" / "blue" / "BIOSSES"
        submit = ray_cli("submit", "--log-style=record", str(yaml_path), str(ROOT / "jobs" / "blue_sweep.py"),
                         "--", "--preset", "smoke", f"runs_root={runs}", "run_name=cluster",
                         f"sweep.task_dirs.biosses={biosses}", "sweep.tasks=[biosses]",
                         "instances.max_seq_lengths=[64]", "pretrain.phase1.steps=10", "pretrain.phase2.steps=0",
                         timeout=600)
        assert submit.returncode == 0, submit.stdout[-4000:] + submit.stderr[-4000:]
        output = submit.stdout + submit.stderr
        assert "ray cluster" in output  # attached to the launched head, not an embedded Ray
        report = runs / "cluster" / "report" / "blue_table.html"
        assert report.is_file() and str(report) in output
        resolved = json.loads((runs / "cluster" / "chain_config.json").read_text())
        assert resolved["sweep"]["task_dirs"] == {"biosses": str(biosses)}
        results = json.loads((runs / "cluster" / "sweep" / "results.json").read_text())
        assert results["models"] and all(results["cells"][m] for m in results["models"])

        again = ray_cli("up", "-y", "--no-config-cache", "--log-style=record", str(yaml_path))
        assert again.returncode == 0, again.stderr[-3000:]  # idempotent start

        down = ray_cli("down", "-y", "--log-style=record", str(yaml_path))
        assert down.returncode == 0, down.stderr[-3000:]
        assert f"Ray processes of {temp_dir}" in down.stdout + down.stderr  # our stop, not `ray stop`
        deadline = time.time() + 20
        while processes_of(temp_dir) and time.time() < deadline:
            time.sleep(0.5)
        assert processes_of(temp_dir) == []
    finally:
        stop_head(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        for leftover in (state_file, state_file.with_suffix(".lock")):
            leftover.unlink(missing_ok=True)
        # Ray's SSH control sockets for this cluster: /tmp/ray_ssh_<user hash>/<cluster hash>
        user_hash = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
        cluster_hash = hashlib.sha256(f"orchtest{gcs}".encode()).hexdigest()[:10]
        shutil.rmtree(Path("/tmp") / f"ray_ssh_{user_hash}" / cluster_hash, ignore_errors=True)


_ATTACHED = """
import errno, logging, sys, threading
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from orchestrator.core import runtime
from orchestrator.core.errors import CLUSTER_LOST, ConfigError, raised_by_environment, worker_failure
lost = threading.Event()
class Lost(logging.Handler):
    def emit(self, record):
        if CLUSTER_LOST in record.getMessage():
            lost.set()
logging.getLogger().addHandler(Lost())
runtime.CLUSTER_CHECK_S = 1.0  # a check a second (a job's: 5 s): the same watcher, said sooner
with runtime.ray_session(address=sys.argv[1]):
    try:
        runtime.check_fits({"CPU": 1, "GPU": 1}, "sweep.gpus_per_trial")
        print("NOT REFUSED", flush=True)
    except ConfigError as exc:
        print("REFUSED", exc, flush=True)
    runtime.check_fits({"CPU": 4}, "instances.cpus_per_worker")  # a node may come: said, not refused
    print("STOP THE HEAD", flush=True)
    sys.stdin.readline()
    lost.wait(runtime.CLUSTER_CHECKS_LOST * runtime.CLUSTER_CHECK_S + 20)  # said; Ray ends the driver at 60 s
    said = worker_failure(RuntimeError("The actor abc is unavailable: RpcError: Socket closed"), "pretraining")
    print("MAPPED", type(said).__name__, raised_by_environment(said), flush=True)
"""


def test_a_cluster_that_cannot_meet_a_request_or_is_lost_is_said_on_the_terminal(tmp_path):
    """A cluster probe (session 45): attached to a cluster without GPUs (nor node types with any),
    `sweep.gpus_per_trial=1` waited for good with the terminal silent; the head lost mid-sweep ended the job
    60 s later with exit 1 and not a word (Ray's core worker ends the driver from C++), and mid-pretraining
    as "pretraining failed: ... RpcError" with exit 2, the bad-input code. Now: refused when no node could
    ever fit, said when it waits for an autoscaler, and a lost cluster is said while Ray still lets the job
    speak, and mapped to what the machine lacks (exit 1), not to bad input."""
    temp_dir, gcs, dashboard = private_temp_dir(), free_port(), free_port()
    env = {**ray_env(tmp_path / "home"), "PYTHONPATH": str(ROOT), "ORCH_IGNORE_LOCAL_CLUSTER": "1"}
    (tmp_path / "home").mkdir()
    try:
        start = subprocess.run(head_command(temp_dir, gcs, dashboard, num_cpus=1), env=env, capture_output=True,
                               text=True, timeout=120)
        assert start.returncode == 0, start.stderr[-3000:]
        job = subprocess.Popen([sys.executable, "-c", _ATTACHED, f"127.0.0.1:{gcs}"], env=env, text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        lines = []
        for line in job.stdout:
            lines.append(line)
            if line.startswith("STOP THE HEAD"):
                break
        stop_head(temp_dir)
        job.stdin.write("\n")
        job.stdin.flush()
        rest, _ = job.communicate(timeout=120)
        out = "".join(lines) + rest
        assert "REFUSED sweep.gpus_per_trial: each task asks for GPU 1, but this cluster could give at most 0" in out
        assert "instances.cpus_per_worker: each task asks for CPU 4 and the cluster's nodes have at most CPU 1" in out
        assert f"the Ray cluster stopped answering (did its head node stop, or the network between them?) at " \
               f"127.0.0.1:{gcs}: this job will end" in out
        assert f"MAPPED ConnectionResetError ({errno.ECONNRESET}, 'the Ray cluster stopped answering" in out, out
    finally:
        stop_head(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


_RELATIVE = """
import os, sys
from pathlib import Path
import ray
from orchestrator.core import runtime
try:
    with runtime.ray_session(address=sys.argv[1]):
        @ray.remote(num_cpus=1)
        def write(relative):
            Path(relative).parent.mkdir(parents=True, exist_ok=True)
            Path(relative).write_text("x")
            return os.getcwd()
        print("WORKER IN", ray.get(write.remote("rel/out.txt")), flush=True)
except Exception as exc:
    print("REFUSED", type(exc).__name__, exc, flush=True)
"""


def test_an_attached_clusters_workers_follow_the_jobs_directory_and_a_refused_token_is_said(tmp_path):
    """An environment probe (session 46): with `ray start` run in one directory and the job in another, a relative
    `out_dir=rel/bc` failed inside a Ray task (a RayTaskError called a bug) and relative corpus paths were "file not
    found", though the driver had checked them: the workers ran in the raylet's directory. Now they move to the job's.
    And a cluster with token authentication refusing a job without its token was said as "the Ray cluster stopped
    answering ... re-run once it is fixed", the reason (InvalidAuthToken) only in the log file."""
    temp_dir, gcs, dashboard = private_temp_dir(), free_port(), free_port()
    home, head_dir, job_dir = tmp_path / "home", tmp_path / "head", tmp_path / "job"
    for d in (home, head_dir, job_dir):
        d.mkdir()
    env = {**ray_env(home), "PYTHONPATH": str(ROOT), "ORCH_IGNORE_LOCAL_CLUSTER": "1", "RAY_AUTH_MODE": "token"}
    try:
        token = subprocess.run([str(RAY), "get-auth-token", "--generate"], env=env, capture_output=True, text=True,
                               timeout=120)  # into the private home's ~/.ray/auth_token
        assert token.returncode == 0, token.stderr[-3000:]
        start = subprocess.run(head_command(temp_dir, gcs, dashboard, num_cpus=1), env=env, capture_output=True,
                               text=True, timeout=120, cwd=head_dir)
        assert start.returncode == 0, start.stderr[-3000:]
        attached = subprocess.run([sys.executable, "-c", _RELATIVE, f"127.0.0.1:{gcs}"], env=env, cwd=job_dir,
                                  capture_output=True, text=True, timeout=180)
        assert f"WORKER IN {job_dir}" in attached.stdout, attached.stdout[-2000:] + attached.stderr[-3000:]
        assert (job_dir / "rel" / "out.txt").is_file() and not (head_dir / "rel").exists()
        tick = time.monotonic()
        refused = subprocess.run([sys.executable, "-c", _RELATIVE, f"127.0.0.1:{gcs}"], cwd=job_dir,
                                 env={**env, "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True, timeout=180)
        said = next((line for line in refused.stdout.splitlines() if line.startswith("REFUSED")), refused.stdout)
        assert said.startswith(f"REFUSED OrchestratorError the Ray cluster at 127.0.0.1:{gcs} (from RAY_ADDRESS or "
                               "config) answers but did not let this job attach"), said + refused.stderr[-3000:]
        assert "needs the same RAY_AUTH_MODE here (it is disabled)" in said and "stopped answering" not in said
        print(f"refused in {time.monotonic() - tick:.0f} s")
    finally:
        stop_head(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
