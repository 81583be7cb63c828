"""The pretraining workers' torch.distributed process group, its rendezvous store bound to one address.

Ray Train's torch backend (2.60, ``init_method="env"``) gives every worker ``MASTER_ADDR`` (the node
address of rank 0) and a free ``MASTER_PORT``, and rank 0's ``init_process_group`` starts torch's
``TCPStore`` there. That store binds every interface (``ss -ltnp``: ``LISTEN *:<port>
ray::RayTrainWorker``) whatever ``MASTER_ADDR`` says, and it has no authentication. Here rank 0
binds the listening socket itself, to ``MASTER_ADDR`` only (the address Ray knows the node by:
127.0.0.1 for an embedded single-node Ray, the node's cluster address on a cluster), and hands it
to the store (``TCPStore(master_listen_fd=...)``, torch's documented way); the other ranks connect
to it, and every rank joins the process group with ``store=``. The rest (backend choice, ``RANK``
and the other environment variables, shutdown) is Ray's ``TorchConfig`` and its backend unchanged.
gloo's own pair sockets bind the address the host name resolves to (``GLOO_SOCKET_IFNAME`` picks
an interface), as before.
"""
from __future__ import annotations

import dataclasses
import datetime
import os
import socket

import ray
import torch.distributed as dist
from ray.train._internal.worker_group import WorkerGroup as V1WorkerGroup
from ray.train.torch import TorchConfig
from ray.train.torch.config import _set_torch_distributed_env_vars, _TorchBackend

_listener: socket.socket | None = None  # rank 0's bound socket, between _listen and _join


def _listen() -> tuple[str, int]:
    """On rank 0: a socket bound to this node's address on a free port, listening."""
    global _listener
    addr = ray.util.get_node_ip_address()
    sock = socket.socket(socket.AF_INET6 if ":" in addr else socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((addr, 0))
    sock.listen(socket.SOMAXCONN)
    _listener = sock
    return addr, sock.getsockname()[1]


def _join(backend: str, rank: int, world_size: int, addr: str, port: int, timeout_s: int) -> None:
    """Join the process group through the store rank 0 serves on ``addr:port``."""
    global _listener
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)  # as Ray sets them
    if backend == "nccl" and "TORCH_NCCL_BLOCKING_WAIT" not in os.environ:
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")  # as Ray does: fail on a timed-out collective
    timeout = datetime.timedelta(seconds=timeout_s)
    if rank == 0:
        fd, _listener = _listener.detach(), None  # the store owns the socket from here
        store = dist.TCPStore(addr, port, world_size, True, timeout, master_listen_fd=fd)
    else:
        store = dist.TCPStore(addr, port, world_size, False, timeout)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


class _BoundStoreBackend(_TorchBackend):
    def on_start(self, worker_group, backend_config: TorchConfig):
        backend = backend_config.backend or (
            "nccl" if worker_group.get_resources_per_worker().get("GPU", 0) > 0 else "gloo")
        if backend not in ("gloo", "nccl"):  # what this project never asks for: Ray's own setup
            return super().on_start(worker_group, backend_config)
        addr, port = worker_group.execute_single(0, _listen)
        if not isinstance(worker_group, V1WorkerGroup):
            worker_group.execute(_set_torch_distributed_env_vars)
        n = len(worker_group)
        ray.get([worker_group.execute_single_async(rank, _join, backend, rank, n, addr, port, backend_config.timeout_s)
                 for rank in range(n)])


@dataclasses.dataclass
class BoundStoreTorchConfig(TorchConfig):
    """Ray Train's ``TorchConfig``, but rank 0's rendezvous store listens on its node address only."""

    @property
    def backend_cls(self):
        return _BoundStoreBackend
