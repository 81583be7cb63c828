"""What a pretraining run over several nodes needs, checked before anything trains.

On one machine every path the driver names is a path the workers see. On several nodes they are
not: the instances are read and the tokenizer, ``model.init_from`` and a resumed checkpoint loaded
by workers elsewhere; Ray Train persists checkpoints from rank 0's node into ``storage_path``; and
rank 0 logs to MLflow from its own node. So a multi-node run needs

- shared storage: the stage's paths on a filesystem every node mounts at the same path, which the
  user declares (``pretrain.shared_storage: true``); checkpoints may go to an object store instead
  (``pretrain.storage_path: s3://...``), but the inputs are still read by the workers;
- an MLflow store the workers reach: a tracking server (``http://<head private address>:5000``) or
  a database URI, not the default SQLite file in the driver's run directory, and not a server on
  the driver's loopback unless every node is that machine (or tracking off).

A run is multi-node when the config says so (``pretrain.multi_node``, what a dry run checks), when
the Ray cluster it attaches to has more than one alive node, or when its GPU workers cannot all fit
on the driver's node (an autoscaling cluster whose GPU nodes have not started yet). A laptop or a
single GPU box is none of these, and nothing changes for it.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.core.errors import ConfigError
from orchestrator.pretrain.config import PretrainConfig

#: MLflow stores that are a network service: every node reaches the same one.
SERVER_SCHEMES = ("http", "https", "databricks", "postgresql", "mysql", "mssql")


def is_uri(path: str) -> bool:
    """An object-store / remote-filesystem URI (s3://, gs://, abfs://, hdfs://); ``file://`` is local."""
    return "://" in path and not path.startswith("file://")


def driver_resources(nodes: Sequence[dict]) -> dict[str, float]:
    """The resources of the node this process (the driver) runs on."""
    import ray  # heavy: ray

    here = ray.get_runtime_context().get_node_id()
    return next((n.get("Resources", {}) for n in nodes if n.get("NodeID") == here), {})


def multi_node_reason(cfg: PretrainConfig, nodes: Sequence[dict] | None,
                      driver_resources: dict[str, float] | None = None) -> str | None:
    """Why this run spans several nodes, or None. ``nodes``: the cluster's alive nodes (None when no
    cluster is attached, as in a dry run); ``driver_resources``: the driver node's resources."""
    if cfg.multi_node:
        return "pretrain.multi_node is true"
    if nodes is not None and len(nodes) > 1:
        return f"the Ray cluster has {len(nodes)} nodes"
    if cfg.use_gpu and driver_resources is not None and driver_resources.get("GPU", 0.0) < cfg.num_workers:
        return (f"{cfg.num_workers} GPU workers do not fit on the driver's node "
                f"({driver_resources.get('GPU', 0.0):g} GPUs): they run on other nodes")
    return None


def _loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def tracking_problem(uri: str | None, nodes: Sequence[dict] | None) -> str | None:
    """Why rank 0 on another node cannot log to ``uri`` (None: it can, or tracking is off)."""
    if not uri:
        return None
    scheme = urlparse(uri).scheme.split("+")[0]
    if scheme not in SERVER_SCHEMES:
        return (f"the MLflow store {uri} is a file on the driver's machine, and pretraining's rank 0 logs from "
                f"its own node (a SQLite file on a shared mount is no better: it is not safe for writers on "
                f"several machines): run an MLflow server reachable from every node and set "
                f"tracking.tracking_uri=http://<head private address>:5000 (docs/CLUSTER.md, section 4), or "
                f"tracking.enabled=false")
    addresses = {n.get("NodeManagerAddress") for n in nodes or ()}
    if _loopback(urlparse(uri).hostname) and (nodes is None or len(addresses) > 1):
        return (f"the MLflow server {uri} listens on the driver's loopback, which the other nodes do not reach: "
                f"bind it to the head's private address and set tracking.tracking_uri to that address")
    return None


def storage_problems(cfg: PretrainConfig, out_dir: Path | None, instances: Sequence[Path] = (),
                     tokenizer_dir: Path | None = None) -> list[str]:
    """What is local to the driver among the paths the workers use."""
    if cfg.shared_storage:
        return []
    where = cfg.storage_path or (f"{Path(out_dir) / 'checkpoints'}" if out_dir else "<out_dir>/checkpoints")
    problems = []
    if not is_uri(cfg.storage_path):
        problems.append(f"checkpoints go to {where} on the driver's disk, which workers on other nodes do not see "
                        f"(rank 0 persists them, every worker resumes from them): set pretrain.storage_path to an "
                        f"object-store URI (s3://bucket/prefix, gs://...), or keep it on a filesystem every node "
                        f"mounts and set pretrain.shared_storage=true")
    read = [f"instances {', '.join(str(p) for p in instances)}" if instances else "the instances",
            f"tokenizer {tokenizer_dir}" if tokenizer_dir else "the tokenizer"]
    if cfg.model.init_from:
        read.append(f"model.init_from {cfg.model.init_from}")
    problems.append(f"the workers read {'; '.join(read)}: keep them on a filesystem every node mounts at the same "
                    f"path and set pretrain.shared_storage=true")
    return problems


def check_multi_node(cfg: PretrainConfig, tracking_uri: str | None, *, nodes: Sequence[dict] | None = None,
                     driver_resources: dict[str, float] | None = None, out_dir: Path | None = None,
                     instances: Sequence[Path] = (), tokenizer_dir: Path | None = None) -> str | None:
    """Refuse (ConfigError, saying what a multi-node run needs) a multi-node run whose storage or
    MLflow store is local to the driver. ``tracking_uri``: the configured store, None when tracking
    is off. Returns why the run is multi-node (None for a single-node run, which is never refused)."""
    reason = multi_node_reason(cfg, nodes, driver_resources)
    if reason is None:
        return None
    problems = storage_problems(cfg, out_dir, instances, tokenizer_dir)
    tracking = tracking_problem(tracking_uri, nodes)
    if tracking:
        problems.append(tracking)
    if problems:
        raise ConfigError(f"pretrain: a multi-node run ({reason}) needs shared storage and an MLflow server every "
                          "node reaches:\n" + "\n".join(f"  - {p}" for p in problems))
    return reason
