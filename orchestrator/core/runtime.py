"""The one place that owns ray.init, seeds, device and rank.

Local by default: an embedded Ray bound to 127.0.0.1. Attach to an existing cluster when
``RAY_ADDRESS`` is set, an explicit address is given, or this process runs on a cluster head
(``ray start`` wrote /tmp/ray/ray_current_cluster).
"""
from __future__ import annotations

import contextlib
import logging
import os
import random
import resource
import signal
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import yaml

from orchestrator.core.console import run_log
from orchestrator.core.errors import CLUSTER_LOST, ConfigError, OrchestratorError, gcs_unreachable, raise_on_sigterm
from orchestrator.core.worker_setup import DRIVER_CWD_ENV

log = logging.getLogger(__name__)

_CLUSTER_MARKER = Path("/tmp/ray/ray_current_cluster")


def cluster_address(explicit: str | None = None, marker: Path | None = None) -> str | None:
    """The address to attach to, or None for an embedded local Ray: the one given, ``RAY_ADDRESS``, or the
    cluster ``ray start`` left its marker for on this host (a job a cluster's head node runs, ``ray submit``)
    when this user made it: ``/tmp/ray`` is writable by anyone, so another user's marker would send the job,
    its code and data to a cluster of their choosing."""
    if explicit and explicit != "local":
        return explicit
    if explicit == "local":
        return None
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    if os.environ.get("ORCH_IGNORE_LOCAL_CLUSTER") == "1":
        return None
    marker = marker or _CLUSTER_MARKER
    try:
        info = os.lstat(marker)
    except OSError:  # none: no cluster was started on this host
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
        log.warning("ignoring %s (%s): this job starts its own Ray; set RAY_ADDRESS (or ray_address) to attach to "
                    "a cluster", marker, "not a file" if not stat.S_ISREG(info.st_mode)
                    else f"another user's, uid {info.st_uid}")
        return None
    return "auto"


#: Variables ``init_ray`` sets in this process (if unset) for the Ray it starts or attaches to; ``ray_session``
#: gives the caller its own values back
RAY_ENV_SET = ("TUNE_DISABLE_SIGINT_HANDLER", "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "RAY_USAGE_STATS_ENABLED")


def init_ray(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None,
             log_to_driver: bool = True) -> dict:
    """Start or attach Ray once per process. Returns a description of what it did."""
    import ray  # heavy: ray

    if ray.is_initialized():
        return {"mode": "already", "resources": ray.cluster_resources()}
    target = cluster_address(address)
    # Project code and sample data must be importable by every Ray worker.
    project_root = str(Path(__file__).resolve().parents[2])
    env = {"env_vars": {"PYTHONPATH": _pythonpath_with(project_root), "TOKENIZERS_PARALLELISM": "false",
                        # Fine-tuning loads pretraining checkpoints without their heads on purpose;
                        # transformers' per-key load report would drown the progress output.
                        "TRANSFORMERS_VERBOSITY": os.environ.get("TRANSFORMERS_VERBOSITY", "error")}}
    # Ctrl-C stays a KeyboardInterrupt in a sweep: Ray Tune's own handler ended the run as if it had finished, and
    # the job then reported the unfinished trials as bad input (exit 2). The trials' records are the restore unit.
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    # Tune's runs log their results to result.json only (``tune_loggers``): the CSV and tensorboardX loggers Tune
    # adds by default import tensorboardX, and torch with it, on the driver as a sweep starts (0.3-1.2 s before
    # its first trial), and write every result twice more; MLflow holds the metrics
    os.environ.setdefault("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    open_files_for_ray()
    check_temp_dir_for_ray()
    if target is None:
        _force_loopback()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        env["worker_process_setup_hook"] = "orchestrator.core.worker_setup.quiet_embedded_ray"  # no dashboard
        ray.init(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False,
                 log_to_driver=log_to_driver, runtime_env=env, _node_ip_address="127.0.0.1",
                 object_store_memory=object_store_for_limits())
        mode = "local"
        global _EMBEDDED_SESSION
        _EMBEDDED_SESSION = ray.get_runtime_context().gcs_address
    else:
        _check_reachable(target)
        # a worker of a cluster starts in its raylet's directory: it moves to this job's, where relative paths
        # in the config point, when its node has it (a `ray start` from another directory: out_dir=rel/x failed)
        env["env_vars"][DRIVER_CWD_ENV] = os.getcwd()
        env["worker_process_setup_hook"] = "orchestrator.core.worker_setup.follow_driver_directory"
        try:
            ray.init(address=target, log_to_driver=log_to_driver, runtime_env=env)
        except Exception as exc:  # noqa: BLE001 - Ray raises several types for a refused attach
            raise _attach_refused(target, exc) from exc
        mode = "cluster"
    raise_on_sigterm()  # ray.init's own handler exits with status 15 and no word
    res = ray.cluster_resources()
    log.info("ray %s: %s", mode, {k: v for k, v in res.items() if k in ("CPU", "GPU", "memory")})
    return {"mode": mode, "address": target, "resources": res}


#: The GCS address of the local Ray ``init_ray`` started in this process (a fixed set of nodes: no autoscaler
#: adds one).
_EMBEDDED_SESSION: str | None = None


def alive_nodes() -> list[dict]:
    """The Ray cluster's alive nodes (``ray.nodes()`` entries); Ray must be initialised."""
    import ray  # heavy: ray

    return [n for n in ray.nodes() if n.get("Alive")]


def check_fits(request: dict[str, float], setting: str, what: str = "task") -> None:
    """Refuse, on an embedded local Ray, a task's or worker's resource request that none of its nodes can
    meet: Ray would queue it for good (``retrieval use_gpu=true`` on a machine without a GPU, ``cpus_per_worker``
    above the machine's CPUs: the job sat at 0 done with only Ray's autoscaler lines saying why). On a cluster
    Ray attached to, GPUs beyond what it could ever give (``possible_gpus``: its nodes and its autoscaler's
    node types) are refused too; a request its autoscaler may meet is said once, as the wait it starts."""
    import ray  # heavy: ray

    wanted = {k: float(v) for k, v in request.items() if v and float(v) > 0}
    if not wanted or not ray.is_initialized():
        return
    nodes = [n.get("Resources", {}) for n in alive_nodes()]
    if any(all(node.get(k, 0.0) >= v for k, v in wanted.items()) for node in nodes):
        return
    has = ", ".join(f"{k} {max((n.get(k, 0.0) for n in nodes), default=0.0):g}" for k in wanted)
    asks = ", ".join(f"{k} {v:g}" for k, v in wanted.items())
    if _EMBEDDED_SESSION is None or ray.get_runtime_context().gcs_address != _EMBEDDED_SESSION:
        if wanted.get("GPU", 0.0) > (possible := possible_gpus()):
            raise ConfigError(f"{setting}: each {what} asks for GPU {wanted['GPU']:g}, but this cluster could give "
                              f"at most {possible:g} (its nodes and its autoscaler's node types), so no {what} could "
                              f"ever start: lower the setting, or set {CLUSTER_GPUS_ENV} when the cluster can add "
                              "GPU nodes this job cannot see")
        log.warning("%s: each %s asks for %s and the cluster's nodes have at most %s now: the job waits for its "
                    "autoscaler to start a node that fits (its lines are in the run's log file)", setting, what,
                    asks, has)
        return
    raise ConfigError(f"{setting}: each {what} asks for {asks}, but this machine's Ray has at most {has}, so no "
                      f"{what} could ever start: lower the setting, or run on a Ray cluster with such a node")


def _check_reachable(address: str, timeout: float = 5.0) -> None:
    """Fail fast on a host:port nobody listens on (Ray itself retries for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or "://" in address or not port.isdigit():
        return  # "auto", ray:// client addresses and dashboard URLs are resolved by Ray
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise OrchestratorError(f"Ray cluster at {address} (from RAY_ADDRESS or config) is not reachable: {exc}; "
                                "unset RAY_ADDRESS to run on an embedded local Ray") from None


#: Words of Ray's error when a cluster whose port answers refuses a driver (its GCS connection, its auth check)
ATTACH_REFUSED_SIGNS = ("Failed to connect to", "InvalidAuthToken", "Unauthenticated", "authentication",
                        "Authentication")


def _attach_refused(address: str, exc: Exception) -> Exception:
    """What a job raises when Ray at ``address``, whose port answered, did not let it attach: in Ray 2.60 a
    cluster with token authentication that rejects this shell's token (or its lack of one) fails the GCS
    connection after about 20 s, which read as a cluster that "stopped answering" and "re-run once it is fixed",
    Ray's InvalidAuthToken lines only in the log file. Other failures are ``exc`` itself."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    if not isinstance(exc, ConnectionError) and not any(sign in first for sign in ATTACH_REFUSED_SIGNS):
        return exc
    mode = os.environ.get("RAY_AUTH_MODE") or "unset"
    return OrchestratorError(
        f"the Ray cluster at {address} (from RAY_ADDRESS or config) answers but did not let this job attach "
        f"({first[:200].rstrip('.')}). A cluster started with token authentication needs the same RAY_AUTH_MODE "
        f"here (it is {mode}) and its token (~/.ray/auth_token from its head node, or RAY_AUTH_TOKEN): see "
        "docs/CLUSTER.md; Ray's own lines are in the run's log file")


#: Open files below which Ray's daemons and workers fail (a Ray Data stage at 64 died with no word; 256 ran).
MIN_OPEN_FILES = 256
#: Ray's smallest object store (``ray_constants.OBJECT_STORE_MINIMUM_MEMORY_BYTES``) and its default share of
#: the machine's memory (``DEFAULT_OBJECT_STORE_MEMORY_PROPORTION``).
MIN_OBJECT_STORE = 75 * 2**20
OBJECT_STORE_SHARE = 0.3


def check_temp_dir_for_ray() -> None:
    """ConfigError when the temp directory (``TMPDIR``) has a name Ray's start cannot use: its worker encodes
    it as ASCII (a UnicodeEncodeError from inside Ray, called a bug)."""
    temp = tempfile.gettempdir()
    if not temp.isascii():
        raise ConfigError(f"the temp directory {temp} (TMPDIR) has characters beyond ASCII, which Ray cannot start "
                          "with: point TMPDIR at a directory whose path is ASCII")


def open_files_for_ray() -> int:
    """Raise this process's open-file limit to its hard limit (at most 65,536; Ray's daemons and workers inherit
    it), as Ray's documentation asks; a hard limit under ``MIN_OPEN_FILES`` is a ConfigError naming
    ``ulimit -n``. Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 65536 if hard == resource.RLIM_INFINITY else min(hard, 65536)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    if soft != resource.RLIM_INFINITY and soft < MIN_OPEN_FILES:
        raise ConfigError(f"this shell allows {soft} open files (ulimit -n, hard limit {hard}); Ray needs at least "
                          f"{MIN_OPEN_FILES}: raise it (ulimit -n 65536, or ask the machine's administrator)")
    return soft


def object_store_for_limits() -> int | None:
    """The object store an embedded Ray can map under this process's limits, or None for Ray's default: every
    worker maps the whole store in its address space (``ulimit -v``: a quarter of it, the rest for the worker's
    own libraries) and the store is one file (``ulimit -f``). Under such a limit Ray's default (30 % of the
    machine's memory) hung the job without a word (``ulimit -v``) or failed after 30 s blaming Ray's start
    (``ulimit -f``). A limit that leaves less than Ray's smallest store is a ConfigError naming it."""
    caps = []
    for name, limit, share, flag in (("ulimit -v", resource.RLIMIT_AS, 4, "address space"),
                                     ("ulimit -f", resource.RLIMIT_FSIZE, 1, "file size")):
        soft = resource.getrlimit(limit)[0]
        if soft != resource.RLIM_INFINITY:
            caps.append((soft // share, name, soft, flag))
    if not caps:
        return None
    cap, name, soft, flag = min(caps)
    if cap < MIN_OBJECT_STORE:
        raise ConfigError(f"this shell limits the {flag} to {soft / 2**20:.1f} MiB ({name}); Ray's object store "
                          f"needs at least {MIN_OBJECT_STORE // 2**20} MiB there: raise the limit ({name} unlimited)")
    return min(cap, int(OBJECT_STORE_SHARE * psutil.virtual_memory().total))


def _force_loopback() -> None:
    """Keep an embedded Ray (raylet, workers, gloo) on 127.0.0.1.

    Ray 2.60 binds the eth0 address unless RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which it reads
    once at import into ray_constants: set the variable for the processes Ray spawns, and the
    constant for this one in case ray was imported before us.
    """
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    from ray._private import ray_constants  # heavy: ray

    ray_constants.ENABLE_RAY_CLUSTER = False


def _pythonpath_with(root: str) -> str:
    parts = [root] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return os.pathsep.join(parts)


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None,
                log_to_driver: bool = True, log_file: str | Path | None = None) -> Iterator[dict]:
    """init_ray for the block; shuts Ray down afterwards only if this block started it.

    ``log_file``: the block's output (this process's stdout and stderr, Ray's and Tune's own lines, the
    workers' output Ray forwards) goes to that file, the terminal keeping the project's concise lines
    (``orchestrator.core.console``); ``info["log_file"]`` says where (None with ``--verbose``)."""
    import ray  # heavy: ray

    with contextlib.ExitStack() as stack:
        written = stack.enter_context(run_log(log_file)) if log_file is not None else None
        started = not ray.is_initialized()
        # the environment as the caller gets it back (a library call from a notebook: its own Tune runs, pdb for its
        # breakpoint(), which ray.init pointed at Ray's debugger, the loopback switch kept from processes started
        # later: probe L7); MLflow's variables are orchestrator.track.caller's to give back
        saved = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        sigterm = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        try:  # Ray starting counts: a Ctrl-C then left its first processes and Ray's SIGTERM handler (probe L3)
            info = init_ray(address=address, num_cpus=num_cpus, log_to_driver=log_to_driver)
            if started and info["mode"] == "cluster":
                stack.enter_context(_said_if_cluster_lost())
            yield {**info, "log_file": written}
        finally:
            if started:
                ray.shutdown()  # before the log file closes: the workers' last lines are flushed into it
                # ray.shutdown leaves SIGTERM to kill the process outright, without a clean-up: the caller's
                # handler again (a job's raises Terminated; one not set from Python: ours)
                if sigterm is not None:
                    signal.signal(signal.SIGTERM, sigterm)
                else:
                    raise_on_sigterm()
                _environment_back(saved)


def _environment_back(saved: dict[str, str]) -> None:
    """``os.environ`` as ``saved`` holds it, MLflow's variables left as they are."""
    for key in [k for k in os.environ if k not in saved and not k.startswith("MLFLOW_")]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


#: How often an attached cluster is checked, and after how many checks without an answer its loss is said
CLUSTER_CHECK_S, CLUSTER_CHECKS_LOST = 5.0, 3


@contextlib.contextmanager
def _said_if_cluster_lost(every: float | None = None, misses: int = CLUSTER_CHECKS_LOST) -> Iterator[None]:
    """While the block runs, a thread that says, on the terminal, that the attached cluster stopped answering:
    Ray's core worker ends a driver that lost its cluster's GCS for 60 s from C++, exit 1 and not a word on the
    terminal (its own line went to the run's log file), so the job's handlers never run. It checks every
    ``CLUSTER_CHECK_S`` as the module holds it when the block starts."""
    every = CLUSTER_CHECK_S if every is None else every
    done = threading.Event()

    def watch() -> None:
        missed = 0
        while not done.wait(every):
            lost = gcs_unreachable()
            missed = missed + 1 if lost else 0
            if missed == misses:
                log.error("%s at %s: this job will end; finished work is kept: re-run the same command once the "
                          "cluster answers", CLUSTER_LOST, lost)

    thread = threading.Thread(target=watch, name="cluster-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    try:
        import torch  # heavy: torch

        torch.manual_seed(seed)
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass


@contextlib.contextmanager
def generators_kept() -> Iterator[None]:
    """Python's, NumPy's and (imported already) torch's CPU generators as the caller had them after the block: a
    stage called from a notebook (``pretrain``, ``run_sweep``) moved them (Ray's start and Tune draw from
    ``random``: probe L8), which a workflow's ``seeded`` gives back."""
    torch = sys.modules.get("torch")
    state = random.getstate(), np.random.get_state(), torch.random.get_rng_state() if torch is not None else None
    try:
        yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        if torch is not None:
            torch.random.set_rng_state(state[2])


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """``seed_everything(seed)`` for the block; after it, Python's, NumPy's and torch's (CPU) generators as the
    caller had them. A job seeds its driver; a library call (a workflow's ``run`` from a notebook) must not
    change the draws its caller makes next."""
    import torch  # noqa: F401  (heavy: torch; imported first, so that generators_kept keeps its generator too)

    with generators_kept():
        seed_everything(seed)
        yield


def choose_device(prefer: str = "auto"):
    """'auto' -> cuda if available else cpu; or an explicit torch device string."""
    import torch  # heavy: torch

    if prefer == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(prefer)


def available_cpus(default: int = 2) -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or default


#: An explicit count of the GPUs the cluster can give (all its nodes at their most), for a cluster
#: whose autoscaler this process cannot read; it wins over everything read from Ray.
CLUSTER_GPUS_ENV = "ORCH_CLUSTER_GPUS"
#: Where ``ray up`` leaves the autoscaler's config on the head (cluster.yaml starts Ray with it).
_BOOTSTRAP_CONFIG = Path("~/ray_bootstrap_config.yaml")


def node_type_gpus(cluster: dict) -> float:
    """The GPUs an autoscaler config (cluster.yaml's form: ``available_node_types``,
    ``head_node_type``, ``max_workers``) can start: each worker type's GPUs x its most nodes (its own
    ``max_workers``, else the cluster's, never above the cluster's), plus the head's."""
    limit = cluster.get("max_workers")
    total = 0.0
    for name, node in (cluster.get("available_node_types") or {}).items():
        gpus = float((node.get("resources") or {}).get("GPU", 0) or 0)
        if name == cluster.get("head_node_type"):
            total += gpus
            continue
        most = node.get("max_workers", limit) or 0
        total += gpus * (most if limit is None else min(most, limit))
    return total


def possible_gpus() -> float:
    """How many GPUs the connected Ray cluster could give: those it has now, or, on an autoscaling
    cluster whose GPU nodes have not started yet (``min_workers: 0``), those its node types can start.

    Read from, the largest winning: ``ORCH_CLUSTER_GPUS`` (when set, the answer); the live cluster;
    the autoscaler's cluster config in Ray's GCS (KubeRay, autoscaler v2); and, attached to a cluster,
    the head's ``~/ray_bootstrap_config.yaml`` (``ray up``'s copy of cluster.yaml). An embedded
    laptop Ray has only the first two: its answer is its GPUs."""
    import ray  # heavy: ray

    explicit = os.environ.get(CLUSTER_GPUS_ENV, "").strip()
    if explicit:
        try:
            value = float(explicit)
        except ValueError:
            value = -1.0
        if value < 0:
            raise ConfigError(f"{CLUSTER_GPUS_ENV}={explicit!r}: expected a number of GPUs >= 0")
        return value
    found = [float(ray.cluster_resources().get("GPU", 0) or 0)]
    try:  # what Ray Train v2 reads for the same question; None when no autoscaler reported a config
        from ray._private.state import state  # heavy: ray

        found.append(float((state.get_max_resources_from_cluster_config() or {}).get("GPU", 0) or 0))
    except Exception as exc:  # a private API: an older or newer Ray may lack it or fail differently
        log.debug("no autoscaler cluster config from Ray's GCS: %s", exc)
    bootstrap = _BOOTSTRAP_CONFIG.expanduser()
    if cluster_address() is not None and bootstrap.is_file():
        try:
            found.append(node_type_gpus(yaml.safe_load(bootstrap.read_text(encoding="utf-8")) or {}))
        except (OSError, yaml.YAMLError, AttributeError, TypeError, ValueError) as exc:
            log.warning("%s: not an autoscaler config (%s); counting only the GPUs the cluster has now",
                        bootstrap, exc)
    return max(found)


def tune_loggers() -> list:
    """The logger callbacks a project Tune run passes: Tune's result.json writer, the one its runs read
    (``benchmarks/sweep_overhead.py``). ``init_ray`` turns off the ones Tune adds by default."""
    from ray.tune.logger import JsonLoggerCallback  # heavy: ray

    return [JsonLoggerCallback()]
